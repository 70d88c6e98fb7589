"""Store queries through a read-only MessageStoreReader bounded by the dispatcher's published
counts: offsets by queue and time, messages by id and key, a topic's status.

Owns the handlers of SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31),
GET_EARLIEST_MSG_STORETIME (32), VIEW_MESSAGE_BY_ID (33), QUERY_MESSAGE (12) and
GET_TOPIC_STATS_INFO (202). Any admin processor serves them. Stored messages leave by sendfile
(`_record_run`), never as copies.
"""

from __future__ import annotations

import logging

from mqbox.message import STORETIMESTAMP_POSITION_BYTES
from mqbox.protocol import admin_bodies
from mqbox.protocol.admin_bodies import TopicRequestHeader
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import (
    RemotingCommand,
)
from mqbox.protocol.headers import (
    GetEarliestMsgStoretimeResponseHeader,
    MessageQueue,
    OffsetResponseHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    QueueRequestHeader,
    SearchOffsetRequestHeader,
    ViewMessageRequestHeader,
)
from mqbox.server.parcels import Run
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import (
    _STORE_TIMESTAMP,
    QUERY_MESSAGE_BODY_SIZE_BYTES_MAX,
    QUERY_MESSAGE_COUNT_MAX,
    UNIQUE_KEY_QUERY_COUNT,
    AdminBase,
    _shown,
)
from mqbox.store.message_store import MessageStoreReader

log = logging.getLogger("mqbox.admin")


class StoreQueries(AdminBase):
    """Handlers of the store queries (any admin processor)."""

    def _queue_reader(
        self, request: Request, header: QueueRequestHeader | SearchOffsetRequestHeader
    ) -> MessageStoreReader | RemotingCommand:
        error = self._unknown_queue(request, header.topic, header.queue_id)
        if error is not None:
            return error
        reader = self.store.for_queue(header.topic, header.queue_id)
        return self._no_store(request) if reader is None else reader

    @handles(RequestCode.GET_MAX_OFFSET)
    def _max_offset(self, request: Request) -> RemotingCommand:
        """GET_MAX_OFFSET (30): the queue's published entry count."""
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.max_offset(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    @handles(RequestCode.GET_MIN_OFFSET)
    def _min_offset(self, request: Request) -> RemotingCommand:
        """GET_MIN_OFFSET (31): the queue's first index still stored."""
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.min_offset(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    @handles(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
    def _search_offset(self, request: Request) -> RemotingCommand:
        """SEARCH_OFFSET_BY_TIMESTAMP (29): the index of the first message stored at or after
        the time."""
        header = SearchOffsetRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        queue_index = reader.search_offset_by_timestamp(
            header.topic, header.queue_id, header.timestamp_ms
        )
        return request.make_response(
            ResponseCode.SUCCESS, OffsetResponseHeader(queue_index).to_ext()
        )

    @handles(RequestCode.GET_EARLIEST_MSG_STORETIME)
    def _earliest_store_time(self, request: Request) -> RemotingCommand:
        """GET_EARLIEST_MSG_STORETIME (32): the store time of the queue's first message."""
        header = QueueRequestHeader.from_ext(request.command.ext_fields)
        reader = self._queue_reader(request, header)
        if isinstance(reader, RemotingCommand):
            return reader
        timestamp_ms = reader.earliest_message_store_timestamp_ms(header.topic, header.queue_id)
        return request.make_response(
            ResponseCode.SUCCESS, GetEarliestMsgStoretimeResponseHeader(timestamp_ms).to_ext()
        )

    def _record_run(self, log_offset_bytes: int, size_bytes: int) -> Run:
        """Where a stored record lies in its commit-log segment: the reactor sends it from there
        with os.sendfile, as a pull's body. A copy in the reply would travel as spill files and
        sit in the reactor's memory for a client that does not read (issue 9: 3.3 GB of spill
        files for 24 such clients asking 40 times each for a 3.9 MB message)."""
        segment_size_bytes = self.ctx.broker.commit_log_segment_size_bytes
        file_offset_bytes = log_offset_bytes % segment_size_bytes
        assert file_offset_bytes + size_bytes <= segment_size_bytes, "records never span segments"
        return Run(log_offset_bytes - file_offset_bytes, file_offset_bytes, size_bytes)

    @handles(RequestCode.VIEW_MESSAGE_BY_ID)
    def _view_message(self, request: Request) -> RemotingCommand | None:
        """VIEW_MESSAGE_BY_ID (33): the record at a commit-log offset, sent from the segment
        (`_record_run`)."""
        header = ViewMessageRequestHeader.from_ext(request.command.ext_fields)
        reader = self.store.for_log()
        if reader is None:
            return self._no_store(request)
        record = reader.read_message(header.log_offset_bytes)
        if record is None:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark=f"no message at commit log offset {header.log_offset_bytes}",
            )
        run = self._record_run(header.log_offset_bytes, len(record))
        self.reply_with_runs(request, request.make_response(ResponseCode.SUCCESS, {}), [run])
        return None

    @handles(RequestCode.QUERY_MESSAGE)
    def _query_message(self, request: Request) -> RemotingCommand | None:
        """QUERY_MESSAGE (12): the records of the topic whose key (KEYS token, or UNIQ_KEY)
        matches, in the time range, from the index; at most QUERY_MESSAGE_COUNT_MAX (32 for a
        UNIQ_KEY query) and QUERY_MESSAGE_BODY_SIZE_BYTES_MAX, sent from their segments."""
        header = QueryMessageRequestHeader.from_ext(request.command.ext_fields)
        error = self._unknown_topic(request, header.topic)
        if error is not None:
            return error
        reader = self.store.for_log()
        if reader is None:
            return self._no_store(request)
        if header.unique_key_query:
            count_max = UNIQUE_KEY_QUERY_COUNT
        else:
            count_max = min(max(header.message_count_max, 1), QUERY_MESSAGE_COUNT_MAX)
        found = reader.query_records_by_key(
            header.topic,
            header.key,
            header.begin_timestamp_ms,
            header.end_timestamp_ms,
            count_max,
        )
        runs: list[Run] = []
        size_bytes = 0
        newest_ms = 0
        newest_log_offset_bytes = 0
        for log_offset_bytes, record in found:
            if runs and size_bytes + len(record) > QUERY_MESSAGE_BODY_SIZE_BYTES_MAX:
                break
            runs.append(self._record_run(log_offset_bytes, len(record)))
            size_bytes += len(record)
            store_ms: int = _STORE_TIMESTAMP.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)[0]
            newest_ms = max(newest_ms, store_ms)
            newest_log_offset_bytes = max(newest_log_offset_bytes, log_offset_bytes)
        if not runs:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                {},
                remark="mqbox: no message of this topic carries the key in the time range",
            )
        # Java answers with the index file's newest entry; mqbox with the newest record found,
        # which is what a client merging answers from several brokers compares.
        ext = QueryMessageResponseHeader(newest_ms, newest_log_offset_bytes).to_ext()
        self.reply_with_runs(request, request.make_response(ResponseCode.SUCCESS, ext), runs)
        return None

    @handles(RequestCode.GET_TOPIC_STATS_INFO)
    def _topic_stats(self, request: Request) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO (202): ext `topic`. Java's TopicStatsTable, one TopicOffset
        {minOffset, maxOffset, lastUpdateTimestamp} per write queue, keyed by MessageQueue
        (fastjson text, protocol/admin_bodies.py); lastUpdateTimestamp is the newest message's
        store time, 0 for an empty queue. 17 with Java's remark for a topic this broker lacks."""
        header = TopicRequestHeader.from_ext(request.command.ext_fields)
        topic = header.topic
        config = self.topics.get(topic) or self.topics.get_fresh(topic)
        if config is None:
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST, {}, remark=f"topic[{_shown(topic)}] not exist"
            )
        broker_name = self.ctx.broker.broker_name
        offsets: dict[MessageQueue, dict[str, int]] = {}
        for queue_id in range(config.write_queue_nums):
            reader = self.store.for_queue(topic, queue_id)
            if reader is None:
                return self._no_store(request)
            offsets[MessageQueue(topic, broker_name, queue_id)] = admin_bodies.topic_offset(
                max(0, reader.min_offset(topic, queue_id)),
                max(0, reader.max_offset(topic, queue_id)),
                self.store.last_store_timestamp_ms(topic, queue_id),
            )
        body = admin_bodies.dumps_fastjson(admin_bodies.topic_stats_table(offsets))
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

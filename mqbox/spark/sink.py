"""The sink: `df.write.format("mqbox")` and `df.writeStream.format("mqbox")`.

Owns: MqboxArrowWriter (batch) and MqboxStreamArrowWriter (streaming), both Arrow writers; the
scope of their UNIQ_KEYs (arrow_encode.RowKeys); PartitionSender, which turns each Arrow batch
of a Spark partition into SEND_BATCH_MESSAGE requests and pipelines them through the
mqbox.client Producer (send_prepared_async, at most maxInFlight at a time); and the Producer of
each Python worker process (one per name server and group, started once, shut down at exit).

Never: commits anything on the driver: every message is acknowledged by the broker before its
task ends, so `commit` only counts, and `abort` has nothing to undo (docs/spark.md section 5:
what a failed task or batch sent is either kept, or dropped on the replay by the broker's
idempotent window).

Scopes (arrow_encode's module docstring says why content and not position): a batch write's
job id, made once on the driver in `writer()` and pickled to every task, so a retried task
names its rows as the first attempt did; a stream's query id and micro-batch id, which Spark
sets as local properties of every task (`sql.streaming.queryId`, `streaming.sql.batchId`) and
which a query restarted from its checkpoint keeps; and in both, the Spark partition id.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from mqbox.client.errors import NoRouteError
from mqbox.client.outgoing import OutgoingMessage, SendResult
from mqbox.client.producer import Producer
from mqbox.message import encode_properties_str
from mqbox.protocol.headers import MessageQueue
from mqbox.spark.arrow_encode import (
    RowKeys,
    SinkColumns,
    choose_queues,
    encode_rows,
    send_groups,
)
from mqbox.spark.options import WriteOptions

log = logging.getLogger("mqbox.spark")

_BATCH_HEADER_PROPERTIES: Final = encode_properties_str({"WAIT": "true"}).decode()
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"

_PRODUCERS_LOCK: Final = threading.Lock()
_PRODUCERS: dict[tuple[str, str, str], Producer] = {}


def worker_producer(options: WriteOptions) -> Producer:
    """This process's Producer for the options' name server and group, started on first use."""
    account = options.credentials.access_key if options.credentials is not None else ""
    key = (options.namesrv_addr, options.producer_group, account)
    with _PRODUCERS_LOCK:
        producer = _PRODUCERS.get(key)
        if producer is None:
            producer = Producer(
                options.producer_group,
                options.namesrv_addr,
                send_timeout_ms=options.send_timeout_ms,
                credentials=options.credentials,
            )
            producer.start()
            _PRODUCERS[key] = producer
        return producer


@atexit.register
def _shutdown_producers() -> None:
    with _PRODUCERS_LOCK:
        for producer in _PRODUCERS.values():
            producer.shutdown()
        _PRODUCERS.clear()


@dataclasses.dataclass(frozen=True)
class SentCount(WriterCommitMessage):
    """What one task sent: rows, and the SEND_BATCH_MESSAGE requests that carried them."""

    rows: int
    requests: int


class PartitionSender:
    """Sends one Spark partition's rows (module docstring); `finish()` waits for every answer."""

    def __init__(self, options: WriteOptions, scope: str, producer: Producer) -> None:
        self.options = options
        self.producer = producer
        self.keys = RowKeys(scope, exactly_once=options.exactly_once)
        self._in_flight: deque[Future[SendResult]] = deque()
        self._queues: dict[str, list[MessageQueue]] = {}
        self.rows = 0
        self.requests = 0

    def _publish_queues(self, topic: str) -> list[MessageQueue]:
        queues = self._queues.get(topic)
        if queues is None:
            producer = self.producer
            info = producer.instance.publish_info(
                topic, producer.create_topic_key, producer.default_topic_queue_nums
            )
            if info is None or not info.ok():
                raise NoRouteError(topic, f"topic {topic} has no writable queue")
            queues = self._queues[topic] = list(info.queues)
        return queues

    def send(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        options = self.options
        columns = SinkColumns.of(batch, options.topic)
        key_high, uniq_keys = self.keys.keys(columns)
        queues = [self._publish_queues(topic) for topic in columns.topics]
        chosen = choose_queues(columns, key_high, [len(listed) for listed in queues])
        for topic_index, queue_index, rows in send_groups(
            columns,
            chosen,
            count_max=options.send_batch_size,
            size_bytes_max=options.send_batch_bytes,
        ):
            queue = queues[topic_index][queue_index]
            message = OutgoingMessage(
                queue.topic,
                encode_rows(columns, uniq_keys, rows),
                sysflag=0,
                flag=0,
                properties=_BATCH_HEADER_PROPERTIES,
                msg_id="",
                batch=True,
                message_count=int(rows.size),
                idempotent=options.exactly_once,
            )
            while len(self._in_flight) >= options.max_in_flight:
                self._in_flight.popleft().result()
            self._in_flight.append(self.producer.send_prepared_async(message, queue))
            self.requests += 1
        self.rows += columns.count

    def finish(self) -> SentCount:
        """Wait for every request; raise the first failure (Spark then retries the task)."""
        while self._in_flight:
            self._in_flight.popleft().result()
        return SentCount(self.rows, self.requests)


def _send_all(options: WriteOptions, scope: str, batches: Iterator[pa.RecordBatch]) -> SentCount:
    sender = PartitionSender(options, scope, worker_producer(options))
    for batch in batches:
        sender.send(batch)
    return sender.finish()


def _partition_id() -> int:
    context = TaskContext.get()
    assert context is not None, "a writer's write() runs in a Spark task"
    return int(context.partitionId())


class MqboxArrowWriter(DataSourceArrowWriter):
    """A batch write: one job id for every task of the job (module docstring)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.job_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentCount:
        scope = f"job:{self.job_id}/partition:{_partition_id()}"
        return _send_all(self.options, scope, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(message.rows for message in messages if isinstance(message, SentCount))
        log.info("mqbox sink: job %s sent %d rows", self.job_id, rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("mqbox sink: job %s failed; what it sent stays", self.job_id)


class MqboxStreamArrowWriter(DataSourceStreamArrowWriter):
    """A micro-batch's writer: UNIQ_KEYs scoped by query, batch and partition."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SentCount:
        context = TaskContext.get()
        assert context is not None, "a writer's write() runs in a Spark task"
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        assert query_id, "Spark sets the query id of a streaming task"
        assert batch_id is not None, "Spark sets the batch id of a streaming task"
        scope = f"query:{query_id}/batch:{batch_id}/partition:{context.partitionId()}"
        return _send_all(self.options, scope, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(message.rows for message in messages if isinstance(message, SentCount))
        log.info("mqbox sink: micro-batch %d sent %d rows", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("mqbox sink: micro-batch %d failed; a replay sends it again", batchId)

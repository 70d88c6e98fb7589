"""The send processor: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and
CONSUMER_SEND_MSG_BACK (36).

Owns: the checks of a send (topic name, topic existence and auto-creation, write permission,
queue id, body and properties sizes, batch rules), the stored records built from it (one
message with message.encode_record; a batch with the `encode_batch_records` kernel, which writes
every element's record with its BODYCRC in one call), the APPEND parcel to the store writer and
the answer once its APPEND_ACK arrives (SendMessageResponseHeader: the offset msgId of every
record, the queue id, the first queue index; every value a string).

Never: writes the commit log (the store writer does, and assigns queue indexes and log offsets),
answers 10/11/12 except for the store writer's real flush timeout, or copies a batch element in
a Python loop (the kernel walks the elements; Python touches the batch as a whole).

Rules from docs/protocol.md section 4.2 (the Java broker's, as far as they go here):
- `batch` is true for code 320 and for "1"/"true" (C++ sends batches as code 10 with "1"); a
  batch with sysFlag bit 0 was compressed as a whole by C++ 1.2.3: it is inflated, split, and
  each element stored as its own message with the compression bits cleared.
- Topic name: validate_topic's rule, else SYSTEM_ERROR (1) with its remark, as Java's
  TopicValidator answers. SCHEDULE_TOPIC_XXXX takes no direct sends (16, as 4.9.x).
- An unknown topic is created from the client's template (TBW102) when autoCreateTopicEnable, a
  `%RETRY%` topic with one queue; otherwise 17 TOPIC_NOT_EXIST (topics.py has the rules).
- No write permission: 16. queueId >= max(read, write queues): 1; a negative queueId: a random
  write queue. Body over maxMessageSize, properties over 32767 bytes, a record over
  maxMessageSize: 13 MESSAGE_ILLEGAL. A batch with a DELAY property, a transaction sysFlag, to a
  `%RETRY%` topic or holding no element: 13 (Java 4.5.2).
- Born host is the connection's peer, store host brokerIP1:port; the IPv6 host bits of sysFlag
  are cleared because mqbox stores 8-byte hosts only.

- Routing by content (delivery.py has the rewrites): a single message to `%RETRY%<group>` whose
  reconsumeTimes reached the limit (the header's maxReconsumeTimes, else the group's
  retryMaxTimes) goes to `%DLQ%<group>` (1 queue, perm 6, created here); then DELAY > 0 stores
  it under SCHEDULE_TOPIC_XXXX, queue level - 1, with REAL_TOPIC and REAL_QID (a level above
  messageDelayLevel's count is cut to the last); a DELAY that is not an integer: 13. The
  answer names the queue the client asked for and the index in the queue it was stored in.

The idempotent window (store/idempotence.py, docs/idempotence.md): a send whose header holds
`mqboxIdempotent` = "true" (case as Java's Boolean.parseBoolean) has its APPEND flagged
APPEND_FLAG_IDEMPOTENT; when the store writer's ack lists duplicates, the answer is built from
its per-record log offsets (the records stored first), names the first record's queue id and
queue index, and adds `mqboxDuplicates`. Other sends pay one dict lookup.

CONSUMER_SEND_MSG_BACK (docs/protocol.md sections 4.3 and 9): the failed record is read by
its commit-log offset from a read-only map of the commit log (bounded by the writer's published
position; a bad offset or a record that does not decode: 1 with "look message by offset
failed"); a record the group has no claim on (not in its `%RETRY%` topic, not of a topic it
subscribes to or committed an offset for: group_topics.py, docs/security.md) is refused with 16
NO_PERMISSION before anything is copied or created; the group's retryQueueNums and
retryMaxTimes come from subscriptionGroup.json, which admin.0 alone writes: this process only
reads it, and an unknown group gets the defaults (1 and 16) when autoCreateSubscriptionGroup is
on (admin.0 creates the group on its first heartbeat), 26 when it is off; a group with
retryQueueNums 0 is answered 0 and nothing is stored (Java). The header's maxReconsumeTimes,
when present, wins over the group's. The new record (delivery.send_back_message, then the
DELAY routing above) goes to the store writer like any send, with WAIT=false, and the answer
(0, no ext) goes out only after its APPEND_ACK; a refused append is answered 1 with the
writer's remark. `%RETRY%<group>` and `%DLQ%<group>` are created here when missing
(topics.json changes, so the services role registers them with the name servers).

A slave (brokerRole=SLAVE) stores nothing a client sends, as Java's store refuses puts on a
slave (docs/replication.md, "Slave service"): 10/310/320 are answered 14 SERVICE_NOT_AVAILABLE
with Java's remark (the disk use of the commit log, consume queue and index directories as
fractions, "%5.2f"); 36 is answered 1 with the remark "SERVICE_NOT_AVAILABLE" (Java's put
status name), after the group checks Java makes first.

Not yet: transaction half messages, the 4.9.x CLUSTER property.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import struct
import time
from pathlib import Path
from typing import Any, Final, NoReturn

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.config import BrokerConfig, BrokerRole, delay_level_durations_ms
from mqbox.errors import AutoCreateLimitError, MessageIllegalError, MqboxError
from mqbox.ipc.ring import Ring
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    BATCH_FLAG_POSITION_BYTES,
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
    BODYCRC_MASK,
    BODYCRC_POSITION_BYTES,
    BORNHOST_POSITION_BYTES,
    BORNTIMESTAMP_POSITION_BYTES,
    FLAG_POSITION_BYTES,
    HOST_SIZE_BYTES,
    MAGICCODE_POSITION_BYTES,
    MESSAGE_MAGIC,
    PHYSICALOFFSET_POSITION_BYTES,
    PREPARED_TRANSACTION_OFFSET_POSITION_BYTES,
    PROPERTIES_SIZE_BYTES_MAX,
    PROPERTY_SEPARATOR,
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECONSUMETIMES_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STOREHOST_POSITION_BYTES,
    STORETIMESTAMP_POSITION_BYTES,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_TYPE_MASK,
    SYSFLAG_HOSTS_V6,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_TRANSACTION_MASK,
    TOTALSIZE_POSITION_BYTES,
    MessageToStore,
    StoredMessage,
    decode_record,
    encode_offset_msg_id,
    encode_record,
    inflate,
    java_utf8_decode,
    java_utf8_encode,
    pack_host,
    terminate_properties,
)
from mqbox.message_kernels import (
    SPLIT_BATCH_BODY_TOO_LARGE,
    SPLIT_BATCH_TOO_MANY,
    copy_bytes,
    crc32,
    read_s16_be,
    read_s32_be,
    split_batch,
    write_i16_be,
    write_i32_be,
    write_i64_be,
)
from mqbox.protocol.codes import PERM_WRITE, RequestCode, ResponseCode
from mqbox.protocol.headers import (
    SEND_DUPLICATES_KEY,
    SEND_IDEMPOTENT_KEY,
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from mqbox.protocol.headers import validate_topic as validate_topic_name
from mqbox.server import parcels, runtime
from mqbox.server.parcels import AppendAck
from mqbox.server.queue_counters import StorePositions, store_positions_name
from mqbox.server.roles.processors import Processor, Request, delivery, handles, run_processor
from mqbox.server.roles.processors.group_configs import SubscriptionGroupsView
from mqbox.server.roles.processors.group_topics import GroupTopics
from mqbox.server.roles.processors.topics import (
    PERM_READ_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TopicConfigStore,
)
from mqbox.server.roles.store_writer import store_config_of
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics import HISTOGRAM_SEND, S_SEND_REFUSED, S_SEND_REQUESTS
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Outbox
from mqbox.store.commit_log import CommitLog
from mqbox.store.config_files import SubscriptionGroupConfig, TopicConfig
from mqbox.store.layout import (
    commit_log_dir,
    consume_queue_root_dir,
    index_dir,
)

_HOST: Final = struct.Struct(">4si")
_PROPERTY_WAIT_FALSE: Final = "\x02WAIT\x01false\x02"
_PROPERTY_DELAY: Final = "\x02DELAY\x01"
_HEX_DIGITS: Final = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_MSG_ID_SEPARATOR: Final = ord(",")
_OK: Final = int(ResponseCode.SUCCESS)
_FLUSH_DISK_TIMEOUT: Final = int(ResponseCode.FLUSH_DISK_TIMEOUT)
# Answers of a stored message that is not yet durable or replicated: the normal send header
# goes with them (RocketMQ's SendMessageProcessor), the client decides what they mean.
_STORED_CODES: Final = frozenset(
    {
        _OK,
        _FLUSH_DISK_TIMEOUT,
        int(ResponseCode.SLAVE_NOT_AVAILABLE),
        int(ResponseCode.FLUSH_SLAVE_TIMEOUT),
    }
)
# Only a single send to a retry topic, or one whose properties hold this, may need routing by
# content (delivery.py); only those pay for parsing their properties.
_DELAY_NAME: Final = "DELAY\x01"


# --- The batch kernel ---------------------------------------------------------------------------


@kernel
def count_unterminated_properties(
    batch: NDArray[np.uint8],
    element_offsets_bytes: NDArray[np.int64],
    element_sizes_bytes: NDArray[np.int32],
    element_count: int,
) -> int:
    """How many elements have properties that are not empty and lack the final 0x02 (each
    record of those is one byte longer than its element says); -1 if one of them already holds
    32767 bytes, so that the byte would put it over the limit. Elements as split_batch found
    them."""
    count = 0
    for element in range(element_count):
        element_at = int(element_offsets_bytes[element])
        end_at = element_at + int(element_sizes_bytes[element])
        body_size = read_s32_be(batch, element_at + BATCH_BODY_LENGTH_POSITION_BYTES)
        properties_size = read_s16_be(batch, element_at + BATCH_BODY_POSITION_BYTES + body_size)
        if properties_size > 0 and batch[end_at - 1] != PROPERTY_SEPARATOR:
            if properties_size >= PROPERTIES_SIZE_BYTES_MAX:
                return -1
            count += 1
    return count


@kernel
def encode_batch_records(
    batch: NDArray[np.uint8],
    element_offsets_bytes: NDArray[np.int64],
    element_sizes_bytes: NDArray[np.int32],
    element_count: int,
    topic: NDArray[np.uint8],
    queue_id: int,
    sysflag: int,
    born_timestamp_ms: int,
    born_host: NDArray[np.uint8],
    reconsume_times: int,
    out_records: NDArray[np.uint8],
    out_sizes_bytes: NDArray[np.int32],
) -> int:
    """Write the stored record of each batch element back to back into out_records; return the
    bytes written. Element i starts at element_offsets_bytes[i] of `batch` and has
    element_sizes_bytes[i] bytes, as split_batch found them (so its lengths are consistent).

    Each record is what message.encode_record makes of MessageToStore(topic, queue_id, element
    body, element properties, element flag, sysflag, born_timestamp_ms, born_host,
    reconsume_times): BODYCRC computed here, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP,
    STOREHOST and the prepared-transaction offset zero (the store writer patches the first
    four). Properties that are not empty and lack the final 0x02 get it (the stored form,
    message.terminate_properties). out_sizes_bytes[i] gets record i's size. out_records must
    hold the sum of element_sizes_bytes[i] + 69 + topic.size (record = 91 + body + topic +
    properties bytes; element = 22 + body + properties bytes), plus
    count_unterminated_properties(...) bytes.
    """
    assert born_host.size == HOST_SIZE_BYTES
    assert element_count <= element_offsets_bytes.size
    topic_size = topic.size
    at = 0
    for element in range(element_count):
        element_at = int(element_offsets_bytes[element])
        element_size = int(element_sizes_bytes[element])
        flag = read_s32_be(batch, element_at + BATCH_FLAG_POSITION_BYTES)
        body_size = read_s32_be(batch, element_at + BATCH_BODY_LENGTH_POSITION_BYTES)
        body_at = element_at + BATCH_BODY_POSITION_BYTES
        properties_size = read_s16_be(batch, body_at + body_size)
        assert element_size == BATCH_ELEMENT_SIZE_BYTES_MIN + body_size + properties_size
        terminate = properties_size > 0 and batch[element_at + element_size - 1] != (
            PROPERTY_SEPARATOR
        )
        stored_properties_size = properties_size + 1 if terminate else properties_size
        assert stored_properties_size <= PROPERTIES_SIZE_BYTES_MAX
        record_size = RECORD_SIZE_BYTES_MIN + body_size + topic_size + stored_properties_size
        assert at + record_size <= out_records.size
        write_i32_be(out_records, at + TOTALSIZE_POSITION_BYTES, record_size)
        write_i32_be(out_records, at + MAGICCODE_POSITION_BYTES, MESSAGE_MAGIC)
        body_crc = crc32(batch, body_at, body_at + body_size) & BODYCRC_MASK
        write_i32_be(out_records, at + BODYCRC_POSITION_BYTES, body_crc)
        write_i32_be(out_records, at + QUEUEID_POSITION_BYTES, queue_id)
        write_i32_be(out_records, at + FLAG_POSITION_BYTES, flag)
        write_i64_be(out_records, at + QUEUEOFFSET_POSITION_BYTES, 0)
        write_i64_be(out_records, at + PHYSICALOFFSET_POSITION_BYTES, 0)
        write_i32_be(out_records, at + SYSFLAG_POSITION_BYTES, sysflag)
        write_i64_be(out_records, at + BORNTIMESTAMP_POSITION_BYTES, born_timestamp_ms)
        for index in range(HOST_SIZE_BYTES):
            out_records[at + BORNHOST_POSITION_BYTES + index] = born_host[index]
        write_i64_be(out_records, at + STORETIMESTAMP_POSITION_BYTES, 0)
        write_i64_be(out_records, at + STOREHOST_POSITION_BYTES, 0)
        write_i32_be(out_records, at + RECONSUMETIMES_POSITION_BYTES, reconsume_times)
        write_i64_be(out_records, at + PREPARED_TRANSACTION_OFFSET_POSITION_BYTES, 0)
        write_i32_be(out_records, at + BODY_LENGTH_POSITION_BYTES, body_size)
        copy_bytes(out_records, at + BODY_POSITION_BYTES, batch, body_at, body_size)
        topic_length_at = at + BODY_POSITION_BYTES + body_size
        out_records[topic_length_at] = topic_size
        copy_bytes(out_records, topic_length_at + 1, topic, 0, topic_size)
        properties_length_at = topic_length_at + 1 + topic_size
        write_i16_be(out_records, properties_length_at, stored_properties_size)
        copy_bytes(
            out_records, properties_length_at + 2, batch, body_at + body_size + 2, properties_size
        )
        if terminate:
            out_records[properties_length_at + 2 + properties_size] = PROPERTY_SEPARATOR
        out_sizes_bytes[element] = record_size
        at += record_size
    return at


def warm_up() -> None:
    """Compile the batch kernels once (the supervisor runs this in the zygote)."""
    element = struct.pack(">iIiii", BATCH_ELEMENT_SIZE_BYTES_MIN + 1, 0, 0, 7, 1) + b"x\0\0"
    batch = np.frombuffer(element, dtype=np.uint8)
    offsets = np.zeros(1, dtype=np.int64)
    sizes = np.zeros(1, dtype=np.int32)
    assert split_batch(batch, 16, offsets, sizes) == 1
    assert count_unterminated_properties(batch, offsets, sizes, 1) == 0
    topic = np.frombuffer(b"T", dtype=np.uint8)
    out = np.zeros(RECORD_SIZE_BYTES_MIN + 2, dtype=np.uint8)
    out_sizes = np.zeros(1, dtype=np.int32)
    host = np.zeros(HOST_SIZE_BYTES, dtype=np.uint8)
    written = encode_batch_records(
        batch, offsets, sizes, 1, topic, 0, 0, 1, host, 0, out, out_sizes
    )
    assert written == out.size
    assert offset_msg_ids(bytes(HOST_SIZE_BYTES), 0, out_sizes) == "0" * 32


@kernel
def write_offset_msg_ids(
    host_hex: NDArray[np.uint8],
    first_log_offset_bytes: int,
    sizes_bytes: NDArray[np.int32],
    count: int,
    out: NDArray[np.uint8],
) -> int:
    """Write the offset msgIds of `count` records laid back to back from first_log_offset_bytes
    (record i is sizes_bytes[i] bytes), joined by ',', into `out` as ASCII; return the length.
    host_hex is the store host's 16 uppercase hex digits; `out` holds 33 * count bytes."""
    assert host_hex.size == 2 * HOST_SIZE_BYTES
    assert out.size >= 33 * count
    log_offset_bytes = first_log_offset_bytes
    at = 0
    for record in range(count):
        if record > 0:
            out[at] = _MSG_ID_SEPARATOR
            at += 1
        for index in range(2 * HOST_SIZE_BYTES):
            out[at + index] = host_hex[index]
        at += 2 * HOST_SIZE_BYTES
        for index in range(16):
            out[at + index] = _HEX_DIGITS[(log_offset_bytes >> (60 - 4 * index)) & 0xF]
        at += 16
        log_offset_bytes += sizes_bytes[record]
    return at


def offset_msg_ids(
    store_host: bytes, first_log_offset_bytes: int, sizes_bytes: NDArray[np.int32]
) -> str:
    """The offset msgIds of records laid back to back from first_log_offset_bytes, joined by
    ',' (message.encode_offset_msg_id for each, without a Python loop per record)."""
    count = sizes_bytes.size
    assert count > 0
    host_hex = np.frombuffer(store_host.hex().upper().encode("ascii"), dtype=np.uint8)
    out = np.empty(33 * count, dtype=np.uint8)
    size = write_offset_msg_ids(host_hex, first_log_offset_bytes, sizes_bytes, count, out)
    return out[:size].tobytes().decode("ascii")


# --- The processor ------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _PendingSend:
    """A send waiting for its APPEND_ACK."""

    request: Request
    queue_id: int
    sizes_bytes: NDArray[np.int32] | None  # a batch's record sizes; None for one message
    record_count: int
    send_back: bool = False  # CONSUMER_SEND_MSG_BACK: answered 0 without ext, or 1
    topic: str = ""  # the stored topic, for the statistics block
    records_size_bytes: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class SendStatistics:
    sends: int
    batches: int
    messages: int
    refused: int
    topics_created: int
    acks: int
    pending: int
    delayed: int  # messages stored under SCHEDULE_TOPIC_XXXX
    dead_letters: int  # messages routed to a %DLQ% topic
    send_backs: int  # CONSUMER_SEND_MSG_BACK requests
    send_backs_refused: int  # of them, for a record of a topic the group does not consume
    duplicates: int  # messages the idempotent window answered instead of storing them again


class _RefusedError(Exception):
    """A send answered with an error: code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def _used_fraction(directory: Path) -> float:
    """Java's UtilAll.getDiskPartitionSpaceUsedPercent: (total - free) / total of the
    partition holding `directory`, or -1 when it cannot be read."""
    try:
        status = os.statvfs(directory)
    except OSError:
        return -1.0
    total = status.f_blocks * status.f_frsize
    if total <= 0:
        return -1.0
    return (total - status.f_bfree * status.f_frsize) / total


class SendProcessor(Processor):
    """Checks sends, builds their records, hands them to the store writer, answers its acks."""

    kind = RoleKind.SEND

    def __init__(self, ctx: RoleContext, **options: Any) -> None:
        super().__init__(ctx, **options)
        broker = ctx.broker
        self.max_message_size_bytes = broker.max_message_size_bytes
        self.is_slave = broker.broker_role is BrokerRole.SLAVE
        self.store_host = pack_host(broker.broker_ip1 or "127.0.0.1", broker.listen_port)
        self.topics = TopicConfigStore(ctx.store_root, broker)
        self.groups = SubscriptionGroupsView(ctx.store_root)
        self.group_topics = GroupTopics(ctx.store_root)
        self.delay_level_count = len(delay_level_durations_ms(broker.message_delay_level))
        # The commit log as a reader sees it, for CONSUMER_SEND_MSG_BACK: mapped on first use.
        self._log: CommitLog | None = None
        self._positions: StorePositions | None = None
        writer_ids = [role.role_id for role in ctx.topology.roles_of(RoleKind.STORE_WRITER)]
        assert len(writer_ids) == 1, "a broker has one store writer"
        self.writer_outbox = Outbox(
            Ring.attach(ctx.topology.ring(self.role_id, writer_ids[0]).name), self.spill_writer
        )
        self.extra_outboxes.append(self.writer_outbox)
        # Request ids carry this process's pid, so a restarted processor never mistakes an ack
        # meant for its predecessor for one of its own.
        self._request_ids = itertools.count(((os.getpid() & 0xFFFFFFFF) << 32) + 1)
        self._pending: dict[int, _PendingSend] = {}
        self._random = random.Random()
        self._topic_bytes: dict[str, tuple[bytes, NDArray[np.uint8]]] = {}
        self._split_offsets = np.zeros(1024, dtype=np.int64)
        self._split_sizes = np.zeros(1024, dtype=np.int32)
        self._record_sizes = np.zeros(1024, dtype=np.int32)
        self._payload = np.zeros(1 << 16, dtype=np.uint8)
        self._payload_size = 0
        self._one_type = np.array([parcels.APPEND], dtype=np.int32)
        self._one_offset = np.zeros(1, dtype=np.int64)
        self._one_size = np.zeros(1, dtype=np.int64)
        self._direct_appends = 0
        self._idempotent = False  # the send being handled asked for the idempotent window
        self._duplicates = 0
        self._sends = 0
        self._batches = 0
        self._messages = 0
        self._refused = 0
        self._topics_created = 0
        self._acks = 0
        self._delayed = 0
        self._dead_letters = 0
        self._send_backs = 0
        self._send_backs_refused = 0
        self.stats = runtime.statistics_writer(ctx)

    # -- requests ---------------------------------------------------------------------------------

    def on_broker_config(self, broker: BrokerConfig) -> None:
        """autoCreateTopicEnable and autoCreateSubscriptionGroup are read from the topic
        store's copy (server/runtime_config.py)."""
        self.topics.broker = broker

    @handles(RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    def _send(self, request: Request) -> None:
        """SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320): check the topic,
        pick the queue, build the records and append them; answered on the store writer's
        APPEND_ACK (module docstring), or now when refused."""
        command = request.command
        header = SendMessageRequestHeader.from_command(command)
        self._sends += 1
        if self.is_slave:
            self._refused += 1
            self.reply(
                request,
                request.make_response(
                    ResponseCode.SERVICE_NOT_AVAILABLE, {}, remark=self._slave_remark()
                ),
            )
            return
        try:
            topic_config = self._check_topic(header)
            queue_id = self._pick_queue(header, topic_config)
            born_host = _HOST.pack(request.peer_ipv4, request.peer_port)
            sysflag = header.sys_flag & ~SYSFLAG_HOSTS_V6
            asked = command.ext_fields_json.get(SEND_IDEMPOTENT_KEY)
            self._idempotent = type(asked) is str and asked.lower() == "true"
            if header.batch:
                self._send_batch(request, header, command.body, queue_id, sysflag, born_host)
            else:
                self._send_one(request, header, command.body, queue_id, sysflag, born_host)
        except _RefusedError as refused:
            self._refused += 1
            self.stats.add(S_SEND_REQUESTS)
            self.stats.add(S_SEND_REFUSED)
            self.reply(request, request.make_response(refused.code, {}, remark=refused.remark))

    def _slave_remark(self) -> str:
        """Java's remark for a put its store refused as SERVICE_NOT_AVAILABLE, with its disk
        figures: used / total of each directory's partition, a fraction (-1 when unknown)."""
        store_root = self.ctx.store_root
        figures = [
            _used_fraction(directory)
            for directory in (
                commit_log_dir(store_root),
                consume_queue_root_dir(store_root),
                index_dir(store_root),
            )
        ]
        usage = "CL: {:5.2f} CQ: {:5.2f} INDEX: {:5.2f}".format(*figures)
        return (
            "service not available now. It may be caused by one of the following reasons: the "
            f"broker's disk is full [{usage}], messages are put to the slave, message store has "
            "been shut down, etc."
        )

    def _check_topic(self, header: SendMessageRequestHeader) -> TopicConfig:
        topic = header.topic
        problem = validate_topic_name(topic)
        if problem is not None:
            raise _RefusedError(ResponseCode.SYSTEM_ERROR, problem)
        if topic == SCHEDULE_TOPIC:
            raise _RefusedError(
                ResponseCode.NO_PERMISSION, f"sending message to topic[{topic}] is forbidden"
            )
        config = self.topics.get(topic)
        if config is None:
            config = self.topics.get_fresh(topic)
        if config is None:
            default_topic = header.default_topic
            if default_topic and validate_topic_name(default_topic) is not None:
                default_topic = ""
            try:
                config = self.topics.auto_create(
                    topic, default_topic, header.default_topic_queue_nums
                )
            except AutoCreateLimitError as error:
                raise _RefusedError(ResponseCode.TOPIC_NOT_EXIST, str(error)) from None
            if config is None:
                raise _RefusedError(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{topic}] not exist, apply first please! (autoCreateTopicEnable="
                    f"{str(self.topics.broker.auto_create_topic_enable).lower()}, "
                    f"template {header.default_topic!r})",
                )
            self._topics_created += 1
        if not config.perm & PERM_WRITE:
            raise _RefusedError(
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] sending message is forbidden (perm {config.perm})",
            )
        return config

    def _pick_queue(self, header: SendMessageRequestHeader, config: TopicConfig) -> int:
        queue_id = header.queue_id
        if queue_id < 0:
            return self._random.randrange(config.write_queue_nums)
        queue_count = max(config.read_queue_nums, config.write_queue_nums)
        if queue_id >= queue_count:
            raise _RefusedError(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal: topic[{header.topic}] has "
                f"{queue_count} queues; producer group {header.producer_group}",
            )
        return queue_id

    def _topic_of(self, topic: str) -> tuple[bytes, NDArray[np.uint8]]:
        found = self._topic_bytes.get(topic)
        if found is None:
            encoded = topic.encode("utf-8")
            found = (encoded, np.frombuffer(encoded, dtype=np.uint8))
            if len(self._topic_bytes) < 65_536:
                self._topic_bytes[topic] = found
        return found

    def _send_one(
        self,
        request: Request,
        header: SendMessageRequestHeader,
        body: bytes,
        queue_id: int,
        sysflag: int,
        born_host: bytes,
    ) -> None:
        if len(body) > self.max_message_size_bytes:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body is {len(body)} bytes, over maxMessageSize "
                f"{self.max_message_size_bytes}",
            )
        properties = terminate_properties(java_utf8_encode(header.properties))  # message.py
        if len(properties) > PROPERTIES_SIZE_BYTES_MAX:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message properties are {len(properties)} bytes, over "
                f"{PROPERTIES_SIZE_BYTES_MAX}",
            )
        message = MessageToStore(
            header.topic,
            queue_id,
            body,
            properties,
            header.flag,
            sysflag,
            header.born_timestamp_ms,
            born_host,
            header.reconsume_times,
        )
        if header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or _DELAY_NAME in header.properties:
            message = self._route_by_content(message, header)
        try:
            record = encode_record(message, body_size_bytes_max=self.max_message_size_bytes)
        except MessageIllegalError as error:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, str(error)) from None
        self._append_one(
            request,
            message.topic,
            message.queue_id,
            record,
            header.properties,
            reply_queue_id=queue_id,
        )
        self._messages += 1

    def _append_one(
        self,
        request: Request,
        topic: str,
        queue_id: int,
        record: bytearray,
        properties: str,
        *,
        reply_queue_id: int | None = None,
        send_back: bool = False,
    ) -> None:
        """Hand one encoded record for (topic, queue_id) to the store writer; the answer names
        reply_queue_id (the queue the client asked for) when given."""
        if len(record) > self.max_message_size_bytes:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the stored message is {len(record)} bytes, over maxMessageSize "
                f"{self.max_message_size_bytes}",
            )
        topic_bytes, _ = self._topic_of(topic)
        payload, sizes_at, records_at = self._append_payload(topic_bytes, 1, len(record))
        payload[sizes_at : sizes_at + 4] = np.frombuffer(struct.pack("<i", len(record)), np.uint8)
        payload[records_at : records_at + len(record)] = np.frombuffer(record, dtype=np.uint8)
        self._append(
            request,
            topic_bytes,
            queue_id,
            properties,
            1,
            len(record),
            None,
            reply_queue_id=reply_queue_id,
            send_back=send_back,
        )

    def _route_by_content(
        self, message: MessageToStore, header: SendMessageRequestHeader
    ) -> MessageToStore:
        """A single message whose topic or properties may redirect it (module docstring): a
        retry topic past its limit to the group's DLQ, then a DELAY level to the schedule
        topic. The slow path: it parses the properties."""
        topic = message.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            group = topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX)
            config = self._group_config(group)
            maximum = header.max_reconsume_times
            if maximum is None:
                maximum = config.retry_max_times
            dead_letter_topic = delivery.dead_letter_topic(topic, header.reconsume_times, maximum)
            if dead_letter_topic is not None:
                self._ensure_dead_letter_topic(dead_letter_topic)
                message = dataclasses.replace(message, topic=dead_letter_topic, queue_id=0)
        return self._route_delayed(message)

    def _route_delayed(self, message: MessageToStore) -> MessageToStore:
        try:
            routed = delivery.route_delayed(message, self.delay_level_count)
        except MessageIllegalError as error:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, str(error)) from None
        if routed.topic == SCHEDULE_TOPIC:
            self._delayed += 1
        return routed

    def _group_config(self, group: str) -> SubscriptionGroupConfig:
        """The group's retry settings: subscriptionGroup.json's, else the defaults when groups
        are created automatically (admin.0 writes the group at its first heartbeat), else 26."""
        config = self.groups.get(group)
        if config is None:
            if not self.topics.broker.auto_create_subscription_group:
                raise _RefusedError(
                    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                    f"subscription group not exist, {group} (autoCreateSubscriptionGroup=false)",
                )
            config = SubscriptionGroupConfig(group)
        return config

    def _ensure_topic(self, topic: str, queue_count: int) -> TopicConfig:
        """`%RETRY%<group>` or `%DLQ%<group>` as topics.json holds it, created (perm 6) if
        absent; SYSTEM_ERROR for a name that is not a legal topic, 16 without write perm."""
        problem = validate_topic_name(topic)
        if problem is not None:
            raise _RefusedError(ResponseCode.SYSTEM_ERROR, problem)
        config = self.topics.get(topic)
        if config is None:
            try:
                config, created = self.topics.create_if_absent(
                    TopicConfig(topic, queue_count, queue_count, PERM_READ_WRITE)
                )
            except AutoCreateLimitError as error:
                raise _RefusedError(ResponseCode.TOPIC_NOT_EXIST, str(error)) from None
            self._topics_created += int(created)
        if not config.perm & PERM_WRITE:
            raise _RefusedError(
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] sending message is forbidden (perm {config.perm})",
            )
        return config

    def _ensure_dead_letter_topic(self, topic: str) -> None:
        # 4.9.x makes the DLQ readable (perm 6; 4.5.2 made it 2), so tools can drain it.
        self._ensure_topic(topic, delivery.DLQ_QUEUE_COUNT)
        self._dead_letters += 1

    # -- CONSUMER_SEND_MSG_BACK -------------------------------------------------------------------

    @handles(RequestCode.CONSUMER_SEND_MSG_BACK)
    def _send_back(self, request: Request) -> None:
        """CONSUMER_SEND_MSG_BACK (36): store the message again for a retry, or in the DLQ past
        the group's limit (delivery.py); answered on the APPEND_ACK, or now when refused."""
        header = ConsumerSendMsgBackRequestHeader.from_ext(request.command.ext_fields)
        self._send_backs += 1
        try:
            self._send_back_checked(request, header)
        except _RefusedError as refused:
            self._refused += 1
            self.reply(request, request.make_response(refused.code, {}, remark=refused.remark))

    def _send_back_checked(
        self, request: Request, header: ConsumerSendMsgBackRequestHeader
    ) -> None:
        group = header.group
        retry_topic = RETRY_GROUP_TOPIC_PREFIX + group
        if not group or validate_topic_name(retry_topic) is not None:
            raise _RefusedError(
                ResponseCode.SYSTEM_ERROR, f"group {group[:300]!r} makes no legal retry topic"
            )
        config = self._group_config(group)
        if config.retry_queue_nums <= 0:
            # Java: a group without retry queues drops what its consumers send back.
            self.reply_fields(request, _OK, {})
            return
        if self.is_slave:
            raise _RefusedError(ResponseCode.SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")
        stored = self._read_stored(header.log_offset_bytes)
        if stored is None:
            raise _RefusedError(
                ResponseCode.SYSTEM_ERROR,
                f"look message by offset failed, {header.log_offset_bytes}",
            )
        self._check_send_back_owner(group, stored)
        retry_config = self._ensure_topic(retry_topic, config.retry_queue_nums)
        maximum = header.max_reconsume_times
        if maximum is None:
            maximum = config.retry_max_times
        queue_count = max(1, min(config.retry_queue_nums, retry_config.write_queue_nums))
        try:
            message = delivery.send_back_message(
                stored,
                group=group,
                delay_level=header.delay_level,
                reconsume_times_max=maximum,
                retry_queue_id=self._random.randrange(queue_count),
                origin_msg_id=encode_offset_msg_id(stored.store_host, stored.log_offset_bytes),
            )
        except MessageIllegalError as error:
            raise _RefusedError(ResponseCode.SYSTEM_ERROR, str(error)) from None
        if message.topic != retry_topic:
            self._ensure_dead_letter_topic(message.topic)
        message = self._route_delayed(message)
        try:
            record = encode_record(message, body_size_bytes_max=self.max_message_size_bytes)
        except MessageIllegalError as error:
            raise _RefusedError(ResponseCode.SYSTEM_ERROR, str(error)) from None
        properties = java_utf8_decode(message.properties)  # WAIT=false
        self._append_one(
            request, message.topic, message.queue_id, record, properties, send_back=True
        )

    def _check_send_back_owner(self, group: str, stored: StoredMessage) -> None:
        """Refuse (16) a record the group has no claim on, before anything is copied: it must
        be in the group's own `%RETRY%` topic, or of a topic (or for a retried record, first
        sent to a topic) the group subscribes to or committed an offset for (group_topics.py).
        The remark names neither the record's topic nor anything else of it."""
        if stored.topic == RETRY_GROUP_TOPIC_PREFIX + group:
            return
        if self.group_topics.consumes_any(group, delivery.send_back_topics(stored)):
            return
        self._send_backs_refused += 1
        raise _RefusedError(
            ResponseCode.NO_PERMISSION,
            f"mqbox: the message at offset {stored.log_offset_bytes} is not of a topic consumer "
            f"group {group} subscribes to or has committed an offset for; not sent back",
        )

    def _read_stored(self, log_offset_bytes: int) -> StoredMessage | None:
        """The record that starts at `log_offset_bytes` below the writer's published position,
        decoded with its CRC checked; None if there is none (an offset from outside)."""
        if self._log is None or self._positions is None:
            try:
                self._positions = StorePositions.attach(store_positions_name(self.ctx.instance))
                config = store_config_of(self.ctx)
                self._log = CommitLog.open(
                    self.ctx.store_root,
                    config.geometry,
                    writable=False,
                    record_size_bytes_max=config.max_message_size_bytes,
                    store_host=config.store_host,
                )
            except (OSError, MqboxError) as error:
                raise _RefusedError(
                    ResponseCode.SYSTEM_ERROR, f"mqbox: the store is not readable: {error}"
                ) from None
        self._log.follow_retention(self._positions.min_log_offset_bytes)  # one stat if none
        record = self._log.read_record(log_offset_bytes, self._positions.write_log_offset_bytes)
        if record is None:
            return None
        try:
            return decode_record(record)
        except MessageIllegalError:
            return None

    def _send_batch(
        self,
        request: Request,
        header: SendMessageRequestHeader,
        body: bytes,
        queue_id: int,
        sysflag: int,
        born_host: bytes,
    ) -> None:
        topic = header.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be sent to a %RETRY% topic"
            )
        if _PROPERTY_DELAY in "\x02" + header.properties:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot carry a DELAY level")
        if sysflag & SYSFLAG_TRANSACTION_MASK:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, "a batch cannot be a transaction")
        size_max = self.max_message_size_bytes
        if sysflag & SYSFLAG_COMPRESSED:
            # C++ 1.2.3 compressed the whole batch; the elements were never compressed alone.
            try:
                plain = inflate(body, size_max)  # MessageTooLargeError is a MessageIllegalError
            except MessageIllegalError as error:
                raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, str(error)) from None
            sysflag &= ~(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_TYPE_MASK)
        else:
            plain = body
        if len(plain) > size_max:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the batch is {len(plain)} bytes, over maxMessageSize {size_max}",
            )
        batch = np.frombuffer(plain, dtype=np.uint8)
        capacity = len(plain) // BATCH_ELEMENT_SIZE_BYTES_MIN + 1
        if self._split_offsets.size < capacity:
            self._split_offsets = np.zeros(capacity, dtype=np.int64)
            self._split_sizes = np.zeros(capacity, dtype=np.int32)
            self._record_sizes = np.zeros(capacity, dtype=np.int32)
        count = split_batch(batch, size_max, self._split_offsets, self._split_sizes)
        assert count != SPLIT_BATCH_TOO_MANY  # the arrays hold every element that fits
        if count == SPLIT_BATCH_BODY_TOO_LARGE:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"a batch element body is over maxMessageSize {size_max}",
            )
        if count < 0:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, "the batch body is malformed")
        if count == 0:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        unterminated_count = count_unterminated_properties(
            batch, self._split_offsets, self._split_sizes, count
        )
        if unterminated_count < 0:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"a batch element's properties are over {PROPERTIES_SIZE_BYTES_MAX - 1} bytes "
                "without their final 0x02",
            )
        topic_bytes, topic_array = self._topic_of(topic)
        records_size = (
            len(plain)
            + count * (RECORD_SIZE_BYTES_MIN - BATCH_ELEMENT_SIZE_BYTES_MIN + len(topic_bytes))
            + unterminated_count
        )
        payload, sizes_at, records_at = self._append_payload(topic_bytes, count, records_size)
        written = encode_batch_records(
            batch,
            self._split_offsets,
            self._split_sizes,
            count,
            topic_array,
            queue_id,
            sysflag,
            header.born_timestamp_ms,
            np.frombuffer(born_host, dtype=np.uint8),
            header.reconsume_times,
            payload[records_at:],
            self._record_sizes,
        )
        assert written == records_size
        sizes = self._record_sizes[:count].copy()
        if int(sizes.max()) > size_max:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"a stored message of the batch is {int(sizes.max())} bytes, over "
                f"maxMessageSize {size_max}",
            )
        payload[sizes_at : sizes_at + 4 * count] = sizes.view(np.uint8)
        self._append(request, topic_bytes, queue_id, header.properties, count, records_size, sizes)
        self._batches += 1
        self._messages += count

    def _append_payload(
        self, topic_bytes: bytes, record_count: int, records_size_bytes: int
    ) -> tuple[NDArray[np.uint8], int, int]:
        """The reused buffer the next APPEND is built in, with its topic written and its sizes
        area zeroed: (buffer, where the sizes go, where the records go). The caller writes the
        records and sizes there; `_append` adds the head and sends it. Building the record in
        place saves a copy of every byte (the Outbox would stage it once more)."""
        sizes_at = parcels.APPEND_HEAD_STRUCT.size + parcels.padded_size_bytes(len(topic_bytes))
        records_at = sizes_at + parcels.padded_size_bytes(4 * record_count)
        size = records_at + records_size_bytes
        if self._payload.size < size:
            self._payload = np.zeros(max(size, 2 * self._payload.size), dtype=np.uint8)
        payload = self._payload
        topic_at = parcels.APPEND_HEAD_STRUCT.size
        payload[topic_at:records_at] = 0
        payload[topic_at : topic_at + len(topic_bytes)] = np.frombuffer(topic_bytes, np.uint8)
        self._payload_size = size
        return payload, sizes_at, records_at

    def _append(
        self,
        request: Request,
        topic_bytes: bytes,
        queue_id: int,
        properties: str,
        record_count: int,
        records_size_bytes: int,
        sizes: NDArray[np.int32] | None,
        *,
        reply_queue_id: int | None = None,
        send_back: bool = False,
    ) -> None:
        """Finish the APPEND built by `_append_payload` and hand it to the store writer: straight
        into its ring when nothing is staged before it and it fits (one copy), else through the
        Outbox, which keeps the order and spills what the ring can never hold. The answer names
        `reply_queue_id` if given, else `queue_id`."""
        request_id = next(self._request_ids)
        flags = 0 if _PROPERTY_WAIT_FALSE in "\x02" + properties else parcels.APPEND_FLAG_WAIT_FLUSH
        if self._idempotent and not send_back:
            flags |= parcels.APPEND_FLAG_IDEMPOTENT
        payload = self._payload
        size = self._payload_size
        head = (request_id, record_count, queue_id, flags, len(topic_bytes), records_size_bytes)
        parcels.APPEND_HEAD_STRUCT.pack_into(payload.data, 0, *head)
        self._pending[request_id] = _PendingSend(
            request,
            queue_id if reply_queue_id is None else reply_queue_id,
            sizes,
            record_count,
            send_back,
            topic_bytes.decode("utf-8", "surrogatepass"),
            records_size_bytes,
        )
        outbox = self.writer_outbox
        ring = outbox.ring
        if outbox.pending_count == 0 and size <= ring.payload_size_bytes_max:
            self._one_size[0] = size
            if ring.try_write_batch_nowait(
                self._one_type, payload, self._one_offset, self._one_size
            ):
                self._direct_appends += 1
                return
        head_size = parcels.APPEND_HEAD_STRUCT.size  # what stays inline if the rest spills
        outbox.append(parcels.APPEND, payload[:head_size].data, payload[head_size:size].data)

    # -- acks -------------------------------------------------------------------------------------

    def on_parcel(self, producer: str, parcel_type: int, payload: memoryview) -> None:
        if parcel_type != parcels.APPEND_ACK:
            super().on_parcel(producer, parcel_type, payload)
            return
        ack = parcels.unpack_append_ack(payload, 0, len(payload))
        pending = self._pending.pop(ack.request_id, None)
        if pending is None:
            return  # meant for this role's previous process
        self._acks += 1
        self.guarded(pending.request, self._answer, pending, ack)
        self._count(pending, ack)

    def _count(self, pending: _PendingSend, ack: AppendAck) -> None:
        """The statistics block: one request, its latency from the processor taking it to the
        answer, and the records stored (per request, never per message)."""
        stats = self.stats
        stats.add(S_SEND_REQUESTS)
        stats.observe_ns(HISTOGRAM_SEND, time.monotonic_ns() - pending.request.received_ns)
        if ack.response_code not in (_OK, _FLUSH_DISK_TIMEOUT):
            stats.add(S_SEND_REFUSED)
            return
        stored_count = pending.record_count - ack.duplicate_count
        if stored_count > 0:
            stats.count_put(pending.topic, stored_count, pending.records_size_bytes)

    def _answer(self, pending: _PendingSend, ack: AppendAck) -> None:
        request = pending.request
        if pending.send_back:
            # Java answers a send-back 0 without ext; a store that refused it, SYSTEM_ERROR.
            if ack.response_code in _STORED_CODES:
                self.reply_fields(request, _OK, {})
            else:
                self._refused += 1
                self.reply_fields(
                    request, int(ResponseCode.SYSTEM_ERROR), {}, remark=ack.remark or None
                )
            return
        if ack.response_code not in _STORED_CODES:
            self._refused += 1
            self.reply(request, request.make_response(ack.response_code, {}, remark=ack.remark))
            return
        assert ack.record_count == pending.record_count
        sizes = pending.sizes_bytes
        if ack.duplicate_count:
            # Not contiguous any more: a duplicate names the record stored first.
            self._duplicates += ack.duplicate_count
            msg_ids = ",".join(
                encode_offset_msg_id(self.store_host, log_offset)
                for log_offset in ack.log_offsets_bytes
            )
            ext = SendMessageResponseHeader(msg_ids, ack.queue_id, ack.queue_index).to_ext()
            ext[SEND_DUPLICATES_KEY] = str(ack.duplicate_count)
            remark = ack.remark if ack.response_code != _OK else None
            self.reply_fields(request, ack.response_code, ext, remark=remark)
            return
        if sizes is None:
            msg_ids = encode_offset_msg_id(self.store_host, ack.log_offset_bytes)
        else:
            msg_ids = offset_msg_ids(self.store_host, ack.log_offset_bytes, sizes)
        ext = SendMessageResponseHeader(msg_ids, pending.queue_id, ack.queue_index).to_ext()
        remark = ack.remark if ack.response_code != _OK else None
        self.reply_fields(request, ack.response_code, ext, remark=remark)

    def awaiting_answers(self) -> bool:
        """Appends are at the store writer: its WRITTEN comes back on a ring."""
        return bool(self._pending)

    def statistics_send(self) -> SendStatistics:
        return SendStatistics(
            sends=self._sends,
            batches=self._batches,
            messages=self._messages,
            refused=self._refused,
            topics_created=self._topics_created,
            acks=self._acks,
            pending=len(self._pending),
            delayed=self._delayed,
            dead_letters=self._dead_letters,
            send_backs=self._send_backs,
            send_backs_refused=self._send_backs_refused,
            duplicates=self._duplicates,
        )


def main(ctx: RoleContext) -> NoReturn:
    """The send processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, SendProcessor)

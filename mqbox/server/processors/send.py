"""The send processor: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Owns: the checks of a send (topic name, topic existence and auto-creation, write permission,
queue id, body and properties sizes, batch rules), the stored records built from it (one
message with message.encode_record; a batch with the `encode_batch_records` kernel, which writes
every element's record with its BODYCRC in one call), the APPEND record to the store writer and
the answer once its APPEND_ACK arrives (SendMessageResponseHeader: the offset msgId of every
record, the queue id, the first queue index; every value a string).

Never: writes the commit log (the store writer does, and assigns queue indexes and log offsets),
answers 10/11/12 except for the store writer's real flush timeout, or copies a batch element in
a Python loop (the kernel walks the elements; Python touches the batch as a whole).

Rules from remoting-protocol.md section 4.2 (the Java broker's, as far as they go here):
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

Not yet (the next issue): DELAY routing to SCHEDULE_TOPIC_XXXX, `%RETRY%` messages past
maxReconsumeTimes to `%DLQ%`, transaction half messages, the 4.9.x CLUSTER property; a message
with a DELAY property is stored on its own topic at once for now.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import struct
from typing import Any, Final, NoReturn

import numpy as np
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.errors import MessageIllegalError
from mqbox.ipc.ring import Ring
from mqbox.message import (
    BATCH_BODY_LENGTH_POSITION_BYTES,
    BATCH_BODY_POSITION_BYTES,
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    BATCH_FLAG_POSITION_BYTES,
    BODY_LENGTH_POSITION_BYTES,
    BODY_POSITION_BYTES,
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
    QUEUEID_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    RECONSUMETIMES_POSITION_BYTES,
    RECORD_SIZE_BYTES_MIN,
    STOREHOST_POSITION_BYTES,
    STORETIMESTAMP_POSITION_BYTES,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_TYPE_MASK,
    SYSFLAG_POSITION_BYTES,
    SYSFLAG_TRANSACTION_MASK,
    TOTALSIZE_POSITION_BYTES,
    MessageToStore,
    encode_offset_msg_id,
    encode_record,
    inflate,
    pack_host,
)
from mqbox.message_kernels import (
    SPLIT_BATCH_BODY_TOO_LARGE,
    SPLIT_BATCH_TOO_MANY,
    read_s16_be,
    read_s32_be,
    split_batch,
)
from mqbox.protocol.codes import PERM_WRITE, RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from mqbox.protocol.headers import validate_topic as validate_topic_name
from mqbox.server import records
from mqbox.server.processors import Processor, Request, run_processor
from mqbox.server.records import AppendAck, Outbox
from mqbox.server.topics import RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC, TopicConfigStore
from mqbox.server.topology import RoleContext, RoleKind
from mqbox.store.config_files import TopicConfig
from mqbox.store.kernels import crc32

SEND_CODES: Final = frozenset(
    {
        int(RequestCode.SEND_MESSAGE),
        int(RequestCode.SEND_MESSAGE_V2),
        int(RequestCode.SEND_BATCH_MESSAGE),
    }
)
SYSFLAG_HOSTS_V6: Final = 0x10 | 0x20  # BORNHOST_V6 | STOREHOSTADDRESS_V6: never stored
_BODYCRC_MASK: Final = 0x7FFFFFFF
_HOST: Final = struct.Struct(">4si")
_PROPERTY_WAIT_FALSE: Final = "\x02WAIT\x01false\x02"
_PROPERTY_DELAY: Final = "\x02DELAY\x01"
_HEX_DIGITS: Final = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_MSG_ID_SEPARATOR: Final = ord(",")
_OK: Final = int(ResponseCode.SUCCESS)
_FLUSH_DISK_TIMEOUT: Final = int(ResponseCode.FLUSH_DISK_TIMEOUT)


# --- The batch kernel ---------------------------------------------------------------------------


@kernel
def _write_u32_be(buf: NDArray[np.uint8], at: int, value: int) -> None:
    buf[at] = (value >> 24) & 0xFF
    buf[at + 1] = (value >> 16) & 0xFF
    buf[at + 2] = (value >> 8) & 0xFF
    buf[at + 3] = value & 0xFF


@kernel
def _write_s64_be(buf: NDArray[np.uint8], at: int, value: int) -> None:
    _write_u32_be(buf, at, (value >> 32) & 0xFFFFFFFF)
    _write_u32_be(buf, at + 4, value & 0xFFFFFFFF)


@kernel
def _copy(
    target: NDArray[np.uint8], target_at: int, source: NDArray[np.uint8], at: int, size: int
) -> None:
    """target[target_at:+size] = source[at:+size], as two local slices so LLVM vectorizes it."""
    target_slice = target[target_at : target_at + size]
    source_slice = source[at : at + size]
    for index in range(size):
        target_slice[index] = source_slice[index]


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
    four). out_sizes_bytes[i] gets record i's size. out_records must hold the sum of
    element_sizes_bytes[i] + 69 + topic.size (record = 91 + body + topic + properties bytes;
    element = 22 + body + properties bytes).
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
        record_size = RECORD_SIZE_BYTES_MIN + body_size + topic_size + properties_size
        assert at + record_size <= out_records.size
        _write_u32_be(out_records, at + TOTALSIZE_POSITION_BYTES, record_size)
        _write_u32_be(out_records, at + MAGICCODE_POSITION_BYTES, MESSAGE_MAGIC)
        body_crc = crc32(batch, body_at, body_at + body_size) & _BODYCRC_MASK
        _write_u32_be(out_records, at + BODYCRC_POSITION_BYTES, body_crc)
        _write_u32_be(out_records, at + QUEUEID_POSITION_BYTES, queue_id & 0xFFFFFFFF)
        _write_u32_be(out_records, at + FLAG_POSITION_BYTES, flag & 0xFFFFFFFF)
        _write_s64_be(out_records, at + QUEUEOFFSET_POSITION_BYTES, 0)
        _write_s64_be(out_records, at + PHYSICALOFFSET_POSITION_BYTES, 0)
        _write_u32_be(out_records, at + SYSFLAG_POSITION_BYTES, sysflag & 0xFFFFFFFF)
        _write_s64_be(out_records, at + BORNTIMESTAMP_POSITION_BYTES, born_timestamp_ms)
        for index in range(HOST_SIZE_BYTES):
            out_records[at + BORNHOST_POSITION_BYTES + index] = born_host[index]
        _write_s64_be(out_records, at + STORETIMESTAMP_POSITION_BYTES, 0)
        _write_s64_be(out_records, at + STOREHOST_POSITION_BYTES, 0)
        _write_u32_be(out_records, at + RECONSUMETIMES_POSITION_BYTES, reconsume_times & 0xFFFFFFFF)
        _write_s64_be(out_records, at + PREPARED_TRANSACTION_OFFSET_POSITION_BYTES, 0)
        _write_u32_be(out_records, at + BODY_LENGTH_POSITION_BYTES, body_size)
        _copy(out_records, at + BODY_POSITION_BYTES, batch, body_at, body_size)
        topic_length_at = at + BODY_POSITION_BYTES + body_size
        out_records[topic_length_at] = topic_size
        _copy(out_records, topic_length_at + 1, topic, 0, topic_size)
        properties_length_at = topic_length_at + 1 + topic_size
        out_records[properties_length_at] = (properties_size >> 8) & 0xFF
        out_records[properties_length_at + 1] = properties_size & 0xFF
        _copy(
            out_records, properties_length_at + 2, batch, body_at + body_size + 2, properties_size
        )
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


@dataclasses.dataclass(frozen=True, slots=True)
class SendStatistics:
    sends: int
    batches: int
    messages: int
    refused: int
    topics_created: int
    acks: int
    pending: int


class _RefusedError(Exception):
    """A send answered with an error: code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class SendProcessor(Processor):
    """Checks sends, builds their records, hands them to the store writer, answers its acks."""

    kind = RoleKind.SEND

    def __init__(self, ctx: RoleContext, **options: Any) -> None:
        super().__init__(ctx, **options)
        broker = ctx.broker
        self.max_message_size_bytes = broker.max_message_size_bytes
        self.store_host = pack_host(broker.broker_ip1 or "127.0.0.1", broker.listen_port)
        self.topics = TopicConfigStore(ctx.store_root, broker)
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
        self._one_type = np.array([records.APPEND], dtype=np.int32)
        self._one_offset = np.zeros(1, dtype=np.int64)
        self._one_size = np.zeros(1, dtype=np.int64)
        self._direct_appends = 0
        self._sends = 0
        self._batches = 0
        self._messages = 0
        self._refused = 0
        self._topics_created = 0
        self._acks = 0

    # -- requests ---------------------------------------------------------------------------------

    def handle(self, request: Request) -> None:
        if request.code not in SEND_CODES:
            super().handle(request)
            return
        command = request.command
        header = SendMessageRequestHeader.from_command(command)
        self._sends += 1
        try:
            topic_config = self._check_topic(header)
            queue_id = self._pick_queue(header, topic_config)
            born_host = _HOST.pack(request.peer_ipv4, request.peer_port)
            sysflag = header.sys_flag & ~SYSFLAG_HOSTS_V6
            if header.batch:
                self._send_batch(request, header, command.body, queue_id, sysflag, born_host)
            else:
                self._send_one(request, header, command.body, queue_id, sysflag, born_host)
        except _RefusedError as refused:
            self._refused += 1
            self.reply(request, request.make_response(refused.code, {}, remark=refused.remark))

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
            config = self.topics.auto_create(topic, default_topic, header.default_topic_queue_nums)
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
        properties = header.properties.encode("utf-8", "surrogateescape")
        if len(properties) > PROPERTIES_SIZE_BYTES_MAX:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message properties are {len(properties)} bytes, over "
                f"{PROPERTIES_SIZE_BYTES_MAX}",
            )
        try:
            record = encode_record(
                MessageToStore(
                    header.topic,
                    queue_id,
                    body,
                    properties,
                    header.flag,
                    sysflag,
                    header.born_timestamp_ms,
                    born_host,
                    header.reconsume_times,
                ),
                body_size_bytes_max=self.max_message_size_bytes,
            )
        except MessageIllegalError as error:
            raise _RefusedError(ResponseCode.MESSAGE_ILLEGAL, str(error)) from None
        if len(record) > self.max_message_size_bytes:
            raise _RefusedError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the stored message is {len(record)} bytes, over maxMessageSize "
                f"{self.max_message_size_bytes}",
            )
        topic_bytes, _ = self._topic_of(header.topic)
        payload, sizes_at, records_at = self._append_payload(topic_bytes, 1, len(record))
        payload[sizes_at : sizes_at + 4] = np.frombuffer(struct.pack("<i", len(record)), np.uint8)
        payload[records_at : records_at + len(record)] = np.frombuffer(record, dtype=np.uint8)
        self._append(request, topic_bytes, queue_id, header.properties, 1, len(record), None)
        self._messages += 1

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
        topic_bytes, topic_array = self._topic_of(topic)
        records_size = len(plain) + count * (
            RECORD_SIZE_BYTES_MIN - BATCH_ELEMENT_SIZE_BYTES_MIN + len(topic_bytes)
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
        sizes_at = records.APPEND_HEAD_STRUCT.size + records.padded_size_bytes(len(topic_bytes))
        records_at = sizes_at + records.padded_size_bytes(4 * record_count)
        size = records_at + records_size_bytes
        if self._payload.size < size:
            self._payload = np.zeros(max(size, 2 * self._payload.size), dtype=np.uint8)
        payload = self._payload
        topic_at = records.APPEND_HEAD_STRUCT.size
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
    ) -> None:
        """Finish the APPEND built by `_append_payload` and hand it to the store writer: straight
        into its ring when nothing is staged before it and it fits (one copy), else through the
        Outbox, which keeps the order and spills what the ring can never hold."""
        request_id = next(self._request_ids)
        flags = 0 if _PROPERTY_WAIT_FALSE in "\x02" + properties else records.APPEND_FLAG_WAIT_FLUSH
        payload = self._payload
        size = self._payload_size
        head = (request_id, record_count, queue_id, flags, len(topic_bytes), records_size_bytes)
        records.APPEND_HEAD_STRUCT.pack_into(payload.data, 0, *head)
        self._pending[request_id] = _PendingSend(request, queue_id, sizes, record_count)
        outbox = self.writer_outbox
        ring = outbox.ring
        if outbox.pending_count == 0 and size <= ring.payload_size_bytes_max:
            self._one_size[0] = size
            if ring.try_write_batch_nowait(
                self._one_type, payload, self._one_offset, self._one_size
            ):
                self._direct_appends += 1
                return
        head_size = records.APPEND_HEAD_STRUCT.size  # what stays inline if the rest spills
        outbox.append(records.APPEND, payload[:head_size].data, payload[head_size:size].data)

    # -- acks -------------------------------------------------------------------------------------

    def on_record(self, producer: str, record_type: int, payload: memoryview) -> None:
        if record_type != records.APPEND_ACK:
            super().on_record(producer, record_type, payload)
            return
        ack = records.unpack_append_ack(payload, 0, len(payload))
        pending = self._pending.pop(ack.request_id, None)
        if pending is None:
            return  # meant for this role's previous process
        self._acks += 1
        self._answer(pending, ack)

    def _answer(self, pending: _PendingSend, ack: AppendAck) -> None:
        request = pending.request
        if ack.response_code not in (_OK, _FLUSH_DISK_TIMEOUT):
            self._refused += 1
            self.reply(request, request.make_response(ack.response_code, {}, remark=ack.remark))
            return
        assert ack.record_count == pending.record_count
        sizes = pending.sizes_bytes
        if sizes is None:
            msg_ids = encode_offset_msg_id(self.store_host, ack.log_offset_bytes)
        else:
            msg_ids = offset_msg_ids(self.store_host, ack.log_offset_bytes, sizes)
        ext = SendMessageResponseHeader(msg_ids, pending.queue_id, ack.queue_index).to_ext()
        remark = ack.remark if ack.response_code != _OK else None
        self.reply_fields(request, ack.response_code, ext, remark=remark)

    def statistics_send(self) -> SendStatistics:
        return SendStatistics(
            sends=self._sends,
            batches=self._batches,
            messages=self._messages,
            refused=self._refused,
            topics_created=self._topics_created,
            acks=self._acks,
            pending=len(self._pending),
        )


def main(ctx: RoleContext) -> NoReturn:
    """The send processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, SendProcessor)

"""A PULL response body as messages: one kernel call, then lazy Python objects.

Owns: decode_pull_body (one call of pull_kernels.decode_pull_records over the whole body), the
PulledBatch it returns (the body, the kernel's table, and why decoding stopped), the
PulledMessage views over it, and the client-side tag check over a batch (subscription.py rule 2,
Java's PullAPIWrapper.processPullResult step 3).

Never: sockets, clocks, or a Python loop of struct calls per message. A message costs nothing
until it is looked at; each field is read from the table when asked for; the properties string is
parsed (message.decode_properties_str) and the body inflated (message.decompress_body, bounded by
`body_size_bytes_max`) on first access and then kept.

Damage: the kernel stops at the first record that is not whole and self-consistent. Java's and
C++'s clients then deliver the records before it and move on to nextBeginOffset, silently losing
the rest. Here the batch says so (`complete`, `stop_reason`, `stop_position_bytes`), and
`raise_for_damage()` turns it into PullBodyError, so the consumer can decide (pull again from the
first index it did not get, rather than skip).

Message ids: `msg_id` is UNIQ_KEY when present, else the offset msgId (MessageClientExt.getMsgId);
`offset_msg_id` is the store host's address and port and the commit-log offset in uppercase hex
(16 bytes for an IPv4 store host, 28 for IPv6), as Java's MessageDecoder builds it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from typing import Final, overload

import numpy as np
from numpy.typing import NDArray

from mqbox.client.pull_kernels import (
    COLUMN_BODY_POSITION_BYTES,
    COLUMN_BODY_SIZE_BYTES,
    COLUMN_BORN_TIMESTAMP_MS,
    COLUMN_COUNT,
    COLUMN_FLAG,
    COLUMN_LOG_OFFSET_BYTES,
    COLUMN_PROPERTIES_POSITION_BYTES,
    COLUMN_PROPERTIES_SIZE_BYTES,
    COLUMN_QUEUE_ID,
    COLUMN_QUEUE_INDEX,
    COLUMN_RECONSUME_TIMES,
    COLUMN_RECORD_POSITION_BYTES,
    COLUMN_RECORD_SIZE_BYTES,
    COLUMN_STORE_HOST_POSITION_BYTES,
    COLUMN_STORE_TIMESTAMP_MS,
    COLUMN_SYSFLAG,
    COLUMN_TAGS_POSITION_BYTES,
    COLUMN_TAGS_SIZE_BYTES,
    COLUMN_TOPIC_POSITION_BYTES,
    COLUMN_TOPIC_SIZE_BYTES,
    DECODE_STOP_END,
    DECODE_STOP_FULL,
    DECODE_STOP_INVALID,
    DECODE_STOP_TRUNCATED,
    decode_pull_records,
)
from mqbox.client.subscription import Subscription
from mqbox.errors import MqboxError
from mqbox.message import (
    BODY_SIZE_BYTES_MAX_DEFAULT,
    BORNHOST_POSITION_BYTES,
    PROPERTY_KEYS,
    PROPERTY_KEYS_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    RECORD_SIZE_BYTES_MIN,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    decode_properties_str,
    decompress_body,
    java_utf8_decode,
)

STOP_REASON_NAMES: Final = {
    DECODE_STOP_END: "end",
    DECODE_STOP_FULL: "full",
    DECODE_STOP_TRUNCATED: "truncated",
    DECODE_STOP_INVALID: "invalid",
}


class PullBodyError(MqboxError):
    """A PULL body holds a record that is torn or inconsistent; `position_bytes` is where."""

    def __init__(self, message: str, position_bytes: int) -> None:
        super().__init__(message)
        self.position_bytes = position_bytes


def decode_pull_body(
    body: bytes,
    *,
    broker_name: str = "",
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
) -> PulledBatch:
    """Decode every record of `body` with one kernel call; see PulledBatch for the result.

    `broker_name` is the broker the pull went to (Java sets it on every message).
    `body_size_bytes_max` bounds each message body, inflated or not, when it is read.
    """
    assert body_size_bytes_max >= 0
    buffer = np.frombuffer(body, dtype=np.uint8)
    # Every record has at least RECORD_SIZE_BYTES_MIN bytes, so the table never fills.
    table = np.empty((COLUMN_COUNT, len(body) // RECORD_SIZE_BYTES_MIN + 1), dtype=np.int64)
    count, stop_position_bytes, stop_reason = decode_pull_records(buffer, 0, len(body), table)
    assert stop_reason != DECODE_STOP_FULL
    return PulledBatch(
        body, table[:, :count], stop_reason, stop_position_bytes, broker_name, body_size_bytes_max
    )


class PulledBatch(Sequence["PulledMessage"]):
    """The decoded records of one PULL body, in order; `batch[i]` is a PulledMessage view."""

    __slots__ = (
        "_topics",
        "body",
        "body_size_bytes_max",
        "broker_name",
        "columns",
        "stop_position_bytes",
        "stop_reason",
        "table",
    )

    def __init__(
        self,
        body: bytes,
        table: NDArray[np.int64],
        stop_reason: int,
        stop_position_bytes: int,
        broker_name: str,
        body_size_bytes_max: int,
    ) -> None:
        assert table.shape[0] == COLUMN_COUNT
        self.body = body
        self.table = table  # int64, (COLUMN_COUNT, len(self)): pull_kernels.COLUMN_* rows
        self.stop_reason = stop_reason
        self.stop_position_bytes = stop_position_bytes
        self.broker_name = broker_name
        self.body_size_bytes_max = body_size_bytes_max
        # column c as Python ints once column(c) made it; PulledMessage reads it directly
        self.columns: list[list[int] | None] = [None] * COLUMN_COUNT
        self._topics: dict[bytes, str] = {}

    @property
    def complete(self) -> bool:
        """True when every byte of the body was a whole, consistent record."""
        return self.stop_reason == DECODE_STOP_END

    def raise_for_damage(self) -> None:
        """Raise PullBodyError unless the batch is complete."""
        if not self.complete:
            reason = STOP_REASON_NAMES[self.stop_reason]
            raise PullBodyError(
                f"pull body record at byte {self.stop_position_bytes} is {reason} "
                f"({len(self)} records before it)",
                self.stop_position_bytes,
            )

    def column(self, column: int) -> list[int]:
        """One field of every record as Python ints (pull_kernels.COLUMN_*), made once."""
        values = self.columns[column]
        if values is None:
            values = self.columns[column] = self.table[column].tolist()
        return values

    def queue_indexes(self) -> NDArray[np.int64]:
        """Every record's queue index (QUEUEOFFSET), as an array view of the table."""
        queue_indexes: NDArray[np.int64] = self.table[COLUMN_QUEUE_INDEX]
        return queue_indexes

    def __len__(self) -> int:
        return int(self.table.shape[1])

    @overload
    def __getitem__(self, index: int) -> PulledMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[PulledMessage]: ...

    def __getitem__(self, index: int | slice) -> PulledMessage | list[PulledMessage]:
        if isinstance(index, slice):
            return [PulledMessage(self, at) for at in range(len(self))[index]]
        count = len(self)
        if not -count <= index < count:
            raise IndexError(index)
        return PulledMessage(self, index % count)

    def __iter__(self) -> Iterator[PulledMessage]:
        return (PulledMessage(self, at) for at in range(len(self)))

    def accepted_positions(self, subscription: Subscription) -> list[int] | None:
        """The positions of the messages that pass the client's exact tag check (subscription.py
        rule 2), in order; None when the subscription takes every message. No object is made
        per message."""
        if not subscription.filters_tags:
            return None
        body = self.body
        accepts_utf8 = subscription.accepts_utf8
        return [
            at
            for at, (tags_at, tags_size) in enumerate(
                zip(
                    self.column(COLUMN_TAGS_POSITION_BYTES),
                    self.column(COLUMN_TAGS_SIZE_BYTES),
                    strict=True,
                )
            )
            if tags_at >= 0 and accepts_utf8(body[tags_at : tags_at + tags_size])
        ]

    def accepted(self, subscription: Subscription) -> list[PulledMessage]:
        """The messages that pass the client's exact tag check (subscription.py rule 2)."""
        positions = self.accepted_positions(subscription)
        if positions is None:
            return list(self)
        return [PulledMessage(self, at) for at in positions]

    def topic_at(self, index: int) -> str:
        """The topic of record `index`, decoded as Java decodes it (once per distinct topic)."""
        start = self.column(COLUMN_TOPIC_POSITION_BYTES)[index]
        raw = self.body[start : start + self.column(COLUMN_TOPIC_SIZE_BYTES)[index]]
        topic = self._topics.get(raw)
        if topic is None:
            topic = self._topics[raw] = _decode_text(raw)
        return topic


def _decode_text(raw: bytes) -> str:
    """UTF-8 as Java's `new String(bytes, UTF_8)` reads it; the fast path for valid input."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return java_utf8_decode(raw)


def _host(body: bytes, position_bytes: int, is_v6: bool) -> tuple[str, int]:
    """(address, port) of a stored host: 4 or 16 address bytes, then an int32 port."""
    address_size_bytes = 16 if is_v6 else 4
    address = body[position_bytes : position_bytes + address_size_bytes]
    port = int.from_bytes(
        body[position_bytes + address_size_bytes : position_bytes + address_size_bytes + 4],
        "big",
        signed=True,
    )
    text = str(ipaddress.IPv6Address(address) if is_v6 else ipaddress.IPv4Address(address))
    return text, port


class PulledMessage:
    """One pulled message, read from its batch's body and table when a field is asked for.

    Raises, on access only: `body` MessageTooLargeError or MessageIllegalError (from
    message.decompress_body) for a body over the batch's bound or a bad compressed stream;
    `properties` MessageIllegalError for a properties string over 32767 bytes (never, for a
    record the kernel accepted).
    """

    __slots__ = ("_body", "_index", "_properties", "batch")

    def __init__(self, batch: PulledBatch, index: int) -> None:
        self.batch = batch
        self._index = index
        self._body: bytes | None = None
        self._properties: dict[str, str] | None = None

    def _field(self, column: int) -> int:
        values = self.batch.columns[column]
        if values is None:
            values = self.batch.column(column)
        return values[self._index]

    def _span(self, position_column: int, size_column: int) -> bytes:
        start = self._field(position_column)
        return self.batch.body[start : start + self._field(size_column)]

    # The hot fields (queue index, body size, body) read the batch's column lists inline: a
    # consumer reads them for every message, and each saved call is a tenth of the decode cost.

    @property
    def queue_index(self) -> int:
        """The consume-queue index (QUEUEOFFSET): what offsets are committed from."""
        values = self.batch.columns[COLUMN_QUEUE_INDEX]
        if values is None:
            values = self.batch.column(COLUMN_QUEUE_INDEX)
        return values[self._index]

    @property
    def queue_id(self) -> int:
        return self._field(COLUMN_QUEUE_ID)

    @property
    def log_offset_bytes(self) -> int:
        """The record's commit-log position (PHYSICALOFFSET)."""
        return self._field(COLUMN_LOG_OFFSET_BYTES)

    @property
    def size_bytes(self) -> int:
        """The stored record's TOTALSIZE."""
        return self._field(COLUMN_RECORD_SIZE_BYTES)

    @property
    def flag(self) -> int:
        return self._field(COLUMN_FLAG)

    @property
    def sysflag(self) -> int:
        """As stored; the compression bits say whether `stored_body` is a zlib stream."""
        return self._field(COLUMN_SYSFLAG)

    @property
    def born_timestamp_ms(self) -> int:
        return self._field(COLUMN_BORN_TIMESTAMP_MS)

    @property
    def store_timestamp_ms(self) -> int:
        return self._field(COLUMN_STORE_TIMESTAMP_MS)

    @property
    def reconsume_times(self) -> int:
        return self._field(COLUMN_RECONSUME_TIMES)

    @property
    def body_size_bytes(self) -> int:
        """The stored body's size (compressed when sysflag says so): what flow control counts."""
        values = self.batch.columns[COLUMN_BODY_SIZE_BYTES]
        if values is None:
            values = self.batch.column(COLUMN_BODY_SIZE_BYTES)
        return values[self._index]

    @property
    def stored_body(self) -> bytes:
        """The body as stored: a zlib stream when sysflag has SYSFLAG_COMPRESSED."""
        return self._span(COLUMN_BODY_POSITION_BYTES, COLUMN_BODY_SIZE_BYTES)

    @property
    def body(self) -> bytes:
        """The body, inflated when it was stored compressed (once; then kept)."""
        body = self._body
        if body is None:
            batch = self.batch
            columns = batch.columns
            index = self._index
            start = (
                columns[COLUMN_BODY_POSITION_BYTES] or batch.column(COLUMN_BODY_POSITION_BYTES)
            )[index]
            size_bytes = (columns[COLUMN_BODY_SIZE_BYTES] or batch.column(COLUMN_BODY_SIZE_BYTES))[
                index
            ]
            sysflag = (columns[COLUMN_SYSFLAG] or batch.column(COLUMN_SYSFLAG))[index]
            body = batch.body[start : start + size_bytes]
            if sysflag & SYSFLAG_COMPRESSED or size_bytes > batch.body_size_bytes_max:
                body, _sysflag = decompress_body(
                    body, sysflag, size_bytes_max=batch.body_size_bytes_max
                )
            self._body = body
        return body

    @property
    def topic(self) -> str:
        return self.batch.topic_at(self._index)

    @property
    def broker_name(self) -> str:
        return self.batch.broker_name

    @property
    def properties(self) -> dict[str, str]:
        """Every property, parsed on first access (message.decode_properties_str)."""
        if self._properties is None:
            self._properties = decode_properties_str(
                self._span(COLUMN_PROPERTIES_POSITION_BYTES, COLUMN_PROPERTIES_SIZE_BYTES)
            )
        return self._properties

    @property
    def tags(self) -> str | None:
        """The TAGS property, None when absent."""
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        """The KEYS property split on spaces, [] when absent."""
        keys = self.properties.get(PROPERTY_KEYS)
        return [key for key in keys.split(PROPERTY_KEYS_SEPARATOR) if key] if keys else []

    @property
    def born_host(self) -> tuple[str, int]:
        """(address, port) of the producer as the broker saw it."""
        position_bytes = self._field(COLUMN_RECORD_POSITION_BYTES) + BORNHOST_POSITION_BYTES
        return _host(self.batch.body, position_bytes, bool(self.sysflag & SYSFLAG_BORNHOST_V6))

    @property
    def store_host(self) -> tuple[str, int]:
        """(address, port) of the broker that stored it (where C++ sends it back)."""
        position_bytes = self._field(COLUMN_STORE_HOST_POSITION_BYTES)
        return _host(self.batch.body, position_bytes, bool(self.sysflag & SYSFLAG_STOREHOST_V6))

    @property
    def offset_msg_id(self) -> str:
        """Store host bytes + commit-log offset, uppercase hex (module docstring)."""
        host_size_bytes = 20 if self.sysflag & SYSFLAG_STOREHOST_V6 else 8
        start = self._field(COLUMN_STORE_HOST_POSITION_BYTES)
        host = self.batch.body[start : start + host_size_bytes]
        offset = self.log_offset_bytes.to_bytes(8, "big", signed=True)
        return (host + offset).hex().upper()

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY when the producer set one, else offset_msg_id."""
        return self.properties.get(PROPERTY_UNIQ_KEY) or self.offset_msg_id

    def __repr__(self) -> str:
        return (
            f"PulledMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_index={self.queue_index}, body_size_bytes={self.body_size_bytes})"
        )

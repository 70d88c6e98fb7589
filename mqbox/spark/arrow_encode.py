"""Arrow record batches as SEND_BATCH_MESSAGE bodies, each row with its own UNIQ_KEY.

Owns: what the sink reads of a row (SinkColumns: the columns of docs/spark.md section 4, checked
and turned into byte spans), the rows' UNIQ_KEYs (RowKeys), their queue (choose_queues), and
the batch bodies (encode_rows). The Spark side (sink.py) groups rows by queue and sends.

Never: sockets, Spark, or a Python loop per row: kernels.py does every per-row step.

UNIQ_KEYs with exactly-once (docs/spark.md section 5): a row's key is a function of its scope
(the query and micro-batch, or the batch job; and the Spark partition), its content (every
column the sink stores: topic, body, tags, keys, properties, shardingKey, queueId, flag), and how
many rows of the same content came before it in the partition. Not of its position: after a
shuffle, a replayed partition holds the same rows in another order, and position-based ids would
then name different rows on the second run. Two rows of equal content are interchangeable, so
numbering them in arrival order names the same set of messages on every run. The key is two
64-bit hashes (FNV-1a and a multiply-xorshift, kernels.hash_spans) seeded from the scope, mixed
with the occurrence number by MurmurHash3's finalizer, written as 32 uppercase hex digits (the
length of a RocketMQ UNIQ_KEY). Without exactly-once a key is a random 64-bit prefix per writer
and a row counter.

Queues: the row's queueId when given; else Java's `abs(hashCode % n)` of its shardingKey (the
same queue for the same key, selector.by_hash); else the key's first hash modulo n, so that a
replayed row goes to the same queue, on the same broker, whose idempotent window knows it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from mqbox.client.outgoing import RESERVED_PROPERTY_NAMES, check_topic
from mqbox.errors import MqboxError
from mqbox.message import (
    BATCH_ELEMENT_SIZE_BYTES_MIN,
    BODY_SIZE_BYTES_MAX_DEFAULT,
    PROPERTIES_SIZE_BYTES_MAX,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    UNIQ_KEY_SIZE_CHARS,
)
from mqbox.spark.kernels import (
    count_occurrences,
    encode_elements,
    encode_map_properties,
    grow_occurrences,
    hash_spans,
    java_hashes,
)

SINK_COLUMNS: Final = (
    "body",
    "topic",
    "tags",
    "keys",
    "properties",
    "shardingKey",
    "queueId",
    "flag",
)
_TAGS_NAME: Final = np.frombuffer(PROPERTY_TAGS.encode("ascii"), dtype=np.uint8)
_KEYS_NAME: Final = np.frombuffer(PROPERTY_KEYS.encode("ascii"), dtype=np.uint8)
_UNIQ_KEY_NAME: Final = np.frombuffer(PROPERTY_UNIQ_KEY.encode("ascii"), dtype=np.uint8)
_RESERVED_NAMES: Final = pa.array(sorted(RESERVED_PROPERTY_NAMES), pa.string())
# Bytes an element's properties take besides the user's: UNIQ_KEY 0x01 <32> 0x02.
_UNIQ_PROPERTY_SIZE_BYTES: Final = len(PROPERTY_UNIQ_KEY) + 2 + UNIQ_KEY_SIZE_CHARS
_HEX_DIGITS: Final = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_MIX_1: Final = np.uint64(0xFF51AFD7ED558CCD)
_MIX_2: Final = np.uint64(0xC4CEB9FE1A85EC53)
_OCCURRENCE_MIX: Final = np.uint64(0x9E3779B97F4A7C15)
_TABLE_SLOTS_MIN: Final = 1 << 12


class SinkRowError(MqboxError):
    """A row the sink cannot send: the message names the column, the row and why."""


@dataclasses.dataclass(slots=True)
class Spans:
    """One column of a batch as byte spans: row i is data[starts[i]:starts[i] + sizes[i]],
    starts[i] < 0 for null."""

    data: NDArray[np.uint8]
    starts: NDArray[np.int64]
    sizes: NDArray[np.int64]

    @classmethod
    def absent(cls, count: int) -> Spans:
        return cls(
            np.zeros(0, dtype=np.uint8),
            np.full(count, -1, dtype=np.int64),
            np.zeros(count, dtype=np.int64),
        )

    @classmethod
    def of(cls, array: pa.Array) -> Spans:
        """A binary or string array (large ones too) as spans, without copying its data."""
        kind = array.type
        large = pa.types.is_large_binary(kind) or pa.types.is_large_string(kind)
        assert large or pa.types.is_binary(kind) or pa.types.is_string(kind), kind
        offsets_dtype = np.int64 if large else np.int32
        count = len(array)
        buffers = array.buffers()
        offsets = np.frombuffer(buffers[1], dtype=offsets_dtype)[
            array.offset : array.offset + count + 1
        ].astype(np.int64)
        data = (
            np.zeros(0, dtype=np.uint8)
            if buffers[2] is None
            else np.frombuffer(buffers[2], dtype=np.uint8)
        )
        starts = offsets[:-1].copy()
        sizes = offsets[1:] - offsets[:-1]
        if array.null_count:
            valid = array.is_valid().to_numpy(zero_copy_only=False)
            starts[~valid] = -1
            sizes[~valid] = 0
        return cls(data, starts, sizes)

    def contains(self, values: Sequence[int]) -> NDArray[np.bool_]:
        """Per row: whether its bytes hold any of `values` (vectorised over the data buffer)."""
        count = self.starts.size
        hits = np.zeros(count, dtype=np.bool_)
        if self.data.size == 0:
            return hits
        marked = np.isin(self.data, np.array(values, dtype=np.uint8))
        if not marked.any():
            return hits
        before = np.concatenate(([0], np.cumsum(marked, dtype=np.int64)))
        present = self.starts >= 0
        starts = np.where(present, self.starts, 0)
        hits[present] = (before[starts + self.sizes] - before[starts])[present] > 0
        return hits


def _int_column(array: pa.Array, name: str) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    if not pa.types.is_integer(array.type):
        raise SinkRowError(f"column {name} must be an integer column, not {array.type}")
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return values, valid


def _first(rows: NDArray[np.bool_]) -> int:
    return int(np.flatnonzero(rows)[0])


@dataclasses.dataclass(slots=True)
class SinkColumns:
    """What the sink stores of one batch, checked (module docstring; docs/spark.md section 4)."""

    count: int
    topics: list[str]  # the distinct topics
    topic_index: NDArray[np.int64]  # per row, into `topics`
    topic_spans: Spans
    body: Spans
    tags: Spans
    keys: Spans
    properties: Spans  # the user's, as `name 0x01 value 0x02` strings
    sharding: Spans
    queue_ids: NDArray[np.int64]  # -1 when not given
    flags: NDArray[np.int32]

    @classmethod
    def of(
        cls,
        batch: pa.RecordBatch,
        topic_option: str | None,
        *,
        body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
    ) -> SinkColumns:
        """Check the batch's columns and rows; SinkRowError names the first problem."""
        names = batch.schema.names
        unknown = sorted(set(names) - set(SINK_COLUMNS))
        if unknown:
            raise SinkRowError(
                f"the mqbox sink does not know the columns {unknown}; it reads {list(SINK_COLUMNS)}"
            )
        if "body" not in names:
            raise SinkRowError("the mqbox sink needs a `body` column (binary or string)")
        count = batch.num_rows
        body = Spans.of(_binary_like(batch.column("body"), "body"))
        if (body.starts < 0).any():
            raise SinkRowError(f"row {_first(body.starts < 0)}: the body is null")
        if (body.sizes == 0).any():
            raise SinkRowError(f"row {_first(body.sizes == 0)}: the body is empty")
        if (body.sizes > body_size_bytes_max).any():
            row = _first(body.sizes > body_size_bytes_max)
            raise SinkRowError(
                f"row {row}: the body is {int(body.sizes[row])} bytes, over {body_size_bytes_max}"
            )
        topics, topic_index, topic_spans = _topics(batch, topic_option, count)
        tags = _text_spans(batch, "tags", count)
        keys = _keys_spans(batch, count)
        for spans, name in ((tags, "tags"), (keys, "keys")):
            bad = spans.contains((1, 2))
            if bad.any():
                raise SinkRowError(f"row {_first(bad)}: {name} holds a 0x01 or 0x02 byte")
        properties = _user_properties(batch, count)
        sharding = _text_spans(batch, "shardingKey", count)
        queue_ids = np.full(count, -1, dtype=np.int64)
        if "queueId" in names:
            values, valid = _int_column(batch.column("queueId"), "queueId")
            if (values[valid] < 0).any():
                raise SinkRowError(f"row {_first(valid & (values < 0))}: queueId is negative")
            queue_ids[valid] = values[valid]
        flags = np.zeros(count, dtype=np.int32)
        if "flag" in names:
            values, _valid = _int_column(batch.column("flag"), "flag")
            if ((values < -(2**31)) | (values >= 2**31)).any():
                raise SinkRowError("a flag is not a 32-bit integer")
            flags = values.astype(np.int32)
        columns = cls(
            count,
            topics,
            topic_index,
            topic_spans,
            body,
            tags,
            keys,
            properties,
            sharding,
            queue_ids,
            flags,
        )
        too_large = columns.properties_sizes() > PROPERTIES_SIZE_BYTES_MAX
        if too_large.any():
            raise SinkRowError(
                f"row {_first(too_large)}: its properties are over {PROPERTIES_SIZE_BYTES_MAX} "
                "bytes"
            )
        return columns

    def properties_sizes(self) -> NDArray[np.int64]:
        """Each element's properties size: the user's, TAGS, KEYS and UNIQ_KEY."""
        sizes = self.properties.sizes + _UNIQ_PROPERTY_SIZE_BYTES
        sizes = sizes + np.where(self.tags.sizes > 0, self.tags.sizes + len(_TAGS_NAME) + 2, 0)
        return sizes + np.where(self.keys.sizes > 0, self.keys.sizes + len(_KEYS_NAME) + 2, 0)

    def element_sizes(self) -> NDArray[np.int64]:
        """Each row's size in a batch body (encode_rows writes exactly this much)."""
        return BATCH_ELEMENT_SIZE_BYTES_MIN + self.body.sizes + self.properties_sizes()


def _binary_like(array: pa.Array, name: str) -> pa.Array:
    kind = array.type
    if (
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_large_string(kind)
    ):
        return array
    raise SinkRowError(f"column {name} must be binary or string, not {kind}")


def _text_spans(batch: pa.RecordBatch, name: str, count: int) -> Spans:
    if name not in batch.schema.names:
        return Spans.absent(count)
    array = batch.column(name)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise SinkRowError(f"column {name} must be a string column, not {array.type}")
    return Spans.of(array)


def _keys_spans(batch: pa.RecordBatch, count: int) -> Spans:
    """`keys`: a string of space-separated keys, or an array of strings joined by spaces."""
    if "keys" not in batch.schema.names:
        return Spans.absent(count)
    array = batch.column("keys")
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        if not pa.types.is_string(array.type.value_type):
            raise SinkRowError(f"column keys must hold strings, not {array.type.value_type}")
        array = pc.binary_join(array, " ")
    return _text_spans(pa.RecordBatch.from_arrays([array], names=["keys"]), "keys", count)


def _topics(
    batch: pa.RecordBatch, topic_option: str | None, count: int
) -> tuple[list[str], NDArray[np.int64], Spans]:
    """The option's topic for every row, else the `topic` column's (checked once per topic)."""
    if topic_option is not None:
        check_topic(topic_option)
        data = np.frombuffer(topic_option.encode("utf-8"), dtype=np.uint8)
        spans = Spans(data, np.zeros(count, dtype=np.int64), np.full(count, data.size))
        return [topic_option], np.zeros(count, dtype=np.int64), spans
    if "topic" not in batch.schema.names:
        raise SinkRowError("no topic: give the `topic` option or a `topic` column")
    column = batch.column("topic")
    if column.null_count:
        null_rows = ~column.is_valid().to_numpy(zero_copy_only=False)
        raise SinkRowError(f"row {_first(null_rows)}: topic is null")
    encoded = pc.dictionary_encode(column)
    topics = [str(topic) for topic in encoded.dictionary.to_pylist()]
    for topic in topics:
        check_topic(topic)
    indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return topics, indices, _text_spans(batch, "topic", count)


def _user_properties(batch: pa.RecordBatch, count: int) -> Spans:
    """The `properties` map column as one `name 0x01 value 0x02` string per row: entries with an
    empty name or a null or empty value left out, and names the client owns (UNIQ_KEY, TAGS,
    KEYS, WAIT, ...: use the columns) too; a name holding 0x01 or 0x02, or a value holding 0x02,
    is refused."""
    if "properties" not in batch.schema.names:
        return Spans.absent(count)
    array = batch.column("properties")
    if not (
        pa.types.is_map(array.type)
        and pa.types.is_string(array.type.key_type)
        and pa.types.is_string(array.type.item_type)
    ):
        raise SinkRowError(f"column properties must be map<string,string>, not {array.type}")
    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    names = array.keys if len(array.keys) == last - first else array.keys.slice(first, last - first)
    values = (
        array.items if len(array.items) == last - first else array.items.slice(first, last - first)
    )
    entry_offsets = offsets - first
    name_spans = Spans.of(names)
    value_spans = Spans.of(values)
    if name_spans.contains((1, 2)).any():
        raise SinkRowError("a property name holds a 0x01 or 0x02 byte")
    if value_spans.contains((2,)).any():
        raise SinkRowError("a property value holds a 0x02 byte")
    reserved = pc.is_in(names, value_set=_RESERVED_NAMES).to_numpy(zero_copy_only=False)
    keep = (name_spans.sizes > 0) & (value_spans.sizes > 0) & ~reserved
    if array.null_count:
        null_rows = ~array.is_valid().to_numpy(zero_copy_only=False)
        # A null map's offsets may still span entries (Arrow allows it): drop them.
        entry_row = np.repeat(np.arange(count), np.diff(entry_offsets))
        keep &= ~null_rows[entry_row]
    total = int((name_spans.sizes + value_spans.sizes + 2)[keep].sum())
    out = np.empty(total, dtype=np.uint8)
    starts = np.empty(count, dtype=np.int64)
    sizes = np.empty(count, dtype=np.int64)
    written = encode_map_properties(
        entry_offsets,
        keep,
        name_spans.data,
        name_spans.starts,
        name_spans.sizes,
        value_spans.data,
        value_spans.starts,
        value_spans.sizes,
        out,
        starts,
        sizes,
    )
    assert written == total
    return Spans(out, starts, sizes)


def _fmix(values: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer over an array (numpy's uint64 arithmetic wraps)."""
    values = values ^ (values >> np.uint64(33))
    values = values * _MIX_1
    values = values ^ (values >> np.uint64(33))
    values = values * _MIX_2
    return values ^ (values >> np.uint64(33))


def hex_keys(high: NDArray[np.uint64], low: NDArray[np.uint64]) -> NDArray[np.uint8]:
    """Rows of 32 uppercase hex digits: high's 16, then low's."""
    count = high.size
    raw = np.empty((count, 16), dtype=np.uint8)
    raw[:, :8] = high.astype(">u8").view(np.uint8).reshape(count, 8)
    raw[:, 8:] = low.astype(">u8").view(np.uint8).reshape(count, 8)
    out = np.empty((count, UNIQ_KEY_SIZE_CHARS), dtype=np.uint8)
    out[:, 0::2] = _HEX_DIGITS[raw >> 4]
    out[:, 1::2] = _HEX_DIGITS[raw & 0x0F]
    return out


class RowKeys:
    """The UNIQ_KEYs of one Spark partition's rows, batch after batch (module docstring)."""

    def __init__(self, scope: str, *, exactly_once: bool) -> None:
        self.exactly_once = exactly_once
        if exactly_once:
            digest = hashlib.blake2b(scope.encode("utf-8"), digest_size=16).digest()
        else:
            digest = os.urandom(16)
        self._seed_high = np.uint64(int.from_bytes(digest[:8], "big"))
        self._seed_low = np.uint64(int.from_bytes(digest[8:], "big"))
        self._rows_seen = 0
        self._table_high = np.zeros(_TABLE_SLOTS_MIN, dtype=np.uint64)
        self._table_low = np.zeros(_TABLE_SLOTS_MIN, dtype=np.uint64)
        self._table_counts = np.zeros(_TABLE_SLOTS_MIN, dtype=np.int64)
        self._table_used = 0

    def keys(self, columns: SinkColumns) -> tuple[NDArray[np.uint64], NDArray[np.uint8]]:
        """(each row's first key hash, for the queue choice; its UNIQ_KEY as 32 hex bytes)."""
        count = columns.count
        if not self.exactly_once:
            high = np.full(count, self._seed_high, dtype=np.uint64)
            low = np.arange(self._rows_seen, self._rows_seen + count, dtype=np.uint64)
            self._rows_seen += count
            return _fmix(low ^ self._seed_low), hex_keys(high, low)
        high = np.full(count, self._seed_high, dtype=np.uint64)
        low = np.full(count, self._seed_low, dtype=np.uint64)
        for spans in (
            columns.topic_spans,
            columns.body,
            columns.tags,
            columns.keys,
            columns.properties,
            columns.sharding,
            _number_spans(columns.queue_ids),
            _number_spans(columns.flags.astype(np.int64)),
        ):
            hash_spans(spans.data, spans.starts, spans.sizes, high, low)
        occurrences = self._occurrences(high, low).astype(np.uint64)
        key_high = _fmix(high ^ (occurrences * _OCCURRENCE_MIX))
        key_low = _fmix(low + occurrences)
        return key_high, hex_keys(key_high, key_low)

    def _occurrences(self, high: NDArray[np.uint64], low: NDArray[np.uint64]) -> NDArray[np.int64]:
        needed = self._table_used + high.size
        if 2 * needed > self._table_counts.size:
            slots = 1 << (4 * needed - 1).bit_length()
            new_high = np.zeros(slots, dtype=np.uint64)
            new_low = np.zeros(slots, dtype=np.uint64)
            new_counts = np.zeros(slots, dtype=np.int64)
            moved = grow_occurrences(
                self._table_high, self._table_low, self._table_counts, new_high, new_low, new_counts
            )
            assert moved == self._table_used
            self._table_high, self._table_low, self._table_counts = new_high, new_low, new_counts
        occurrences = np.empty(high.size, dtype=np.int64)
        self._table_used += count_occurrences(
            self._table_high, self._table_low, self._table_counts, high, low, occurrences
        )
        return occurrences


def _number_spans(values: NDArray[np.int64]) -> Spans:
    """An integer column as 8-byte spans (so it joins the content hash); -1 is absent."""
    count = values.size
    data = np.ascontiguousarray(values).view(np.uint8)
    return Spans(data, np.arange(count, dtype=np.int64) * 8, np.full(count, 8, dtype=np.int64))


def choose_queues(
    columns: SinkColumns,
    key_high: NDArray[np.uint64],
    queue_counts: Sequence[int],
) -> NDArray[np.int64]:
    """Each row's index into its topic's publish queues (module docstring): queueId, else the
    sharding key's Java hash, else its key hash. SinkRowError for a queueId past the queues."""
    counts = np.array(queue_counts, dtype=np.int64)[columns.topic_index]
    chosen = (key_high % counts.astype(np.uint64)).astype(np.int64)
    sharded = columns.sharding.starts >= 0
    if sharded.any():
        hashes = np.empty(columns.count, dtype=np.int64)
        java_hashes(columns.sharding.data, columns.sharding.starts, columns.sharding.sizes, hashes)
        # Java's abs(hashCode % size), with % truncating toward zero.
        chosen[sharded] = np.abs(np.fmod(hashes, counts))[sharded]
    given = columns.queue_ids >= 0
    if given.any():
        past = given & (columns.queue_ids >= counts)
        if past.any():
            row = _first(past)
            raise SinkRowError(
                f"row {row}: queueId {int(columns.queue_ids[row])} is past the "
                f"{int(counts[row])} queues of {columns.topics[int(columns.topic_index[row])]}"
            )
        chosen[given] = columns.queue_ids[given]
    return chosen


def encode_rows(
    columns: SinkColumns, uniq_keys: NDArray[np.uint8], rows: NDArray[np.int64]
) -> bytes:
    """The batch body of `rows` in that order (kernels.encode_elements)."""
    size = int(columns.element_sizes()[rows].sum())
    out = np.empty(size, dtype=np.uint8)
    written = encode_elements(
        rows,
        columns.body.data,
        columns.body.starts,
        columns.body.sizes,
        columns.flags,
        columns.properties.data,
        columns.properties.starts,
        columns.properties.sizes,
        columns.tags.data,
        columns.tags.starts,
        columns.tags.sizes,
        columns.keys.data,
        columns.keys.starts,
        columns.keys.sizes,
        uniq_keys,
        _TAGS_NAME,
        _KEYS_NAME,
        _UNIQ_KEY_NAME,
        out,
    )
    assert written == size
    return out.tobytes()


def send_groups(
    columns: SinkColumns,
    queue_index: NDArray[np.int64],
    *,
    count_max: int,
    size_bytes_max: int,
) -> list[tuple[int, int, NDArray[np.int64]]]:
    """The rows cut into sends: [(topic index, queue index, rows in order)], each at most
    count_max rows and size_bytes_max bytes of batch body (a row over it goes alone). Rows keep
    their order within a queue."""
    order = np.lexsort((queue_index, columns.topic_index))  # stable: rows in order within a key
    topic_sorted = columns.topic_index[order]
    queue_sorted = queue_index[order]
    sizes = columns.element_sizes()[order]
    change = np.flatnonzero((np.diff(topic_sorted) != 0) | (np.diff(queue_sorted) != 0)) + 1
    groups: list[tuple[int, int, NDArray[np.int64]]] = []
    for start, end in zip([0, *change.tolist()], [*change.tolist(), order.size], strict=True):
        at = start
        while at < end:
            cumulative = np.cumsum(sizes[at:end])
            fits = int(np.searchsorted(cumulative, size_bytes_max, side="right"))
            stop = at + max(1, min(fits, count_max))
            groups.append((int(topic_sorted[at]), int(queue_sorted[at]), order[at:stop]))
            at = stop
    return groups

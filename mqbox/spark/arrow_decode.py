"""PULL bodies as Arrow record batches in the source's schema, without a Python loop per record.

Owns: READ_SCHEMA (the source's columns, docs/spark.md section 3), `decode_pull_to_arrow`, and
the Java text rule for Arrow strings (valid UTF-8 goes through as it is; a value that is not is
decoded as Java decodes it, message.java_utf8_decode).

Never: sockets, Spark, or per-record Python on the common path. One pull_decode call walks the
body (pull_kernels.decode_pull_records); kernels.gather_spans copies each column's spans into
Arrow buffers; kernels.split_properties splits every properties string at once. Python touches a
record only on the rare paths: a body stored compressed (inflated one by one), a record without
UNIQ_KEY (its offset msgId is made in Python), text that is not valid UTF-8.

The schema (Spark's `to_arrow_schema` of the source's StructType must equal it, a unit test
checks): topic, broker, queueId int, queueOffset long, msgId, tags, keys, properties
map<string,string> (the user's properties: names the client or broker own, such as UNIQ_KEY,
TAGS, KEYS, WAIT, are columns or left out), body binary, bornTimestamp and storeTimestamp
(timestamp, microseconds, UTC), reconsumeTimes int.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from mqbox.client.outgoing import RESERVED_PROPERTY_NAMES
from mqbox.client.pull_decode import PulledBatch, decode_pull_body
from mqbox.client.pull_kernels import (
    COLUMN_BODY_POSITION_BYTES,
    COLUMN_BODY_SIZE_BYTES,
    COLUMN_BORN_TIMESTAMP_MS,
    COLUMN_PROPERTIES_POSITION_BYTES,
    COLUMN_PROPERTIES_SIZE_BYTES,
    COLUMN_QUEUE_ID,
    COLUMN_QUEUE_INDEX,
    COLUMN_RECONSUME_TIMES,
    COLUMN_STORE_TIMESTAMP_MS,
    COLUMN_SYSFLAG,
    COLUMN_TAGS_POSITION_BYTES,
    COLUMN_TAGS_SIZE_BYTES,
)
from mqbox.message import (
    BODY_SIZE_BYTES_MAX_DEFAULT,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    decompress_body,
    java_utf8_decode,
)
from mqbox.spark.kernels import gather_spans, split_properties

PROPERTIES_TYPE: Final = pa.map_(pa.string(), pa.string())
TIMESTAMP_TYPE: Final = pa.timestamp("us", tz="UTC")
READ_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("broker", pa.string()),
        ("queueId", pa.int32()),
        ("queueOffset", pa.int64()),
        ("msgId", pa.string()),
        ("tags", pa.string()),
        ("keys", pa.string()),
        ("properties", PROPERTIES_TYPE),
        ("body", pa.binary()),
        ("bornTimestamp", TIMESTAMP_TYPE),
        ("storeTimestamp", TIMESTAMP_TYPE),
        ("reconsumeTimes", pa.int32()),
    ]
)
_KEYS_NAME: Final = np.frombuffer(PROPERTY_KEYS.encode("ascii"), dtype=np.uint8)
_UNIQ_KEY_NAME: Final = np.frombuffer(PROPERTY_UNIQ_KEY.encode("ascii"), dtype=np.uint8)
_RESERVED_NAMES: Final = pa.array(sorted(RESERVED_PROPERTY_NAMES), pa.string())


def empty_batch() -> pa.RecordBatch:
    """A batch of no rows in READ_SCHEMA."""
    return pa.RecordBatch.from_arrays(
        [pa.array([], field.type) for field in READ_SCHEMA], schema=READ_SCHEMA
    )


def _validity(valid: NDArray[np.bool_]) -> pa.Buffer | None:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def spans_array(
    data: NDArray[np.uint8],
    starts: NDArray[np.int64],
    sizes: NDArray[np.int64],
    *,
    text: bool,
) -> pa.Array:
    """An Arrow binary (or, with `text`, string) array of the spans; start < 0 is null. Text
    that is not valid UTF-8 is decoded value by value as Java decodes it."""
    count = starts.size
    valid = starts >= 0
    out_data = np.empty(int(sizes[valid].sum()), dtype=np.uint8)
    out_offsets = np.empty(count + 1, dtype=np.int32)
    gather_spans(data, starts, sizes, out_data, out_offsets)
    buffers = [_validity(valid), pa.py_buffer(out_offsets), pa.py_buffer(out_data)]
    if not text:
        return pa.Array.from_buffers(pa.binary(), count, buffers)
    array = pa.Array.from_buffers(pa.string(), count, buffers)
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        raw = pa.Array.from_buffers(pa.binary(), count, buffers).to_pylist()
        return pa.array(
            [None if value is None else java_utf8_decode(value) for value in raw], pa.string()
        )
    return array


def constant_text(value: str, count: int) -> pa.Array:
    """`count` copies of `value` as a string array, made from two buffers."""
    encoded = value.encode("utf-8")
    offsets = np.arange(count + 1, dtype=np.int32) * len(encoded)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * count)]
    )


def _timestamps(milliseconds: NDArray[np.int64]) -> pa.Array:
    micros = milliseconds * 1000
    return pa.Array.from_buffers(TIMESTAMP_TYPE, micros.size, [None, pa.py_buffer(micros)])


def _offset_msg_ids(batch: PulledBatch, rows: NDArray[np.int64]) -> list[str]:
    return [batch[int(row)].offset_msg_id for row in rows]


def decode_pull_to_arrow(
    body: bytes | PulledBatch,
    *,
    topic: str,
    broker: str,
    queue_index_end: int,
    accepted_tags: Collection[str] | None = None,
    include_properties: bool = True,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
) -> tuple[pa.RecordBatch, int]:
    """The records of a PULL body below `queue_index_end`, as a batch in READ_SCHEMA, and the
    queue index after the last record decoded (-1 when none was). With `accepted_tags`, only
    records whose TAGS is one of them are kept (the broker filtered by tag hash; this is the exact
    check). `body` is a PULL body, or one pull_decode already walked (mqbox.client.pull's
    PullResult.batch). Raises PullBodyError for a damaged body (pull_decode)."""
    if isinstance(body, PulledBatch):
        pulled = body
    else:
        pulled = decode_pull_body(body, broker_name=broker, body_size_bytes_max=body_size_bytes_max)
    pulled.raise_for_damage()
    table = pulled.table
    queue_indexes = table[COLUMN_QUEUE_INDEX]
    count = int(np.searchsorted(queue_indexes, queue_index_end, side="left"))
    if count == 0:
        return empty_batch(), -1
    next_queue_index = int(queue_indexes[count - 1]) + 1
    table = table[:, :count]
    data = np.frombuffer(pulled.body, dtype=np.uint8)
    properties_starts = table[COLUMN_PROPERTIES_POSITION_BYTES]
    properties_sizes = table[COLUMN_PROPERTIES_SIZE_BYTES]
    capacity = int(properties_sizes.sum()) // 3 + 1
    name_starts = np.empty(capacity, dtype=np.int64)
    name_sizes = np.empty(capacity, dtype=np.int64)
    value_starts = np.empty(capacity, dtype=np.int64)
    value_sizes = np.empty(capacity, dtype=np.int64)
    record_ends = np.empty(count, dtype=np.int64)
    keys_starts = np.empty(count, dtype=np.int64)
    keys_sizes = np.empty(count, dtype=np.int64)
    uniq_starts = np.empty(count, dtype=np.int64)
    uniq_sizes = np.empty(count, dtype=np.int64)
    entry_count = split_properties(
        data,
        properties_starts,
        properties_sizes,
        _KEYS_NAME,
        _UNIQ_KEY_NAME,
        name_starts,
        name_sizes,
        value_starts,
        value_sizes,
        record_ends,
        keys_starts,
        keys_sizes,
        uniq_starts,
        uniq_sizes,
    )
    tags = spans_array(
        data, table[COLUMN_TAGS_POSITION_BYTES], table[COLUMN_TAGS_SIZE_BYTES], text=True
    )
    msg_ids = spans_array(data, uniq_starts, uniq_sizes, text=True)
    missing = np.flatnonzero(uniq_starts < 0)
    if missing.size:
        texts = msg_ids.to_pylist()
        for row, msg_id in zip(missing.tolist(), _offset_msg_ids(pulled, missing), strict=True):
            texts[row] = msg_id
        msg_ids = pa.array(texts, pa.string())
    bodies = spans_array(
        data, table[COLUMN_BODY_POSITION_BYTES], table[COLUMN_BODY_SIZE_BYTES], text=False
    )
    compressed = np.flatnonzero(table[COLUMN_SYSFLAG] & SYSFLAG_COMPRESSED)
    if compressed.size:
        values = bodies.to_pylist()
        sysflags = table[COLUMN_SYSFLAG]
        for row in compressed.tolist():
            values[row], _ = decompress_body(
                values[row], int(sysflags[row]), size_bytes_max=body_size_bytes_max
            )
        bodies = pa.array(values, pa.binary())
    if include_properties:
        properties = _properties_map(
            data, name_starts, name_sizes, value_starts, value_sizes, record_ends, entry_count
        )
    else:
        properties = pa.nulls(count, PROPERTIES_TYPE)
    batch = pa.RecordBatch.from_arrays(
        [
            constant_text(topic, count),
            constant_text(broker, count),
            pa.array(table[COLUMN_QUEUE_ID].astype(np.int32), pa.int32()),
            pa.array(table[COLUMN_QUEUE_INDEX], pa.int64()),
            msg_ids,
            tags,
            spans_array(data, keys_starts, keys_sizes, text=True),
            properties,
            bodies,
            _timestamps(table[COLUMN_BORN_TIMESTAMP_MS]),
            _timestamps(table[COLUMN_STORE_TIMESTAMP_MS]),
            pa.array(table[COLUMN_RECONSUME_TIMES].astype(np.int32), pa.int32()),
        ],
        schema=READ_SCHEMA,
    )
    if accepted_tags is not None:
        wanted = pa.array(sorted(accepted_tags), pa.string())
        batch = batch.filter(pc.fill_null(pc.is_in(tags, value_set=wanted), False))
    return batch, next_queue_index


def _properties_map(
    data: NDArray[np.uint8],
    name_starts: NDArray[np.int64],
    name_sizes: NDArray[np.int64],
    value_starts: NDArray[np.int64],
    value_sizes: NDArray[np.int64],
    record_ends: NDArray[np.int64],
    entry_count: int,
) -> pa.Array:
    """Every record's user properties as one map array (entries the client or broker own left
    out)."""
    names = spans_array(data, name_starts[:entry_count], name_sizes[:entry_count], text=True)
    values = spans_array(data, value_starts[:entry_count], value_sizes[:entry_count], text=True)
    keep = np.logical_not(pc.is_in(names, value_set=_RESERVED_NAMES).to_numpy(zero_copy_only=False))
    kept_before = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))
    offsets = kept_before[np.concatenate(([0], record_ends))].astype(np.int32)
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), names.filter(keep), values.filter(keep)
    )

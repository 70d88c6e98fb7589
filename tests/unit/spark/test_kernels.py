"""Goal: every kernel of mqbox/spark/kernels.py gives exactly what its plain twin in
kernels_ref.py gives: spans gathered into Arrow buffers, properties split by Java's rules (empty
names and values skipped, the last of equal names wins), content hashes, occurrence counts across
calls and across the table's growth, map entries encoded, batch elements laid out, Java hashes of
sharding keys.

Method: hypothesis draws the bytes (separators and broken UTF-8 included) and the spans; each test
runs the kernel and the twin on the same input and compares.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from mqbox.spark import kernels as k
from mqbox.spark import kernels_ref as ref

PROPERTY_BYTES = st.binary(max_size=40).map(
    lambda raw: bytes(b"\x01\x02ab\xff"[byte % 5] if byte % 3 == 0 else byte for byte in raw)
)


@st.composite
def spans_over(draw: st.DrawFn, data: bytes) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()) and data:
            start = draw(st.integers(0, len(data)))
            spans.append((start, draw(st.integers(0, len(data) - start))))
        else:
            spans.append((-1, 0))
    return spans


def arrays(spans: list[tuple[int, int]]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    return (
        np.array([start for start, _ in spans], dtype=np.int64),
        np.array([size for _, size in spans], dtype=np.int64),
    )


@given(st.data())
def test_gather_spans_agrees_with_its_twin(data: st.DataObject) -> None:
    raw = data.draw(st.binary(max_size=50))
    spans = data.draw(spans_over(raw))
    starts, sizes = arrays(spans)
    out = np.empty(int(sizes[starts >= 0].sum()), dtype=np.uint8)
    offsets = np.empty(len(spans) + 1, dtype=np.int32)
    written = k.gather_spans(np.frombuffer(raw, dtype=np.uint8), starts, sizes, out, offsets)
    expected, expected_offsets = ref.gather_spans_ref(raw, spans)
    assert written == len(expected)
    assert out.tobytes() == expected
    assert offsets.tolist() == expected_offsets


@given(st.lists(PROPERTY_BYTES, max_size=5))
@settings(max_examples=300)
def test_split_properties_agrees_with_its_twin(records: list[bytes]) -> None:
    records = [
        record + (b"\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02KEYS\x01k3" if index % 2 else b"")
        for index, record in enumerate(records)
    ]
    raw = b"".join(records)
    spans: list[tuple[int, int]] = []
    at = 0
    for record in records:
        spans.append((at, len(record)))
        at += len(record)
    starts, sizes = arrays(spans)
    capacity = len(raw) // 3 + 1
    outs = [np.empty(capacity, dtype=np.int64) for _ in range(4)]
    ends = np.empty(len(records), dtype=np.int64)
    per_record = [np.empty(len(records), dtype=np.int64) for _ in range(4)]
    data = np.frombuffer(raw, dtype=np.uint8)
    count = k.split_properties(
        data,
        starts,
        sizes,
        np.frombuffer(b"KEYS", dtype=np.uint8),
        np.frombuffer(b"UNIQ_KEY", dtype=np.uint8),
        outs[0],
        outs[1],
        outs[2],
        outs[3],
        ends,
        per_record[0],
        per_record[1],
        per_record[2],
        per_record[3],
    )
    name_starts, name_sizes, value_starts, value_sizes = outs
    keys_starts, keys_sizes, uniq_starts, uniq_sizes = per_record
    expected = ref.split_properties_ref(raw, spans)
    assert count == (int(ends[-1]) if records else 0)
    first = 0
    for row, (entries, keys, uniq) in enumerate(expected):
        got = [
            (
                raw[name_starts[i] : name_starts[i] + name_sizes[i]],
                raw[value_starts[i] : value_starts[i] + value_sizes[i]],
            )
            for i in range(first, int(ends[row]))
        ]
        assert got == entries
        first = int(ends[row])

        def value(starts_: NDArray[np.int64], sizes_: NDArray[np.int64]) -> bytes | None:
            start = int(starts_[row])  # noqa: B023 (used at once)
            return None if start < 0 else raw[start : start + int(sizes_[row])]  # noqa: B023

        assert value(keys_starts, keys_sizes) == keys
        assert value(uniq_starts, uniq_sizes) == uniq


@given(st.data())
def test_hash_spans_agrees_with_its_twin(data: st.DataObject) -> None:
    raw = data.draw(st.binary(max_size=40))
    spans = data.draw(spans_over(raw))
    seeds = [(data.draw(st.integers(0, 2**64 - 1)), 7) for _ in spans]
    starts, sizes = arrays(spans)
    high = np.array([seed for seed, _ in seeds], dtype=np.uint64)
    low = np.array([seed for _, seed in seeds], dtype=np.uint64)
    k.hash_spans(np.frombuffer(raw, dtype=np.uint8), starts, sizes, high, low)
    assert list(zip(high.tolist(), low.tolist(), strict=True)) == ref.hash_spans_ref(
        raw, spans, seeds
    )


def test_hash_spans_keeps_field_boundaries_apart() -> None:
    def two_fields(first: bytes, second: bytes) -> tuple[int, int]:
        high = np.zeros(1, dtype=np.uint64)
        low = np.zeros(1, dtype=np.uint64)
        for field in (first, second):
            k.hash_spans(
                np.frombuffer(field, dtype=np.uint8),
                np.zeros(1, dtype=np.int64),
                np.array([len(field)], dtype=np.int64),
                high,
                low,
            )
        return int(high[0]), int(low[0])

    assert two_fields(b"ab", b"c") != two_fields(b"a", b"bc")


@given(st.lists(st.lists(st.integers(0, 5), max_size=40), max_size=4))
def test_count_occurrences_agrees_with_a_dict_across_calls_and_growth(
    calls: list[list[int]],
) -> None:
    slots = 16
    table = [np.zeros(slots, dtype=np.uint64), np.zeros(slots, dtype=np.uint64)]
    counts = np.zeros(slots, dtype=np.int64)
    used = 0
    seen: dict[tuple[int, int], int] = {}
    for values in calls:
        pairs = [(value * 0x9E3779B97F4A7C15 % 2**64, value) for value in values]
        if 2 * (used + len(pairs)) > counts.size:
            grown = [np.zeros(counts.size * 4, dtype=np.uint64) for _ in range(2)]
            grown_counts = np.zeros(counts.size * 4, dtype=np.int64)
            used_after = k.grow_occurrences(
                table[0], table[1], counts, grown[0], grown[1], grown_counts
            )
            assert used_after == used
            table, counts = grown, grown_counts
        high = np.array([pair[0] for pair in pairs], dtype=np.uint64)
        low = np.array([pair[1] for pair in pairs], dtype=np.uint64)
        out = np.empty(len(pairs), dtype=np.int64)
        used += k.count_occurrences(table[0], table[1], counts, high, low, out)
        assert out.tolist() == ref.count_occurrences_ref(seen, pairs)
    assert used == len(seen)


entries = st.lists(
    st.tuples(st.binary(min_size=1, max_size=4), st.binary(min_size=1, max_size=4), st.booleans()),
    max_size=4,
)


@given(st.lists(entries, max_size=5))
def test_encode_map_properties_agrees_with_its_twin(
    rows: list[list[tuple[bytes, bytes, bool]]],
) -> None:
    flat = [entry for row in rows for entry in row]
    names = b"".join(name for name, _, _ in flat)
    values = b"".join(value for _, value, _ in flat)
    name_sizes = np.array([len(name) for name, _, _ in flat], dtype=np.int64)
    value_sizes = np.array([len(value) for _, value, _ in flat], dtype=np.int64)
    name_starts = np.concatenate(([0], np.cumsum(name_sizes)[:-1])).astype(np.int64)
    value_starts = np.concatenate(([0], np.cumsum(value_sizes)[:-1])).astype(np.int64)
    keep = np.array([kept for _, _, kept in flat], dtype=np.bool_)
    offsets = np.concatenate(([0], np.cumsum([len(row) for row in rows]))).astype(np.int64)
    out = np.empty(len(names) + len(values) + 2 * len(flat), dtype=np.uint8)
    starts = np.empty(len(rows), dtype=np.int64)
    sizes = np.empty(len(rows), dtype=np.int64)
    k.encode_map_properties(
        offsets,
        keep,
        np.frombuffer(names, dtype=np.uint8),
        name_starts[: len(flat)],
        name_sizes,
        np.frombuffer(values, dtype=np.uint8),
        value_starts[: len(flat)],
        value_sizes,
        out,
        starts,
        sizes,
    )
    got = [out[start : start + size].tobytes() for start, size in zip(starts, sizes, strict=True)]
    assert got == ref.encode_map_properties_ref(rows)


optional_text = st.one_of(st.none(), st.binary(max_size=6))


@given(
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=20),
            st.integers(-(2**31), 2**31 - 1),
            optional_text,
            optional_text,
            optional_text,
        ),
        min_size=1,
        max_size=6,
    ),
    st.randoms(use_true_random=False),
)
def test_encode_elements_agrees_with_its_twin(
    rows: list[tuple[bytes, int, bytes | None, bytes | None, bytes | None]],
    random: object,
) -> None:
    order = list(range(len(rows)))
    random.shuffle(order)  # type: ignore[attr-defined]

    def column(index: int) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64]]:
        values: list[bytes | None] = [row[index] for row in rows]  # type: ignore[misc]
        data = b"".join(value or b"" for value in values)
        sizes = np.array([len(value or b"") for value in values], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        starts[[value is None for value in values]] = -1
        return np.frombuffer(data, dtype=np.uint8), starts, sizes

    uniq = np.frombuffer(
        b"".join(f"{row:032X}".encode() for row in range(len(rows))), dtype=np.uint8
    ).reshape(len(rows), 32)
    bodies, body_starts, body_sizes = column(0)
    user, user_starts, user_sizes = column(2)
    tags, tags_starts, tags_sizes = column(3)
    keys, keys_starts, keys_sizes = column(4)
    rows_order = np.array(order, dtype=np.int64)
    properties_size = int(
        user_sizes.sum() + (tags_sizes + 6).sum() + (keys_sizes + 6).sum() + 42 * len(rows)
    )
    out = np.empty(int(body_sizes.sum()) + 22 * len(rows) + properties_size, dtype=np.uint8)
    written = k.encode_elements(
        rows_order,
        bodies,
        body_starts,
        body_sizes,
        np.array([row[1] for row in rows], dtype=np.int32),
        user,
        user_starts,
        user_sizes,
        tags,
        tags_starts,
        tags_sizes,
        keys,
        keys_starts,
        keys_sizes,
        uniq,
        np.frombuffer(b"TAGS", dtype=np.uint8),
        np.frombuffer(b"KEYS", dtype=np.uint8),
        np.frombuffer(b"UNIQ_KEY", dtype=np.uint8),
        out,
    )
    expected = ref.encode_elements_ref(
        [rows[i][0] for i in order],
        [rows[i][1] for i in order],
        [rows[i][2] for i in order],
        [rows[i][3] for i in order],
        [rows[i][4] for i in order],
        [uniq[i].tobytes() for i in order],
    )
    assert out[:written].tobytes() == expected


@given(st.data())
def test_java_hashes_agree_with_their_twin(data: st.DataObject) -> None:
    raw = data.draw(st.binary(max_size=30))
    spans = data.draw(spans_over(raw))
    starts, sizes = arrays(spans)
    out = np.empty(len(spans), dtype=np.int64)
    k.java_hashes(np.frombuffer(raw, dtype=np.uint8), starts, sizes, out)
    assert out.tolist() == ref.java_hashes_ref(raw, spans)

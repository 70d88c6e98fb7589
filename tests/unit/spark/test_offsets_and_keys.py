"""Goal: the connector's pure decisions, without Spark or a broker. (1) Offsets JSON: what
offsets_to_json writes, offsets_from_json reads back; the short form needs one broker and names
the brokers otherwise; bad offsets are refused. (2) limit_rows (maxOffsetsPerTrigger) takes
exactly min(limit, waiting) rows, never moves a queue back or past its latest, and gives the
same ends for the same inputs. (3) split_ranges (minPartitions) covers exactly the same offsets
in at least minPartitions pieces when there are that many rows. (4) The sink's UNIQ_KEYs with
exactly-once are a function of the scope and the rows as a multiset: the same rows in another
order and other batches get the same keys, equal rows get distinct keys, another scope gets
other keys; without exactly-once two writers never share a key. (5) Options that cannot work
are refused with the option's name.

Method: hypothesis draws offsets, limits and rows; the reference is plain Python counting.
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.spark.arrow_encode import RowKeys, SinkColumns
from mqbox.spark.offsets import (
    OffsetsError,
    QueueKey,
    QueueRange,
    limit_rows,
    offsets_from_json,
    offsets_to_json,
    split_ranges,
)
from mqbox.spark.options import OptionError, ReadOptions, WriteOptions

keys = st.builds(
    QueueKey,
    st.sampled_from(["clicks", "orders"]),
    st.sampled_from(["broker-a", "broker-b"]),
    st.integers(0, 7),
)
offset_maps = st.dictionaries(keys, st.integers(0, 10**12), max_size=12)


@given(offset_maps)
def test_offsets_json_round_trips(offsets: dict[QueueKey, int]) -> None:
    document = offsets_to_json(offsets)
    assert offsets_from_json(document) == offsets
    assert list(document) == sorted(document)


def test_the_short_form_needs_one_broker_and_bad_offsets_are_refused() -> None:
    one = {"clicks": ["broker-a"]}
    got = offsets_from_json('{"clicks": {"0": 5, "1": -2}}', brokers_by_topic=one)
    assert got == {QueueKey("clicks", "broker-a", 0): 5, QueueKey("clicks", "broker-a", 1): -2}
    with pytest.raises(OffsetsError, match="broker-a, broker-b"):
        offsets_from_json(
            '{"clicks": {"0": 5}}', brokers_by_topic={"clicks": ["broker-a", "broker-b"]}
        )
    for bad in ('{"clicks": {"broker-a": {"0": -3}}}', '{"clicks": {"broker-a": {"x": 1}}}', "[1]"):
        with pytest.raises(OffsetsError):
            offsets_from_json(bad)


@given(
    st.dictionaries(keys, st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1),
    st.integers(1, 3000),
)
def test_limit_rows_takes_exactly_the_limit_within_each_queue(
    spans: dict[QueueKey, tuple[int, int]], limit: int
) -> None:
    start = {key: min(a, b) for key, (a, b) in spans.items()}
    latest = {key: max(a, b) for key, (a, b) in spans.items()}
    ends = limit_rows(start, latest, limit)
    waiting = sum(latest[key] - start[key] for key in latest)
    assert sum(ends[key] - start[key] for key in latest) == min(limit, waiting)
    assert all(start[key] <= ends[key] <= latest[key] for key in latest)
    assert limit_rows(dict(reversed(start.items())), latest, limit) == ends


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 500)), min_size=1, max_size=6),
    st.integers(1, 20),
)
def test_split_ranges_covers_the_same_offsets_in_enough_pieces(
    sizes: list[tuple[int, int]], min_partitions: int
) -> None:
    ranges = [
        QueueRange(QueueKey("t", "b", queue), first, first + size)
        for queue, (first, size) in enumerate(sizes)
    ]
    pieces = split_ranges(ranges, min_partitions)

    def offsets(parts: list[QueueRange]) -> Counter[tuple[QueueKey, int]]:
        return Counter((p.key, at) for p in parts for at in range(p.start, p.end))

    assert offsets(pieces) == offsets(ranges)
    total = sum(size for _, size in sizes)
    if total >= min_partitions:
        assert len(pieces) >= min_partitions


def columns_of(rows: list[tuple[bytes, str | None]]) -> SinkColumns:
    batch = pa.record_batch(
        [pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.string())],
        names=["body", "tags"],
    )
    return SinkColumns.of(batch, "Out")


def uniq_keys(
    scope: str, batches: list[list[tuple[bytes, str | None]]], exactly_once: bool = True
) -> list[bytes]:
    row_keys = RowKeys(scope, exactly_once=exactly_once)
    found: list[bytes] = []
    for rows in batches:
        _, hexes = row_keys.keys(columns_of(rows))
        found += [bytes(line) for line in hexes]
    return found


rows_drawn = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", b"long body"]), st.sampled_from([None, "T"])),
    min_size=1,
    max_size=40,
)


@given(rows_drawn, st.randoms(use_true_random=False), st.integers(1, 5))
def test_exactly_once_keys_depend_on_the_rows_as_a_multiset(
    rows: list[tuple[bytes, str | None]], rng: random.Random, cut: int
) -> None:
    first = uniq_keys("query:q/batch:3/partition:1", [rows])
    shuffled = list(rows)
    rng.shuffle(shuffled)
    again = uniq_keys(
        "query:q/batch:3/partition:1",
        [shuffled[:cut], shuffled[cut:]] if cut < len(shuffled) else [shuffled],
    )
    assert sorted(first) == sorted(again)
    assert len(set(first)) == len(first)
    assert all(len(key) == 32 for key in first)
    other = uniq_keys("query:q/batch:4/partition:1", [rows])
    assert not set(first) & set(other)
    plain = uniq_keys("job:x", [rows], exactly_once=False) + uniq_keys(
        "job:x", [rows], exactly_once=False
    )
    assert len(set(plain)) == len(plain)


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"topic": "t"}, False, "namesrvAddr"),
        (
            {"namesrvAddr": "h:1", "topic": "t", "maxOffsetsPerTrigger": "5"},
            False,
            "maxOffsetsPerTrigger",
        ),
        ({"namesrvAddr": "h:1", "topic": "t", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({"namesrvAddr": "h:1", "topic": "t", "startingOffsets": "group"}, True, "consumerGroup"),
        ({"namesrvAddr": "h:1", "topic": "t", "failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        (
            {
                "namesrvAddr": "h:1",
                "topic": "t",
                "startingOffsets": "earliest",
                "startingTimestamp": "5",
            },
            False,
            "startingTimestamp",
        ),
    ],
)
def test_read_options_that_cannot_work_are_refused(
    options: dict[str, str], streaming: bool, named: str
) -> None:
    with pytest.raises(OptionError, match=named):
        ReadOptions.parse(options, streaming=streaming)


def test_write_options_need_a_name_server_and_a_valid_topic() -> None:
    with pytest.raises(OptionError, match="namesrvAddr"):
        WriteOptions.parse({"topic": "t"})
    with pytest.raises(OptionError, match="topic"):
        WriteOptions.parse({"namesrvAddr": "h:1", "topic": "bad topic!"})
    assert WriteOptions.parse({"namesrvAddr": "h:1", "exactlyOnce": "false"}).exactly_once is False


def test_credentials_options_make_session_credentials() -> None:
    """accessKey and secretKey (plain ACL): both make the credentials every request is signed
    with; one alone is refused."""
    read = ReadOptions.parse(
        {"namesrvAddr": "h:1", "topic": "T", "accessKey": "spark-ak1", "secretKey": "spark-sk1"},
        streaming=False,
    )
    assert read.credentials is not None
    assert read.credentials.access_key == "spark-ak1"
    assert (
        ReadOptions.parse({"namesrvAddr": "h:1", "topic": "T"}, streaming=False).credentials is None
    )
    write = WriteOptions.parse({"namesrvAddr": "h:1", "ACCESSKEY": "a" * 7, "secretkey": "s" * 7})
    assert write.credentials is not None
    with pytest.raises(OptionError, match="accessKey and secretKey together"):
        WriteOptions.parse({"namesrvAddr": "h:1", "accessKey": "spark-ak1"})

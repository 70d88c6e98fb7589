"""The /metrics text: label escaping, one group per family, histogram buckets cumulative."""

from __future__ import annotations

from mqbox.ipc.ring import Ring, ring_occupancy
from mqbox.server.statistics import BUCKET_COUNT, Histogram
from mqbox.server.web.prometheus import _Writer, escape_label_value


def test_label_values_are_escaped() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_samples_of_a_family_stay_together_and_histograms_accumulate() -> None:
    writer = _Writer({"broker": "b"})
    writer.family("first", "gauge", "First")
    writer.family("second", "counter", "Second")
    writer.sample("first", 1.5, {"topic": "T"})
    writer.sample("second", 2)
    writer.sample("first", 3, {"topic": 'q"'})
    counts = (1, 2) + (0,) * (BUCKET_COUNT - 3) + (4,)
    writer.histogram("latency_seconds", "Latency", Histogram(counts, 2_000_000_000, 7))
    lines = writer.text().splitlines()
    assert lines[:6] == [
        "# HELP first First",
        "# TYPE first gauge",
        'first{broker="b",topic="T"} 1.5',
        'first{broker="b",topic="q\\""} 3',
        "# HELP second Second",
        "# TYPE second counter",
    ]
    buckets = [line for line in lines if line.startswith("latency_seconds_bucket")]
    assert buckets[0] == 'latency_seconds_bucket{broker="b",le="0.0001"} 1'
    assert buckets[1] == 'latency_seconds_bucket{broker="b",le="0.00025"} 3'
    assert buckets[-1] == 'latency_seconds_bucket{broker="b",le="+Inf"} 7'
    assert 'latency_seconds_sum{broker="b"} 2.0' in lines
    assert 'latency_seconds_count{broker="b"} 7' in lines


def test_ring_occupancy_reads_the_header(shm_instance: str) -> None:
    name = f"/mqbox.{shm_instance}.occupancy.0"
    ring = Ring.create(name, 1 << 16)
    try:
        assert ring_occupancy(name) == (0, 1 << 16)
        assert ring.try_write_nowait(7, b"x" * 100)
        used_bytes, capacity_bytes = ring_occupancy(name)
        assert 100 < used_bytes < 200
        assert capacity_bytes == 1 << 16
    finally:
        ring.close()
        ring.unlink()

"""The statistics block (shared counters per role) and the history that turns snapshots into
RocketMQ's windows and TPS figures."""

from __future__ import annotations

import os

import pytest

from mqbox.server import statistics
from mqbox.server.statistics import (
    HISTOGRAM_SEND,
    KEY_SLOT_COUNT,
    S_SEND_REQUESTS,
    StatisticsBlock,
    StatisticsWriter,
    read_totals,
)
from mqbox.server.statistics_history import (
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    StatisticsHistory,
    distribute_time,
    percentile_ms,
    stats_item_from_document,
)


def test_totals_add_up_over_roles_and_keys() -> None:
    block = StatisticsBlock.create(["send.0", "send.1", "pull.0"])
    first = StatisticsWriter(block, "send.0")
    second = StatisticsWriter(block, "send.1")
    puller = StatisticsWriter(block, "pull.0")
    first.count_put("TopicA", 3, 300)
    first.count_put("TopicA", 1, 100)
    second.count_put("TopicA", 2, 50)
    second.count_put("TopicB", 5, 500)
    puller.count_get("GroupX", "TopicA", 4, 400)
    first.add(S_SEND_REQUESTS, 2)
    totals = read_totals(block)
    assert totals.puts["TopicA"].messages == 6
    assert totals.puts["TopicA"].size_bytes == 450
    assert totals.puts["TopicA"].requests == 3
    assert totals.puts["TopicB"].messages == 5
    assert totals.gets["TopicA@GroupX"].messages == 4
    assert totals.scalars["put_messages"] == 11
    assert totals.scalars["get_bytes"] == 400
    assert totals.scalars["send_requests"] == 2
    assert totals.role_scalars["send.1"]["put_messages"] == 7


def test_a_forked_writer_sees_the_same_words() -> None:
    """The block is MAP_SHARED: a child's counts are the parent's to read (as roles are)."""
    block = StatisticsBlock.create(["send.0"])
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        StatisticsWriter(block, "send.0").count_put("Forked", 7, 70)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert read_totals(block).puts["Forked"].messages == 7


def test_a_restarted_role_adopts_its_slots() -> None:
    block = StatisticsBlock.create(["send.0"])
    StatisticsWriter(block, "send.0").count_put("T", 1, 10)
    again = StatisticsWriter(block, "send.0")
    again.count_put("T", 1, 10)
    totals = read_totals(block)
    assert totals.puts["T"].messages == 2
    assert len(totals.puts) == 1


def test_a_full_region_drops_new_keys_and_counts_them() -> None:
    block = StatisticsBlock.create(["send.0"])
    writer = StatisticsWriter(block, "send.0")
    for index in range(KEY_SLOT_COUNT):
        writer.count_put(f"T{index}", 1, 1)
    writer.count_put("OneTooMany", 1, 1)
    writer.count_put("x" * (statistics.SLOT_NAME_SIZE_BYTES_MAX + 1), 1, 1)
    totals = read_totals(block)
    assert len(totals.puts) == KEY_SLOT_COUNT
    assert "OneTooMany" not in totals.puts
    assert totals.dropped_count == 2
    assert totals.scalars["put_messages"] == KEY_SLOT_COUNT + 2  # the broker total keeps them


@pytest.mark.parametrize(
    ("duration_ns", "bucket"),
    [(0, 0), (100_000, 0), (100_001, 1), (1_000_000, 3), (10_000_000_000, 14), (10**12, 15)],
)
def test_histogram_buckets_are_upper_bounds(duration_ns: int, bucket: int) -> None:
    block = StatisticsBlock.create(["send.0"])
    StatisticsWriter(block, "send.0").observe_ns(HISTOGRAM_SEND, duration_ns)
    histogram = read_totals(block).histograms["send_latency"]
    assert histogram.bucket_counts[bucket] == 1
    assert histogram.count == 1
    assert histogram.sum_ns == duration_ns


def _history_with(samples: list[tuple[int, int]]) -> StatisticsHistory:
    """A history fed `(time ms, TopicA messages)` samples (one request per message)."""
    block = StatisticsBlock.create(["send.0"])
    writer = StatisticsWriter(block, "send.0")
    history = StatisticsHistory("Cluster")
    seen = 0
    for now_ms, messages in samples:
        for _ in range(messages - seen):
            writer.count_put("TopicA", 1, 10)
        seen = messages
        history.sample(now_ms, read_totals(block))
    return history


def test_windows_follow_rocketmq_stats_item() -> None:
    history = _history_with([(1000 * second, 10 * second) for second in range(70)])
    item = history.stats_item(TOPIC_PUT_NUMS, "TopicA")
    assert item is not None
    minute = item["statsMinute"]
    assert minute.sum == 600  # 61 samples: the newest against the one 60 s before
    assert minute.tps == pytest.approx(10.0)
    assert minute.avgpt == pytest.approx(1.0)  # one message per request
    size = history.stats_item(TOPIC_PUT_SIZE, "TopicA")
    assert size is not None
    assert size["statsMinute"].tps == pytest.approx(100.0)
    assert history.stats_item(TOPIC_PUT_NUMS, "Nobody") is None
    assert history.rate(TOPIC_PUT_NUMS, "TopicA", 10) == pytest.approx(10.0)
    assert history.rate(BROKER_PUT_NUMS, "Cluster") == pytest.approx(10.0)
    assert history.stats_item(GROUP_GET_NUMS, "TopicA@G") is None


def test_runtime_tps_needs_enough_samples() -> None:
    history = _history_with([(1000 * second, 5 * second) for second in range(12)])
    figures = history.runtime_info()["putTps"].split(" ")
    assert float(figures[0]) == pytest.approx(5.0)
    assert figures[1:] == ["", ""]  # fewer than 61 and 601 samples: empty, as Java


def test_published_document_answers_315() -> None:
    history = _history_with([(0, 0), (1000, 4)])
    document = history.published_document()
    item = stats_item_from_document(document, TOPIC_PUT_NUMS, "TopicA")
    assert item is not None
    assert item["statsMinute"] == {"sum": 4, "tps": 4.0, "avgpt": 1.0}
    assert set(item) == {"statsMinute", "statsHour", "statsDay"}
    assert stats_item_from_document(document, TOPIC_PUT_NUMS, "Other") is None
    assert stats_item_from_document(None, TOPIC_PUT_NUMS, "TopicA") is None


def test_percentiles_and_distribution_text() -> None:
    counts = (0, 90, 9, 1) + (0,) * 12
    assert percentile_ms(counts, 0.9) == pytest.approx(0.25)
    assert percentile_ms(counts, 0.99) == pytest.approx(0.5)
    assert percentile_ms(counts, 0.999) == pytest.approx(1.0)
    assert percentile_ms((0,) * 16, 0.99) == 0.0
    text = distribute_time(counts)
    assert text.startswith("[<=0.1ms]:0 [<=0.25ms]:90")
    assert text.endswith("[>10000ms]:0")

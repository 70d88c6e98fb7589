"""Goal: `mqbox top`'s arithmetic is right: rates are changes per second between two samples,
zero without a previous sample and never negative (a deleted topic, a reset group), and the
store row's gaps are write minus flushed and write minus dispatched; the view draws every row.

Method: Sample values built by hand (top_data's arithmetic is pure), rendered with rich into a
string; the gathering itself runs against real appliances in tests/integration/test_cli_ops.py.
"""

from __future__ import annotations

import io

from rich.console import Console

from mqbox.admin import top_data, top_view
from mqbox.admin.top_data import GroupSample, ProcessSample, Sample, StoreSample, TopicSample


def sample(
    taken_s: float,
    stored_total: int,
    committed_total: int,
    write_bytes: int,
    *,
    topic: str = "Orders",
) -> Sample:
    return Sample(
        taken_s=taken_s,
        namesrv="127.0.0.1:9876",
        topics=(TopicSample(topic, 4, stored_total, stored_total - 10),),
        groups=(GroupSample("CG", topic, committed_total, stored_total - committed_total, 2),),
        processes=(ProcessSample("send.0", "send", 42, "ready", 12.5, 30 << 20, 200 << 20),),
        store=StoreSample(0, write_bytes, write_bytes - 100, write_bytes - 300, stored_total),
        problems=(),
    )


def test_rates_are_changes_per_second_between_two_samples() -> None:
    shown = top_data.frame(sample(12.0, 1300, 900, 8000), sample(10.0, 1100, 500, 4000))
    assert shown.interval_s == 2.0
    (topic,) = shown.topics
    assert (topic.put_per_s, topic.stored_now, topic.queue_count) == (100.0, 1290, 4)
    (group,) = shown.groups
    assert (group.get_per_s, group.lag, group.consumer_count) == (200.0, 400, 2)
    assert shown.store is not None
    assert shown.store.write_bytes_per_s == 2000.0
    assert shown.store.append_records_per_s == 100.0
    assert (shown.store.unflushed_bytes, shown.store.undispatched_bytes) == (100, 300)


def test_a_first_frame_has_no_rates() -> None:
    shown = top_data.frame(sample(10.0, 1100, 500, 4000))
    assert shown.interval_s == 0.0
    assert shown.topics[0].put_per_s == 0.0
    assert shown.groups[0].get_per_s == 0.0
    assert shown.store is not None
    assert shown.store.write_bytes_per_s == 0.0


def test_a_rate_never_goes_negative_and_new_rows_start_at_zero() -> None:
    shown = top_data.frame(sample(11.0, 50, 10, 4000), sample(10.0, 1100, 500, 4000))
    assert shown.topics[0].put_per_s == 0.0  # the topic was deleted and made again
    assert shown.groups[0].get_per_s == 0.0  # the group was reset to an earlier offset
    renamed = top_data.frame(sample(11.0, 50, 10, 4000, topic="New"), sample(10.0, 1, 1, 1))
    assert renamed.topics[0].put_per_s == 0.0


def test_system_topics_are_recognised() -> None:
    for topic in ("TBW102", "SCHEDULE_TOPIC_XXXX", "%RETRY%CG", "RMQ_SYS_TRACE_TOPIC"):
        assert top_data.is_system_topic(topic)
    assert top_data.is_system_topic("DefaultCluster", {"DefaultCluster", "broker-a"})
    for topic in ("Orders", "%DLQ%CG"):
        assert not top_data.is_system_topic(topic, {"DefaultCluster"})


def test_the_view_draws_every_row() -> None:
    shown = top_data.frame(sample(12.0, 1150, 520, 8000), sample(10.0, 1100, 500, 4000))
    output = io.StringIO()
    Console(file=output, width=160).print(top_view.render(shown))
    text = output.getvalue()
    for fact in (
        "Orders",
        "CG",
        "send.0",
        "25.0",
        "10.0",
        "12.5",
        "rates over 2.0 s",
        "+2.0 KB/s",
    ):
        assert fact in text, text

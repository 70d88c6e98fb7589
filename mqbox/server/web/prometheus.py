"""/metrics: the broker's figures in Prometheus' text exposition format (version 0.0.4).

Owns: the metric names, types, help texts and labels (docs/metrics.md lists them), and their
rendering. Never: reads shared memory or files itself (`BrokerSources` does), or keeps state.

Names follow rocketmq-exporter where it has one (rocketmq_broker_tps, rocketmq_producer_tps,
rocketmq_consumer_tps, rocketmq_group_diff, rocketmq_brokeruntime_*), so dashboards built for it
find their series; those are gauges of rates, computed as the exporter's are (over the last
minute). mqbox's own counters and histograms (mqbox_*) are the raw totals, for PromQL's rate().
Every series carries `cluster` and `broker` labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from mqbox.server.statistics import BUCKET_BOUNDS_NS, Histogram, Totals
from mqbox.server.statistics_history import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
)
from mqbox.server.web.sources import BrokerSources

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

Labels = Mapping[str, str | int]


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if value != value:  # NaN
        return "NaN"
    return repr(float(value))


class _Writer:
    """Collects families, each with its HELP and TYPE lines and its samples kept together (the
    format wants one group per family, whatever order they were added in)."""

    def __init__(self, base_labels: Labels) -> None:
        self._base = dict(base_labels)
        self._families: dict[str, list[str]] = {}

    def family(self, name: str, kind: str, help_text: str) -> None:
        if name not in self._families:
            self._families[name] = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(
        self, name: str, value: float, labels: Labels | None = None, family: str | None = None
    ) -> None:
        merged = {**self._base, **(labels or {})}
        text = ",".join(f'{key}="{escape_label_value(str(item))}"' for key, item in merged.items())
        self._families[family or name].append(f"{name}{{{text}}} {_format_value(value)}")

    def one(
        self, name: str, kind: str, help_text: str, value: float, labels: Labels | None = None
    ) -> None:
        self.family(name, kind, help_text)
        self.sample(name, value, labels)

    def histogram(self, name: str, help_text: str, histogram: Histogram) -> None:
        self.family(name, "histogram", help_text)
        cumulative = 0
        for bound_ns, count in zip(BUCKET_BOUNDS_NS, histogram.bucket_counts, strict=False):
            cumulative += count
            self.sample(f"{name}_bucket", cumulative, {"le": repr(bound_ns / 1e9)}, name)
        self.sample(f"{name}_bucket", histogram.count, {"le": "+Inf"}, name)
        self.sample(f"{name}_sum", histogram.sum_ns / 1e9, None, name)
        self.sample(f"{name}_count", histogram.count, None, name)

    def text(self) -> str:
        return "".join(line + "\n" for lines in self._families.values() for line in lines)


def render(sources: BrokerSources) -> str:
    """The whole /metrics page."""
    identity = sources.identity()
    writer = _Writer({"cluster": identity["cluster"], "broker": identity["broker"]})
    with sources.lock:
        history = sources.history
        totals = history.latest
        processes = list(sources.processes)
        cluster = history.cluster_name
        broker_put_tps = history.rate(BROKER_PUT_NUMS, cluster)
        broker_get_tps = history.rate(BROKER_GET_NUMS, cluster)
        topic_rates = {
            topic: (history.rate(TOPIC_PUT_NUMS, topic), history.rate(TOPIC_PUT_SIZE, topic))
            for topic in (totals.puts if totals else {})
        }
        group_rates = {
            key: (history.rate(GROUP_GET_NUMS, key), history.rate(GROUP_GET_SIZE, key))
            for key in (totals.gets if totals else {})
        }
        runtime = history.runtime_info()
    assert totals is not None, "BrokerSources samples once before it serves"
    _render_exporter(writer, sources, broker_put_tps, broker_get_tps, topic_rates, group_rates)
    _render_runtime(writer, sources, runtime)
    _render_totals(writer, totals)
    _render_store(writer, sources)
    _render_processes(writer, processes)
    return writer.text()


def _render_exporter(
    writer: _Writer,
    sources: BrokerSources,
    broker_put_tps: float,
    broker_get_tps: float,
    topic_rates: Mapping[str, tuple[float, float]],
    group_rates: Mapping[str, tuple[float, float]],
) -> None:
    writer.one("rocketmq_broker_tps", "gauge", "BrokerPutNums", broker_put_tps)
    writer.one("rocketmq_broker_qps", "gauge", "BrokerGetNums", broker_get_tps)
    writer.family("rocketmq_producer_tps", "gauge", "TopicPutNums")
    for topic, (tps, _) in sorted(topic_rates.items()):
        writer.sample("rocketmq_producer_tps", tps, {"topic": topic})
    writer.family("rocketmq_producer_message_size", "gauge", "TopicPutMessageSize")
    for topic, (_, size_rate) in sorted(topic_rates.items()):
        writer.sample("rocketmq_producer_message_size", size_rate, {"topic": topic})
    writer.family("rocketmq_producer_offset", "counter", "TopicOffset")
    for topic, config in sorted(sources.topics().items()):
        writer.sample(
            "rocketmq_producer_offset",
            sum(sources.topic_queue_maxes(topic, config)),
            {"topic": topic},
        )
    writer.family("rocketmq_consumer_tps", "gauge", "GroupGetNums")
    writer.family("rocketmq_consumer_message_size", "gauge", "GroupGetMessageSize")
    for key, (tps, size_rate) in sorted(group_rates.items()):
        topic, _, group = key.partition("@")
        labels = {"topic": topic, "group": group}
        writer.sample("rocketmq_consumer_tps", tps, labels)
        writer.sample("rocketmq_consumer_message_size", size_rate, labels)
    lag_by_group: dict[tuple[str, str], list[int]] = {}
    writer.family(
        "mqbox_group_queue_lag",
        "gauge",
        "Messages a group has yet to consume in one queue (from the saved consumerOffset.json)",
    )
    for group, topic, queue_id, broker_max, committed in sources.lags():
        lag = max(0, broker_max - committed)
        writer.sample(
            "mqbox_group_queue_lag", lag, {"group": group, "topic": topic, "queue_id": queue_id}
        )
        sums = lag_by_group.setdefault((group, topic), [0, 0, 0])
        sums[0] += lag
        sums[1] += committed
        sums[2] += broker_max
    writer.family("rocketmq_group_diff", "gauge", "GroupDiff")
    writer.family("rocketmq_consumer_offset", "counter", "GroupOffset")
    for (group, topic), (lag, committed, _) in sorted(lag_by_group.items()):
        labels = {"group": group, "topic": topic}
        writer.sample("rocketmq_group_diff", lag, labels)
        writer.sample("rocketmq_consumer_offset", committed, labels)


def _render_runtime(writer: _Writer, sources: BrokerSources, runtime: Mapping[str, str]) -> None:
    labels = {"brokerIP": sources.ctx.broker_address}
    for key, name in (
        ("putTps", "rocketmq_brokeruntime_put_tps"),
        ("getFoundTps", "rocketmq_brokeruntime_getfound_tps"),
        ("getTransferedTps", "rocketmq_brokeruntime_gettransfered_tps"),
        ("getTotalTps", "rocketmq_brokeruntime_gettotal_tps"),
        ("getMissTps", "rocketmq_brokeruntime_getmiss_tps"),
    ):
        figures = runtime.get(key, "").split(" ")
        for span, figure in zip(("10", "60", "600"), figures, strict=False):
            writer.one(
                f"{name}{span}",
                "gauge",
                f"brokerRuntime {key} over {span} s",
                float(figure) if figure else 0.0,
                labels,
            )
    for key, name in (
        ("msgPutTotalTodayNow", "rocketmq_brokeruntime_msg_put_total_today_now"),
        ("msgGetTotalTodayNow", "rocketmq_brokeruntime_msg_get_total_today_now"),
        ("putMessageSizeTotal", "rocketmq_brokeruntime_put_message_size_total"),
        ("putLatency99", "rocketmq_brokeruntime_put_latency_99"),
        ("putLatency999", "rocketmq_brokeruntime_put_latency_999"),
    ):
        writer.one(name, "gauge", f"brokerRuntime {key}", float(runtime.get(key) or 0), labels)
    store = sources.store()
    writer.one(
        "rocketmq_brokeruntime_commitlog_max_offset",
        "gauge",
        "brokerRuntimeCommitLogMaxOffset",
        store["write_log_offset_bytes"],
        labels,
    )
    writer.one(
        "rocketmq_brokeruntime_commitlog_min_offset",
        "gauge",
        "brokerRuntimeCommitLogMinOffset",
        store["min_log_offset_bytes"],
        labels,
    )
    writer.one(
        "rocketmq_brokeruntime_commitlog_disk_ratio",
        "gauge",
        "brokerRuntimeCommitLogDiskRatio",
        store["disk_used_ratio"],
        labels,
    )


def _render_totals(writer: _Writer, totals: Totals) -> None:
    writer.family(
        "mqbox_topic_put_messages_total", "counter", "Messages stored into a topic by sends"
    )
    writer.family(
        "mqbox_topic_put_bytes_total", "counter", "Record bytes stored into a topic by sends"
    )
    for topic, counts in sorted(totals.puts.items()):
        writer.sample("mqbox_topic_put_messages_total", counts.messages, {"topic": topic})
        writer.sample("mqbox_topic_put_bytes_total", counts.size_bytes, {"topic": topic})
    writer.family(
        "mqbox_group_get_messages_total", "counter", "Messages a group pulled from a topic"
    )
    writer.family(
        "mqbox_group_get_bytes_total", "counter", "Record bytes a group pulled from a topic"
    )
    for key, counts in sorted(totals.gets.items()):
        topic, _, group = key.partition("@")
        labels = {"topic": topic, "group": group}
        writer.sample("mqbox_group_get_messages_total", counts.messages, labels)
        writer.sample("mqbox_group_get_bytes_total", counts.size_bytes, labels)
    for name, value in sorted(totals.scalars.items()):
        writer.one(
            f"mqbox_{name}_total", "counter", f"Broker total: {name.replace('_', ' ')}", value
        )
    writer.one(
        "mqbox_statistics_dropped_total",
        "counter",
        "Events whose key found no free statistics slot",
        totals.dropped_count,
    )
    writer.histogram(
        "mqbox_send_latency_seconds",
        "From the send processor taking a send to its answer",
        totals.histograms["send_latency"],
    )
    writer.histogram(
        "mqbox_flush_latency_seconds",
        "One commit-log flush (msync) that wrote something",
        totals.histograms["flush_latency"],
    )


def _render_store(writer: _Writer, sources: BrokerSources) -> None:
    store = sources.store()
    for key, help_text in (
        ("write_log_offset_bytes", "Commit log write position"),
        ("flushed_log_offset_bytes", "Commit log flushed position"),
        ("min_log_offset_bytes", "Commit log minimum (retention)"),
        ("dispatched_log_offset_bytes", "Position the dispatcher indexed up to"),
        ("commit_log_disk_bytes", "Disk blocks of the commit log's segments"),
        ("disk_total_bytes", "Size of the store's file system"),
        ("disk_free_bytes", "Free bytes of the store's file system"),
    ):
        writer.one(f"mqbox_store_{key}", "gauge", help_text, store[key])
    writer.family("mqbox_ring_used_bytes", "gauge", "Bytes not yet released in a ring")
    writer.family("mqbox_ring_capacity_bytes", "gauge", "A ring's capacity")
    rings = sources.rings()
    for ring in rings:
        labels = {"producer": ring["producer"], "consumer": ring["consumer"]}
        writer.sample("mqbox_ring_used_bytes", ring["used_bytes"], labels)
        writer.sample("mqbox_ring_capacity_bytes", ring["capacity_bytes"], labels)


def _render_processes(writer: _Writer, processes: Iterable[Mapping[str, object]]) -> None:
    writer.family("mqbox_role_up", "gauge", "1 while the role's process runs")
    writer.family(
        "mqbox_role_cpu_percent",
        "gauge",
        "CPU of the role's process over the last second, percent of one core",
    )
    writer.family("mqbox_role_rss_bytes", "gauge", "Resident memory of the role's process")
    for process in processes:
        labels = {"role": str(process["role"]), "kind": str(process["kind"])}
        writer.sample("mqbox_role_up", 1 if process["up"] else 0, labels)
        if process["up"]:
            writer.sample("mqbox_role_cpu_percent", float(str(process["cpu_percent"])), labels)
            writer.sample("mqbox_role_rss_bytes", int(str(process["rss_bytes"])), labels)

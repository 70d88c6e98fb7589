"""Rates from periodic snapshots of the statistics block, RocketMQ's way.

Owns: `StatisticsHistory` (samples of `statistics.Totals` taken once a second by one reader, the
services role's sampler thread), the rates over 10 s / 1 min / 10 min, RocketMQ's stats items
(`stats_items`: the minute, hour and day windows of VIEW_BROKER_STATS_DATA, 315) and the
statistics keys of GET_BROKER_RUNTIME_INFO (28, `runtime_info`), and the document the sampler
publishes for other processes (`published_document`; the admin processor answers 315 from it).
Never: reads shared memory itself (callers pass Totals), a clock (callers pass `now_ms`), or a
lock (one thread samples and reads; others read the published document).

RocketMQ's StatsItem keeps, per key, (time, value, times) samples and answers a window with the
newest sample against the oldest one inside it: sum = value difference, tps = sum * 1000 /
time difference, avgpt = sum / times difference (0 when no call happened). Its StoreStatsService
samples broker totals every second and gives putTps etc. as three TPS figures over the last 10,
60 and 600 samples, space-separated (an empty figure until enough samples exist). mqbox keeps
per-key samples every second for a minute, every minute for an hour and every hour for a day,
and broker totals every second for 600 s; the windows are those spans.

Stats names and keys, as RocketMQ's BrokerStatsManager builds them: TOPIC_PUT_NUMS and
TOPIC_PUT_SIZE keyed by topic; GROUP_GET_NUMS and GROUP_GET_SIZE keyed by "topic@group";
BROKER_PUT_NUMS and BROKER_GET_NUMS keyed by the broker's cluster name.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from mqbox.server.statistics import BUCKET_BOUNDS_NS, Totals

TOPIC_PUT_NUMS: Final = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE: Final = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS: Final = "GROUP_GET_NUMS"
GROUP_GET_SIZE: Final = "GROUP_GET_SIZE"
BROKER_PUT_NUMS: Final = "BROKER_PUT_NUMS"
BROKER_GET_NUMS: Final = "BROKER_GET_NUMS"
STATS_NAMES: Final = (
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    BROKER_PUT_NUMS,
    BROKER_GET_NUMS,
)

SECOND_SAMPLE_COUNT: Final = 61  # per key: one minute
MINUTE_SAMPLE_COUNT: Final = 61  # per key: one hour
HOUR_SAMPLE_COUNT: Final = 25  # per key: one day
BROKER_SAMPLE_COUNT: Final = 601  # broker totals: RocketMQ's 600-sample TPS
TPS_SPANS: Final = (10, 60, 600)

STATISTICS_FILE_NAME: Final = "broker-statistics.json"  # in <home>/run/, the sampler's

# (value, times) per (stats name, key)
Items = dict[tuple[str, str], tuple[int, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class WindowStats:
    """One window of one stats item: RocketMQ's BrokerStatsItem."""

    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict[str, Any]:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


def items_of(totals: Totals, cluster_name: str) -> Items:
    """The stats items of one snapshot (module docstring has the names and keys)."""
    items: Items = {}
    for topic, counts in totals.puts.items():
        items[(TOPIC_PUT_NUMS, topic)] = (counts.messages, counts.requests)
        items[(TOPIC_PUT_SIZE, topic)] = (counts.size_bytes, counts.requests)
    for key, counts in totals.gets.items():
        items[(GROUP_GET_NUMS, key)] = (counts.messages, counts.requests)
        items[(GROUP_GET_SIZE, key)] = (counts.size_bytes, counts.requests)
    scalars = totals.scalars
    put_requests = scalars["send_requests"] - scalars["send_refused"]
    items[(BROKER_PUT_NUMS, cluster_name)] = (scalars["put_messages"], put_requests)
    items[(BROKER_GET_NUMS, cluster_name)] = (scalars["get_messages"], scalars["pull_found"])
    return items


def window(first: tuple[int, int, int], last: tuple[int, int, int]) -> WindowStats:
    """RocketMQ's StatsItem.computeStatsData over two (time ms, value, times) samples."""
    sum_value = last[1] - first[1]
    span_ms = last[0] - first[0]
    tps = sum_value * 1000.0 / span_ms if span_ms > 0 else 0.0
    times = last[2] - first[2]
    return WindowStats(sum_value, tps, sum_value / times if times > 0 else 0.0)


class StatisticsHistory:
    """Samples of the totals and what they answer (module docstring)."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._seconds: collections.deque[tuple[int, Items]] = collections.deque(
            maxlen=SECOND_SAMPLE_COUNT
        )
        self._minutes: collections.deque[tuple[int, Items]] = collections.deque(
            maxlen=MINUTE_SAMPLE_COUNT
        )
        self._hours: collections.deque[tuple[int, Items]] = collections.deque(
            maxlen=HOUR_SAMPLE_COUNT
        )
        self._broker: collections.deque[tuple[int, dict[str, int]]] = collections.deque(
            maxlen=BROKER_SAMPLE_COUNT
        )
        self.latest: Totals | None = None
        self.latest_ms = 0

    def sample(self, now_ms: int, totals: Totals) -> None:
        """Take one sample (call once a second)."""
        items = items_of(totals, self.cluster_name)
        self._seconds.append((now_ms, items))
        if not self._minutes or now_ms - self._minutes[-1][0] >= 60_000:
            self._minutes.append((now_ms, items))
        if not self._hours or now_ms - self._hours[-1][0] >= 3_600_000:
            self._hours.append((now_ms, items))
        self._broker.append((now_ms, dict(totals.scalars)))
        self.latest = totals
        self.latest_ms = now_ms

    @staticmethod
    def _window(samples: collections.deque[tuple[int, Items]], key: tuple[str, str]) -> WindowStats:
        if not samples:
            return WindowStats(0, 0.0, 0.0)
        last_ms, last_items = samples[-1]
        first_ms, first_items = samples[0]
        last_value, last_times = last_items.get(key, (0, 0))
        first_value, first_times = first_items.get(key, (0, 0))
        return window((first_ms, first_value, first_times), (last_ms, last_value, last_times))

    def stats_item(self, stats_name: str, stats_key: str) -> dict[str, WindowStats] | None:
        """315's BrokerStatsData (statsMinute, statsHour, statsDay); None for an unknown item
        (the broker answers SYSTEM_ERROR "The stats <name> <key> not exist", as Java)."""
        key = (stats_name, stats_key)
        if not self._seconds or key not in self._seconds[-1][1]:
            return None
        # The hour and day windows end at the newest second sample.
        newest = self._seconds[-1]
        hour = collections.deque([*self._minutes, newest])
        day = collections.deque([*self._hours, newest])
        return {
            "statsMinute": self._window(self._seconds, key),
            "statsHour": self._window(hour, key),
            "statsDay": self._window(day, key),
        }

    def rate(self, stats_name: str, stats_key: str, span_s: int = 60) -> float:
        """Per-second rate of an item over the last `span_s` seconds (at most 60)."""
        samples = list(self._seconds)[-(span_s + 1) :]
        if len(samples) < 2:
            return 0.0
        key = (stats_name, stats_key)
        first = samples[0]
        last = samples[-1]
        first_value = first[1].get(key, (0, 0))
        last_value = last[1].get(key, (0, 0))
        return window((first[0], *first_value), (last[0], *last_value)).tps

    def broker_tps(self, scalar: str, span: int) -> str:
        """A broker total's TPS over the last `span` samples, "" until there are enough."""
        samples = self._broker
        if len(samples) <= span:
            return ""
        first_ms, first = samples[-(span + 1)]
        last_ms, last = samples[-1]
        return str(window((first_ms, first[scalar], 0), (last_ms, last[scalar], 0)).tps)

    def _tps_triplet(self, scalar: str) -> str:
        return " ".join(self.broker_tps(scalar, span) for span in TPS_SPANS)

    def runtime_info(self) -> dict[str, str]:
        """The statistics keys of GET_BROKER_RUNTIME_INFO (28), every value a string as Java
        sends them: putTps, getFoundTps, getMissTps, getTotalTps, getTransferedTps ("tps10
        tps60 tps600"), putMessageTimesTotal, putMessageSizeTotal, putMessageAverageSize,
        putMessageFailedTimes, putLatency99, putLatency999 (ms, from the send histogram: the
        upper bound of the bucket the percentile falls in), putMessageDistributeTime."""
        totals = self.latest
        if totals is None:
            return {}
        scalars = totals.scalars
        put_count = max(1, scalars["put_messages"])
        histogram = totals.histograms["send_latency"]
        return {
            "putTps": self._tps_triplet("put_messages"),
            "getFoundTps": self._tps_triplet("pull_found"),
            "getMissTps": self._tps_triplet("pull_missed"),
            "getTotalTps": self._tps_triplet("pull_requests"),
            "getTransferedTps": self._tps_triplet("get_messages"),
            "putMessageTimesTotal": str(put_count),
            "putMessageSizeTotal": str(scalars["put_bytes"]),
            "putMessageAverageSize": str(scalars["put_bytes"] / put_count),
            "putMessageFailedTimes": str(scalars["send_refused"]),
            "putLatency99": f"{percentile_ms(histogram.bucket_counts, 0.99):.2f}",
            "putLatency999": f"{percentile_ms(histogram.bucket_counts, 0.999):.2f}",
            "putMessageDistributeTime": distribute_time(histogram.bucket_counts),
            "msgPutTotalTodayNow": str(scalars["put_messages"]),
            "msgGetTotalTodayNow": str(scalars["get_messages"]),
        }

    def published_document(self) -> dict[str, Any]:
        """What the sampler writes for other processes: the runtime keys and every stats item
        (module docstring)."""
        items: dict[str, dict[str, Any]] = {}
        if self._seconds:
            for stats_name, stats_key in self._seconds[-1][1]:
                data = self.stats_item(stats_name, stats_key)
                assert data is not None
                items.setdefault(stats_name, {})[stats_key] = {
                    name: value.to_json() for name, value in data.items()
                }
        return {"sampled_at_ms": self.latest_ms, "runtime": self.runtime_info(), "stats": items}


def percentile_ms(bucket_counts: tuple[int, ...], fraction: float) -> float:
    """The upper bound (ms) of the bucket holding the `fraction` percentile; the last finite
    bound for the +Inf bucket; 0 with no observations."""
    total = sum(bucket_counts)
    if total == 0:
        return 0.0
    rank = fraction * total
    seen = 0
    for index, count in enumerate(bucket_counts):
        seen += count
        if seen >= rank:
            bound_index = min(index, len(BUCKET_BOUNDS_NS) - 1)
            return BUCKET_BOUNDS_NS[bound_index] / 1e6
    return BUCKET_BOUNDS_NS[-1] / 1e6


def distribute_time(bucket_counts: tuple[int, ...]) -> str:
    """putMessageDistributeTime in mqbox's buckets: "[<=0.1ms]:n [<=0.25ms]:n ... [>10000ms]:n"."""
    parts = [
        f"[<={bound / 1e6:g}ms]:{count}"
        for bound, count in zip(BUCKET_BOUNDS_NS, bucket_counts, strict=False)
    ]
    parts.append(f"[>{BUCKET_BOUNDS_NS[-1] / 1e6:g}ms]:{bucket_counts[-1]}")
    return " ".join(parts)


def stats_item_from_document(
    document: Mapping[str, Any] | None, stats_name: str, stats_key: str
) -> dict[str, Any] | None:
    """The published BrokerStatsData of one item, or None (no document, unknown item)."""
    if document is None:
        return None
    stats = document.get("stats")
    if not isinstance(stats, dict):
        return None
    by_key = stats.get(stats_name)
    if not isinstance(by_key, dict):
        return None
    item = by_key.get(stats_key)
    return item if isinstance(item, dict) else None


def statistics_file_path(home: Path) -> Path:
    """Where the sampler publishes its document (the home's run directory)."""
    return home / "run" / STATISTICS_FILE_NAME


def runtime_info_from_document(document: Mapping[str, Any] | None) -> dict[str, str]:
    """The published statistics keys of GET_BROKER_RUNTIME_INFO (28), for its handler to merge
    into the other runtime keys; {} before the sampler's first write."""
    if document is None:
        return {}
    runtime = document.get("runtime")
    if not isinstance(runtime, dict):
        return {}
    return {str(key): str(value) for key, value in runtime.items()}

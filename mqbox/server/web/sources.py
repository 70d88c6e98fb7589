"""What the HTTP endpoint shows, read from where each fact lives, and the once-a-second sampler.

Owns: `BrokerSources` (read-only views of the statistics block, the control block's pids, the
store positions and queue counters in shared memory, the rings' headers, topics.json,
subscriptionGroup.json, consumerOffset.json, the disk, and /proc/<pid>/stat of the role pids)
and its sampler thread, which takes one statistics snapshot a second into a `StatisticsHistory`,
keeps per-topic series for the dashboard's charts, measures every role's CPU and memory, and
publishes the 315 / 28 document (`run/broker-statistics.json`, read by the admin processor).
Never: writes anything a role owns (it only reads), or speaks HTTP (server.py does).

The sampler's cost is the idle broker's largest timer (issue 15: under 1 % of a core with no
request in flight), so each second stays cheap: one read of /proc/<pid>/stat per role instead
of psutil's three files and its objects (about 10x less CPU), and the document is rewritten
only when one of its figures changed (a quiet broker's windows stop moving once they hold no
activity), so `sampled_at_ms` in it is the sample its figures come from.

Lag is computed from admin.0's saved consumerOffset.json (saved at most every 5 s while offsets
change, docs/metrics.md) against the dispatcher's per-queue counts, so it may be up to that much
behind; the dashboard's group page asks the broker itself (GET_CONSUME_STATS 208,
GET_CONSUMER_CONNECTION_LIST 203) for the live figure and the members.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

import orjson

from mqbox.clock import wall_clock_ms
from mqbox.errors import MqboxError
from mqbox.ipc.ring import ring_occupancy
from mqbox.resources import process_stat_fields
from mqbox.run_files import write_bytes_atomically
from mqbox.server import statistics
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    store_positions_name,
)
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics_history import StatisticsHistory, statistics_file_path
from mqbox.store import config_files
from mqbox.store.layout import config_dir

log = logging.getLogger("mqbox.web")

SAMPLE_INTERVAL_S: Final = 1.0
# The 315 / 28 document is rewritten every second, or every 10 s once more than this many keys
# are counted (it holds three windows of every key).
PUBLISH_INTERVAL_MS: Final = 1000
PUBLISH_ITEM_COUNT_FAST: Final = 2000
CHART_SAMPLE_COUNT: Final = 301  # five minutes of per-second points for the dashboard charts
CLOCK_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")  # the unit of /proc/<pid>/stat's times
PAGE_SIZE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")  # the unit of its resident set
MQBOX_VERSION: Final = "0.1.0"
ROCKETMQ_VERSION_DESC: Final = "V4_9_4"  # the protocol mqbox answers as (docs/protocol.md)


class BrokerSources:
    """Read-only views of the broker for the endpoint, plus the sampler (module docstring)."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        assert ctx.statistics is not None, "the endpoint runs in a broker role"
        self.block = ctx.statistics
        self.history = StatisticsHistory(ctx.broker.broker_cluster_name)
        # Attached on first use: a topology without a store writer or dispatcher (tests' stand-in
        # roles) has no segments, and then the figures read 0.
        self._positions: StorePositions | None = None
        self._counters: QueueCounters | None = None
        self.started_at_ms = wall_clock_ms()
        self.lock = threading.Lock()  # the sampler's state against the HTTP threads
        # (time ms, put msgs, get msgs) per second, and per topic (time ms, {topic: put msgs})
        self.broker_series: collections.deque[tuple[int, int, int]] = collections.deque(
            maxlen=CHART_SAMPLE_COUNT
        )
        self.topic_series: collections.deque[tuple[int, dict[str, int]]] = collections.deque(
            maxlen=CHART_SAMPLE_COUNT
        )
        self.processes: list[dict[str, Any]] = []
        # pid -> (its start time, CPU clock ticks, monotonic ns) at the last sample
        self._cpu_seen: dict[int, tuple[int, int, int]] = {}
        self._published = b""  # the figures of the last document written, serialized
        self._stopping = threading.Event()
        self._published_at_ms = 0
        self._thread: threading.Thread | None = None
        self.sample_once()

    # -- the sampler -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mqbox-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stopping.wait(SAMPLE_INTERVAL_S):
            try:
                self.sample_once()
            except (OSError, MqboxError, ValueError):
                log.exception("statistics sample failed")

    def sample_once(self) -> None:
        """One sample: totals into the history and the chart series, role CPU and memory, and
        the published 315 / 28 document."""
        now_ms = wall_clock_ms()
        totals = statistics.read_totals(self.block)
        processes = self._measure_processes()
        with self.lock:
            self.history.sample(now_ms, totals)
            scalars = totals.scalars
            self.broker_series.append((now_ms, scalars["put_messages"], scalars["get_messages"]))
            self.topic_series.append(
                (now_ms, {topic: counts.messages for topic, counts in totals.puts.items()})
            )
            self.processes = processes
            item_count = len(totals.puts) + len(totals.gets)
            interval_ms = PUBLISH_INTERVAL_MS if item_count <= PUBLISH_ITEM_COUNT_FAST else 10_000
            if now_ms - self._published_at_ms < interval_ms:
                return
            self._published_at_ms = now_ms
            document = self.history.published_document()
            figures = serialized([document["runtime"], document["stats"]])
            if figures == self._published:
                return  # nothing moved: the file keeps the sample its figures come from
            self._published = figures
        write_bytes_atomically(
            statistics_file_path(self.ctx.home), serialized(document, indent=True)
        )

    def _measure_processes(self) -> list[dict[str, Any]]:
        """CPU (percent of one core since the last sample) and RSS of every role's process."""
        control = self.ctx.control
        found: list[dict[str, Any]] = []
        roles = [(role.role_id, role.kind.value) for role in self.ctx.topology.roles]
        pids = [("supervisor", "supervisor", os.getppid())]
        if control is not None:
            pids += [(role_id, kind, control.pid(role_id)) for role_id, kind in roles]
        now_ns = time.monotonic_ns()
        cpu_seen: dict[int, tuple[int, int, int]] = {}
        for role_id, kind, pid in pids:
            entry: dict[str, Any] = {"role": role_id, "kind": kind, "pid": pid, "up": False}
            stat = read_process_stat(pid) if pid > 0 else None
            if stat is not None:
                start_ticks, cpu_ticks, thread_count, rss_pages = stat
                cpu_percent = 0.0  # the first sample of a process only starts its clock
                seen = self._cpu_seen.get(pid)
                if seen is not None and seen[0] == start_ticks and now_ns > seen[2]:
                    cpu_s = (cpu_ticks - seen[1]) / CLOCK_TICKS_PER_S
                    cpu_percent = round(cpu_s / ((now_ns - seen[2]) / 1e9) * 100, 1)
                cpu_seen[pid] = (start_ticks, cpu_ticks, now_ns)
                entry.update(
                    up=True,
                    cpu_percent=cpu_percent,
                    rss_bytes=rss_pages * PAGE_SIZE_BYTES,
                    thread_count=thread_count,
                )
            found.append(entry)
        self._cpu_seen = cpu_seen
        return found

    # -- reads (any thread) ----------------------------------------------------------------------

    def _store_views(self) -> tuple[StorePositions | None, QueueCounters | None]:
        instance = self.ctx.instance
        if self._positions is None:
            with contextlib.suppress(FileNotFoundError):
                self._positions = StorePositions.attach(store_positions_name(instance))
        if self._counters is None:
            with contextlib.suppress(FileNotFoundError):
                self._counters = QueueCounters.attach(queue_counters_name(instance))
        return self._positions, self._counters

    def topics(self) -> dict[str, config_files.TopicConfig]:
        table = config_files.load_topics(
            config_dir(self.ctx.store_root), use_backup_if_corrupt=True
        )
        return dict(table.topics)

    def groups(self) -> list[str]:
        table = config_files.load_subscription_groups(
            config_dir(self.ctx.store_root), use_backup_if_corrupt=True
        )
        return sorted(table.groups)

    def consumer_offsets(self) -> config_files.ConsumerOffsetTable:
        """admin.0's last saved offsets: (topic, group) -> queue_id -> next queue index."""
        return config_files.load_consumer_offsets(
            config_dir(self.ctx.store_root), use_backup_if_corrupt=True
        )

    def queue_max(self, topic: str, queue_id: int) -> int:
        """The queue's entry count as the dispatcher published it (RocketMQ's max offset)."""
        counters = self._store_views()[1]
        if counters is None:
            return 0
        count = counters.entry_count(topic.encode("utf-8", "surrogatepass"), queue_id)
        return count or 0

    def topic_queue_maxes(self, topic: str, config: config_files.TopicConfig) -> list[int]:
        queue_count = max(config.read_queue_nums, config.write_queue_nums)
        return [self.queue_max(topic, queue_id) for queue_id in range(queue_count)]

    def lags(self) -> Iterator[tuple[str, str, int, int, int]]:
        """(group, topic, queue_id, broker max, committed) for every saved offset."""
        for (topic, group), queues in sorted(self.consumer_offsets().items()):
            for queue_id, committed in sorted(queues.items()):
                yield group, topic, queue_id, self.queue_max(topic, queue_id), committed

    def rings(self) -> list[dict[str, Any]]:
        """Every ring's used and capacity bytes, read from its header."""
        found = []
        for spec in self.ctx.topology.rings:
            with contextlib.suppress(OSError):
                used_bytes, capacity_bytes = ring_occupancy(spec.name)
                found.append(
                    {
                        "producer": spec.producer,
                        "consumer": spec.consumer,
                        "used_bytes": used_bytes,
                        "capacity_bytes": capacity_bytes,
                    }
                )
        return found

    def store(self) -> dict[str, Any]:
        """Store positions and disk use."""
        positions, counters = self._store_views()
        store_root = self.ctx.store_root
        commit_log_size_bytes = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(store_root / "commitlog"):
                with contextlib.suppress(OSError):
                    commit_log_size_bytes += entry.stat().st_blocks * 512
        try:
            total_bytes, _, free_bytes = shutil.disk_usage(store_root)
        except OSError:
            total_bytes = free_bytes = 0
        return {
            "write_log_offset_bytes": positions.write_log_offset_bytes if positions else 0,
            "flushed_log_offset_bytes": positions.flushed_log_offset_bytes if positions else 0,
            "min_log_offset_bytes": positions.min_log_offset_bytes if positions else 0,
            "dispatched_log_offset_bytes": counters.dispatched_log_offset_bytes if counters else 0,
            "commit_log_disk_bytes": commit_log_size_bytes,
            "disk_total_bytes": total_bytes,
            "disk_free_bytes": free_bytes,
            "disk_used_ratio": (total_bytes - free_bytes) / total_bytes if total_bytes else 0.0,
            "store_root": str(store_root),
        }

    def identity(self) -> dict[str, Any]:
        broker = self.broker
        return {
            "cluster": broker.broker_cluster_name,
            "broker": broker.broker_name,
            "broker_id": broker.broker_id,
            "role": broker.broker_role.value,
            "address": self.ctx.broker_address,
            "namesrv_addr": broker.namesrv_addr,
            "version": MQBOX_VERSION,
            "rocketmq_version": ROCKETMQ_VERSION_DESC,
            "started_at_ms": self.started_at_ms,
        }

    def uptime_ms(self) -> int:
        return max(0, wall_clock_ms() - self.started_at_ms)

    def monotonic_s(self) -> float:
        return time.monotonic()


def read_process_stat(pid: int) -> tuple[int, int, int, int] | None:
    """(start time, user + system CPU, thread count, resident pages) of process `pid` from
    /proc/<pid>/stat (proc(5): times in clock ticks); None if it is gone."""
    fields = process_stat_fields(pid)
    if fields is None or len(fields) < 22:
        return None
    # Fields 14 utime, 15 stime, 20 num_threads, 22 starttime, 24 rss, each at index n - 3.
    return int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[17]), int(fields[21])


def serialized(value: object, *, indent: bool = False) -> bytes:
    """`value` as JSON bytes, keys sorted (`indent`: two spaces a level, a final newline). orjson
    costs a tenth of comparing the dicts and a fortieth of json.dumps, which was half of a
    sample's CPU; json takes what orjson refuses (a name with a lone surrogate, which
    statistics.py keeps from the wire)."""
    try:
        options = orjson.OPT_SORT_KEYS
        if indent:
            options |= orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
        return orjson.dumps(value, option=options)
    except TypeError:
        return (json.dumps(value, indent=2 if indent else None, sort_keys=True) + "\n").encode()

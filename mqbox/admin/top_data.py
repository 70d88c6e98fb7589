"""What `mqbox top` shows, gathered in one place: samples of the appliance and the rates between
two of them.

Owns: where each figure comes from today, and the arithmetic that turns two samples into rates.
Never: drawing (admin/top_view.py draws), prints, or writes anything anywhere.

Sources (one `TopSource.sample()` each second):
- brokers and their addresses: the name server's cluster table (106), through a WireSession that
  stays open between samples;
- topics: each broker's topic table (21); a topic's stored total is the sum of its queues' max
  offsets (GET_TOPIC_STATS_INFO, 202), so its put rate is the change of that sum per second;
- consumer groups: the `%RETRY%<group>` topics a broker makes when a consumer group first
  heartbeats, plus the groups named with --group; a group's committed total per topic and its
  lag come from GET_CONSUME_STATS (208), its members from GET_CONSUMER_CONNECTION_LIST (203),
  so its get rate is the change of the
  committed sum per second (what the group acknowledged, as rocketmq-exporter's
  consumer TPS is);
- processes: the pids the supervisor records in `<home>/run/state.json`, measured with psutil
  (CPU since the previous sample, as `top` does) and /proc/PID/smaps_rollup (PSS);
- store positions: the store writer's and the dispatcher's shared words
  (server/queue_counters.py), read-only, when the appliance runs on this host.

When shared-memory statistics or a metrics endpoint exist, they become another `TopSource`
behind the same `Sample`; the view does not change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.admin import broker_ops, ops
from mqbox.client import admin_api
from mqbox.errors import MqboxError
from mqbox.protocol.codes import ResponseCode
from mqbox.server.roles.processors.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    OFFSET_MOVED_EVENT,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)

SYSTEM_TOPICS: Final = frozenset(
    (
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        BENCHMARK_TOPIC,
        OFFSET_MOVED_EVENT,
        SCHEDULE_TOPIC,
        SELF_TEST_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
    )
)
SYSTEM_TOPIC_PREFIXES: Final = (RETRY_GROUP_TOPIC_PREFIX, "RMQ_SYS_")


# ---------------------------------------------------------------------------------------------
# One sample


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSample:
    topic: str
    queue_count: int  # over every broker of the topic
    stored_total: int  # sum of the queues' max offsets: messages ever put, by queue index
    stored_now: int  # sum of (max - min): messages still stored


@dataclasses.dataclass(frozen=True, slots=True)
class GroupSample:
    group: str
    topic: str
    committed_total: int  # sum of the committed queue indexes (queues without one: none)
    lag: int
    consumer_count: int  # live clients of the group the brokers know


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessSample:
    name: str  # "supervisor", "namesrv" or a role id
    kind: str
    pid: int  # 0: down
    state: str
    cpu_percent: float  # since the previous sample (0.0 on the first)
    pss_bytes: int  # Pss_Anon + Pss_Shmem
    rss_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class StoreSample:
    min_log_offset_bytes: int  # the commit log's first byte still kept
    write_log_offset_bytes: int  # appended so far
    flushed_log_offset_bytes: int  # durable so far
    dispatched_log_offset_bytes: int  # indexed into consume queues so far
    appended_record_total: int  # records appended since the store writer started


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    taken_s: float  # time.monotonic() when the sample was taken
    namesrv: str
    topics: tuple[TopicSample, ...]
    groups: tuple[GroupSample, ...]
    processes: tuple[ProcessSample, ...]
    store: StoreSample | None  # None: no appliance of this host's home, or not ready
    problems: tuple[str, ...]  # what could not be read this time, one line each


# ---------------------------------------------------------------------------------------------
# Rates between two samples: what a frame shows


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRow:
    topic: str
    queue_count: int
    stored_now: int
    put_per_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class GroupRow:
    group: str
    topic: str
    consumer_count: int
    lag: int
    get_per_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoreRow:
    store: StoreSample
    write_bytes_per_s: float
    append_records_per_s: float
    unflushed_bytes: int
    undispatched_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    namesrv: str
    interval_s: float  # between the two samples; 0 for a frame from one sample
    topics: tuple[TopicRow, ...]
    groups: tuple[GroupRow, ...]
    processes: tuple[ProcessSample, ...]
    store: StoreRow | None
    problems: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return ops.config_as_dict(self)


def _rate(now: int, before: int | None, interval_s: float) -> float:
    """Change per second; 0 without a previous value, and never negative (a reset, a deleted
    topic or a group moved back shows as 0, not as a negative rate)."""
    if before is None or interval_s <= 0:
        return 0.0
    return max(0, now - before) / interval_s


def frame(current: Sample, previous: Sample | None = None) -> Frame:
    """The rows of `current`, with rates against `previous` (rates 0 without it)."""
    interval_s = current.taken_s - previous.taken_s if previous is not None else 0.0
    put_before = {t.topic: t.stored_total for t in previous.topics} if previous else {}
    get_before = (
        {(g.group, g.topic): g.committed_total for g in previous.groups} if previous else {}
    )
    topics = tuple(
        TopicRow(
            t.topic,
            t.queue_count,
            t.stored_now,
            _rate(t.stored_total, put_before.get(t.topic), interval_s),
        )
        for t in current.topics
    )
    groups = tuple(
        GroupRow(
            g.group,
            g.topic,
            g.consumer_count,
            g.lag,
            _rate(g.committed_total, get_before.get((g.group, g.topic)), interval_s),
        )
        for g in current.groups
    )
    store_row = None
    if current.store is not None:
        store = current.store
        before = previous.store if previous is not None else None
        store_row = StoreRow(
            store,
            _rate(
                store.write_log_offset_bytes,
                before.write_log_offset_bytes if before else None,
                interval_s,
            ),
            _rate(
                store.appended_record_total,
                before.appended_record_total if before else None,
                interval_s,
            ),
            max(0, store.write_log_offset_bytes - store.flushed_log_offset_bytes),
            max(0, store.write_log_offset_bytes - store.dispatched_log_offset_bytes),
        )
    return Frame(
        current.namesrv,
        interval_s,
        topics,
        groups,
        current.processes,
        store_row,
        current.problems,
    )


# ---------------------------------------------------------------------------------------------
# The source of today: the wire, run/state.json, psutil, shared memory


def is_system_topic(topic: str, named_topics: Collection[str] = ()) -> bool:
    """RocketMQ's own topics, and `named_topics` (the cluster- and broker-named ones a broker
    makes): hidden unless asked."""
    return (
        topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIXES) or topic in named_topics
    )


class TopSource:
    """Takes samples of one appliance: over the wire through `namesrv`, and on this host from the
    run files of `home`. A context manager (it keeps its connections between samples)."""

    def __init__(
        self,
        namesrv: ops.NamesrvAddress,
        home: Path,
        *,
        groups: Iterable[str] = (),
        all_topics: bool = False,
    ) -> None:
        self.home: Final = home
        self._session = broker_ops.WireSession(namesrv)
        self._named_groups: Final = tuple(groups)
        self._all_topics: Final = all_topics
        self._processes: dict[tuple[int, float | None], psutil.Process] = {}

    def __enter__(self) -> TopSource:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._session.close()

    def sample(self) -> Sample:
        """Everything `top` shows, now. What cannot be read is named in `problems` (a broker
        down, a stopped appliance), never raised: a live view keeps going."""
        problems: list[str] = []
        topics: list[TopicSample] = []
        groups: list[GroupSample] = []
        try:
            topics, groups = self._wire(problems)
        except MqboxError as error:
            problems.append(" ".join(str(error).split()))
        state = ops.running_state(self.home)
        processes = self._measure(state) if state is not None else ()
        store = _store_sample(state) if state is not None else None
        if state is None:
            problems.append(f"no appliance runs in {self.home}: no processes or store shown")
        return Sample(
            time.monotonic(),
            self._session.namesrv_addr,
            tuple(topics),
            tuple(groups),
            processes,
            store,
            tuple(problems),
        )

    # -- over the wire -------------------------------------------------------------------------

    def _wire(self, problems: list[str]) -> tuple[list[TopicSample], list[GroupSample]]:
        session = self._session
        brokers = session.brokers()
        targets = sorted(
            (
                target
                for broker in brokers.values()
                if (target := broker_ops.read_target(broker)) is not None
            ),
            key=lambda target: target.name,
        )
        named_topics = set(brokers) | {broker.cluster for broker in brokers.values()}
        topic_queues: dict[str, list[tuple[int, int]]] = {}  # topic -> [(min, max)] per queue
        group_names: set[str] = set(self._named_groups)
        for target in targets:
            try:
                table = session.ask_broker(target, admin_api.all_topic_config).topic_config_table
                for topic in sorted(table):
                    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                        group_names.add(topic.removeprefix(RETRY_GROUP_TOPIC_PREFIX))
                    if not self._all_topics and is_system_topic(topic, named_topics):
                        continue
                    bounds = self._queue_bounds(target, topic, problems)
                    if bounds:
                        topic_queues.setdefault(topic, []).extend(bounds)
            except MqboxError as error:  # the broker cannot be reached: the next one may
                problems.append(" ".join(str(error).split()))
        topics = [
            TopicSample(
                topic,
                len(queues),
                sum(high for _, high in queues),
                sum(max(0, high - low) for low, high in queues),
            )
            for topic, queues in sorted(topic_queues.items())
        ]
        groups = self._groups(targets, sorted(group_names), problems)
        return topics, groups

    def _queue_bounds(
        self, target: broker_ops.BrokerTarget, topic: str, problems: list[str]
    ) -> list[tuple[int, int]]:
        """(min, max) offset of each queue of `topic` on `target`; none for a topic deleted
        since the broker listed it, and a problem for any other refusal."""
        try:
            status = self._session.ask_broker(target, admin_api.topic_status, topic)
        except broker_ops.BrokerAnswerError as error:
            if error.code != ResponseCode.TOPIC_NOT_EXIST:
                problems.append(" ".join(str(error).split()))
            return []
        return [(queue.queue_index_min, queue.queue_index_max) for queue in status.queues]

    def _groups(
        self, targets: list[broker_ops.BrokerTarget], names: list[str], problems: list[str]
    ) -> list[GroupSample]:
        """Per (group, topic): committed total, lag and live consumers over every broker."""
        totals: dict[tuple[str, str], list[int]] = {}  # -> [committed, lag]
        clients: dict[str, set[str]] = {}
        for group in names:
            for target in targets:
                try:
                    progress = self._session.ask_broker(
                        target, admin_api.consume_stats, group, None
                    )
                    members = self._session.ask_broker(
                        target, admin_api.consumer_connections, group
                    )
                except broker_ops.BrokerAnswerError as error:
                    if error.code != ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST:
                        problems.append(" ".join(str(error).split()))
                    continue
                except MqboxError as error:
                    problems.append(" ".join(str(error).split()))
                    continue
                clients.setdefault(group, set()).update(member.client_id for member in members)
                for queue in progress.queues:
                    if queue.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not self._all_topics:
                        continue
                    entry = totals.setdefault((group, queue.topic), [0, 0])
                    entry[0] += max(0, queue.consumer_queue_index)
                    entry[1] += queue.lag
        return [
            GroupSample(group, topic, committed, lag, len(clients.get(group, ())))
            for (group, topic), (committed, lag) in sorted(totals.items())
        ]

    # -- on this host --------------------------------------------------------------------------

    def _measure(self, state: Mapping[str, Any]) -> tuple[ProcessSample, ...]:
        """Every process the state lists, CPU since the previous sample of the same process."""
        rows = ops.state_rows(state)
        measured: list[ProcessSample] = []
        seen: set[tuple[int, float | None]] = set()
        for row in rows:
            key = (row.pid, row.create_time)
            process = self._processes.get(key)
            if process is None and row.pid:
                process = ops.live_process(row.pid, row.create_time)
                if process is not None:
                    with contextlib.suppress(psutil.Error):
                        process.cpu_percent(None)  # starts the interval; 0.0 this time
                    self._processes[key] = process
            cpu_percent = 0.0
            memory: dict[str, int] = {}
            if process is not None:
                seen.add(key)
                try:
                    cpu_percent = process.cpu_percent(None)
                except psutil.Error:
                    process = None
                memory = ops.smaps_rollup(row.pid)
            measured.append(
                ProcessSample(
                    row.name,
                    row.kind,
                    row.pid if process is not None else 0,
                    row.state if process is not None else "down",
                    cpu_percent,
                    memory.get("Pss_Anon", 0) + memory.get("Pss_Shmem", 0),
                    memory.get("Rss", 0),
                )
            )
        for key in set(self._processes) - seen:
            del self._processes[key]
        return tuple(measured)


def _store_sample(state: Mapping[str, Any]) -> StoreSample | None:
    """The store writer's and dispatcher's published positions; None when they are not there
    (starting, restarting, or a broker of another host)."""
    from mqbox.server.queue_counters import (
        QueueCounters,
        StorePositions,
        queue_counters_name,
        store_positions_name,
    )

    instance = state.get("instance")
    if not isinstance(instance, str) or not instance:
        return None
    try:
        positions = StorePositions.attach(store_positions_name(instance))
    except (MqboxError, OSError, ValueError):
        return None
    try:
        if not positions.ready:
            return None
        dispatched = positions.dispatch_start_log_offset_bytes
        with contextlib.suppress(MqboxError, OSError, ValueError):
            counters = QueueCounters.attach(queue_counters_name(instance))
            try:
                dispatched = max(dispatched, counters.dispatched_log_offset_bytes)
            finally:
                counters.close()
        return StoreSample(
            positions.min_log_offset_bytes,
            positions.write_log_offset_bytes,
            positions.flushed_log_offset_bytes,
            dispatched,
            positions.appended_record_total,
        )
    finally:
        positions.close()

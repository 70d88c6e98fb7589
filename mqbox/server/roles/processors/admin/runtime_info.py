"""GET_BROKER_RUNTIME_INFO's table (28): Java's runtime keys, one function per key.

Owns: `RUNTIME_INFO_KEYS`, key -> function of a `RuntimeSources`, in Java 4.9's names
(AdminBrokerProcessor.prepareRuntimeInfo over DefaultMessageStore.getRuntimeInfo;
docs/protocol.md section 4.7), and Java's text forms of sizes and durations. Never: statistics
counted over time (put and get TPS, message totals, latencies: issue 16's statistics, which add
their keys to this table), or a key mqbox has nothing true to fill with (the thread pools'
queues: mqbox's pools are processes behind rings).

A function returns the value's text, or None to leave its key out (a store not yet attached).
Each value is a string, as in Java's KVTable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psutil

from mqbox.config import BrokerConfig
from mqbox.protocol.codes import VERSION_MQBOX
from mqbox.server.queue_counters import QueueCounters, StorePositions

# MQVersion's name of VERSION_MQBOX (docs/protocol.md section 2.1).
VERSION_DESC_MQBOX: Final = "V4_5_2"
COMMIT_LOG_DIR_NAME: Final = "commitlog"
CONSUME_QUEUE_DIR_NAME: Final = "consumequeue"


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeSources:
    """What the runtime keys are computed from, gathered once per request."""

    broker: BrokerConfig
    store_root: Path
    boot_timestamp_ms: int  # when the broker's supervisor started
    now_ms: int
    positions: StorePositions | None  # None before the store writer published
    counters: QueueCounters | None  # None before the dispatcher published
    earliest_message_timestamp_ms: int  # store time of the oldest stored record, -1 for none


def broker_boot_timestamp_ms() -> int:
    """When this broker's supervisor (the parent of every role) started, in wall-clock ms."""
    with contextlib.suppress(psutil.Error):
        return int(psutil.Process(os.getppid()).create_time() * 1000)
    return 0


def human_readable_bytes(size_bytes: int) -> str:
    """Java's MixAll.humanReadableByteCount(bytes, false): "512 B", "1.5 GiB"."""
    if size_bytes < 1024:
        return f"{size_bytes} B"
    exponent = min(int(math.log(size_bytes) / math.log(1024)), 6)
    return f"{size_bytes / 1024**exponent:.1f} {'KMGTPE'[exponent - 1]}iB"


def disk_used_ratio(path: Path) -> float:
    """Java's UtilAll.getDiskPartitionSpaceUsedPercent: the used share of the partition
    holding `path`, rounded up to hundredths (0.45); -1 if the path does not exist."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return -1.0
    used = usage.total - usage.free
    entire = used + usage.free
    if usage.total <= 0 or entire <= 0:
        return -1.0
    hundredths = used * 100 // entire + (1 if used * 100 % entire else 0)
    return hundredths / 100.0


def format_runtime(duration_ms: int) -> str:
    """StoreStatsService.getFormatRuntime: "[ 0 days, 1 hours, 2 minutes, 3 seconds ]"."""
    seconds_total = max(0, duration_ms) // 1000
    days, rest = divmod(seconds_total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def _broker_version_desc(sources: RuntimeSources) -> str | None:
    return VERSION_DESC_MQBOX


def _broker_version(sources: RuntimeSources) -> str | None:
    return str(VERSION_MQBOX)


def _boot_timestamp(sources: RuntimeSources) -> str | None:
    return str(sources.boot_timestamp_ms)


def _runtime(sources: RuntimeSources) -> str | None:
    return format_runtime(sources.now_ms - sources.boot_timestamp_ms)


def _commit_log_min_offset(sources: RuntimeSources) -> str | None:
    positions = sources.positions
    return None if positions is None else str(positions.min_log_offset_bytes)


def _commit_log_max_offset(sources: RuntimeSources) -> str | None:
    positions = sources.positions
    return None if positions is None else str(positions.write_log_offset_bytes)


def _remain_how_many_data_to_flush(sources: RuntimeSources) -> str | None:
    positions = sources.positions
    if positions is None:
        return None
    behind = positions.write_log_offset_bytes - positions.flushed_log_offset_bytes
    return human_readable_bytes(max(0, behind))


def _dispatch_behind_bytes(sources: RuntimeSources) -> str | None:
    positions, counters = sources.positions, sources.counters
    if positions is None or counters is None:
        return None
    behind = positions.write_log_offset_bytes - counters.dispatched_log_offset_bytes
    return str(max(0, behind))


def _commit_log_disk_ratio(sources: RuntimeSources) -> str | None:
    return str(disk_used_ratio(sources.store_root / COMMIT_LOG_DIR_NAME))


def _consume_queue_disk_ratio(sources: RuntimeSources) -> str | None:
    return str(disk_used_ratio(sources.store_root / CONSUME_QUEUE_DIR_NAME))


def _commit_log_dir_capacity(sources: RuntimeSources) -> str | None:
    try:
        usage = shutil.disk_usage(sources.store_root)
    except OSError:
        return None
    total, free = human_readable_bytes(usage.total), human_readable_bytes(usage.free)
    return f"Total : {total}, Free : {free}."


def _earliest_message_time_stamp(sources: RuntimeSources) -> str | None:
    return str(sources.earliest_message_timestamp_ms)


def _start_accept_send_request_time_stamp(sources: RuntimeSources) -> str | None:
    # Java's BrokerConfig default: a broker accepts sends as soon as it serves.
    return "0"


RUNTIME_INFO_KEYS: Final[dict[str, Callable[[RuntimeSources], str | None]]] = {
    "brokerVersionDesc": _broker_version_desc,
    "brokerVersion": _broker_version,
    "bootTimestamp": _boot_timestamp,
    "runtime": _runtime,
    "commitLogMinOffset": _commit_log_min_offset,
    "commitLogMaxOffset": _commit_log_max_offset,
    "remainHowManyDataToFlush": _remain_how_many_data_to_flush,
    "dispatchBehindBytes": _dispatch_behind_bytes,
    "commitLogDiskRatio": _commit_log_disk_ratio,
    "consumeQueueDiskRatio": _consume_queue_disk_ratio,
    "commitLogDirCapacity": _commit_log_dir_capacity,
    "earliestMessageTimeStamp": _earliest_message_time_stamp,
    "startAcceptSendRequestTimeStamp": _start_accept_send_request_time_stamp,
}


def runtime_info(sources: RuntimeSources) -> dict[str, str]:
    """Every key of RUNTIME_INFO_KEYS that has a value now, plus Java's per-path
    `commitLogDiskRatio_<path>` (mqbox's CommitLog has one path)."""
    table: dict[str, str] = {}
    for key, compute in RUNTIME_INFO_KEYS.items():
        value = compute(sources)
        if value is not None:
            table[key] = value
    commit_log_dir = sources.store_root / COMMIT_LOG_DIR_NAME
    table[f"commitLogDiskRatio_{commit_log_dir}"] = table["commitLogDiskRatio"]
    return table

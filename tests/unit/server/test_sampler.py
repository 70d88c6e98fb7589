"""Goal: the services role's statistics sampler (server/web/sources.py) stays cheap at idle
without changing what it shows: each role's CPU, memory and threads come from one read of
/proc/<pid>/stat (a process that is gone shows as down), and broker-statistics.json, which the
admin processor answers 315 and 28 from, is rewritten only when one of its figures changed, so a
quiet broker does not write it every second, while a counted send is in the next one.

Method: BrokerSources over a real StatisticsBlock and ControlBlock (anonymous shared memory, as
the supervisor makes them) in a context of the few fields the sampler reads; this test process
stands for a role (its pid in the control block) and burns CPU between two samples. Samples are
taken more than PUBLISH_INTERVAL_MS apart, as the sampler's thread takes them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from mqbox.config import BrokerConfig
from mqbox.server.control_block import ControlBlock
from mqbox.server.runtime import RoleContext
from mqbox.server.statistics import StatisticsBlock, StatisticsWriter
from mqbox.server.statistics_history import statistics_file_path
from mqbox.server.topology import RoleKind
from mqbox.server.web.sources import PUBLISH_INTERVAL_MS, BrokerSources

ROLE_IDS = ("send.0", "pull.0")
UNUSED_PID = 4_000_000  # above the kernel's pid_max: never a live process


def sources_in(home: Path) -> tuple[BrokerSources, ControlBlock, StatisticsBlock]:
    (home / "run").mkdir()
    block = StatisticsBlock.create(ROLE_IDS)
    control = ControlBlock.create(ROLE_IDS)
    control.role_started("send.0", os.getpid())
    control.role_started("pull.0", UNUSED_PID)
    roles = [
        SimpleNamespace(role_id="send.0", kind=RoleKind.SEND),
        SimpleNamespace(role_id="pull.0", kind=RoleKind.PULL),
    ]
    ctx = SimpleNamespace(
        statistics=block,
        control=control,
        broker=BrokerConfig(),
        home=home,
        topology=SimpleNamespace(roles=roles),
    )
    return BrokerSources(cast(RoleContext, ctx)), control, block


def next_sample(sources: BrokerSources) -> None:
    time.sleep(PUBLISH_INTERVAL_MS / 1000 + 0.05)
    sources.sample_once()


def test_roles_are_measured_from_proc(tmp_path: Path) -> None:
    sources, _control, _block = sources_in(tmp_path)
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass  # CPU for the second sample to see
    next_sample(sources)
    by_role = {entry["role"]: entry for entry in sources.processes}
    send = by_role["send.0"]
    assert send["up"]
    assert send["pid"] == os.getpid()
    assert send["cpu_percent"] > 5.0
    assert send["rss_bytes"] > 1 << 20
    assert send["thread_count"] >= 1
    assert not by_role["pull.0"]["up"]
    assert by_role["supervisor"]["pid"] == os.getppid()


def test_the_document_is_rewritten_only_when_a_figure_moved(tmp_path: Path) -> None:
    sources, _control, block = sources_in(tmp_path)  # the first sample writes it
    path = statistics_file_path(tmp_path)
    written = (path.stat().st_mtime_ns, path.read_bytes())
    next_sample(sources)
    next_sample(sources)
    assert (path.stat().st_mtime_ns, path.read_bytes()) == written  # nothing was counted
    StatisticsWriter(block, "send.0").count_put("IdleTopic", 3, 300)
    next_sample(sources)
    assert b"IdleTopic" in path.read_bytes()

"""Goal: an idle broker sleeps (issue 15: under 1 % of a core with no request in flight). With no
request in flight each role wakes only for a deadline that needs one: the send and pull
processors, the dispatcher (nothing left to flush) and the store writer's main and flush threads
not at all, the HA service of a master without slaves once a second instead of ten times, the
services role for its statistics sample and its look at topics.json, once a second each. And
after the idle spell the broker still does what those waits were for: a held pull is answered
by the next send (the store writer, the dispatcher and the pull processor all woke for it), the
commit log's flushed position covers that send within the flush interval's promise (the flush
thread woke), and the consume queue's flushed position covers it too (the dispatcher flushed).
Sends that no consumer waits for do not wake the pull processor (the dispatcher sends QUEUES_GREW
only to one that holds pulls), and one that holds a pull is still woken by the next send. A
master that no slave reported to leaves run/replication.json alone while sends go on (nothing
shown from it moves with the write position).

Method: the real appliance (tests/support/appliance.py: every role, ASYNC_FLUSH, no slave). A
few sends first, so every role had work, then SETTLE_S for their flushes, then each role's
voluntary context switches over WINDOW_S, summed over its threads (/proc/<pid>/task/<tid>/
status): each is a sleep the role came back from, a wake-up. Counts, not times, so a loaded box
moves them little; each bound is well above what the role needs in the window and below what it
took before issue 15's change (the comment beside it gives both).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Final

import pytest

from mqbox.message import decode_offset_msg_id
from mqbox.protocol.codes import PULL_FLAG_SUSPEND, RequestCode, ResponseCode
from mqbox.server.home import HomeLayout
from mqbox.server.queue_counters import (
    QueueCounters,
    StorePositions,
    queue_counters_name,
    store_positions_name,
)
from tests.support.appliance import Appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched_at
from tests.support.send_requests import send_to_queue_header
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC: Final = "IdleWakeupsTopic"
PULL_TOPIC: Final = "IdleWakeupsPullTopic"
SETTLE_S: Final = 3.0  # flushIntervalCommitLog 500 ms, flushIntervalConsumeQueue 1 s, and slack
WINDOW_S: Final = 4.0
SEND_COUNT: Final = 20
TRICKLE_S: Final = 3.0
PULL_WAKEUP_COUNT_MAX: Final = 5  # 0 needed; SEND_COUNT before (one QUEUES_GREW per send)
# Wake-ups in WINDOW_S at most, by role: (bound, what it needs; what it took before issue 15).
WAKEUP_COUNT_MAX: Final = {
    "send.0": 2,  # 0; 4 (a tick a second for the runtime keys)
    "pull.0": 2,  # 0; 4 (the same tick; held pulls have deadlines of their own)
    "dispatcher.0": 2,  # 0 (cleanResourceInterval 10 s); 4 (a flush a second, clean or not)
    "store_writer.0": 8,  # 4 (the checkpoint's look); 16 (main loop 4, flush thread 8)
    "ha_service.0": 10,  # 4 (HaLink's retention check); 40 (a 100 ms wait without slaves)
    # 8 (sampler, topics.json) and 2-4 more when the 30 s registration with the name server falls
    # in the window; 20-26 (HTTP accept thread 8, sampler 12)
    "services.0": 16,
}


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of `pid` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # a thread that ended
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def send(client: FrontClient, body: bytes, topic: str = TOPIC) -> int:
    """Send `body` to `topic`'s queue 0; the commit-log offset of its record."""
    header = send_to_queue_header(topic)
    response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), body)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return decode_offset_msg_id(response.ext_fields["msgId"])[1]


def _wakeups_over_sends(client: FrontClient, pid: int, body: bytes) -> int:
    """After SETTLE_S, send SEND_COUNT messages to PULL_TOPIC; how often `pid` woke meanwhile."""
    time.sleep(SETTLE_S)
    before = wakeups(pid)
    for number in range(SEND_COUNT):
        send(client, body + b" %d" % number, PULL_TOPIC)
    return wakeups(pid) - before


def send_to_a_held_pull(
    appliance: Appliance, client: FrontClient, topic: str, queue_index: int
) -> int:
    """Hold a pull of `topic`'s queue 0 at `queue_index` on `client`, send one message from
    another connection, and check that the held pull is answered with it; the send's commit-log
    offset."""
    everything = pull_everything_header(topic, queue_index)
    header = dataclasses.replace(everything, sys_flag=everything.sys_flag | PULL_FLAG_SUSPEND)
    opaque = client.request(RequestCode.PULL_MESSAGE, header.to_ext())
    time.sleep(0.3)  # held by now (an answer would come first otherwise)
    producer = appliance.client()
    try:
        log_offset_bytes = send(producer, b"somebody waits", topic)
    finally:
        producer.close()
    (held,) = client.responses(1)
    assert held.opaque == opaque
    assert held.code == ResponseCode.SUCCESS, held.remark
    assert held.ext_fields["nextBeginOffset"] == str(queue_index + 1)
    return log_offset_bytes


def test_idle_roles_sleep_and_wake_for_the_next_request(appliance: Appliance) -> None:
    client = appliance.client()
    try:
        for number in range(5):
            send(client, b"before the idle spell %d" % number)
        wait_dispatched_at(appliance.broker_address)  # the held pull below waits at index 5
        time.sleep(SETTLE_S)
        roles = {role: appliance.roles[role] for role in WAKEUP_COUNT_MAX}
        before = {role: wakeups(pid) for role, pid in roles.items()}
        time.sleep(WINDOW_S)
        counted = {role: wakeups(pid) - before[role] for role, pid in roles.items()}
        over = {role: count for role, count in counted.items() if count > WAKEUP_COUNT_MAX[role]}
        assert not over, f"woke more than {WAKEUP_COUNT_MAX} in {WINDOW_S} s: {counted}"

        log_offset_bytes = send_to_a_held_pull(appliance, client, TOPIC, 5)
    finally:
        client.close()
    positions = StorePositions.attach(store_positions_name(appliance.instance))
    counters = QueueCounters.attach(queue_counters_name(appliance.instance))
    try:
        wait_until(
            lambda: positions.flushed_log_offset_bytes > log_offset_bytes,
            "the commit log flushed after the idle spell",
        )
        wait_until(
            lambda: counters.logics_flushed_log_offset_bytes > log_offset_bytes,
            "the consume queue flushed after the idle spell",
        )
    finally:
        positions.close()
        counters.close()


def test_sends_wake_the_pull_processor_only_while_it_holds_a_pull(appliance: Appliance) -> None:
    """Twenty sends with no pull held: at most a few wake-ups of pull.0 (one QUEUES_GREW per send
    woke it before); then a held pull is answered by the next send, and the sends after that
    wake it no more."""
    pull_pid = appliance.roles["pull.0"]
    client = appliance.client()
    try:
        send(client, b"first", PULL_TOPIC)
        woken = _wakeups_over_sends(client, pull_pid, b"nobody waits")
        assert woken <= PULL_WAKEUP_COUNT_MAX, f"{SEND_COUNT} sends woke pull.0 {woken} times"

        wait_dispatched_at(appliance.broker_address)  # the held pull waits at the queue's end
        send_to_a_held_pull(appliance, client, PULL_TOPIC, 1 + SEND_COUNT)

        woken = _wakeups_over_sends(client, pull_pid, b"nobody waits again")
        assert woken <= PULL_WAKEUP_COUNT_MAX, f"pull.0 woke {woken} times after its hold"
    finally:
        client.close()


def test_a_master_without_slaves_leaves_its_replication_file_alone(appliance: Appliance) -> None:
    """A send every 100 ms for TRICKLE_S: the HA role looked at the write position ten times a
    second and rewrote the file every second while it moved; now the file stays as it was."""
    path = HomeLayout(appliance.home).replication_path
    wait_until(path.exists, "the HA role's run/replication.json")
    client = appliance.client()
    try:
        send(client, b"before")
        time.sleep(1.5)  # a rewrite the first send may still cause is done by now
        before = (path.stat().st_mtime_ns, path.read_bytes())
        deadline = time.monotonic() + TRICKLE_S
        while time.monotonic() < deadline:
            send(client, b"trickle")
            time.sleep(0.1)
    finally:
        client.close()
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before

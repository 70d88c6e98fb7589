"""Goal: delayed delivery survives the death of its owner. The schedule role is SIGKILLed while
deliveries are due (some delivered, some in flight, the rest coming due while it is dead), twice;
the supervisor re-forks it, and afterwards every delayed message is in its topic at least once,
identical to what was sent. Duplicates are allowed (and counted): a restarted schedule role
delivers again everything after the offsets it last saved, which trail the deliveries by up to
a save interval plus a commit-log flush. The store writer and the dispatcher never restart, and
delayOffset.json ends at the queue's end.

Method: the real appliance (`python -m mqbox.server.supervisor`, every role, the real name
server, port 0, a home of its own) with messageDelayLevel "1s ..."; MESSAGE_COUNT sends with
DELAY=1 through mqbox.client.remoting, each with its own UNIQ_KEY; the schedule role's pid comes
from the supervisor's run/state.json, and the test kills it with SIGKILL as soon as the first
delivery is pullable, waits for the new pid to be ready, and kills again. Pulls read the topic
from index 0 until every key is there. Every process is SIGKILLed by pid at the end and the
instance's shared memory is swept (tests/support/appliance.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import admin_api
from mqbox.client.remoting import RemotingClient
from mqbox.message import StoredMessage, decode_properties_str, encode_properties_str
from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION, ResponseCode
from mqbox.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
from mqbox.server.home import read_state
from tests.conftest import unique_name
from tests.support.appliance import BROKER_CONF, running_appliance

pytestmark = pytest.mark.crash

MESSAGE_COUNT = 300
KILL_COUNT = 2
DELAY_LEVELS = " ".join(["1s"] * 18)
RESTART_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_MS = 5000


def role_process(home: Path, role_id: str) -> dict[str, Any]:
    state = read_state(home)
    assert state is not None, "no run/state.json"
    (role,) = [role for role in state["roles"] if role["role_id"] == role_id]
    return dict(role)


def wait_restarted(home: Path, role_id: str, old_pid: int) -> int:
    """The pid of `role_id` once a process other than `old_pid` reports ready."""
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
        role = role_process(home, role_id)
        if role["pid"] not in (0, old_pid) and role["state"] == "ready":
            return int(role["pid"])
        assert time.monotonic() < deadline, f"{role_id} was not restarted: {role}"
        time.sleep(0.05)


def pull_from(broker: RemotingClient, topic: str, queue_index: int) -> list[StoredMessage]:
    header = PullMessageRequestHeader(
        "KillGroup", topic, 0, queue_index, 32, PULL_FLAG_SUBSCRIPTION, 0, 0, 0, "*"
    )
    result = admin_api.pull_message(broker, header)
    if result.code != ResponseCode.SUCCESS:
        return []
    return list(result.messages)


def test_every_due_message_is_delivered_after_the_schedule_role_is_killed(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    conf = BROKER_CONF + f"messageDelayLevel={DELAY_LEVELS}\n"
    topic = unique_name("KillDelay")
    with (
        running_appliance(tmp_path / "home", reap_pids, conf) as appliance,
        RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker,
    ):
        home = appliance.home
        steady = {
            role_id: role_process(home, role_id)["pid"]
            for role_id in ("store_writer.0", "dispatcher.0")
        }
        pid = int(role_process(home, "schedule.0")["pid"])
        keys = [f"{index:032X}" for index in range(MESSAGE_COUNT)]
        for index, key in enumerate(keys):
            header = SendMessageRequestHeader(
                producer_group="PG",
                topic=topic,
                default_topic="TBW102",
                default_topic_queue_nums=1,
                queue_id=0,
                sys_flag=0,
                born_timestamp_ms=int(time.time() * 1000),
                flag=index,
                properties=encode_properties_str({"UNIQ_KEY": key, "DELAY": "1"}).decode(),
            )
            admin_api.send_message(broker, header, f"body-{index}".encode())

        delivered: list[StoredMessage] = []
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while not delivered:
            assert time.monotonic() < deadline, "nothing was delivered"
            delivered = pull_from(broker, topic, 0)
        kills = 0
        while kills < KILL_COUNT:
            os.kill(pid, signal.SIGKILL)
            kills += 1
            pid = wait_restarted(home, "schedule.0", pid)
            reap_pids.append(pid)

        while len({decode_properties_str(m.properties)["UNIQ_KEY"] for m in delivered}) < len(keys):
            assert time.monotonic() < deadline, f"{len(delivered)} delivered, keys missing"
            more = pull_from(broker, topic, len(delivered))
            delivered.extend(more)
            if not more:
                time.sleep(0.1)

        counts = Counter(decode_properties_str(m.properties)["UNIQ_KEY"] for m in delivered)
        assert set(counts) == set(keys)
        for message in delivered:
            properties = decode_properties_str(message.properties)
            index = int(properties["UNIQ_KEY"], 16)
            assert (message.body, message.flag) == (f"body-{index}".encode(), index)
            assert set(properties) == {"UNIQ_KEY"}
        duplicates = sum(count - 1 for count in counts.values())
        print(f"{MESSAGE_COUNT} delayed, {kills} kills, {duplicates} delivered twice")  # noqa: T201
        assert {role_id: role_process(home, role_id)["pid"] for role_id in steady} == steady

        offsets_path = appliance.home / "store" / "broker-a" / "config" / "delayOffset.json"
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while json.loads(offsets_path.read_text())["offsetTable"].get("1") != MESSAGE_COUNT:
            assert time.monotonic() < deadline, offsets_path.read_text()
            time.sleep(0.2)

"""Orderly consumption per sharding key across a rebalance, a consumer killed and a restart.

Goal: docs/client.md B.10 as mqbox's PushConsumer(orderly=True) does it: while a producer keeps
sending with send_orderly over 8 sharding keys (4 queues), (1) a second consumer joins (queues
move: the old owner persists, then unlocks, and the new one locks), (2) the first consumer is
SIGKILLed in the middle of consuming (its queues come back only when the broker's locks
expire: 30 s here, mqboxRebalanceLockMaxLiveTimeMs at its least, where the default is Java's 60 s;
what it consumed but had not committed is consumed again), (3) it is started again
(queues move back). Throughout: every message the broker acknowledged is consumed; within one
consumer process each key's messages arrive in send order; and over all processes, in time
order, no message of a key arrives before every earlier message of that key arrived once (a
replay after the kill starts at a committed offset, never after a gap).
Method: one appliance for the module, with 30 s locks; the consumers are child processes
(tests/support/consumer_child.py, JSON lines out, killed by PID); the producer runs in the test
process and numbers each key's messages.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import ClientError, Producer
from tests.interop.cpp_client import CppChild, cpp_child
from tests.support.appliance import BROKER_CONF, Appliance, module_appliance
from tests.support.consumers import group_name
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

KEYS = [f"order-{n}" for n in range(8)]
WAIT_S = 60.0
LOCK_LIFETIME_MS = 30_000  # the least mqboxRebalanceLockMaxLiveTimeMs takes
LOCK_EXPIRY_WAIT_S = 90.0  # the broker's lock of the killed consumer, and a rebalance


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """The module's appliance (tests/conftest.py's), with the broker's shortest queue locks."""
    conf = BROKER_CONF + f"mqboxRebalanceLockMaxLiveTimeMs={LOCK_LIFETIME_MS}\n"
    with module_appliance(tmp_path_factory.mktemp("appliance"), conf) as running:
        yield running


class OrderlyLoad:
    """A thread sending `<key>:<n>` with send_orderly, n counting per key, round robin over the
    keys; `acknowledged` holds the bodies the broker took."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.acknowledged: list[str] = []
        self._next = dict.fromkeys(KEYS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orderly-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Idempotent; a load never started just stays stopped."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)
            assert not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for key in KEYS:
                body = f"{key}:{self._next[key]}"
                try:
                    self.producer.send_orderly(
                        self.topic, body.encode(), sharding_key=key, timeout_ms=2000
                    )
                except ClientError:
                    continue  # not acknowledged: the next number comes next, a gap of no matter
                self._next[key] += 1
                self.acknowledged.append(body)


def consumer_child(
    directory: Path, spec: dict[str, Any], reap_pids: list[int]
) -> contextlib.AbstractContextManager[CppChild]:
    """A PushConsumer child process (tests/support/consumer_child.py), SIGKILLed on the way out
    if still running."""
    return cpp_child(directory, spec, reap_pids, module="tests.support.consumer_child")


def consumer_spec(appliance: Appliance, kind: str, *, orderly: bool) -> dict[str, Any]:
    """The children's spec, on a new topic of 4 queues."""
    topic = group_name(kind)
    create_topic(appliance, topic, 4)
    return {
        "namesrv": appliance.namesrv_address,
        "group": group_name(f"CG_{kind}"),
        "topic": topic,
        "orderly": orderly,
        "consume_batch_size": 4,
        "rebalance_interval_ms": 1000,
        "persist_interval_ms": 500,
        "handler_pause_s": 0.002,
    }


def delivered(children: dict[str, CppChild]) -> set[str]:
    """Every body any of the children reported."""
    return {str(e["body"]) for child in children.values() for e in child.messages()}


def parse(body: str) -> tuple[str, int]:
    key, number = body.rsplit(":", 1)
    return key, int(number)


def test_order_per_key_holds_across_a_rebalance_a_kill_and_a_restart(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    spec = consumer_spec(appliance, "Orderly", orderly=True)
    topic = spec["topic"]
    children: dict[str, CppChild] = {}
    producer = Producer(group_name("PG_orderly"), appliance.namesrv_address)
    producer.start()
    load = OrderlyLoad(producer, topic)
    try:
        with (
            consumer_child(tmp_path / "a", spec, reap_pids) as first,
            consumer_child(tmp_path / "b", spec, reap_pids) as second,
        ):
            children["a"] = first
            first.wait_started()
            load.start()
            first.wait_for(lambda c: len(c.messages()) >= 100, WAIT_S, "a consuming")
            children["b"] = second
            second.wait_started()
            second.wait_for(lambda c: len(c.messages()) >= 100, WAIT_S, "b after the rebalance")
            first.wait_for(lambda c: len(c.messages()) >= 400, WAIT_S, "a consuming more")
            first.kill()  # SIGKILL, mid-consumption
            second.wait_for(
                lambda c: len({e["queue_id"] for e in c.messages()[-200:]}) == 4,
                LOCK_EXPIRY_WAIT_S,
                "b consuming every queue once a's locks expired",
            )
            with consumer_child(tmp_path / "a2", spec, reap_pids) as restarted:
                children["a2"] = restarted
                restarted.wait_started()
                restarted.wait_for(lambda c: len(c.messages()) >= 100, WAIT_S, "a restarted")
                load.stop()
                acknowledged = set(load.acknowledged)
                wait_until(lambda: acknowledged <= delivered(children), "every message", WAIT_S)
                restarted.finish()
            second.finish()
    finally:
        load.stop()
        producer.shutdown()
    for child in children.values():  # kept beside the child's stderr, for a failure's story
        lines = (json.dumps(event) + "\n" for event in child.messages())
        (child.directory / "messages.jsonl").write_text("".join(lines), encoding="utf-8")
    assert len(acknowledged) > 1000
    assert not acknowledged - delivered(children)
    # Within one process, each key in send order (a process never replays its own commits).
    for label, child in children.items():
        last: dict[str, int] = {}
        for event in child.messages():
            key, number = parse(str(event["body"]))
            assert number > last.get(key, -1), (label, key, number, last.get(key))
            last[key] = number
    # Over all processes in time order: nothing of a key before all its predecessors.
    events = sorted(
        (float(e["t"]), str(e["body"])) for child in children.values() for e in child.messages()
    )
    highest: dict[str, int] = defaultdict(lambda: -1)
    for _, body in events:
        key, number = parse(body)
        assert number <= highest[key] + 1, (key, number, highest[key])
        highest[key] = max(highest[key], number)
    # The kill made a replay (messages a consumed but had not committed) or nothing at all.
    replayed = [body for body, count in _counts(events).items() if count > 1]
    assert all(body in {str(e["body"]) for e in first.messages()} for body in replayed)


def _counts(events: list[tuple[float, str]]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for _, body in events:
        counts[body] += 1
    return counts


def test_a_concurrent_consumer_killed_and_restarted_loses_nothing(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    """The same kill and restart without order: every acknowledged message is consumed. Some
    may be consumed twice: past the killed process's last commit, and a batch still in a
    handler when its queue moves (B.9: Java drops the result of a dropped queue too)."""
    spec = consumer_spec(appliance, "KillConcurrent", orderly=False)
    topic = spec["topic"]
    children: dict[str, CppChild] = {}
    producer = Producer(group_name("PG_kill"), appliance.namesrv_address)
    producer.start()
    load = OrderlyLoad(producer, topic)
    try:
        with (
            consumer_child(tmp_path / "a", spec, reap_pids) as first,
            consumer_child(tmp_path / "b", spec, reap_pids) as second,
        ):
            children["a"] = first
            children["b"] = second
            first.wait_started()
            second.wait_started()
            load.start()
            first.wait_for(lambda c: len(c.messages()) >= 300, WAIT_S, "a consuming")
            second.wait_for(lambda c: len(c.messages()) >= 300, WAIT_S, "b consuming")
            first.kill()
            with consumer_child(tmp_path / "a2", spec, reap_pids) as restarted:
                children["a2"] = restarted
                restarted.wait_started()
                restarted.wait_for(lambda c: len(c.messages()) >= 100, WAIT_S, "a restarted")
                load.stop()
                acknowledged = set(load.acknowledged)
                wait_until(lambda: acknowledged <= delivered(children), "every message", WAIT_S)
                restarted.finish()
            second.finish()
    finally:
        load.stop()
        producer.shutdown()
    assert not acknowledged - delivered(children)
    assert len(acknowledged) > 600

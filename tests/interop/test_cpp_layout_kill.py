"""The official C++ client on a 2m-2s layout whose broker-a master is SIGKILLed under load.

Goal (issue 14): with `mqbox start --layout etc/examples/2m-2s` (two SYNC_MASTERs, each with a
slave), C++ producers keep sending when broker-a's master dies (the C++ producer retries a
failed send on another broker, then drops broker-a from its route: sends go to broker-b); C++
push consumers of one group (clustering) keep consuming, broker-a's messages from broker-a-s;
and every acknowledged message (SEND_OK: on a SYNC_MASTER, the slave has it) is consumed.
Duplicates are allowed (at-least-once) but counted and bounded.

Method: the real layout (tests/support/layout.py, every port 0); PRODUCER_COUNT C++ producer
children sending numbered messages (the seq is the key and the mqboxSeq property) one sync send
after another until told to stop, CONSUMER_COUNT C++ push consumer children of one group
(tests/interop/cpp_client.py). Each C++ client re-reads its routes every 30 s, 3 s after its start
(MQClientFactory::startScheduledTask), and a consumer reaches broker-a-s only once its route has
lost the master (findBrokerAddressInSubscribe falls back to another id of the broker name,
rocketmq-client-cpp 1.2.2 and later): the kill is placed KILL_BEFORE_ROUTE_POLL_S before the
consumers' second poll (timed from the moment each child called start()) so the test does not idle
for most of 30 s; a kill after that poll only makes it 30 s slower. Just before the kill the
consumers are frozen (SIGSTOP) for FREEZE_S while the producers go on, so broker-a holds messages
no consumer has pulled: after the kill they can only come from broker-a-s. At the end the slave's
queues are read back raw (which messages broker-a stored), and broker-a-s's msgGetTotalTodayNow
(GET_BROKER_RUNTIME_INFO) shows it served messages.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mqbox.client.admin_api import broker_runtime_info
from mqbox.client.remoting import RemotingClient
from mqbox.message import decode_properties_str
from mqbox.server.home import read_state, recorded_processes
from tests.conftest import unique_name
from tests.integration.test_layout_replication import WAIT_S, topic_on
from tests.interop.cpp_client import SEQ_PROPERTY, CppChild, cpp_child
from tests.support.appliance import sigkill_pids
from tests.support.layout import (
    RunningLayout,
    create_topic_by_cli,
    running_layout,
    wait_slaves_connected,
)
from tests.support.read_back import REQUEST_TIMEOUT_MS, pull_queue
from tests.support.waiting import wait_until

pytestmark = pytest.mark.interop
log = logging.getLogger(__name__)

QUEUE_COUNT = 4
PRODUCER_COUNT = 3
CONSUMER_COUNT = 2
SEND_INTERVAL_S = 0.02  # each producer: at most about 50 sends a second
ROUTE_POLL_S = 33.0  # a C++ client's second route poll after its start (3 s, then every 30 s)
KILL_BEFORE_ROUTE_POLL_S = 4.0  # room for the freeze's end and the kill itself
FREEZE_S = 2.0
SEND_AFTER_KILL_S = 5.0  # the producers go on this long after the kill
DRAIN_S = 60.0  # the consumers then get every acknowledged message within this
# Duplicates come from sends the C++ producer repeated (it resends on any failure, e.g. the
# send in flight to the killed master, which may have been stored there) and from queues that
# changed hands; a handful per producer and consumer, nowhere near the load.
DUPLICATES_MAX = 50


def consumer_spec(namesrv: str, group: str, topic: str) -> dict[str, Any]:
    return {
        "mode": "push",
        "namesrv": namesrv,
        "group": group,
        "topic": topic,
        "expression": "*",
        "property_names": [SEQ_PROPERTY],
    }


def producer_spec(namesrv: str, topic: str, index: int) -> dict[str, Any]:
    return {
        "mode": "produce",
        "namesrv": namesrv,
        "group": "CppKillPG",
        "topic": topic,
        "method": "until_stopped",
        "messages": [],
        "prefix": f"p{index}",
        "interval_s": SEND_INTERVAL_S,
    }


def start_children(
    stack: contextlib.ExitStack,
    directory: Path,
    specs: list[dict[str, Any]],
    kind: str,
    reap_pids: list[int],
) -> list[CppChild]:
    """One C++ client child per spec, in `directory`/`kind`-N, stopped with `stack`."""
    return [
        stack.enter_context(cpp_child(directory / f"{kind}-{index}", spec, reap_pids))
        for index, spec in enumerate(specs)
    ]


def acked(child: CppChild) -> list[str]:
    return [str(e["seq"]) for e in child.events("sent") if e.get("status") == "OK"]


def received(consumers: list[CppChild]) -> list[str]:
    return [str(e["properties"].get(SEQ_PROPERTY, "")) for c in consumers for e in c.messages()]


def stored_on(address: str, topic: str) -> set[str]:
    """The seqs a broker's queues of `topic` hold, read back raw from index 0."""
    seqs: set[str] = set()
    with RemotingClient(address, REQUEST_TIMEOUT_MS) as broker:
        for queue_id in range(QUEUE_COUNT):
            for record in pull_queue(broker, topic, queue_id):
                seqs.add(decode_properties_str(record.properties)[SEQ_PROPERTY])
    return seqs


def messages_got(address: str) -> int:
    """msgGetTotalTodayNow of GET_BROKER_RUNTIME_INFO (28): messages the broker's pulls returned."""
    with RemotingClient(address, REQUEST_TIMEOUT_MS) as broker:
        return int(broker_runtime_info(broker)["msgGetTotalTodayNow"])


def signal_all(processes: list[CppChild], signum: int) -> None:
    for child in processes:
        os.kill(child.process.pid, signum)


def kill_master(layout: RunningLayout, name: str) -> None:
    """SIGKILL of the master's supervisor and every role its run files name."""
    state = read_state(layout.broker_home(name)) or {}
    pids = [pid for _, pid, _ in recorded_processes(state)]
    assert pids, f"no processes recorded for {name}"
    sigkill_pids(pids)


def test_cpp_clients_ride_through_a_master_kill(tmp_path: Path, reap_pids: list[int]) -> None:
    with running_layout(tmp_path / "layout") as layout:
        topic = unique_name("CppKill")
        create_topic_by_cli(layout, topic, QUEUE_COUNT)
        group = unique_name("CppKillCG")
        with contextlib.ExitStack() as consumer_stack:
            spec = consumer_spec(layout.namesrv, group, topic)
            consumers = start_children(
                consumer_stack, tmp_path, [spec] * CONSUMER_COUNT, "consumer", reap_pids
            )
            for consumer in consumers:
                consumer.wait_started()
            # The consumers' second route poll, on the monotonic clock.
            first_start_s = min(float(c.events("starting")[0]["wall_time_s"]) for c in consumers)
            route_poll_at = time.monotonic() + first_start_s + ROUTE_POLL_S - time.time()
            # The masters are SYNC_MASTER: sends are acknowledged once a slave has them.
            wait_slaves_connected(layout, WAIT_S)
            with contextlib.ExitStack() as producer_stack:
                specs = [producer_spec(layout.namesrv, topic, i) for i in range(PRODUCER_COUNT)]
                producers = start_children(producer_stack, tmp_path, specs, "producer", reap_pids)
                # broker-a-s must know the topic (its admin copies the master's every 10 s)
                # before it is the only broker serving broker-a's queues.
                wait_until(
                    functools.partial(topic_on, layout.brokers["broker-a-s"], topic),
                    "the topic on broker-a-s",
                    WAIT_S,
                )
                kill_at = route_poll_at - KILL_BEFORE_ROUTE_POLL_S
                time.sleep(max(0.0, kill_at - FREEZE_S - time.monotonic()))
                assert all(acked(p) for p in producers), [p.describe() for p in producers]
                assert received(consumers), [c.describe() for c in consumers]

                signal_all(consumers, signal.SIGSTOP)
                try:
                    time.sleep(FREEZE_S)
                    before_kill = set(received(consumers))
                    acked_before_kill = [len(acked(p)) for p in producers]
                    kill_master(layout, "broker-a")
                finally:
                    signal_all(consumers, signal.SIGCONT)
                killed = time.monotonic()
                time.sleep(SEND_AFTER_KILL_S)
                for producer in producers:
                    producer.finish(60.0)

            sent_after_kill = [
                len(acked(p)) - count for p, count in zip(producers, acked_before_kill, strict=True)
            ]
            # Every producer kept getting SEND_OK after the kill: broker-b took its sends.
            assert all(count > 0 for count in sent_after_kill), sent_after_kill
            acknowledged = {seq for p in producers for seq in acked(p)}
            attempted = {
                str(e["seq"])
                for p in producers
                for e in p.events()
                if e.get("event") in ("sent", "send_failed")
            }

            def all_consumed() -> bool:
                return acknowledged <= set(received(consumers))

            for consumer in consumers:
                consumer.wait_for(
                    lambda _child: all_consumed(), DRAIN_S, "every acknowledged message"
                )
            drained_s = time.monotonic() - killed
            for consumer in consumers:
                consumer.finish()

        seqs = received(consumers)
        assert set(seqs) <= attempted, sorted(set(seqs) - attempted)[:20]
        duplicates = sum(count - 1 for count in Counter(seqs).values())
        assert duplicates <= DUPLICATES_MAX, duplicates
        # The consumers read from broker-a-s (the statistics sampler counts the messages its
        # pulls returned, once a second; before the kill a master suggests itself for pulls) ...
        wait_until(
            lambda: messages_got(layout.brokers["broker-a-s"]) > 0,
            "broker-a-s to count the messages it served",
            WAIT_S,
        )
        served_by_slave = messages_got(layout.brokers["broker-a-s"])
        # ... and broker-a held acknowledged messages no consumer had at the kill (the freeze
        # made sure of that), every one consumed afterwards, with broker-a's master dead.
        on_slave = stored_on(layout.brokers["broker-a-s"], topic)
        left_on_a = (acknowledged & on_slave) - before_kill
        assert left_on_a, "no acknowledged broker-a message was left for broker-a-s to serve"
        assert left_on_a <= set(seqs)
        log.warning(
            f"acknowledged {len(acknowledged)} of {len(attempted)} sends, "
            f"{sum(sent_after_kill)} after the kill; consumed {len(seqs)} "
            f"({duplicates} duplicates); broker-a-s served {served_by_slave}; "
            f"{len(left_on_a)} acknowledged on broker-a and not consumed at the kill; "
            f"drained {drained_s:.1f} s after the kill"
        )

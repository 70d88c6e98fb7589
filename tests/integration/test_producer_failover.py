"""The Producer when brokers refuse, crash, stop or restart: retries, fault avoidance, reconnects.

Goal: (1) a broker answering 17 TOPIC_NOT_EXIST for a topic only the other broker still has
costs a retry, not a failed send, and with latency fault avoidance on that broker is avoided
afterwards; when every broker of a route refuses, the send raises BrokerError with the broker's
code and remark after 1 + 2 attempts; (2) when one of two brokers is killed while a sync load
runs, no send fails (each failed attempt is retried on the other broker) and the dead broker
costs a bounded number of failed attempts; (3) when one of two brokers stops under an async load,
sends go on on the other with a bounded number of failed sends, and the sends after the stop all
succeed; (4) across a restart of the whole appliance (same home, same ports) sends fail with
typed errors while it is down and succeed again after, over new connections, and every
acknowledged message is stored once.
Method: real appliances: for two brokers, two homes whose second broker (brokerName broker-b, no
name server of its own) registers with the first appliance's name server
(tests/support/appliance.py, `namesrv_address`); a Producer in the test process with latency
fault avoidance on; kills are SIGKILL by PID of the supervisor and every role; what a broker
stored is read back over the raw protocol (tests/support/read_back.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from mqbox.client import BrokerError, ClientError, Producer, SendResult
from mqbox.client.admin_api import delete_topic_in_broker
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.message import decode_properties_str
from mqbox.protocol.codes import ResponseCode
from tests.conftest import unique_name
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.read_back import create_topic, read_back

pytestmark = pytest.mark.integration

QUEUE_COUNT = 2
WAIT_S = 20.0
SECOND_BROKER_CONF = BROKER_CONF + "brokerName=broker-b\n"


@contextlib.contextmanager
def two_brokers(
    tmp_path: Path, reap_pids: list[int], first_conf_extra: str = ""
) -> Iterator[tuple[Appliance, Appliance]]:
    """broker-a with its name server, and broker-b registered with it."""
    with (
        running_appliance(tmp_path / "a", reap_pids, BROKER_CONF + first_conf_extra) as first,
        running_appliance(
            tmp_path / "b",
            reap_pids,
            SECOND_BROKER_CONF,
            namesrv_address=first.namesrv_address,
        ) as second,
    ):
        yield first, second


def create_on(brokers: tuple[Appliance, ...], topic: str) -> None:
    """The topic on each broker, then wait until the route names every one of them."""
    for broker in brokers:
        create_topic(broker, topic, QUEUE_COUNT)
    deadline = time.monotonic() + WAIT_S
    with RemotingClient(brokers[0].namesrv_address) as namesrv:
        while True:
            route = get_route(namesrv, topic)
            if route is not None and len(route.queue_datas) == len(brokers):
                return
            assert time.monotonic() < deadline, route
            time.sleep(0.1)


def uniq_keys_stored(appliance: Appliance, topic: str) -> list[str]:
    return [
        decode_properties_str(record.properties)["UNIQ_KEY"]
        for records in read_back(appliance, topic).values()
        for record in records
    ]


def test_topic_not_exist_is_retried_on_the_other_broker_and_raised_when_all_refuse(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    both = unique_name("FailoverBoth")
    only_a = unique_name("FailoverOnlyA")
    with two_brokers(tmp_path, reap_pids, "autoCreateTopicEnable=false\n") as (first, second):
        create_on((first, second), both)
        create_on((first,), only_a)
        with Producer("PG_failover_17", first.namesrv_address, latency_fault_enable=True) as p:
            p.send(both, b"warm")
            p.send(only_a, b"warm")  # both routes are cached now
            with RemotingClient(first.broker_address) as broker_a:
                delete_topic_in_broker(broker_a, both)
                delete_topic_in_broker(broker_a, only_a)
            time.sleep(0.5)  # the send processor sees topics.json change within 100 ms
            results = [p.send(both, f"m{n}".encode()) for n in range(10)]
            with pytest.raises(BrokerError) as caught:
                p.send(only_a, b"refused everywhere")
            stats = p.statistics()
        assert {result.queue.broker_name for result in results} == {"broker-b"}
        assert stats.failed_attempts_by_broker["broker-a"] >= 1
        assert stats.failed == 1  # the only_a send, nothing else
        assert caught.value.code == ResponseCode.TOPIC_NOT_EXIST
        assert caught.value.broker_name == "broker-a"
        assert "not exist" in (caught.value.remark or "")
        assert len(caught.value.__notes__) == 2  # the two earlier attempts
        stored = set(uniq_keys_stored(second, both))
        assert {result.msg_id for result in results} <= stored


def sync_load(
    producer: Producer, topic: str, stop: threading.Event
) -> tuple[list[SendResult], list[ClientError]]:
    results: list[SendResult] = []
    errors: list[ClientError] = []
    number = 0
    while not stop.is_set():
        try:
            results.append(producer.send(topic, f"load {number}".encode()))
        except ClientError as error:
            errors.append(error)
        number += 1
    return results, errors


def test_sync_sends_fail_over_when_a_broker_is_killed_mid_load(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("FailoverKill")
    with two_brokers(tmp_path, reap_pids) as (first, second):
        create_on((first, second), topic)
        with Producer("PG_failover_kill", first.namesrv_address, latency_fault_enable=True) as p:
            stop = threading.Event()
            outcome: Future[tuple[list[SendResult], list[ClientError]]] = Future()
            sender = threading.Thread(target=lambda: outcome.set_result(sync_load(p, topic, stop)))
            sender.start()
            time.sleep(1.0)
            killed_at = p.statistics().sent
            second.kill()
            time.sleep(2.0)
            stop.set()
            sender.join(WAIT_S)
            results, errors = outcome.result(0)
            stats = p.statistics()
        assert errors == []
        assert killed_at > 10
        assert len(results) > killed_at + 10
        assert {r.queue.broker_name for r in results[:killed_at]} == {"broker-a", "broker-b"}
        after = results[killed_at + 5 :]
        assert {result.queue.broker_name for result in after} == {"broker-a"}
        assert 1 <= stats.failed_attempts_by_broker["broker-b"] <= 3
        on_a = [result.msg_id for result in results if result.queue.broker_name == "broker-a"]
        stored = uniq_keys_stored(first, topic)
        assert sorted(set(stored)) == sorted(stored)  # nothing twice on broker-a
        assert set(on_a) <= set(stored)


def test_async_sends_go_on_with_few_failures_when_a_broker_stops_under_load(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("FailoverStop")
    window = 16
    with two_brokers(tmp_path, reap_pids) as (first, second):
        create_on((first, second), topic)
        with Producer("PG_failover_stop", first.namesrv_address, latency_fault_enable=True) as p:
            stopper = threading.Timer(1.0, second.stop)
            stopper.start()
            outstanding: list[tuple[float, Future[SendResult]]] = []
            finished: list[tuple[float, Future[SendResult]]] = []
            began = time.monotonic()
            number = 0
            while time.monotonic() - began < 4.0:
                while len(outstanding) >= window:
                    outstanding[0][1].exception(WAIT_S)
                    finished.append(outstanding.pop(0))
                future = p.send_async(topic, f"async {number}".encode())
                outstanding.append((time.monotonic() - began, future))
                number += 1
            finished.extend(outstanding)
            stopper.join(WAIT_S)
            for _, future in finished:
                future.exception(WAIT_S)
        failures = [(at, f.exception()) for at, f in finished if f.exception() is not None]
        late = [(at, f.result()) for at, f in finished if at > 3.0]
        assert len(failures) <= window, failures
        assert all(isinstance(error, ClientError) for _, error in failures)
        assert late
        assert {result.queue.broker_name for _, result in late} == {"broker-a"}
        assert any(
            f.result().queue.broker_name == "broker-b"
            for at, f in finished
            if at < 0.5 and f.exception() is None
        )


def test_sends_resume_over_new_connections_after_the_appliance_restarts(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("Restart")
    home = tmp_path / "appliance"
    acknowledged: list[SendResult] = []
    with running_appliance(home, reap_pids) as first:
        create_topic(first, topic, QUEUE_COUNT)
        ports = (first.broker_port, int(first.namesrv_address.rsplit(":", 1)[1]))
        producer = Producer("PG_restart", first.namesrv_address, latency_fault_enable=True)
        producer.start()
        acknowledged += [producer.send(topic, f"before {n}".encode()) for n in range(20)]
    with contextlib.closing(_Shutdown(producer)):
        with pytest.raises(ClientError):  # typed, whichever call failed first
            producer.send(topic, b"while down", timeout_ms=1000)
        with running_appliance(
            home, reap_pids, broker_port=ports[0], namesrv_port=ports[1]
        ) as back:
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    acknowledged.append(producer.send(topic, b"first after"))
                    break
                except ClientError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            acknowledged += [producer.send(topic, f"after {n}".encode()) for n in range(20)]
            transports = producer.instance.statistics().transports
            assert any(t.connects >= 2 for t in transports if t.address == back.broker_address)
            stored = uniq_keys_stored(back, topic)
    assert sorted(stored) == sorted(result.msg_id for result in acknowledged)


class _Shutdown:
    """contextlib.closing's view of a producer: shutdown() on the way out."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def close(self) -> None:
        self.producer.shutdown()

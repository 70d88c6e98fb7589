"""The client's route table: what Java's MQClientInstance keeps per topic and per broker.

Goal: route_table.py keeps its three rules: a route is stored with its publish info rebuilt only
when it changed (so an unchanged route keeps its round-robin counter); broker addresses
accumulate from routes and go when no stored route names them; a topic borrowing TBW102's route
gets min(queue count, readQueueNums) read and write queues per broker. Also the address choices:
the master for publishing (and the CLI's writes), the master else the lowest id for the CLI's
reads, and findBrokerAddressInSubscribe's id, id + 1, then lowest-id fallbacks.

Method: hand-built routes and explicit expectations; no sockets, no clocks.
"""

from __future__ import annotations

import random

from mqbox.client.route_table import (
    RouteTable,
    default_topic_route,
    master_address,
    read_address,
    subscribe_queues,
)
from mqbox.protocol.codes import PERM_INHERIT, PERM_READ, PERM_WRITE
from mqbox.protocol.headers import BrokerData, MessageQueue, QueueData, TopicRouteData

RW = PERM_READ | PERM_WRITE


def route(*brokers: tuple[str, dict[int, str], int, int]) -> TopicRouteData:
    """(name, addresses, queue count, perm) per broker."""
    return TopicRouteData(
        queue_datas=tuple(QueueData(name, count, count, perm) for name, _, count, perm in brokers),
        broker_datas=tuple(BrokerData("c", name, dict(addrs)) for name, addrs, _, _ in brokers),
    )


A = ("broker-a", {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}, 4, RW)
B = ("broker-b", {0: "10.0.0.3:10911"}, 2, RW)


def test_master_and_read_addresses_of_a_broker() -> None:
    both = BrokerData("c", "a", {1: "slave:1", 0: "master:1"})
    slaves = BrokerData("c", "a", {2: "s2:1", 1: "s1:1"})
    assert master_address(both) == "master:1"
    assert read_address(both) == "master:1"
    assert master_address(slaves) is None
    assert read_address(slaves) == "s1:1"
    assert read_address(BrokerData("c", "a", {})) is None


def test_update_stores_a_route_and_rebuilds_publish_info_only_on_change() -> None:
    table = RouteTable(random.Random(1))
    assert table.update("T", route(A, B))
    info = table.publish_info("T")
    assert info is not None
    assert [(q.broker_name, q.queue_id) for q in info.queues] == [
        ("broker-a", 0),
        ("broker-a", 1),
        ("broker-a", 2),
        ("broker-a", 3),
        ("broker-b", 0),
        ("broker-b", 1),
    ]
    info.select_one()
    assert not table.update("T", route(A, B))
    assert table.publish_info("T") is info  # the counter goes on
    assert table.update("T", route(A))
    assert table.publish_info("T") is not info


def test_broker_addresses_accumulate_and_offline_ones_are_cleaned() -> None:
    table = RouteTable(random.Random(1))
    table.update("T1", route(A))
    table.update("T2", route(B))
    assert [entry[2] for entry in table.addresses()] == [
        "10.0.0.1:10911",
        "10.0.0.2:10911",
        "10.0.0.3:10911",
    ]
    assert table.master_address("broker-b") == "10.0.0.3:10911"
    assert table.clean_offline_brokers() == []
    table.remove("T2")
    assert table.clean_offline_brokers() == ["10.0.0.3:10911"]
    assert table.master_address("broker-b") is None
    # A later route's addresses of a broker replace the earlier ones (Java's put).
    table.update("T1", route(("broker-a", {0: "10.0.0.1:10911"}, 4, RW)))
    assert list(table.addresses()) == [("broker-a", 0, "10.0.0.1:10911")]


def test_a_borrowed_route_caps_queues_at_the_default_count() -> None:
    template = route(("broker-a", {0: "a:1"}, 8, RW | PERM_INHERIT), ("broker-b", {0: "b:1"}, 2, 7))
    borrowed = default_topic_route(template, 4)
    assert [(q.read_queue_nums, q.write_queue_nums) for q in borrowed.queue_datas] == [
        (4, 4),
        (2, 2),
    ]
    assert [q.perm for q in borrowed.queue_datas] == [RW | PERM_INHERIT, 7]
    assert borrowed.broker_datas == template.broker_datas


def test_subscribe_queues_are_the_readable_ones() -> None:
    only_write = ("broker-w", {0: "w:1"}, 3, PERM_WRITE)
    assert subscribe_queues("T", route(B, only_write)) == (
        MessageQueue("T", "broker-b", 0),
        MessageQueue("T", "broker-b", 1),
    )


def test_subscribe_address_follows_java_fallbacks() -> None:
    table = RouteTable(random.Random(1))
    table.update("T", route(("x", {0: "m:1", 2: "s2:1"}, 1, RW)))
    assert table.subscribe_address("x", 0) == ("m:1", False)
    assert table.subscribe_address("x", 2) == ("s2:1", True)
    assert table.subscribe_address("x", 1) == ("s2:1", True)  # id + 1
    assert table.subscribe_address("x", 5) == ("m:1", False)  # the lowest id
    assert table.subscribe_address("x", 5, only_this_broker=True) is None
    assert table.subscribe_address("unknown", 0) is None

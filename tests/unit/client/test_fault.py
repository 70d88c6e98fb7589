"""Producer queue choice: publish lists, round robin, last-broker avoidance, latency faults.

Goal: fault.py follows RocketMQ 4.9.7 as docs/client.md A.1 to A.3 states it: the
not-available duration table at each boundary, an isolation lasting 600 s, selection that skips
unavailable brokers and falls back to pick_one_at_least's ranking and turn-taking, the
last-broker avoidance of the plain round robin, Java int wrapping of the counters, and the
publish queue list of a route (sorted, WRITE perm, masters only; orderTopicConf as written).

Method: tables and hand-built routes with explicit `now_ms` values; counters are started at
chosen values (SendIndex(start)) so each expected queue follows from Java's arithmetic by hand.
"""

from __future__ import annotations

import random

import pytest

from mqbox.client.fault import (
    INT32_MAX,
    INT32_MIN,
    LatencyFaultTolerance,
    MQFaultStrategy,
    PublishRouteError,
    SendIndex,
    TopicPublishInfo,
    java_abs_index,
    not_available_duration_ms,
    publish_queues,
)
from mqbox.protocol.codes import PERM_READ, PERM_WRITE
from mqbox.protocol.headers import BrokerData, MessageQueue, QueueData, TopicRouteData

TOPIC = "Orders"
RW = PERM_READ | PERM_WRITE
NOW_MS = 1_700_000_000_000


def broker(name: str, *broker_ids: int) -> BrokerData:
    return BrokerData("DefaultCluster", name, {i: f"10.0.0.{i + 1}:10911" for i in broker_ids})


def two_broker_route(queue_count: int = 4) -> TopicRouteData:
    return TopicRouteData(
        queue_datas=(
            QueueData("broker-b", queue_count, queue_count, RW),
            QueueData("broker-a", queue_count, queue_count, RW),
        ),
        broker_datas=(broker("broker-b", 0), broker("broker-a", 0, 1)),
    )


def info_at(route: TopicRouteData, start: int) -> TopicPublishInfo:
    """Publish info whose counter's next index is start + 1."""
    info = TopicPublishInfo.from_route(TOPIC, route, random.Random(0))
    info.send_index = SendIndex(start)
    return info


def short(queue: MessageQueue) -> str:
    return f"{queue.broker_name[-1]}{queue.queue_id}"


# --- Tables -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("latency_ms", "duration_ms"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (100, 0),
        (549, 0),
        (550, 30_000),
        (999, 30_000),
        (1_000, 60_000),
        (1_999, 60_000),
        (2_000, 120_000),
        (2_999, 120_000),
        (3_000, 180_000),
        (14_999, 180_000),
        (15_000, 600_000),
        (30_000, 600_000),
        (10**12, 600_000),
        (-5, 0),
    ],
)
def test_not_available_duration_table_boundaries(latency_ms: int, duration_ms: int) -> None:
    assert not_available_duration_ms(latency_ms) == duration_ms


def test_an_isolated_broker_is_out_for_600_seconds() -> None:
    strategy = MQFaultStrategy(enabled=True)
    strategy.update_fault_item("broker-a", 12, isolation=True, now_ms=NOW_MS)
    assert not strategy.is_available("broker-a", NOW_MS + 599_999)
    assert strategy.is_available("broker-a", NOW_MS + 600_000)
    assert strategy.tolerance.items["broker-a"].current_latency_ms == 12


def test_a_slow_send_makes_its_broker_unavailable_for_its_duration_then_a_fast_one_clears_it() -> (
    None
):
    strategy = MQFaultStrategy(enabled=True)
    strategy.update_fault_item("broker-a", 1_200, isolation=False, now_ms=NOW_MS)
    assert not strategy.is_available("broker-a", NOW_MS + 59_999)
    assert strategy.is_available("broker-a", NOW_MS + 60_000)
    strategy.update_fault_item("broker-a", 1_200, isolation=False, now_ms=NOW_MS)
    strategy.update_fault_item("broker-a", 10, isolation=False, now_ms=NOW_MS + 1)
    assert strategy.is_available("broker-a", NOW_MS + 1)


def test_a_disabled_strategy_records_nothing() -> None:
    strategy = MQFaultStrategy()
    strategy.update_fault_item("broker-a", 20_000, isolation=True, now_ms=NOW_MS)
    assert strategy.tolerance.items == {}
    assert strategy.is_available("broker-a", NOW_MS)


# --- Counters -----------------------------------------------------------------------------------


def test_send_index_wraps_as_a_java_int_and_is_masked() -> None:
    index = SendIndex(INT32_MAX - 1)
    assert index.increment_and_get() == INT32_MAX
    assert index.increment_and_get() == 0  # MIN_VALUE & 0x7FFFFFFF
    assert index.increment_and_get() == 1
    assert SendIndex(-5).increment_and_get() == (-4) & 0x7FFFFFFF


def test_java_abs_index_maps_min_value_to_zero() -> None:
    assert java_abs_index(INT32_MIN, 7) == 0
    assert java_abs_index(-9, 4) == 1
    assert java_abs_index(9, 4) == 1


def test_from_route_seeds_the_counter_from_the_given_random() -> None:
    route = two_broker_route()
    first = TopicPublishInfo.from_route(TOPIC, route, random.Random(42))
    second = TopicPublishInfo.from_route(TOPIC, route, random.Random(42))
    assert [first.select_one() for _ in range(10)] == [second.select_one() for _ in range(10)]


# --- Publish queues -----------------------------------------------------------------------------


def test_publish_queues_are_sorted_writable_and_mastered() -> None:
    route = TopicRouteData(
        queue_datas=(
            QueueData("broker-c", 4, 2, RW),  # master present
            QueueData("broker-a", 4, 2, PERM_WRITE),
            QueueData("broker-d", 4, 2, PERM_READ),  # not writable
            QueueData("broker-b", 4, 2, RW),  # slave only
            QueueData("broker-e", 4, 2, RW),  # no BrokerData
        ),
        broker_datas=(
            broker("broker-c", 0),
            broker("broker-a", 0),
            broker("broker-d", 0),
            broker("broker-b", 1),
        ),
    )
    queues, order_topic = publish_queues(TOPIC, route)
    assert [short(queue) for queue in queues] == ["a0", "a1", "c0", "c1"]
    assert not order_topic


def test_order_topic_conf_is_the_whole_list_in_the_order_written() -> None:
    route = TopicRouteData(
        queue_datas=(QueueData("broker-a", 8, 8, RW),),
        broker_datas=(broker("broker-a", 0),),
        order_topic_conf="broker-b:2;broker-a:1;",
    )
    queues, order_topic = publish_queues(TOPIC, route)
    assert [short(queue) for queue in queues] == ["b0", "b1", "a0"]
    assert order_topic


@pytest.mark.parametrize(
    "conf", ["broker-a", "broker-a:x", "broker-a:1;;broker-b:1", "a:99999999999"]
)
def test_a_malformed_order_topic_conf_is_refused(conf: str) -> None:
    route = TopicRouteData(order_topic_conf=conf)
    with pytest.raises(PublishRouteError):
        publish_queues(TOPIC, route)


def test_a_route_without_writable_queues_is_not_ok() -> None:
    route = TopicRouteData(
        queue_datas=(QueueData("broker-a", 4, 4, PERM_READ),), broker_datas=(broker("broker-a", 0),)
    )
    assert not TopicPublishInfo.from_route(TOPIC, route).ok()


# --- Selection without the strategy -------------------------------------------------------------


def test_plain_selection_is_round_robin_from_the_counter() -> None:
    info = info_at(two_broker_route(), start=5)  # next indexes 6, 7, 8, ...
    assert [short(info.select_one()) for _ in range(4)] == ["b2", "b3", "a0", "a1"]


def test_last_broker_avoidance_skips_queues_of_that_broker() -> None:
    info = info_at(two_broker_route(), start=-1)  # next indexes 0, 1, 2, ...: a0 a1 a2 a3 b0 ...
    strategy = MQFaultStrategy()
    assert short(strategy.select_one(info, "broker-a", NOW_MS)) == "b0"  # tried 0..4
    assert short(strategy.select_one(info, "broker-a", NOW_MS)) == "b1"  # index 5
    assert short(strategy.select_one(info, "broker-b", NOW_MS)) == "a0"  # tried 6, 7, then 8 % 8


def test_last_broker_avoidance_falls_back_when_every_queue_is_on_that_broker() -> None:
    route = TopicRouteData(
        queue_datas=(QueueData("broker-a", 3, 3, RW),), broker_datas=(broker("broker-a", 0),)
    )
    info = info_at(route, start=-1)
    # three tries (indexes 0, 1, 2) all on broker-a, then the plain call takes index 3 -> a0
    assert short(info.select_one("broker-a")) == "a0"
    assert short(info.select_one()) == "a1"  # index 4


# --- Selection with the strategy ----------------------------------------------------------------


def test_selection_skips_unavailable_brokers_and_ignores_last_broker() -> None:
    info = info_at(two_broker_route(), start=-1)
    strategy = MQFaultStrategy(enabled=True)
    strategy.update_fault_item("broker-a", 0, isolation=True, now_ms=NOW_MS)
    picks = [short(strategy.select_one(info, "broker-b", NOW_MS)) for _ in range(3)]
    # each call starts at the next counter value (0, 1, 2) and walks to the first b queue
    assert picks == ["b0", "b0", "b0"]
    info = info_at(two_broker_route(), start=3)  # starts at index 4: b0, then 5: b1
    assert short(strategy.select_one(info, "broker-b", NOW_MS)) == "b0"
    assert short(strategy.select_one(info, "broker-b", NOW_MS)) == "b1"


def test_selection_walks_through_an_index_that_wraps_past_max_int() -> None:
    info = info_at(two_broker_route(), start=INT32_MAX - 1)  # first index MAX (pos 7 = b3)
    strategy = MQFaultStrategy(enabled=True)
    strategy.update_fault_item("broker-b", 0, isolation=True, now_ms=NOW_MS)
    # MAX -> b3 (unavailable), then the local index wraps to MIN -> position 0 = a0
    assert short(strategy.select_one(info, None, NOW_MS)) == "a0"


def test_all_brokers_unavailable_falls_back_to_the_least_bad_one() -> None:
    info = info_at(two_broker_route(), start=-1)
    strategy = MQFaultStrategy(enabled=True, rng=random.Random(1))
    strategy.tolerance.worst_index = SendIndex(0)
    strategy.update_fault_item("broker-a", 3_500, isolation=False, now_ms=NOW_MS)  # 180 s
    strategy.update_fault_item("broker-b", 600, isolation=False, now_ms=NOW_MS)  # 30 s
    # The loop uses index 0 (counter now 0); two items, half = 1, so the best: broker-b.
    # Then a plain select_one (counter 1) and queue id = counter 2 % 4.
    queue = strategy.select_one(info, None, NOW_MS + 1_000)
    assert queue == MessageQueue(TOPIC, "broker-b", 2)
    assert info.send_index.increment_and_get() == 3
    # The publish list itself is untouched (Java 4.9.7 overwrote one of its entries).
    assert info.queues == tuple(publish_queues(TOPIC, two_broker_route())[0])


def test_pick_one_at_least_ranks_available_then_latency_then_start_and_takes_turns() -> None:
    tolerance = LatencyFaultTolerance(SendIndex(-1))  # worst indexes 0, 1, 2, ...
    tolerance.update_fault_item("slow-available", 900, 0, NOW_MS - 10)
    tolerance.update_fault_item("fast-out", 10, 60_000, NOW_MS)
    tolerance.update_fault_item("slow-out", 900, 60_000, NOW_MS)
    tolerance.update_fault_item("slow-out-earlier", 900, 60_000, NOW_MS - 5)
    # ranked: slow-available, fast-out, slow-out-earlier, slow-out; half = 2
    picks = [tolerance.pick_one_at_least(NOW_MS) for _ in range(4)]
    assert picks == ["slow-available", "fast-out", "slow-available", "fast-out"]
    one = LatencyFaultTolerance(SendIndex(0))
    assert one.pick_one_at_least(NOW_MS) is None
    one.update_fault_item("only", 5, 1_000, NOW_MS)
    assert one.pick_one_at_least(NOW_MS) == "only"


def test_a_fallback_broker_without_write_queues_loses_its_fault_item() -> None:
    info = info_at(two_broker_route(), start=-1)
    strategy = MQFaultStrategy(enabled=True)
    strategy.update_fault_item("broker-a", 0, isolation=True, now_ms=NOW_MS)
    strategy.update_fault_item("broker-b", 0, isolation=True, now_ms=NOW_MS)
    strategy.update_fault_item("gone", 0, isolation=False, now_ms=NOW_MS)  # available, ranks first
    strategy.tolerance.worst_index = SendIndex(-1)
    # "gone" is available, so it ranks first and is picked; it has no QueueData (-1 write queues)
    queue = strategy.select_one(info, None, NOW_MS)
    assert "gone" not in strategy.tolerance.items
    assert short(queue) == "a1"  # the loop used index 0; the plain call takes index 1

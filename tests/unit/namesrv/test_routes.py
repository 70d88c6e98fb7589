"""RouteTable: RocketMQ's route rules, with no sockets and no clock.

Goal: registration (first time, dataVersion changed or not, masters and slaves, a slave promoted),
unregistration, eviction after exactly 120 s of silence, eviction when the registering connection
closes, routes with and without orderTopicConf, cluster info, topic list, topic deletion, write
permission wipes and KV config all follow docs/protocol.md section 4.1 and RocketMQ 4.5.2's
RouteInfoManager; the route of a registered topic serialises byte for byte to the example that
the C++ wheel accepted.
Method: drive one RouteTable per test with hand-made headers and bodies and explicit `now_ms`
values; call `check_invariants()` after each change; a hypothesis run of random operations checks
the invariants hold in any order.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.namesrv.routes import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    KvLimits,
    RemovedBroker,
    RouteLimits,
    RouteTable,
)
from mqbox.protocol.headers import (
    BrokerData,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
    TopicRouteData,
    UnregisterBrokerRequestHeader,
)

EXPIRED_MS = 120_000
CLUSTER = "DefaultCluster"
MASTER_ADDR = "127.0.0.1:10911"
SLAVE_ADDR = "127.0.0.1:10921"

# docs/protocol.md section 4.1, "Example that the wheel accepts", byte for byte.
WHEEL_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":'
    b'"broker-a","perm":6,"readQueueNums":4,"topicSynFlag":0,"writeQueueNums":4}]}'
)


def header(
    broker_name: str = "broker-a",
    broker_addr: str = MASTER_ADDR,
    broker_id: int = 0,
    cluster: str = CLUSTER,
    ha_server_addr: str = "127.0.0.1:10912",
) -> RegisterBrokerRequestHeader:
    return RegisterBrokerRequestHeader(broker_name, broker_addr, cluster, ha_server_addr, broker_id)


def body(
    counter: int = 1, *topics: TopicConfig, filter_servers: tuple[str, ...] = ()
) -> RegisterBrokerBody:
    if not topics:
        topics = (TopicConfig("test", 4, 4, 6),)
    return RegisterBrokerBody(
        DataVersion(counter, 1_700_000_000_000),
        {topic.topic_name: topic for topic in topics},
        filter_servers,
    )


def register(
    routes: RouteTable,
    registration: RegisterBrokerRequestHeader | None = None,
    registration_body: RegisterBrokerBody | None = None,
    *,
    connection_id: int = 1,
    now_ms: int = 0,
) -> None:
    routes.register_broker(
        registration or header(),
        registration_body or body(),
        connection_id=connection_id,
        now_ms=now_ms,
    )
    routes.check_invariants()


def unregister(routes: RouteTable, broker_id: int, addr: str) -> RemovedBroker | None:
    request = UnregisterBrokerRequestHeader("broker-a", addr, CLUSTER, broker_id)
    removed = routes.unregister_broker(request)
    routes.check_invariants()
    return removed


# -- registration and routes ------------------------------------------------------------------


def test_route_of_a_registered_topic_is_the_json_the_wheel_accepts() -> None:
    routes = RouteTable()
    register(routes)
    route = routes.route("test")
    assert route is not None
    assert route.to_json() == WHEEL_ROUTE
    assert TopicRouteData.from_json(WHEEL_ROUTE) == route


def test_unknown_topic_has_no_route() -> None:
    routes = RouteTable()
    assert routes.route("test") is None
    register(routes)
    assert routes.route("other") is None


def test_first_registration_reports_itself_and_upserts_topics() -> None:
    routes = RouteTable()
    result = routes.register_broker(header(), body(), connection_id=7, now_ms=5)
    assert result.first_registration
    assert result.topics_updated
    assert (result.ha_server_addr, result.master_addr) == (None, None)
    live = routes.broker_live(MASTER_ADDR)
    assert live is not None
    assert (live.last_update_ms, live.connection_id) == (5, 7)
    assert live.ha_server_addr == "127.0.0.1:10912"
    assert live.data_version == DataVersion(1, 1_700_000_000_000)


def test_same_data_version_keeps_queue_data_but_refreshes_liveness() -> None:
    routes = RouteTable()
    register(routes, now_ms=0)
    changed = body(1, TopicConfig("test", 8, 8, 6), TopicConfig("new-topic", 2, 2, 6))
    result = routes.register_broker(header(), changed, connection_id=1, now_ms=1000)
    assert not result.first_registration
    assert not result.topics_updated
    route = routes.route("test")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6),)
    assert routes.route("new-topic") is None
    live = routes.broker_live(MASTER_ADDR)
    assert live is not None
    assert live.last_update_ms == 1000


def test_changed_data_version_upserts_every_topic_and_removes_none() -> None:
    routes = RouteTable()
    register(
        routes,
        registration_body=body(1, TopicConfig("test", 4, 4, 6), TopicConfig("kept", 1, 1, 6)),
    )
    result = routes.register_broker(
        header(),
        body(2, TopicConfig("test", 8, 16, 4), TopicConfig("new-topic", 2, 2, 6)),
        connection_id=1,
        now_ms=1,
    )
    assert result.topics_updated
    route = routes.route("test")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 8, 16, 4),)
    assert routes.route("new-topic") is not None
    # RocketMQ 4.5.2 never removes a topic on registration.
    assert routes.route("kept") is not None
    assert routes.topic_list() == ("test", "kept", "new-topic")


def test_slave_gets_master_addresses_and_never_writes_queue_data() -> None:
    routes = RouteTable()
    register(routes)
    slave = header(broker_addr=SLAVE_ADDR, broker_id=1, ha_server_addr="127.0.0.1:10922")
    result = routes.register_broker(
        slave, body(9, TopicConfig("slave-only", 4, 4, 6)), connection_id=2, now_ms=0
    )
    routes.check_invariants()
    assert result.master_addr == MASTER_ADDR
    assert result.ha_server_addr == "127.0.0.1:10912"
    assert routes.route("slave-only") is None
    route = routes.route("test")
    assert route is not None
    assert route.broker_datas == (BrokerData(CLUSTER, "broker-a", {0: MASTER_ADDR, 1: SLAVE_ADDR}),)


def test_slave_without_a_live_master_gets_no_master_address() -> None:
    routes = RouteTable()
    result = routes.register_broker(
        header(broker_addr=SLAVE_ADDR, broker_id=1), body(), connection_id=2, now_ms=0
    )
    assert (result.master_addr, result.ha_server_addr) == (None, None)
    # A broker name with only a slave has no queue data, hence no route.
    assert routes.route("test") is None


def test_slave_promoted_to_master_leaves_its_old_id() -> None:
    routes = RouteTable()
    register(routes, header(broker_addr=SLAVE_ADDR, broker_id=1), connection_id=2)
    register(routes, header(broker_addr=SLAVE_ADDR, broker_id=0), connection_id=2)
    info = routes.cluster_info()
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: SLAVE_ADDR}
    assert routes.route("test") is not None


def test_broker_moving_cluster_leaves_the_old_one() -> None:
    routes = RouteTable()
    register(routes)
    register(routes, header(cluster="OtherCluster"), body(2))
    info = routes.cluster_info()
    assert info.cluster_addr_table == {"OtherCluster": ("broker-a",)}
    assert info.broker_addr_table["broker-a"].cluster == "OtherCluster"


def test_route_lists_every_broker_serving_the_topic() -> None:
    routes = RouteTable()
    register(routes)
    register(routes, header("broker-b", "127.0.0.1:20911"), body(1, TopicConfig("test", 2, 2, 6)))
    route = routes.route("test")
    assert route is not None
    assert [queue.broker_name for queue in route.queue_datas] == ["broker-a", "broker-b"]
    assert [broker.broker_name for broker in route.broker_datas] == ["broker-a", "broker-b"]


def test_filter_servers_are_kept_per_address_and_cleared() -> None:
    routes = RouteTable()
    register(routes, registration_body=body(1, filter_servers=("127.0.0.1:30000",)))
    assert routes.filter_servers(MASTER_ADDR) == ("127.0.0.1:30000",)
    register(routes, registration_body=body(1))
    assert routes.filter_servers(MASTER_ADDR) == ()
    # Never part of a route: the JSON always carries an empty filterServerTable.
    route = routes.route("test")
    assert route is not None
    assert b'"filterServerTable":{}' in route.to_json()


# -- orderTopicConf and KV config -------------------------------------------------------------


def test_order_topic_conf_is_routed_only_when_order_messages_are_enabled() -> None:
    for enabled in (False, True):
        routes = RouteTable(order_message_enable=enabled)
        register(routes)
        routes.kv_put(NAMESPACE_ORDER_TOPIC_CONFIG, "test", "broker-a:4")
        route = routes.route("test")
        assert route is not None
        assert route.order_topic_conf == ("broker-a:4" if enabled else None)
        assert (b'"orderTopicConf":"broker-a:4"' in route.to_json()) is enabled


def test_kv_config_put_get_delete() -> None:
    routes = RouteTable()
    assert routes.kv_get("ns", "k") is None
    assert routes.kv_namespace("ns") is None
    routes.kv_put("ns", "k", "v1")
    routes.kv_put("ns", "k", "v2")
    routes.kv_put("ns", "other", "x")
    assert routes.kv_get("ns", "k") == "v2"
    assert routes.kv_namespace("ns") == {"k": "v2", "other": "x"}
    assert routes.kv_delete("ns", "k")
    assert not routes.kv_delete("ns", "k")
    assert routes.kv_delete("ns", "other")
    assert routes.kv_namespace("ns") is None
    assert not routes.kv_delete("missing", "k")


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(["a", "b", "c", "\udcff"]),
            st.sampled_from(["k0", "k1", "k2", "kk" * 5, "\ud800"]),
            st.text(max_size=12),
        ),
        max_size=60,
    )
)
def test_kv_table_stays_within_its_limits_under_any_operations(
    operations: list[tuple[bool, str, str, str]],
) -> None:
    """Issue 9: the KV table is bounded (invariant 4); a refused put changes nothing."""
    routes = RouteTable(kv_limits=KvLimits(4, 2, 8, 16))
    for is_put, namespace, key, value in operations:
        if not is_put:
            routes.kv_delete(namespace, key)
        else:
            before = routes.kv_namespace(namespace)
            problem = routes.kv_put(namespace, key, value)
            if problem is None:
                assert routes.kv_get(namespace, key) == value
            else:
                assert problem.split("=")[0].rsplit(" ", 1)[-1].startswith("mqboxKv"), problem
                assert routes.kv_namespace(namespace) == before
        routes.check_invariants()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["register", "unregister", "close"]),
            st.sampled_from(["broker-a", "broker-b", "broker-c"]),
            st.integers(0, 2),  # broker id
            st.integers(0, 3),  # address
            st.sets(st.sampled_from(["t0", "t1", "t2", "t3", "t4"]), min_size=1, max_size=4),
        ),
        max_size=40,
    )
)
def test_route_tables_stay_within_their_limits_under_any_registrations(
    operations: list[tuple[str, str, int, int, set[str]]],
) -> None:
    """Invariant 5: live addresses, (name, id) slots and routed topics stay within RouteLimits;
    a refused registration changes nothing, and one not refused is always taken."""
    limits = RouteLimits(broker_count_max=2, topic_count_max=3)
    routes = RouteTable(route_limits=limits)
    for step, (operation, name, broker_id, address, topics) in enumerate(operations):
        addr = f"127.0.0.1:{10911 + address}"
        request = header(name, addr, broker_id)
        if operation == "unregister":
            routes.unregister_broker(UnregisterBrokerRequestHeader(name, addr, CLUSTER, broker_id))
        elif operation == "close":
            routes.on_connection_closed(address)
        else:
            configs = tuple(TopicConfig(topic, 1, 1, 6) for topic in sorted(topics))
            before = routes.cluster_info()
            refusal = routes.registration_refusal(request)
            if refusal is not None:
                assert "mqboxNamesrvBrokerCountMax=2" in refusal
                assert routes.cluster_info() == before
            else:
                result = routes.register_broker(
                    request, body(step + 1, *configs), connection_id=address, now_ms=step
                )
                assert addr in (routes.cluster_info().broker_addr_table[name].broker_addrs.values())
                routed = [topic for topic in topics if routes.route(topic) is not None]
                if broker_id == 0:
                    assert len(routed) + result.topics_refused_count == len(topics)
        routes.check_invariants()


def test_a_broker_already_registered_re_registers_at_the_limit() -> None:
    routes = RouteTable(route_limits=RouteLimits(broker_count_max=1, topic_count_max=1))
    register(routes, header(), body(1, TopicConfig("t0", 4, 4, 6)))
    assert routes.registration_refusal(header()) is None
    assert "mqboxNamesrvBrokerCountMax=1" in (routes.registration_refusal(header("broker-b")) or "")
    result = routes.register_broker(
        header(),
        body(2, TopicConfig("t0", 8, 8, 6), TopicConfig("t1", 4, 4, 6)),
        connection_id=1,
        now_ms=1,
    )
    assert result.topics_refused_count == 1
    route = routes.route("t0")
    assert route is not None
    assert route.queue_datas[0].read_queue_nums == 8
    assert routes.route("t1") is None
    routes.check_invariants()


# -- eviction ---------------------------------------------------------------------------------


def test_broker_silent_for_exactly_120_s_stays_and_one_ms_more_is_evicted() -> None:
    routes = RouteTable()
    register(routes, now_ms=1000)
    assert routes.scan_not_active(1000 + EXPIRED_MS, EXPIRED_MS) == ()
    assert routes.route("test") is not None
    evicted = routes.scan_not_active(1000 + EXPIRED_MS + 1, EXPIRED_MS)
    routes.check_invariants()
    assert evicted == (RemovedBroker(CLUSTER, "broker-a", 0, MASTER_ADDR, 1, True),)
    assert routes.route("test") is None
    assert routes.topic_list() == ()
    info = routes.cluster_info()
    assert info.broker_addr_table == {}
    assert info.cluster_addr_table == {}
    assert routes.broker_count() == 0


def test_re_registration_postpones_eviction() -> None:
    routes = RouteTable()
    register(routes, now_ms=0)
    register(routes, now_ms=100_000)
    assert routes.scan_not_active(200_000, EXPIRED_MS) == ()
    assert len(routes.scan_not_active(220_001, EXPIRED_MS)) == 1


def test_evicted_slave_leaves_the_master_route_alone() -> None:
    routes = RouteTable()
    register(routes, now_ms=100_000)
    register(routes, header(broker_addr=SLAVE_ADDR, broker_id=1), connection_id=2, now_ms=0)
    evicted = routes.scan_not_active(EXPIRED_MS + 1, EXPIRED_MS)
    routes.check_invariants()
    assert evicted == (RemovedBroker(CLUSTER, "broker-a", 1, SLAVE_ADDR, 2, False),)
    route = routes.route("test")
    assert route is not None
    assert route.broker_datas == (BrokerData(CLUSTER, "broker-a", {0: MASTER_ADDR}),)


def test_eviction_keeps_topics_other_brokers_still_serve() -> None:
    routes = RouteTable()
    register(routes, now_ms=0)
    register(routes, header("broker-b", "127.0.0.1:20911"), connection_id=2, now_ms=100_000)
    routes.scan_not_active(EXPIRED_MS + 1, EXPIRED_MS)
    routes.check_invariants()
    route = routes.route("test")
    assert route is not None
    assert [queue.broker_name for queue in route.queue_datas] == ["broker-b"]


def test_first_registration_after_eviction_upserts_topics_even_with_the_same_version() -> None:
    routes = RouteTable()
    register(routes, now_ms=0)
    routes.scan_not_active(EXPIRED_MS + 1, EXPIRED_MS)
    register(routes, now_ms=EXPIRED_MS + 2)
    assert routes.route("test") is not None


def test_closing_the_registering_connection_removes_its_brokers_only() -> None:
    routes = RouteTable()
    register(routes, connection_id=1)
    register(
        routes,
        header("broker-b", "127.0.0.1:20911"),
        body(1, TopicConfig("b-only", 1, 1, 6)),
        connection_id=2,
    )
    assert routes.on_connection_closed(99) == ()
    removed = routes.on_connection_closed(1)
    routes.check_invariants()
    assert [(item.broker_name, item.connection_id) for item in removed] == [("broker-a", 1)]
    assert routes.route("test") is None
    assert routes.route("b-only") is not None


def test_re_registration_over_a_new_connection_survives_the_old_one_closing() -> None:
    routes = RouteTable()
    register(routes, connection_id=1)
    register(routes, connection_id=2)
    assert routes.on_connection_closed(1) == ()
    assert routes.route("test") is not None
    assert len(routes.on_connection_closed(2)) == 1
    assert routes.route("test") is None


# -- unregistration and admin -----------------------------------------------------------------


def test_unregister_removes_one_id_and_the_last_one_takes_the_queues() -> None:
    routes = RouteTable()
    register(routes)
    register(routes, header(broker_addr=SLAVE_ADDR, broker_id=1), connection_id=2)
    removed = unregister(routes, 1, SLAVE_ADDR)
    assert removed == RemovedBroker(CLUSTER, "broker-a", 1, SLAVE_ADDR, 2, False)
    assert routes.route("test") is not None
    removed = unregister(routes, 0, MASTER_ADDR)
    assert removed is not None
    assert removed.broker_name_removed
    assert routes.route("test") is None
    assert routes.cluster_info().cluster_addr_table == {}


def test_unregister_of_an_unknown_broker_changes_nothing() -> None:
    routes = RouteTable()
    register(routes)
    assert unregister(routes, 3, "127.0.0.1:1") is None
    assert routes.route("test") is not None


def test_cluster_info_and_topic_list_are_copies() -> None:
    routes = RouteTable()
    register(routes)
    register(routes, header("broker-b", "127.0.0.1:20911", cluster="C2"), connection_id=2)
    info = routes.cluster_info()
    assert info.cluster_addr_table == {CLUSTER: ("broker-a",), "C2": ("broker-b",)}
    assert info.broker_addr_table["broker-b"] == BrokerData(
        "C2", "broker-b", {0: "127.0.0.1:20911"}
    )
    info.broker_addr_table["broker-b"].broker_addrs[5] = "mutated"
    assert routes.cluster_info().broker_addr_table["broker-b"].broker_addrs == {
        0: "127.0.0.1:20911"
    }
    assert routes.topic_list() == ("test",)


def test_delete_topic_removes_its_route_until_the_next_changed_registration() -> None:
    routes = RouteTable()
    register(routes)
    assert routes.delete_topic("test")
    assert not routes.delete_topic("test")
    assert routes.route("test") is None
    register(routes, registration_body=body(2))
    assert routes.route("test") is not None


def test_wipe_write_perm_clears_the_write_bit_of_one_broker() -> None:
    routes = RouteTable()
    register(
        routes, registration_body=body(1, TopicConfig("t1", 4, 4, 6), TopicConfig("t2", 4, 4, 7))
    )
    register(
        routes,
        header("broker-b", "127.0.0.1:20911"),
        body(1, TopicConfig("t1", 4, 4, 6)),
        connection_id=2,
    )
    assert routes.wipe_write_perm("broker-a") == 2
    assert routes.wipe_write_perm("nobody") == 0
    perms = {
        (queue.broker_name, topic): queue.perm
        for topic in ("t1", "t2")
        for queue in (routes.route(topic) or TopicRouteData()).queue_datas
    }
    assert perms == {("broker-a", "t1"): 4, ("broker-a", "t2"): 5, ("broker-b", "t1"): 6}


# -- any order of operations keeps the invariants ------------------------------------------------

_BROKERS = ("broker-a", "broker-b")
_ADDRS = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
_TOPICS = ("t1", "t2", "t3")


# Each operation takes the table and the time before it, and returns the time after it.
Operation = Callable[[RouteTable, int], int]


def _register(
    name: str, addr: str, broker_id: int, cluster: str, counter: int, topics: list[str], link: int
) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        configs = (TopicConfig(topic, 1, 1, 6) for topic in topics)
        registration = header(name, addr, broker_id, cluster)
        routes.register_broker(
            registration, body(counter, *configs), connection_id=link, now_ms=now_ms + 1000
        )
        return now_ms + 1000

    return apply


def _unregister(name: str, addr: str, broker_id: int) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        routes.unregister_broker(UnregisterBrokerRequestHeader(name, addr, "c1", broker_id))
        return now_ms

    return apply


def _scan(elapsed_ms: int) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        routes.scan_not_active(now_ms + elapsed_ms, EXPIRED_MS)
        return now_ms + elapsed_ms

    return apply


def _close(link: int) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        routes.on_connection_closed(link)
        return now_ms

    return apply


def _delete(topic: str) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        routes.delete_topic(topic)
        return now_ms

    return apply


def _wipe(broker_name: str) -> Operation:
    def apply(routes: RouteTable, now_ms: int) -> int:
        routes.wipe_write_perm(broker_name)
        return now_ms

    return apply


_operations = st.one_of(
    st.builds(
        _register,
        st.sampled_from(_BROKERS),
        st.sampled_from(_ADDRS),
        st.integers(0, 2),
        st.sampled_from(("c1", "c2")),
        st.integers(0, 3),
        st.lists(st.sampled_from(_TOPICS), max_size=3),
        st.integers(0, 3),
    ),
    st.builds(_unregister, st.sampled_from(_BROKERS), st.sampled_from(_ADDRS), st.integers(0, 2)),
    st.builds(_scan, st.integers(0, 300_000)),
    st.builds(_close, st.integers(0, 3)),
    st.builds(_delete, st.sampled_from(_TOPICS)),
    st.builds(_wipe, st.sampled_from(_BROKERS)),
)


@settings(max_examples=300)
@given(st.lists(_operations, max_size=30))
def test_any_sequence_of_operations_keeps_the_invariants(operations: list[Operation]) -> None:
    routes = RouteTable()
    now_ms = 0
    for operation in operations:
        now_ms = operation(routes, now_ms)
        routes.check_invariants()
        for topic in routes.topic_list():
            route = routes.route(topic)
            assert route is not None, topic
            queue_brokers = {queue.broker_name for queue in route.queue_datas}
            assert queue_brokers == {broker.broker_name for broker in route.broker_datas}


@pytest.mark.parametrize("topic", ["test", "%RETRY%CG_test", "TBW102"])
def test_any_registered_topic_name_routes(topic: str) -> None:
    routes = RouteTable()
    register(routes, registration_body=body(1, TopicConfig(topic, 1, 1, 7)))
    route = routes.route(topic)
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 1, 1, 7),)


# -- admin lists: 224 / 304 -------------------------------------------------------------------


def test_topics_by_cluster_and_the_system_topic_list() -> None:
    routes = RouteTable()
    assert routes.system_topic_list() == ((), None)
    register(routes, registration_body=body(1, TopicConfig("A", 1, 1, 6)))
    other = header("broker-b", "127.0.0.1:10931", cluster="OtherCluster")
    register(routes, other, body(1, TopicConfig("B", 1, 1, 6)), connection_id=2)
    assert routes.topics_of_cluster(CLUSTER) == ("A",)
    assert routes.topics_of_cluster("OtherCluster") == ("B",)
    assert routes.topics_of_cluster("NoSuchCluster") == ()
    names, broker_addr = routes.system_topic_list()
    assert names == (CLUSTER, "broker-a", "OtherCluster", "broker-b")
    assert broker_addr == MASTER_ADDR

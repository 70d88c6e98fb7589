"""Goal: the broker's client tables (processors/client_manager.py) keep one entry per client id and
group, on the connection of its newest heartbeat; report a consumer group's membership change
exactly when its set of client ids changes (heartbeat of a new client, unregister, a closed
connection, 120 s of silence) and never otherwise; recompute tag hashes from tag strings and
never trust codeSet; and keep each group's subscription table by Java's rules (new topics added,
a topic replaced only by a newer subVersion, topics a heartbeat leaves out dropped, the group
forgotten with its last member).

Method: HeartbeatData bodies as the C++ wheel and the Java client write them (golden text from
docs/protocol.md section 10, and a Java-style body with enum names), fed to ClientManager
with explicit monotonic times; and a hypothesis test that drives random sequences of
heartbeats, unregisters, closes and expiries against a plain model of who is in which group,
checking the reported changes and `check_invariants` after every step.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mqbox.message import tag_hash
from mqbox.protocol.codes import ConsumeFromWhere, ConsumeType, MessageModel
from mqbox.protocol.headers import (
    ConsumerData,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from mqbox.server.roles.processors.client_manager import (
    CLIENT_EXPIRY_MS_DEFAULT,
    ClientManager,
    group_name_problem,
    subscription_of,
    tags_of_expression,
)

SECOND_NS = 1_000_000_000
GOLDEN_CPP_HEARTBEAT = (
    b'{"clientID":"15339-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,'
    b'"consumeType":1,"groupName":"CG_order","messageModel":1,"subscriptionDataSet":['
    b'{"subString":"*","subVersion":"1795243997792","topic":"%RETRY%CG_order"},'
    b'{"codeSet":[0,0],"subString":"TagB || TagA","subVersion":"1795243997792",'
    b'"tagsSet":["TagB","TagA"],"topic":"test"}]}]}\n'
)


def consumer_heartbeat(
    client_id: str,
    group: str = "CG",
    subscriptions: dict[str, str] | None = None,
    sub_version: int = 1,
) -> HeartbeatData:
    subs = subscriptions if subscriptions is not None else {"T": "*"}
    return HeartbeatData(
        client_id,
        (),
        (
            ConsumerData(
                group,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                tuple(
                    SubscriptionData(topic, expression, sub_version=sub_version)
                    for topic, expression in subs.items()
                ),
            ),
        ),
    )


def test_golden_cpp_heartbeat_registers_the_consumer_with_recomputed_tag_hashes() -> None:
    manager = ClientManager()
    data = HeartbeatData.from_json(GOLDEN_CPP_HEARTBEAT)
    change = manager.heartbeat(data, conn_id=7, now_ns=0, language="CPP", version=63)
    assert change.groups_changed == frozenset({"CG_order"})
    assert change.groups_created == ("CG_order",)
    assert change.subscriptions_changed
    assert manager.consumer_ids("CG_order") == ["15339-127.0.0.1@DEFAULT"]
    assert manager.consumer_connections("CG_order") == [7]
    subscription = manager.group_subscription("CG_order", "test")
    assert subscription is not None
    assert subscription.tags == ("TagA", "TagB")
    assert subscription.tag_hashes == (2598919, 2598920)  # not the zeros of codeSet
    assert subscription.sub_version == 1795243997792
    retry = manager.group_subscription("CG_order", "%RETRY%CG_order")
    assert retry is not None
    assert retry.takes_every_tag
    group = manager.consumer_group("CG_order")
    assert group is not None
    member = group.members["15339-127.0.0.1@DEFAULT"]
    assert (member.language, member.version) == ("CPP", 63)
    assert member.consume_type is ConsumeType.CONSUME_PASSIVELY
    manager.check_invariants()


def test_java_heartbeat_with_enum_names_and_producers_is_read() -> None:
    body = json.dumps(
        {
            "clientID": "10.0.0.1@DEFAULT",
            "producerDataSet": [{"groupName": "PG"}, {"groupName": "CLIENT_INNER_PRODUCER"}],
            "consumerDataSet": [
                {
                    "groupName": "CG",
                    "consumeType": "CONSUME_ACTIVELY",
                    "messageModel": "BROADCASTING",
                    "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                    "unitMode": False,
                    "subscriptionDataSet": [
                        {
                            "classFilterMode": False,
                            "topic": "T",
                            "subString": "a || b",
                            "tagsSet": ["a", "b"],
                            "codeSet": [97, 98],
                            "subVersion": 5,
                            "expressionType": "TAG",
                        }
                    ],
                }
            ],
        }
    ).encode()
    manager = ClientManager()
    manager.heartbeat(HeartbeatData.from_json(body), conn_id=1, now_ns=0)
    assert manager.producer_groups() == ["CLIENT_INNER_PRODUCER", "PG"]
    assert manager.producer_ids("PG") == ["10.0.0.1@DEFAULT"]
    group = manager.consumer_group("CG")
    assert group is not None
    assert group.message_model is MessageModel.BROADCASTING
    assert group.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    subscription = manager.group_subscription("CG", "T")
    assert subscription is not None
    assert subscription.tag_hashes == (97, 98)
    manager.check_invariants()


def test_tags_come_from_tags_set_or_else_from_the_expression() -> None:
    from_set = subscription_of(SubscriptionData("T", "x || y", ("TagB", " TagA", "TagA")))
    assert from_set.tags == ("TagA", "TagB")
    from_expression = subscription_of(SubscriptionData("T", " TagB ||TagA|| "))
    assert from_expression.tags == ("TagA", "TagB")
    assert from_expression.tag_hashes == tuple(sorted((tag_hash("TagA"), tag_hash("TagB"))))
    for everything in ("*", "", "  ", " * "):
        assert subscription_of(SubscriptionData("T", everything, ("ignored",))).takes_every_tag
    assert tags_of_expression("||") == ()
    assert subscription_of(SubscriptionData("T", "中文")).tag_hashes == (646394,)


def test_a_second_heartbeat_changes_nothing_and_a_new_client_changes_membership() -> None:
    manager = ClientManager()
    assert manager.heartbeat(consumer_heartbeat("a"), 1, 0).groups_changed == {"CG"}
    again = manager.heartbeat(consumer_heartbeat("a"), 1, SECOND_NS)
    assert again.groups_changed == frozenset()
    assert again.groups_created == ()
    assert not again.subscriptions_changed
    joined = manager.heartbeat(consumer_heartbeat("b"), 2, SECOND_NS)
    assert joined.groups_changed == {"CG"}
    assert joined.groups_created == ()
    assert not joined.subscriptions_changed
    assert manager.consumer_ids("CG") == ["a", "b"]
    assert manager.consumer_connections("CG") == [1, 2]
    manager.check_invariants()


def test_a_client_that_reconnects_moves_and_its_old_connection_closing_keeps_it() -> None:
    manager = ClientManager()
    manager.heartbeat(consumer_heartbeat("a"), 1, 0)
    moved = manager.heartbeat(consumer_heartbeat("a"), 9, SECOND_NS)
    assert moved.groups_changed == frozenset()
    assert manager.consumer_connections("CG") == [9]
    assert manager.connection_closed(1).groups_changed == frozenset()
    assert manager.consumer_ids("CG") == ["a"]
    closed = manager.connection_closed(9)
    assert closed.groups_changed == {"CG"}
    assert closed.consumers_removed == 1
    assert closed.subscriptions_changed  # the group is gone, and its subscriptions with it
    assert manager.consumer_ids("CG") == []
    assert manager.consumer_group("CG") is None
    manager.check_invariants()


def test_closing_a_connection_removes_every_group_and_producer_on_it() -> None:
    manager = ClientManager()
    data = HeartbeatData(
        "a",
        (ProducerData("PG"),),
        (
            consumer_heartbeat("a", "G1").consumer_data_set[0],
            consumer_heartbeat("a", "G2").consumer_data_set[0],
        ),
    )
    manager.heartbeat(data, 3, 0)
    manager.heartbeat(consumer_heartbeat("b", "G2"), 4, 0)
    change = manager.connection_closed(3)
    assert change.groups_changed == {"G1", "G2"}
    assert (change.consumers_removed, change.producers_removed) == (2, 1)
    assert manager.consumer_groups() == ["G2"]
    assert manager.consumer_ids("G2") == ["b"]
    assert manager.producer_groups() == []
    assert manager.connection_closed(3).groups_changed == frozenset()
    manager.check_invariants()


def test_unregister_removes_the_client_from_the_named_groups_only() -> None:
    manager = ClientManager()
    data = HeartbeatData("a", (ProducerData("PG"),), consumer_heartbeat("a").consumer_data_set)
    manager.heartbeat(data, 1, 0)
    manager.heartbeat(consumer_heartbeat("b"), 2, 0)
    producer_only = manager.unregister("a", "PG", None)
    assert producer_only.groups_changed == frozenset()
    assert producer_only.producers_removed == 1
    assert manager.consumer_ids("CG") == ["a", "b"]
    change = manager.unregister("a", None, "CG")
    assert change.groups_changed == {"CG"}
    assert not change.subscriptions_changed  # b still subscribes
    assert manager.consumer_ids("CG") == ["b"]
    assert manager.unregister("nobody", "PG", "CG").groups_changed == frozenset()
    manager.check_invariants()


def test_a_client_silent_for_120_s_expires_and_a_fresh_heartbeat_keeps_it() -> None:
    manager = ClientManager()
    expiry_ns = CLIENT_EXPIRY_MS_DEFAULT * 1_000_000
    manager.heartbeat(consumer_heartbeat("a"), 1, 0)
    manager.heartbeat(consumer_heartbeat("b"), 2, 0)
    manager.heartbeat(HeartbeatData("p", (ProducerData("PG"),)), 3, 0)
    manager.heartbeat(consumer_heartbeat("b"), 2, 60 * SECOND_NS)
    assert manager.expire(expiry_ns).groups_changed == frozenset()  # not longer than 120 s yet
    change = manager.expire(expiry_ns + 1)
    assert change.groups_changed == {"CG"}
    assert (change.consumers_removed, change.producers_removed) == (1, 1)
    assert manager.consumer_ids("CG") == ["b"]
    assert manager.producer_groups() == []
    assert manager.statistics().expired_count == 2
    assert manager.expire(60 * SECOND_NS + expiry_ns + 1).groups_changed == {"CG"}
    assert manager.consumer_groups() == []
    manager.check_invariants()


def test_group_subscriptions_follow_java_update_rules() -> None:
    manager = ClientManager()
    manager.heartbeat(
        consumer_heartbeat("a", subscriptions={"T": "x", "U": "*"}, sub_version=5), 1, 0
    )
    older = manager.heartbeat(
        consumer_heartbeat("b", subscriptions={"T": "y", "U": "*"}, sub_version=4), 2, 0
    )
    assert not older.subscriptions_changed
    subscription = manager.group_subscription("CG", "T")
    assert subscription is not None
    assert subscription.sub_string == "x"
    newer = manager.heartbeat(
        consumer_heartbeat("b", subscriptions={"T": "y", "U": "*"}, sub_version=6), 2, 0
    )
    assert newer.subscriptions_changed
    subscription = manager.group_subscription("CG", "T")
    assert subscription is not None
    assert subscription.sub_string == "y"
    dropped = manager.heartbeat(
        consumer_heartbeat("b", subscriptions={"T": "y"}, sub_version=6), 2, 0
    )
    assert dropped.subscriptions_changed
    assert manager.group_subscription("CG", "U") is None
    assert set(manager.group_subscriptions()["CG"]) == {"T"}
    manager.check_invariants()


def test_group_names_are_checked_as_the_java_client_checks_them() -> None:
    assert group_name_problem("CG_order-1%|x") is None
    assert group_name_problem("") is not None
    assert group_name_problem("a@b") is not None
    assert group_name_problem("a b") is not None
    assert group_name_problem("g" * 255) is None
    assert group_name_problem("g" * 256) is not None


# --- random sequences against a model -----------------------------------------------------------

CLIENTS = ("c0", "c1", "c2")
GROUPS = ("G0", "G1")
CONNS = (1, 2, 3)

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("heartbeat"),
            st.sampled_from(CLIENTS),
            st.lists(st.sampled_from(GROUPS), unique=True, max_size=2),
            st.sampled_from(CONNS),
        ),
        st.tuples(st.just("unregister"), st.sampled_from(CLIENTS), st.sampled_from(GROUPS)),
        st.tuples(st.just("close"), st.sampled_from(CONNS)),
        st.tuples(st.just("wait"), st.integers(0, 200)),
    ),
    max_size=40,
)


@given(operations)
def test_reported_membership_changes_match_a_model(ops: list[tuple[object, ...]]) -> None:
    manager = ClientManager()
    # group -> client -> (conn, last heartbeat s)
    model: dict[str, dict[str, tuple[int, int]]] = {}
    now_s = 0
    for op in ops:
        before = {group: set(members) for group, members in model.items()}
        if op[0] == "heartbeat":
            _, client, groups, conn = op
            assert isinstance(client, str)
            assert isinstance(conn, int)
            assert isinstance(groups, list)
            data = HeartbeatData(
                client,
                (),
                tuple(consumer_heartbeat(client, group).consumer_data_set[0] for group in groups),
            )
            change = manager.heartbeat(data, conn, now_s * SECOND_NS)
            for group in groups:
                model.setdefault(group, {})[client] = (conn, now_s)
        elif op[0] == "unregister":
            _, client, group = op
            assert isinstance(client, str)
            assert isinstance(group, str)
            change = manager.unregister(client, None, group)
            model.get(group, {}).pop(client, None)
        elif op[0] == "close":
            (_, conn) = op
            assert isinstance(conn, int)
            change = manager.connection_closed(conn)
            for members in model.values():
                for client in [c for c, (on, _) in members.items() if on == conn]:
                    del members[client]
        else:
            (_, seconds) = op
            assert isinstance(seconds, int)
            now_s += seconds
            change = manager.expire(now_s * SECOND_NS)
            for members in model.values():
                for client in [c for c, (_, seen) in members.items() if now_s - seen > 120]:
                    del members[client]
        model = {group: members for group, members in model.items() if members}
        after = {group: set(members) for group, members in model.items()}
        expected = {g for g in set(before) | set(after) if before.get(g) != after.get(g)}
        assert change.groups_changed == expected
        for group in GROUPS:
            assert manager.consumer_ids(group) == sorted(model.get(group, {}))
            assert manager.consumer_connections(group) == [
                model[group][client][0] for client in sorted(model.get(group, {}))
            ]
        manager.check_invariants()

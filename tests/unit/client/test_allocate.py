"""Allocation strategies: the same queues for the same inputs as Java 4.9.7 and C++ 1.2.3.

Goal: averagely, averagely_by_circle and consistent_hash reproduce the golden vector of
docs/client.md B.4 (checked there against the compiled Java classes and C++'s
AllocateMQAveragely), the averagely examples of the same section, Java's `check` rules, its sort
orders and its hash ring details (later put wins, repeated ids); and every strategy splits the
queues of a topic among the listed clients with no overlap and no gap.

Method: the golden vector and examples are tables written out here from the facts doc; the
partition property runs each strategy once per client id over hypothesis-built queue lists and
id lists (sorted as the rebalancer sorts them) and checks that the union is every queue exactly
once. The ring collision pair was found offline by a birthday search over `c<i>-<r>` keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client.allocate import (
    STRATEGIES,
    AllocationInputError,
    Strategy,
    allocate,
    averagely,
    averagely_by_circle,
    by_config,
    by_machine_room,
    consistent_hash,
    hash_ring,
    machine_room_nearby,
    md5_hash,
    queue_string,
    sort_client_ids,
    sort_queues,
    subscribe_queues,
)
from mqbox.protocol.codes import PERM_READ, PERM_WRITE
from mqbox.protocol.headers import MessageQueue, QueueData, TopicRouteData

TOPIC = "TopicTest"
GOLDEN_QUEUES = [
    MessageQueue(TOPIC, f"broker-{name}", queue_id) for name in "ab" for queue_id in range(4)
]
GOLDEN_CLIENT_IDS = ["10.0.0.1@999#111", "10.0.0.2@1234#567", "12345-10.0.0.1@DEFAULT"]
# docs/client.md B.4, "Golden vector [T]": a0 is broker-a queue 0, and so on.
GOLDEN = {
    "averagely": ["a0 a1 a2", "a3 b0 b1", "b2 b3"],
    "averagely_by_circle": ["a0 a3 b2", "a1 b0 b3", "a2 b1"],
    "consistent_hash": ["a2 a3 b1", "a1", "a0 b0 b2 b3"],
}


def short(queues: Sequence[MessageQueue]) -> str:
    return " ".join(f"{queue.broker_name[-1]}{queue.queue_id}" for queue in queues)


def numbered(count: int) -> list[MessageQueue]:
    return [MessageQueue(TOPIC, "broker-a", queue_id) for queue_id in range(count)]


def everyone(
    strategy: Strategy, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> list[list[MessageQueue]]:
    return [strategy(client_id, queues, client_ids) for client_id in client_ids]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_vector_matches_java_and_cpp(name: str) -> None:
    assert sort_client_ids(reversed(GOLDEN_CLIENT_IDS)) == GOLDEN_CLIENT_IDS
    queues = sort_queues(reversed(GOLDEN_QUEUES))
    assert queues == GOLDEN_QUEUES
    results = everyone(STRATEGIES[name], queues, GOLDEN_CLIENT_IDS)
    assert [short(result) for result in results] == GOLDEN[name]


@pytest.mark.parametrize(
    ("queue_count", "client_count", "blocks"),
    [
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (2, 3, [[0], [1], []]),
        (16, 5, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15]]),
        (3, 3, [[0], [1], [2]]),
        (1, 1, [[0]]),
    ],
)
def test_averagely_gives_contiguous_blocks_largest_first(
    queue_count: int, client_count: int, blocks: list[list[int]]
) -> None:
    client_ids = [f"client-{index}" for index in range(client_count)]
    results = everyone(averagely, numbered(queue_count), client_ids)
    assert [[queue.queue_id for queue in result] for result in results] == blocks


def test_averagely_by_circle_deals_queues_round_robin() -> None:
    client_ids = ["c0", "c1", "c2"]
    results = everyone(averagely_by_circle, numbered(8), client_ids)
    assert [[queue.queue_id for queue in result] for result in results] == [
        [0, 3, 6],
        [1, 4, 7],
        [2, 5],
    ]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_client_not_listed_gets_nothing(name: str) -> None:
    assert STRATEGIES[name]("10.9.9.9@1#1", GOLDEN_QUEUES, GOLDEN_CLIENT_IDS) == []


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_empty_queues_or_client_ids_are_refused(name: str) -> None:
    strategy = STRATEGIES[name]
    with pytest.raises(AllocationInputError):
        strategy(GOLDEN_CLIENT_IDS[0], [], GOLDEN_CLIENT_IDS)
    with pytest.raises(AllocationInputError):
        strategy(GOLDEN_CLIENT_IDS[0], GOLDEN_QUEUES, [])


def test_allocate_sorts_its_inputs_before_the_strategy_sees_them() -> None:
    mine = allocate(
        averagely, GOLDEN_CLIENT_IDS[1], reversed(GOLDEN_QUEUES), GOLDEN_CLIENT_IDS[::-1]
    )
    assert short(mine) == "a3 b0 b1"


def test_sort_order_is_java_utf16_not_code_points() -> None:
    # U+10000 is the surrogate pair D800 DC00, below U+E000 in UTF-16 but above it as a code point.
    assert sort_client_ids(["\ue000", "\U00010000"]) == ["\U00010000", "\ue000"]
    assert sort_queues([MessageQueue("T", "b", 10), MessageQueue("T", "b", 9)]) == [
        MessageQueue("T", "b", 9),
        MessageQueue("T", "b", 10),
    ]


def test_queue_string_is_java_message_queue_to_string() -> None:
    assert queue_string(MessageQueue("T", "broker-a", 3)) == (
        "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
    )


def test_md5_hash_reads_the_first_four_digest_bytes_big_endian() -> None:
    # MD5("") = d41d8cd98f00b204e9800998ecf8427e
    assert md5_hash("") == 0xD41D8CD9


def test_hash_ring_collision_is_won_by_the_later_client() -> None:
    # Found offline: both keys share the MD5 prefix 42680764.
    assert md5_hash("c601-6") == md5_hash("c1081-3") == 0x42680764
    assert hash_ring(["c1081", "c601"], 10)[0x42680764] == "c601"
    assert hash_ring(["c601", "c1081"], 10)[0x42680764] == "c1081"
    assert len(hash_ring(["c1081", "c601"], 10)) == 19


def test_hash_ring_gives_a_repeated_client_id_further_replicas() -> None:
    ring = hash_ring(["a", "a"], 2)
    assert set(ring) == {md5_hash("a-0"), md5_hash("a-1"), md5_hash("a-2"), md5_hash("a-3")}


def test_consistent_hash_without_virtual_nodes_allocates_nothing() -> None:
    assert consistent_hash("c", numbered(4), ["c"], virtual_node_count=0) == []


def test_by_config_returns_its_list_whatever_the_input() -> None:
    strategy = by_config([MessageQueue("T", "x", 7)])
    assert strategy("anyone", [], []) == [MessageQueue("T", "x", 7)]


def test_by_machine_room_keeps_queues_of_listed_rooms_in_blocks() -> None:
    queues = sort_queues(
        [
            MessageQueue(TOPIC, f"{room}@broker", queue_id)
            for room in ("hz", "sh", "bj")
            for queue_id in range(3)
        ]
        + [MessageQueue(TOPIC, "hz@x@", 0), MessageQueue(TOPIC, "plain", 0)]
    )
    strategy = by_machine_room({"hz", "sh"})
    results = everyone(strategy, queues, ["c0", "c1", "c2", "c3"])
    # Kept, in order: hz@broker 0..2, hz@x@ 0 (Java's split drops the trailing empty part, so it
    # has two parts), sh@broker 0..2. Seven queues, four clients: blocks of 1, remainder 3.
    assert [[f"{q.broker_name}:{q.queue_id}" for q in result] for result in results] == [
        ["hz@broker:0", "sh@broker:0"],
        ["hz@broker:1", "sh@broker:1"],
        ["hz@broker:2", "sh@broker:2"],
        ["hz@x@:0"],
    ]


def test_machine_room_nearby_keeps_rooms_local_and_shares_orphan_rooms() -> None:
    queues = sort_queues(
        [
            MessageQueue(TOPIC, f"{room}-broker", queue_id)
            for room in ("hz", "sh", "bj")
            for queue_id in range(2)
        ]
    )
    client_ids = sort_client_ids(["hz-c1", "hz-c2", "sh-c1"])
    strategy = machine_room_nearby(
        averagely, lambda queue: queue.broker_name.split("-")[0], lambda cid: cid.split("-")[0]
    )
    results = {
        client_id: short_rooms(strategy(client_id, queues, client_ids)) for client_id in client_ids
    }
    # hz queues split between the two hz clients, sh queues to the sh client; bj has no client, so
    # its two queues are split by averagely among all three.
    assert results == {
        "hz-c1": ["hz:0", "bj:0"],
        "hz-c2": ["hz:1", "bj:1"],
        "sh-c1": ["sh:0", "sh:1"],
    }


def short_rooms(queues: Sequence[MessageQueue]) -> list[str]:
    return [f"{queue.broker_name.split('-')[0]}:{queue.queue_id}" for queue in queues]


def test_machine_room_nearby_refuses_an_empty_room_name() -> None:
    strategy = machine_room_nearby(averagely, lambda queue: "", lambda cid: "room")
    with pytest.raises(AllocationInputError):
        strategy("c", numbered(2), ["c"])


def test_subscribe_queues_are_the_readable_queues_sorted() -> None:
    route = TopicRouteData(
        queue_datas=(
            QueueData("broker-b", 2, 8, PERM_READ | PERM_WRITE),
            QueueData("broker-c", 4, 4, PERM_WRITE),
            QueueData("broker-a", 1, 1, PERM_READ),
        )
    )
    assert short(subscribe_queues(TOPIC, route)) == "a0 b0 b1"


# --- Partition property -------------------------------------------------------------------------

broker_names = st.sampled_from(["broker-a", "broker-b", "b", "hz@broker-c", "sh@broker-d", "中"])
queue_sets = st.sets(
    st.builds(
        MessageQueue,
        st.sampled_from(["T", "TopicTest", "%RETRY%G"]),
        broker_names,
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=60,
)
client_id_sets = st.sets(
    st.one_of(
        st.from_regex(r"1[0-9]{0,2}\.0\.0\.[0-9]@[0-9]{1,5}#[0-9]{1,6}", fullmatch=True),
        st.from_regex(r"[0-9]{1,5}-127\.0\.0\.1@DEFAULT", fullmatch=True),
        st.text(min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=12,
)


def room_of_broker(queue: MessageQueue) -> str:
    return queue.broker_name.split("@")[0] if "@" in queue.broker_name else "default"


def room_of_client(client_id: str) -> str:
    return ("hz", "default", "bj")[sum(map(ord, client_id)) % 3]


PARTITIONING: dict[str, Strategy] = {
    **STRATEGIES,
    "consistent_hash_3": lambda me, queues, ids: consistent_hash(
        me, queues, ids, virtual_node_count=3
    ),
    "nearby_averagely": machine_room_nearby(averagely, room_of_broker, room_of_client),
    "nearby_consistent_hash": machine_room_nearby(consistent_hash, room_of_broker, room_of_client),
}


@pytest.mark.parametrize("name", sorted(PARTITIONING))
@given(queue_set=queue_sets, client_id_set=client_id_sets)
def test_every_queue_goes_to_exactly_one_client(
    name: str, queue_set: set[MessageQueue], client_id_set: set[str]
) -> None:
    queues = sort_queues(queue_set)
    client_ids = sort_client_ids(client_id_set)
    results = everyone(PARTITIONING[name], queues, client_ids)
    counts = Counter(queue for result in results for queue in result)
    assert set(counts) == set(queues)  # no gap
    assert set(counts.values()) == {1}  # no overlap
    for result in results:  # each client's queues keep the sorted order (per room for nearby)
        if not name.startswith("nearby"):
            assert result == sorted(result, key=queues.index)


@given(queue_set=queue_sets, client_id_set=client_id_sets)
def test_averagely_sizes_differ_by_at_most_one(
    queue_set: set[MessageQueue], client_id_set: set[str]
) -> None:
    queues = sort_queues(queue_set)
    sizes = [len(result) for result in everyone(averagely, queues, sort_client_ids(client_id_set))]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)

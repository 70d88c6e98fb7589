"""Queue allocation for consumer rebalance: which queues of a topic this client pulls.

Owns: the allocation strategies of RocketMQ 4.9.7's `consumer/rebalance` package, restated as
pure functions, and the two sort orders their inputs need (docs/client.md B.3, B.4):

    averagely            AllocateMessageQueueAveragely, the default, and the C++ client's only one
    averagely_by_circle  AllocateMessageQueueAveragelyByCircle
    consistent_hash      AllocateMessageQueueConsistentHash (MD5 ring, 10 virtual nodes per client)
    by_config            AllocateMessageQueueByConfig (a fixed list)
    by_machine_room      AllocateMessageQueueByMachineRoom (brokers named `idc@name`)
    machine_room_nearby  AllocateMachineRoomNearby (an inner strategy per machine room)

Never: sockets, clocks, threads, randomness or logging. The rebalancer fetches the route and the
consumer id list, calls `allocate()` and applies the result.

Rules:

1. Every strategy takes (my_client_id, queues, client_ids) with both lists already sorted as
   Java's RebalanceImpl sorts them: queues by (topic, brokerName, queueId) with Java's
   String.compareTo (UTF-16 code units), client ids as Java strings (`sort_queues`,
   `sort_client_ids`; `allocate()` sorts for you). The C++ client sorts byte-wise (std::string);
   the two orders agree for every name without characters at or above U+E000, which covers
   every client id and broker name either client makes.
2. Java's `check`: no queues or no client ids raises AllocationInputError (Java throws
   IllegalArgumentException, and RebalanceImpl skips the topic for this round); a client id that
   is not in the list gets an empty allocation (all of the topic's queues are dropped).
3. For one input, the allocations of all listed client ids partition the queues: each queue goes
   to exactly one client (tests/unit/client/test_allocate.py checks this for every strategy but
   by_config, whose list is whatever it was given).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from mqbox.errors import MqboxError
from mqbox.protocol.codes import PERM_READ
from mqbox.protocol.headers import MessageQueue, TopicRouteData

# (my_client_id, queues sorted by sort_queues, client ids sorted by sort_client_ids) -> mine
Strategy = Callable[[str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]

VIRTUAL_NODE_COUNT_DEFAULT: Final = 10  # AllocateMessageQueueConsistentHash()


class AllocationInputError(MqboxError):
    """The rebalancer had no queues or no consumer ids for a topic; skip the topic this round."""


# --- Sort orders --------------------------------------------------------------------------------


def java_string_sort_key(text: str) -> bytes:
    """A key that orders str values as Java's String.compareTo orders them (UTF-16 code units).

    Big-endian UTF-16 bytes compare, byte by byte, exactly as their code units do, and a prefix
    sorts first in both. (Python's own str order is by code point, which differs for characters
    above U+FFFF against U+E000..U+FFFF.)
    """
    return text.encode("utf-16-be", "surrogatepass")


def queue_sort_key(queue: MessageQueue) -> tuple[bytes, bytes, int]:
    """Java's MessageQueue.compareTo: topic, then brokerName, then queueId."""
    return (
        java_string_sort_key(queue.topic),
        java_string_sort_key(queue.broker_name),
        queue.queue_id,
    )


def sort_queues(queues: Iterable[MessageQueue]) -> list[MessageQueue]:
    """`queues` in the order Java's and C++'s rebalance sort them (rule 1)."""
    return sorted(queues, key=queue_sort_key)


def sort_client_ids(client_ids: Iterable[str]) -> list[str]:
    """Consumer ids in the order Java's rebalance sorts them (rule 1)."""
    return sorted(client_ids, key=java_string_sort_key)


def queue_string(queue: MessageQueue) -> str:
    """Java's MessageQueue.toString(), the key consistent_hash places on its ring."""
    return (
        f"MessageQueue [topic={queue.topic}, brokerName={queue.broker_name}, "
        f"queueId={queue.queue_id}]"
    )


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The queues a consumer allocates from: readQueueNums queues of every readable QueueData
    (Java's topicRouteData2TopicSubscribeInfo, a set), sorted as rule 1 says."""
    queues = {
        MessageQueue(topic, queue_data.broker_name, queue_id)
        for queue_data in route.queue_datas
        if queue_data.perm & PERM_READ
        for queue_id in range(queue_data.read_queue_nums)
    }
    return sort_queues(queues)


# --- The check every strategy but by_config runs first ------------------------------------------


def _check(my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]) -> bool:
    """Java's AbstractAllocateMessageQueueStrategy.check: False when my id is not listed."""
    assert my_client_id, "the caller's own client id is never empty"
    if not queues:
        raise AllocationInputError("no queues to allocate")
    if not client_ids:
        raise AllocationInputError("no consumer ids to allocate to")
    # Sorting is the caller's duty (rule 1); O(n) is nothing next to a rebalance round.
    assert all(
        queue_sort_key(before) <= queue_sort_key(after)
        for before, after in itertools.pairwise(queues)
    ), "queues are not sorted (sort_queues)"
    assert all(
        java_string_sort_key(before) <= java_string_sort_key(after)
        for before, after in itertools.pairwise(client_ids)
    ), "client ids are not sorted (sort_client_ids)"
    return my_client_id in client_ids


# --- Strategies ---------------------------------------------------------------------------------


def averagely(
    my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> list[MessageQueue]:
    """Contiguous blocks: the first `n % c` clients get one queue more (Java = C++ 1.2.3).

    With n=8, c=3 the blocks are [0,1,2] [3,4,5] [6,7]; with n=2, c=3 they are [0] [1] [].
    """
    if not _check(my_client_id, queues, client_ids):
        return []
    index = client_ids.index(my_client_id)  # Java's indexOf: the first match
    queue_count = len(queues)
    client_count = len(client_ids)
    remainder = queue_count % client_count
    gets_one_more = remainder > 0 and index < remainder
    if queue_count <= client_count:
        average_count = 1
    else:
        average_count = queue_count // client_count + (1 if gets_one_more else 0)
    start = index * average_count if gets_one_more else index * average_count + remainder
    count = min(average_count, queue_count - start)  # <= 0 when there are more clients
    return [queues[(start + offset) % queue_count] for offset in range(count)]


def averagely_by_circle(
    my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> list[MessageQueue]:
    """Round robin: client i gets queues i, i + c, i + 2c, ..."""
    if not _check(my_client_id, queues, client_ids):
        return []
    index = client_ids.index(my_client_id)
    return list(queues[index :: len(client_ids)])


def md5_hash(key: str) -> int:
    """ConsistentHashRouter.MD5Hash: the first 4 bytes of MD5(key as UTF-8), big-endian, unsigned.

    Java hashes `key.getBytes()` in the platform charset; UTF-8 is assumed, and its replacement of
    a lone surrogate by '?' is what errors="replace" does too.
    """
    digest = hashlib.md5(key.encode("utf-8", "replace"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


def hash_ring(client_ids: Iterable[str], virtual_node_count: int) -> dict[int, str]:
    """ConsistentHashRouter's ring: node key -> client id, built as consistent_hash() says."""
    assert virtual_node_count >= 0
    ring: dict[int, str] = {}
    for client_id in client_ids:
        existing_count = sum(1 for owner in ring.values() if owner == client_id)
        for replica in range(existing_count, existing_count + virtual_node_count):
            ring[md5_hash(f"{client_id}-{replica}")] = client_id
    return ring


def consistent_hash(
    my_client_id: str,
    queues: Sequence[MessageQueue],
    client_ids: Sequence[str],
    *,
    virtual_node_count: int = VIRTUAL_NODE_COUNT_DEFAULT,
) -> list[MessageQueue]:
    """The queues whose hash lands on one of my virtual nodes of the MD5 ring.

    Ring: for each client id in order, `virtual_node_count` nodes keyed `md5_hash(f"{id}-{r}")`,
    r counting on from the replicas the id already has (Java's getExistingReplicas: a listed-twice
    id gets r = 10..19 the second time); when two nodes share a key, the later one wins (TreeMap
    put). A queue goes to the first node whose key is >= md5_hash(queue_string(queue)), wrapping
    to the smallest key.
    """
    if not _check(my_client_id, queues, client_ids):
        return []
    ring = hash_ring(client_ids, virtual_node_count)
    if not ring:
        return []  # virtual_node_count 0: Java's routeNode answers null for every queue
    ring_keys = sorted(ring)
    mine: list[MessageQueue] = []
    for queue in queues:
        at = bisect.bisect_left(ring_keys, md5_hash(queue_string(queue)))
        if ring[ring_keys[at % len(ring_keys)]] == my_client_id:
            mine.append(queue)
    return mine


def by_config(configured: Sequence[MessageQueue]) -> Strategy:
    """AllocateMessageQueueByConfig: always `configured`, whatever the route and group say."""
    fixed = tuple(configured)

    def allocate_by_config(
        my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
    ) -> list[MessageQueue]:
        return list(fixed)

    return allocate_by_config


def java_split_drop_trailing_empty(text: str, separator: str) -> list[str]:
    """Java's String.split(separator) for a literal separator: trailing empty parts dropped.

    (Java keeps a lone "" for the empty string; the callers here treat it like [] anyway.)
    """
    parts = text.split(separator)
    while parts and not parts[-1]:
        parts.pop()
    return parts


def by_machine_room(consumer_idcs: Iterable[str]) -> Strategy:
    """AllocateMessageQueueByMachineRoom: only queues of brokers named `idc@name` with idc in
    `consumer_idcs`; client i gets the block [m*i, m*i + m) plus element i + m*c when the
    remainder is greater than i, where m = kept // c."""
    idcs = frozenset(consumer_idcs)

    def allocate_by_machine_room(
        my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check(my_client_id, queues, client_ids):
            return []
        index = client_ids.index(my_client_id)
        kept = []
        for queue in queues:
            parts = java_split_drop_trailing_empty(queue.broker_name, "@")
            if len(parts) == 2 and parts[0] in idcs:
                kept.append(queue)
        block_count, remainder = divmod(len(kept), len(client_ids))
        mine = kept[block_count * index : block_count * index + block_count]
        if remainder > index:
            mine.append(kept[index + block_count * len(client_ids)])
        return mine

    return allocate_by_machine_room


def machine_room_nearby(
    inner: Strategy,
    broker_room: Callable[[MessageQueue], str],
    consumer_room: Callable[[str], str],
) -> Strategy:
    """AllocateMachineRoomNearby: rooms keep their own queues; orphaned rooms are shared.

    Queues are grouped by `broker_room(queue)` and client ids by `consumer_room(id)` (each
    group in input order, so still sorted). My room's queues are split by `inner` among my room's
    clients. The queues of every room with no client at all (in Java string order of room names)
    are split by `inner` among all clients, and added after. A room name that is empty raises
    AllocationInputError, as Java throws IllegalArgumentException.
    """

    def allocate_machine_room_nearby(
        my_client_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check(my_client_id, queues, client_ids):
            return []
        queues_by_room: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            room = broker_room(queue)
            if not room:
                raise AllocationInputError(f"no machine room for {queue_string(queue)}")
            queues_by_room.setdefault(room, []).append(queue)
        clients_by_room: dict[str, list[str]] = {}
        for client_id in client_ids:
            room = consumer_room(client_id)
            if not room:
                raise AllocationInputError(f"no machine room for consumer {client_id}")
            clients_by_room.setdefault(room, []).append(client_id)
        my_room = consumer_room(my_client_id)
        mine: list[MessageQueue] = []
        my_room_queues = queues_by_room.pop(my_room, [])
        if my_room_queues:
            mine.extend(inner(my_client_id, my_room_queues, clients_by_room[my_room]))
        for room in sorted(queues_by_room, key=java_string_sort_key):
            if room not in clients_by_room:
                mine.extend(inner(my_client_id, queues_by_room[room], client_ids))
        return mine

    return allocate_machine_room_nearby


# --- Entry point --------------------------------------------------------------------------------

STRATEGIES: Final[dict[str, Strategy]] = {
    "averagely": averagely,
    "averagely_by_circle": averagely_by_circle,
    "consistent_hash": consistent_hash,
}


def allocate(
    strategy: Strategy,
    my_client_id: str,
    queues: Iterable[MessageQueue],
    client_ids: Iterable[str],
) -> list[MessageQueue]:
    """My queues of one topic under `strategy`, after sorting both inputs as rule 1 says.

    Raises AllocationInputError when there are no queues or no client ids (skip the topic this
    round, as Java's RebalanceImpl does); an empty list when `my_client_id` is not listed.
    """
    return strategy(my_client_id, sort_queues(queues), sort_client_ids(client_ids))

"""The broker's tables of live clients: producers and consumers by group, from heartbeats.

Owns: `ClientManager`, the admin processor's record of who is connected (RocketMQ's
ProducerManager and ConsumerManager in one pure object): per consumer group its members (client
id, the connection its last heartbeat came on, consume type, message model, consumeFromWhere,
subscriptions, last heartbeat time) and the group's subscription table that pulls without a
subscription read; per producer group its members. Also `Subscription`, one topic's filter with
its tag hashes recomputed from the tag strings, and `group_name_problem`, the check of a group
name from outside. Never: I/O, clocks (callers pass monotonic ns), sockets, rings, or deciding
what to send (the admin processor turns a `ClientChange` into NOTIFY_CONSUMER_IDS_CHANGED
requests and file writes).

Rules (docs/protocol.md sections 4.3 and 8.1, Java's ConsumerManager):
- A member is keyed by client id within its group, and remembers the connection its newest
  heartbeat came on: a client that reconnects moves, it does not appear twice in the consumer
  list. Closing a connection removes only the members whose newest heartbeat came on it.
- Membership of a consumer group changes when a client id joins or leaves: by heartbeat,
  UNREGISTER_CLIENT, a closed connection or `expiry_ns` without a heartbeat (120 s, Java's
  channelExpiredTimeout). Each such change is reported once, in `ClientChange.groups_changed`.
- The group's subscription table follows Java's updateSubscription: a heartbeat adds the topics
  the group lacks, replaces a topic's entry when its subVersion is newer, and drops the topics the
  heartbeat no longer names. A group without members is forgotten, subscriptions included.
- Tag hashes are never taken from `codeSet` (the C++ client sends zeros there): they are
  recomputed from `tagsSet`, or from `subString` split on "||" when `tagsSet` is empty.

Invariants (asserted in `check_invariants`, which the tests call after every step): every group in
the tables has at least one member; a member's group name is the group's key; the conn index
lists exactly the (group, client id) pairs whose member sits on that connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final

from mqbox.message import tag_hash
from mqbox.protocol.codes import ConsumeFromWhere, ConsumeType, MessageModel
from mqbox.protocol.headers import HeartbeatData, SubscriptionData

CLIENT_EXPIRY_MS_DEFAULT: Final = 120_000  # Java's ClientHousekeepingService channelExpiredTimeout
GROUP_NAME_SIZE_MAX: Final = 255  # Java's Validators.CHARACTER_MAX_LENGTH
SUBSCRIPTION_ALL: Final = "*"
SUBSCRIPTION_SEPARATOR: Final = "||"
_GROUP_CHARACTERS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%|_-"
)


def group_name_problem(group: str) -> str | None:
    """None if `group` is a usable group name, otherwise the remark to answer with.

    The Java client's rule (Validators.checkGroup): 1 to 255 characters of [A-Za-z0-9%|_-]. The
    broker needs it too: consumerOffset.json keys are `<topic>@<group>`, and `%RETRY%<group>`
    becomes a topic name.
    """
    if not group:
        return "the group name is empty"
    if len(group) > GROUP_NAME_SIZE_MAX:
        return f"the group name is {len(group)} characters long, more than {GROUP_NAME_SIZE_MAX}"
    if not _GROUP_CHARACTERS.issuperset(group):
        return f"the group name {group!r} has characters outside [A-Za-z0-9%|_-]"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    """One topic of a consumer's subscription, with its filter ready for the consume queue."""

    topic: str
    sub_string: str  # subString as sent: "*" or "TagA || TagB"
    tags: tuple[str, ...]  # the tags, trimmed, sorted, without duplicates; () takes every tag
    tag_hashes: tuple[int, ...]  # Java String.hashCode of each tag, sorted; () takes every tag
    sub_version: int  # subVersion (ms)
    expression_type: str = "TAG"  # expressionType: "TAG" (mqbox filters by tag only) or "SQL92"

    @property
    def takes_every_tag(self) -> bool:
        return not self.tags


def tags_of_expression(sub_string: str) -> tuple[str, ...]:
    """The tags of a TAG expression: () for "", "*" or only separators; otherwise each part of
    "TagA || TagB" trimmed, empty parts dropped, sorted, once each."""
    expression = sub_string.strip()
    if not expression or expression == SUBSCRIPTION_ALL:
        return ()
    tags = {part.strip() for part in expression.split(SUBSCRIPTION_SEPARATOR)}
    tags.discard("")
    return tuple(sorted(tags))


def subscription_of(data: SubscriptionData) -> Subscription:
    """A heartbeat's subscription entry with its tags and hashes recomputed (never `codeSet`)."""
    if data.sub_string.strip() in ("", SUBSCRIPTION_ALL):
        tags: tuple[str, ...] = ()
    elif data.tags_set:
        tags = tuple(sorted({tag.strip() for tag in data.tags_set} - {""}))
    else:
        tags = tags_of_expression(data.sub_string)
    hashes = tuple(sorted({tag_hash(tag) for tag in tags}))
    return Subscription(
        data.topic, data.sub_string, tags, hashes, data.sub_version, data.expression_type
    )


@dataclasses.dataclass(slots=True)
class ConsumerClient:
    """One member of a consumer group."""

    client_id: str
    group: str
    conn_id: int  # the connection the newest heartbeat came on
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    subscriptions: dict[str, Subscription]  # topic -> subscription, as this client sent it
    language: str
    version: int
    last_heartbeat_ns: int  # monotonic
    client_addr: str = ""  # "ip:port" of the connection the newest heartbeat came on


@dataclasses.dataclass(slots=True)
class ProducerClient:
    """One member of a producer group."""

    client_id: str
    group: str
    conn_id: int
    language: str
    version: int
    last_heartbeat_ns: int
    client_addr: str = ""  # "ip:port" of the connection the newest heartbeat came on


@dataclasses.dataclass(slots=True)
class ConsumerGroup:
    """A consumer group with at least one member."""

    name: str
    members: dict[str, ConsumerClient] = dataclasses.field(default_factory=dict)
    subscriptions: dict[str, Subscription] = dataclasses.field(default_factory=dict)
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET


@dataclasses.dataclass(frozen=True, slots=True)
class ClientChange:
    """What one call changed, for the caller to act on."""

    groups_changed: frozenset[str] = frozenset()  # consumer groups whose client id set changed
    groups_created: tuple[str, ...] = ()  # consumer groups that had no member before the call
    subscriptions_changed: bool = False  # some group's subscription table changed
    consumers_removed: int = 0
    producers_removed: int = 0

    def merged(self, other: ClientChange) -> ClientChange:
        return ClientChange(
            self.groups_changed | other.groups_changed,
            self.groups_created
            + tuple(g for g in other.groups_created if g not in self.groups_created),
            self.subscriptions_changed or other.subscriptions_changed,
            self.consumers_removed + other.consumers_removed,
            self.producers_removed + other.producers_removed,
        )


NO_CHANGE: Final = ClientChange()


@dataclasses.dataclass(frozen=True, slots=True)
class ClientManagerStatistics:
    consumer_group_count: int
    consumer_count: int
    producer_group_count: int
    producer_count: int
    heartbeat_count: int
    expired_count: int  # members dropped for silence


class ClientManager:
    """Producer and consumer tables (module docstring). Pure: time comes in as arguments."""

    def __init__(self, *, expiry_ns: int = CLIENT_EXPIRY_MS_DEFAULT * 1_000_000) -> None:
        assert expiry_ns > 0
        self.expiry_ns = expiry_ns
        self._consumer_groups: dict[str, ConsumerGroup] = {}
        self._producer_groups: dict[str, dict[str, ProducerClient]] = {}
        # conn id -> {(kind, group, client id)}; kind is "c" (consumer) or "p" (producer)
        self._by_conn: dict[int, set[tuple[str, str, str]]] = {}
        self._heartbeat_count = 0
        self._expired_count = 0

    # -- reading ----------------------------------------------------------------------------------

    def consumer_ids(self, group: str) -> list[str]:
        """The group's client ids, sorted (GET_CONSUMER_LIST_BY_GROUP); [] for no member."""
        found = self._consumer_groups.get(group)
        return [] if found is None else sorted(found.members)

    def consumer_connections(self, group: str) -> list[int]:
        """The connections of the group's members (one per member), in client id order."""
        found = self._consumer_groups.get(group)
        if found is None:
            return []
        return [found.members[client_id].conn_id for client_id in sorted(found.members)]

    def consumer_member(self, group: str, client_id: str) -> ConsumerClient | None:
        """The member `client_id` of the group, or None (GET_CONSUMER_RUNNING_INFO's target)."""
        found = self._consumer_groups.get(group)
        return None if found is None else found.members.get(client_id)

    def consumer_members(self, group: str) -> list[ConsumerClient]:
        """The group's members in client id order (RESET_CONSUMER_CLIENT_OFFSET's targets)."""
        found = self._consumer_groups.get(group)
        if found is None:
            return []
        return [found.members[client_id] for client_id in sorted(found.members)]

    def consumer_group(self, group: str) -> ConsumerGroup | None:
        return self._consumer_groups.get(group)

    def consumer_groups(self) -> list[str]:
        return sorted(self._consumer_groups)

    def producer_ids(self, group: str) -> list[str]:
        return sorted(self._producer_groups.get(group, {}))

    def producer_members(self, group: str) -> list[ProducerClient]:
        """The producer group's members in client id order (GET_PRODUCER_CONNECTION_LIST)."""
        members = self._producer_groups.get(group, {})
        return [members[client_id] for client_id in sorted(members)]

    def producer_groups(self) -> list[str]:
        return sorted(self._producer_groups)

    def group_subscription(self, group: str, topic: str) -> Subscription | None:
        """The subscription of `topic` in the group's table (for a pull that sends none)."""
        found = self._consumer_groups.get(group)
        return None if found is None else found.subscriptions.get(topic)

    def group_subscriptions(self) -> dict[str, dict[str, Subscription]]:
        """Every group's subscription table, copied: group -> topic -> subscription."""
        return {name: dict(group.subscriptions) for name, group in self._consumer_groups.items()}

    # -- changing ---------------------------------------------------------------------------------

    def heartbeat(
        self,
        data: HeartbeatData,
        conn_id: int,
        now_ns: int,
        *,
        language: str = "",
        version: int = 0,
        client_addr: str = "",
    ) -> ClientChange:
        """Record one HEART_BEAT body that came on `conn_id` (from `client_addr`). Group names
        must have passed group_name_problem (the caller answers the client otherwise)."""
        self._heartbeat_count += 1
        client_id = data.client_id
        for producer in data.producer_data_set:
            members = self._producer_groups.setdefault(producer.group_name, {})
            old = members.get(client_id)
            if old is not None and old.conn_id != conn_id:
                self._unindex(old.conn_id, ("p", producer.group_name, client_id))
            members[client_id] = ProducerClient(
                client_id, producer.group_name, conn_id, language, version, now_ns, client_addr
            )
            self._index(conn_id, ("p", producer.group_name, client_id))
        groups_changed: set[str] = set()
        groups_created: list[str] = []
        subscriptions_changed = False
        for consumer in data.consumer_data_set:
            name = consumer.group_name
            assert group_name_problem(name) is None, name
            group = self._consumer_groups.get(name)
            if group is None:
                group = self._consumer_groups[name] = ConsumerGroup(name)
                groups_created.append(name)
            subscriptions = {
                item.topic: subscription_of(item) for item in consumer.subscription_data_set
            }
            old_member = group.members.get(client_id)
            if old_member is None:
                groups_changed.add(name)
            elif old_member.conn_id != conn_id:
                self._unindex(old_member.conn_id, ("c", name, client_id))
            group.members[client_id] = ConsumerClient(
                client_id,
                name,
                conn_id,
                consumer.consume_type,
                consumer.message_model,
                consumer.consume_from_where,
                subscriptions,
                language,
                version,
                now_ns,
                client_addr,
            )
            self._index(conn_id, ("c", name, client_id))
            group.consume_type = consumer.consume_type
            group.message_model = consumer.message_model
            group.consume_from_where = consumer.consume_from_where
            if _update_group_subscriptions(group.subscriptions, subscriptions):
                subscriptions_changed = True
        return ClientChange(frozenset(groups_changed), tuple(groups_created), subscriptions_changed)

    def unregister(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> ClientChange:
        """UNREGISTER_CLIENT: remove `client_id` from the named groups (None: neither)."""
        change = NO_CHANGE
        if producer_group is not None:
            change = change.merged(self._remove_producer(producer_group, client_id))
        if consumer_group is not None:
            change = change.merged(self._remove_consumer(consumer_group, client_id))
        return change

    def connection_closed(self, conn_id: int) -> ClientChange:
        """The connection is gone: remove every member whose newest heartbeat came on it."""
        entries = self._by_conn.get(conn_id)
        if not entries:
            return NO_CHANGE
        change = NO_CHANGE
        for kind, group, client_id in sorted(entries):
            if kind == "c":
                change = change.merged(self._remove_consumer(group, client_id))
            else:
                change = change.merged(self._remove_producer(group, client_id))
        assert conn_id not in self._by_conn
        return change

    def expire(self, now_ns: int) -> ClientChange:
        """Remove every member silent for longer than `expiry_ns`."""
        deadline_ns = now_ns - self.expiry_ns
        doomed: list[tuple[str, str, str]] = []
        for name, group in self._consumer_groups.items():
            doomed.extend(
                ("c", name, member.client_id)
                for member in group.members.values()
                if member.last_heartbeat_ns < deadline_ns
            )
        for name, members in self._producer_groups.items():
            doomed.extend(
                ("p", name, member.client_id)
                for member in members.values()
                if member.last_heartbeat_ns < deadline_ns
            )
        change = NO_CHANGE
        for kind, group_name, client_id in doomed:
            if kind == "c":
                change = change.merged(self._remove_consumer(group_name, client_id))
            else:
                change = change.merged(self._remove_producer(group_name, client_id))
        self._expired_count += len(doomed)
        return change

    # -- internals --------------------------------------------------------------------------------

    def _index(self, conn_id: int, entry: tuple[str, str, str]) -> None:
        self._by_conn.setdefault(conn_id, set()).add(entry)

    def _unindex(self, conn_id: int, entry: tuple[str, str, str]) -> None:
        entries = self._by_conn.get(conn_id)
        if entries is None:
            return
        entries.discard(entry)
        if not entries:
            del self._by_conn[conn_id]

    def _remove_consumer(self, name: str, client_id: str) -> ClientChange:
        group = self._consumer_groups.get(name)
        if group is None:
            return NO_CHANGE
        member = group.members.pop(client_id, None)
        if member is None:
            return NO_CHANGE
        self._unindex(member.conn_id, ("c", name, client_id))
        subscriptions_changed = False
        if not group.members:
            del self._consumer_groups[name]
            subscriptions_changed = bool(group.subscriptions)
        return ClientChange(frozenset((name,)), (), subscriptions_changed, consumers_removed=1)

    def _remove_producer(self, name: str, client_id: str) -> ClientChange:
        members = self._producer_groups.get(name)
        if members is None:
            return NO_CHANGE
        member = members.pop(client_id, None)
        if member is None:
            return NO_CHANGE
        self._unindex(member.conn_id, ("p", name, client_id))
        if not members:
            del self._producer_groups[name]
        return ClientChange(producers_removed=1)

    def check_invariants(self) -> None:
        """The module docstring's invariants, O(n): for tests and debugging."""
        indexed: dict[int, set[tuple[str, str, str]]] = {}
        for name, group in self._consumer_groups.items():
            assert group.name == name
            assert group.members, f"consumer group {name} has no member"
            for client_id, member in group.members.items():
                assert member.client_id == client_id
                assert member.group == name
                indexed.setdefault(member.conn_id, set()).add(("c", name, client_id))
        for name, members in self._producer_groups.items():
            assert members, f"producer group {name} has no member"
            for client_id, producer in members.items():
                assert producer.client_id == client_id
                assert producer.group == name
                indexed.setdefault(producer.conn_id, set()).add(("p", name, client_id))
        assert indexed == self._by_conn

    def statistics(self) -> ClientManagerStatistics:
        return ClientManagerStatistics(
            consumer_group_count=len(self._consumer_groups),
            consumer_count=sum(len(g.members) for g in self._consumer_groups.values()),
            producer_group_count=len(self._producer_groups),
            producer_count=sum(len(members) for members in self._producer_groups.values()),
            heartbeat_count=self._heartbeat_count,
            expired_count=self._expired_count,
        )


def _update_group_subscriptions(
    table: dict[str, Subscription], latest: Mapping[str, Subscription]
) -> bool:
    """Java's updateSubscription on `table` with one heartbeat's entries; True if it changed."""
    changed = False
    for topic, subscription in latest.items():
        old = table.get(topic)
        if old is None or subscription.sub_version > old.sub_version:
            if old != subscription:
                changed = True
            table[topic] = subscription
    for topic in _missing(table, latest):
        del table[topic]
        changed = True
    return changed


def _missing(table: Mapping[str, Subscription], latest: Iterable[str]) -> list[str]:
    keep = set(latest)
    return [topic for topic in table if topic not in keep]

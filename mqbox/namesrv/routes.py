"""RouteTable: the name server's whole state, as plain data with no sockets and no clock.

Owns: the five tables of RocketMQ's RouteInfoManager and the KV config namespaces:

    topic_queue_table    topic -> brokerName -> QueueData       what each broker serves of a topic
    broker_addr_table    brokerName -> (cluster, {brokerId: "ip:port"})
    cluster_addr_table   cluster -> {brokerName}
    broker_live_table    brokerAddr -> BrokerLiveInfo            last registration, dataVersion,
                                                                 haServerAddr, its connection id
    filter_server_table  brokerAddr -> (filter server addresses)  kept, never routed (see route())
    kv_config            namespace -> key -> value               ORDER_TOPIC_CONFIG feeds routes

Never: sockets, clocks, threads, logging. Callers pass `now_ms` (any monotonic millisecond count;
only differences matter) and an opaque `connection_id` for the connection a request came on.

Read/write discipline: the name server is single-threaded (server.py runs one event loop), and
only that loop thread touches a RouteTable, so nothing here locks. RocketMQ guards the same maps
with a read/write lock because Netty runs its processors on a thread pool; one loop makes that
lock unnecessary. Anyone who adds a second thread must add the lock, not share this object.

Invariants, checked by `check_invariants()` (tests call it after every operation):

1. Every brokerName in broker_addr_table has at least one address, and appears in exactly the
   cluster set of its own cluster in cluster_addr_table; every name in a cluster set is in
   broker_addr_table; no cluster set is empty.
2. Every topic in topic_queue_table has at least one QueueData, keyed by its own brokerName,
   and every such brokerName is in broker_addr_table: a route never names an unknown broker.
3. No address appears under two broker ids of one broker (a slave promoted to master moves).
4. The KV table holds at most `KvLimits.entry_count_max` entries, at most
   `namespace_entry_count_max` in one namespace, none of them empty; its entry count is kept
   exactly. Keys and values are within their sizes (checked at `kv_put`).
5. At most `RouteLimits.broker_count_max` broker addresses are live, and as many (brokerName,
   brokerId) slots are filled in all; at most `RouteLimits.topic_count_max` topics are routed.
   A registration past the first two is refused whole (`registration_refusal`); topics past
   the third are left out of it and counted (`RegisterBrokerResult.topics_refused_count`).

Semantics follow RocketMQ 4.5.2's RouteInfoManager (docs/protocol.md section 4.1); where this
file differs, the comment says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from mqbox.protocol.codes import PERM_WRITE
from mqbox.protocol.headers import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicRouteData,
    UnregisterBrokerRequestHeader,
)

MASTER_ID: Final = 0


@dataclass(frozen=True, slots=True)
class KvLimits:
    """Bounds of the KV table (invariant 4). Java's name server has none: its table grows with
    whatever clients put, which any client may do. Sizes are UTF-8 bytes; the config keys of
    namesrv.conf are named in the remarks a refused PUT_KV_CONFIG gets."""

    entry_count_max: int = 10_000  # mqboxKvEntryCountMax
    namespace_entry_count_max: int = 1000  # mqboxKvNamespaceEntryCountMax
    key_size_bytes_max: int = 1024  # mqboxKvKeyBytesMax: the namespace and the key
    value_size_bytes_max: int = 16 * 1024  # mqboxKvValueBytesMax

    def __post_init__(self) -> None:
        assert self.entry_count_max > 0
        assert self.namespace_entry_count_max > 0
        assert self.key_size_bytes_max > 0
        assert self.value_size_bytes_max > 0


@dataclass(frozen=True, slots=True)
class RouteLimits:
    """Bounds of the route tables (invariant 5). Java's name server has none, and any client may
    send 103 REGISTER_BROKER; these keep a hostile or broken one from growing the tables without
    end. The keys of namesrv.conf are named in the remarks and warnings."""

    broker_count_max: int = 1024  # mqboxNamesrvBrokerCountMax: live addresses, and id slots
    topic_count_max: int = 65_536  # mqboxNamesrvTopicCountMax: routed topics

    def __post_init__(self) -> None:
        assert self.broker_count_max > 0
        assert self.topic_count_max > 0


# The KV namespace whose entries ("topic" -> "brokerA:8;brokerB:8") become orderTopicConf in routes
# when orderMessageEnable is set (Java's NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG).
NAMESPACE_ORDER_TOPIC_CONFIG: Final = "ORDER_TOPIC_CONFIG"


@dataclass(slots=True, frozen=True)
class BrokerLiveInfo:
    """One registered broker address: when it last registered and over which connection."""

    last_update_ms: int  # the caller's now_ms at the last registration
    data_version: DataVersion
    ha_server_addr: str
    connection_id: int  # the connection the last registration came on


@dataclass(slots=True, frozen=True)
class RegisterBrokerResult:
    """What 103 REGISTER_BROKER answers, plus what the server logs."""

    ha_server_addr: str | None  # the master's haServerAddr; slaves only
    master_addr: str | None  # the master's address; slaves only
    first_registration: bool  # this broker id of this brokerName had no address before
    topics_updated: bool  # queue data was upserted (a master whose dataVersion changed)
    topics_refused_count: int = 0  # new topics left out: mqboxNamesrvTopicCountMax was reached


@dataclass(slots=True, frozen=True)
class RemovedBroker:
    """One broker address taken out of the tables by eviction, connection close or 104."""

    cluster: str
    broker_name: str
    broker_id: int
    broker_addr: str
    connection_id: int | None  # the connection of its last registration, if it had a live entry
    broker_name_removed: bool  # its brokerName lost its last address, and with it its queue data


@dataclass(slots=True)
class _BrokerEntry:
    """broker_addr_table value: mutable, unlike the BrokerData it is copied into for answers."""

    cluster: str
    broker_addrs: dict[int, str] = field(default_factory=dict)


class RouteTable:
    """The name server's route and KV tables; see the module docstring for the rules."""

    __slots__ = (
        "_broker_addr_table",
        "_broker_live_table",
        "_cluster_addr_table",
        "_filter_server_table",
        "_kv_config",
        "_kv_entry_count",
        "_topic_queue_table",
        "kv_limits",
        "order_message_enable",
        "route_limits",
    )

    def __init__(
        self,
        *,
        order_message_enable: bool = False,
        kv_limits: KvLimits = KvLimits(),
        route_limits: RouteLimits = RouteLimits(),
    ) -> None:
        self.order_message_enable = order_message_enable
        self.kv_limits = kv_limits
        self.route_limits = route_limits
        self._kv_entry_count = 0
        self._topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self._broker_addr_table: dict[str, _BrokerEntry] = {}
        self._cluster_addr_table: dict[str, set[str]] = {}
        self._broker_live_table: dict[str, BrokerLiveInfo] = {}
        self._filter_server_table: dict[str, tuple[str, ...]] = {}
        self._kv_config: dict[str, dict[str, str]] = {}

    # -- 103 / 104 --------------------------------------------------------------------------------

    def registration_refusal(self, header: RegisterBrokerRequestHeader) -> str | None:
        """Why 103 from `header` would break invariant 5 (the remark of the refusal), or None.

        Only a registration that adds a live address or fills a new (brokerName, brokerId) slot
        can be refused: brokers already registered keep re-registering at the limit."""
        limits = self.route_limits
        if (
            header.broker_addr not in self._broker_live_table
            and len(self._broker_live_table) >= limits.broker_count_max
        ):
            return (
                f"{len(self._broker_live_table)} broker addresses are registered: "
                f"mqboxNamesrvBrokerCountMax={limits.broker_count_max}"
            )
        entry = self._broker_addr_table.get(header.broker_name)
        if entry is None or header.broker_id not in entry.broker_addrs:
            slot_count = self._broker_slot_count()
            if slot_count >= limits.broker_count_max:
                return (
                    f"{slot_count} (brokerName, brokerId) pairs are registered: "
                    f"mqboxNamesrvBrokerCountMax={limits.broker_count_max}"
                )
        return None

    def slot_refusal(
        self, header: RegisterBrokerRequestHeader, now_ms: int, expired_ms: int
    ) -> str | None:
        """Why 103 from `header` may not take its (brokerName, brokerId) slot (the remark), or
        None. mqbox's rule, not Java's: a slot held by a live broker at another address stays
        its own until that broker unregisters (104), its registering connection closes, or it
        has been silent for `expired_ms` (brokerChannelExpiredTime; the scan may not have run
        yet). So nobody can push a running broker out of routes; a broker restarting on its
        own address, or moving once the old one is gone, is accepted."""
        entry = self._broker_addr_table.get(header.broker_name)
        if entry is None:
            return None
        holder = entry.broker_addrs.get(header.broker_id)
        if holder is None or holder == header.broker_addr:
            return None
        live = self._broker_live_table.get(holder)
        if live is None or live.last_update_ms + expired_ms < now_ms:
            return None
        return (
            f"broker {header.broker_name} id {header.broker_id} is registered at {holder}, "
            f"which registered {now_ms - live.last_update_ms} ms ago: {header.broker_addr} may "
            f"take its place once it unregisters or is silent for {expired_ms} ms"
        )

    def _broker_slot_count(self) -> int:
        return sum(len(entry.broker_addrs) for entry in self._broker_addr_table.values())

    def register_broker(
        self,
        header: RegisterBrokerRequestHeader,
        body: RegisterBrokerBody,
        *,
        connection_id: int,
        now_ms: int,
    ) -> RegisterBrokerResult:
        """103 REGISTER_BROKER: upsert the broker and, for a changed master, its topics' queues.

        As in RocketMQ 4.5.2, registration never removes a topic: a topic a broker dropped stays
        routed until 216 DELETE_TOPIC_IN_NAMESRV or until the broker goes away. The caller has
        asked `registration_refusal` first; topics past mqboxNamesrvTopicCountMax are left out.
        """
        broker_name = header.broker_name
        broker_addr = header.broker_addr
        broker_id = header.broker_id
        # A broker name belongs to one cluster; a re-registration under another cluster moves it.
        entry = self._broker_addr_table.get(broker_name)
        if entry is None:
            entry = _BrokerEntry(header.cluster_name)
            self._broker_addr_table[broker_name] = entry
        elif entry.cluster != header.cluster_name:
            self._cluster_set_discard(entry.cluster, broker_name)
            entry.cluster = header.cluster_name
        self._cluster_addr_table.setdefault(header.cluster_name, set()).add(broker_name)
        # One address, one broker id: a slave switched to master first leaves its old id.
        for other_id, other_addr in list(entry.broker_addrs.items()):
            if other_addr == broker_addr and other_id != broker_id:
                del entry.broker_addrs[other_id]
        previous_addr = entry.broker_addrs.get(broker_id)
        entry.broker_addrs[broker_id] = broker_addr
        first_registration = previous_addr is None

        data_version = body.data_version
        previous_live = self._broker_live_table.get(broker_addr)
        topics_updated = False
        topics_refused_count = 0
        topic_count_max = self.route_limits.topic_count_max
        if broker_id == MASTER_ID and (
            first_registration
            or previous_live is None
            or previous_live.data_version != data_version
        ):
            for config in body.topic_config_table.values():
                if (
                    config.topic_name not in self._topic_queue_table
                    and len(self._topic_queue_table) >= topic_count_max
                ):
                    topics_refused_count += 1
                    continue
                self._upsert_queue_data(
                    config.topic_name,
                    QueueData(
                        broker_name,
                        config.read_queue_nums,
                        config.write_queue_nums,
                        config.perm,
                        config.topic_sys_flag,
                    ),
                )
            topics_updated = True
        self._broker_live_table[broker_addr] = BrokerLiveInfo(
            now_ms, data_version, header.ha_server_addr, connection_id
        )
        if body.filter_server_list:
            self._filter_server_table[broker_addr] = body.filter_server_list
        else:
            self._filter_server_table.pop(broker_addr, None)

        ha_server_addr: str | None = None
        master_addr: str | None = None
        if broker_id != MASTER_ID:
            candidate = entry.broker_addrs.get(MASTER_ID)
            master_live = None if candidate is None else self._broker_live_table.get(candidate)
            if master_live is not None:
                ha_server_addr = master_live.ha_server_addr
                master_addr = candidate
        return RegisterBrokerResult(
            ha_server_addr, master_addr, first_registration, topics_updated, topics_refused_count
        )

    def _upsert_queue_data(self, topic: str, queue_data: QueueData) -> None:
        queues = self._topic_queue_table.get(topic)
        if queues is None:
            self._topic_queue_table[topic] = {queue_data.broker_name: queue_data}
        else:
            queues[queue_data.broker_name] = queue_data

    def unregister_broker(self, header: UnregisterBrokerRequestHeader) -> RemovedBroker | None:
        """104 UNREGISTER_BROKER: forget one broker id; its brokerName's last id takes the queues.

        None when that id was not registered (104 still answers SUCCESS, as Java does).
        """
        live = self._broker_live_table.pop(header.broker_addr, None)
        self._filter_server_table.pop(header.broker_addr, None)
        entry = self._broker_addr_table.get(header.broker_name)
        if entry is None or entry.broker_addrs.get(header.broker_id) != header.broker_addr:
            return None
        del entry.broker_addrs[header.broker_id]
        broker_name_removed = not entry.broker_addrs
        if broker_name_removed:
            self._remove_broker_name(header.broker_name)
        return RemovedBroker(
            entry.cluster,
            header.broker_name,
            header.broker_id,
            header.broker_addr,
            None if live is None else live.connection_id,
            broker_name_removed,
        )

    # -- eviction -------------------------------------------------------------------------------

    def scan_not_active(self, now_ms: int, expired_ms: int) -> tuple[RemovedBroker, ...]:
        """Evict every broker address whose last registration is more than `expired_ms` old.

        RocketMQ's test is `last + expired < now`, so a broker silent for exactly `expired_ms`
        stays. The caller closes the evicted brokers' connections, as Java closes the channel.
        """
        assert expired_ms > 0
        expired = [
            broker_addr
            for broker_addr, live in self._broker_live_table.items()
            if live.last_update_ms + expired_ms < now_ms
        ]
        return tuple(removed for addr in expired for removed in self._remove_broker_addr(addr))

    def on_connection_closed(self, connection_id: int) -> tuple[RemovedBroker, ...]:
        """Evict every broker address whose last registration came on `connection_id`.

        A broker that re-registered over a newer connection is not touched: its live entry names
        the newer one. Java also falls back to the channel's remote address; connection ids are
        exact, so mqbox does not need to.
        """
        closed = [
            broker_addr
            for broker_addr, live in self._broker_live_table.items()
            if live.connection_id == connection_id
        ]
        return tuple(removed for addr in closed for removed in self._remove_broker_addr(addr))

    def _remove_broker_addr(self, broker_addr: str) -> list[RemovedBroker]:
        """Take `broker_addr` out of every table (Java's onChannelDestroy)."""
        live = self._broker_live_table.pop(broker_addr, None)
        self._filter_server_table.pop(broker_addr, None)
        connection_id = None if live is None else live.connection_id
        removed: list[RemovedBroker] = []
        for broker_name, entry in list(self._broker_addr_table.items()):
            for broker_id, addr in list(entry.broker_addrs.items()):
                if addr != broker_addr:
                    continue
                del entry.broker_addrs[broker_id]
                broker_name_removed = not entry.broker_addrs
                if broker_name_removed:
                    self._remove_broker_name(broker_name)
                removed.append(
                    RemovedBroker(
                        entry.cluster,
                        broker_name,
                        broker_id,
                        broker_addr,
                        connection_id,
                        broker_name_removed,
                    )
                )
        return removed

    def _remove_broker_name(self, broker_name: str) -> None:
        """A brokerName with no address left: drop it, its cluster membership and its queues."""
        entry = self._broker_addr_table.pop(broker_name)
        assert not entry.broker_addrs
        self._cluster_set_discard(entry.cluster, broker_name)
        for topic, queues in list(self._topic_queue_table.items()):
            if queues.pop(broker_name, None) is not None and not queues:
                del self._topic_queue_table[topic]

    def _cluster_set_discard(self, cluster: str, broker_name: str) -> None:
        names = self._cluster_addr_table.get(cluster)
        if names is None:
            return
        names.discard(broker_name)
        if not names:
            del self._cluster_addr_table[cluster]

    # -- queries ----------------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRouteData | None:
        """105 GET_ROUTEINFO_BY_TOPIC: the route, or None when the answer is 17 TOPIC_NOT_EXIST.

        None when the topic has no queue data or none of its brokers has an address (Java answers
        17 if either list is empty). queueDatas keep registration order; brokerDatas follow them.
        filterServerTable is always written as {} (TopicRouteData.to_json): C++ ignores it and
        mqbox runs no filter servers.
        """
        queues = self._topic_queue_table.get(topic)
        if not queues:
            return None
        broker_datas: list[BrokerData] = []
        for broker_name in queues:
            entry = self._broker_addr_table.get(broker_name)
            if entry is not None:
                broker_datas.append(
                    BrokerData(entry.cluster, broker_name, dict(entry.broker_addrs))
                )
        if not broker_datas:
            return None
        order_topic_conf = None
        if self.order_message_enable:
            order_topic_conf = self.kv_get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        return TopicRouteData(tuple(queues.values()), tuple(broker_datas), order_topic_conf)

    def cluster_info(self) -> ClusterInfo:
        """106 GET_BROKER_CLUSTER_INFO: copies, so the answer never changes under the caller."""
        return ClusterInfo(
            {
                broker_name: BrokerData(entry.cluster, broker_name, dict(entry.broker_addrs))
                for broker_name, entry in self._broker_addr_table.items()
            },
            {cluster: tuple(sorted(names)) for cluster, names in self._cluster_addr_table.items()},
        )

    def topic_list(self) -> tuple[str, ...]:
        """206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER: every topic with queue data, first seen first."""
        return tuple(self._topic_queue_table)

    def topics_of_cluster(self, cluster: str) -> tuple[str, ...]:
        """224 GET_TOPICS_BY_CLUSTER: the topics with queue data on a broker of `cluster`."""
        names = self._cluster_addr_table.get(cluster, set())
        return tuple(
            topic
            for topic, queue_datas in self._topic_queue_table.items()
            if any(broker_name in names for broker_name in queue_datas)
        )

    def system_topic_list(self) -> tuple[tuple[str, ...], str | None]:
        """304 GET_SYSTEM_TOPIC_LIST_FROM_NS: (every cluster name and broker name, the address
        of one registered broker or None), as Java's getSystemTopicList."""
        names: list[str] = []
        for cluster, broker_names in sorted(self._cluster_addr_table.items()):
            names.append(cluster)
            names.extend(sorted(broker_names))
        broker_addr = None
        for entry in self._broker_addr_table.values():
            if entry.broker_addrs:
                broker_addr = entry.broker_addrs[min(entry.broker_addrs)]
                break
        return tuple(dict.fromkeys(names)), broker_addr

    def broker_live(self, broker_addr: str) -> BrokerLiveInfo | None:
        """The live entry of `broker_addr`, for tests and statistics."""
        return self._broker_live_table.get(broker_addr)

    def broker_count(self) -> int:
        """How many broker addresses are registered (live entries)."""
        return len(self._broker_live_table)

    def filter_servers(self, broker_addr: str) -> tuple[str, ...]:
        """The filter servers `broker_addr` registered last (kept, never routed)."""
        return self._filter_server_table.get(broker_addr, ())

    # -- admin: 205 / 216 -------------------------------------------------------------------------

    def delete_topic(self, topic: str) -> bool:
        """216 DELETE_TOPIC_IN_NAMESRV: drop the topic's queue data; False if it had none."""
        return self._topic_queue_table.pop(topic, None) is not None

    def wipe_write_perm(self, broker_name: str) -> int:
        """205 WIPE_WRITE_PERM_OF_BROKER: clear the write bit of every queue data of the broker.

        Returns the number of topics touched (wipeTopicCount). A later registration with a new
        dataVersion brings the broker's own perm back, as in Java.
        """
        wiped_count = 0
        for queues in self._topic_queue_table.values():
            queue_data = queues.get(broker_name)
            if queue_data is None:
                continue
            queues[broker_name] = QueueData(
                queue_data.broker_name,
                queue_data.read_queue_nums,
                queue_data.write_queue_nums,
                queue_data.perm & ~PERM_WRITE,
                queue_data.topic_sys_flag,
            )
            wiped_count += 1
        return wiped_count

    # -- KV config: 100 / 101 / 102 ---------------------------------------------------------------

    def kv_put(self, namespace: str, key: str, value: str) -> str | None:
        """100 PUT_KV_CONFIG: None when stored, else why not (the remark of the refusal; nothing
        changed). Kept in memory only: mqbox does not persist kvConfig.json. Replacing a key the
        table holds is always allowed: it does not grow the table."""
        limits = self.kv_limits
        for label, text in (("namespace", namespace), ("key", key)):
            size_bytes = _utf8_size_bytes(text)
            if size_bytes > limits.key_size_bytes_max:
                return (
                    f"the {label} has {size_bytes} bytes, more than "
                    f"mqboxKvKeyBytesMax={limits.key_size_bytes_max}"
                )
        size_bytes = _utf8_size_bytes(value)
        if size_bytes > limits.value_size_bytes_max:
            return (
                f"the value has {size_bytes} bytes, more than "
                f"mqboxKvValueBytesMax={limits.value_size_bytes_max}"
            )
        table = self._kv_config.get(namespace)
        if table is None or key not in table:
            if table is not None and len(table) >= limits.namespace_entry_count_max:
                return (
                    f"namespace {namespace!r} holds {len(table)} keys: "
                    f"mqboxKvNamespaceEntryCountMax={limits.namespace_entry_count_max}"
                )
            if self._kv_entry_count >= limits.entry_count_max:
                return (
                    f"the KV table holds {self._kv_entry_count} entries: "
                    f"mqboxKvEntryCountMax={limits.entry_count_max}"
                )
            self._kv_entry_count += 1
        self._kv_config.setdefault(namespace, {})[key] = value
        return None

    def kv_get(self, namespace: str, key: str) -> str | None:
        """101 GET_KV_CONFIG: the value, or None (answered 22 QUERY_NOT_FOUND)."""
        table = self._kv_config.get(namespace)
        return None if table is None else table.get(key)

    def kv_delete(self, namespace: str, key: str) -> bool:
        """102 DELETE_KV_CONFIG: False if the key was absent; an emptied namespace goes too."""
        table = self._kv_config.get(namespace)
        if table is None or table.pop(key, None) is None:
            return False
        self._kv_entry_count -= 1
        if not table:
            del self._kv_config[namespace]
        return True

    def kv_namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace (the 103 response body), or None if it has no key."""
        table = self._kv_config.get(namespace)
        return None if table is None else dict(table)

    # -- invariants -------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert the rules of the module docstring; O(size of the tables), for tests."""
        for broker_name, entry in self._broker_addr_table.items():
            assert entry.broker_addrs, broker_name
            assert broker_name in self._cluster_addr_table.get(entry.cluster, ()), broker_name
            addresses = list(entry.broker_addrs.values())
            assert len(addresses) == len(set(addresses)), entry
        for cluster, names in self._cluster_addr_table.items():
            assert names, cluster
            for broker_name in names:
                assert self._broker_addr_table[broker_name].cluster == cluster
        for topic, queues in self._topic_queue_table.items():
            assert queues, topic
            for broker_name, queue_data in queues.items():
                assert queue_data.broker_name == broker_name
                assert broker_name in self._broker_addr_table, (topic, broker_name)
        kv_sizes = [len(table) for table in self._kv_config.values()]
        assert sum(kv_sizes) == self._kv_entry_count
        assert self._kv_entry_count <= self.kv_limits.entry_count_max
        assert all(0 < size <= self.kv_limits.namespace_entry_count_max for size in kv_sizes)
        assert len(self._broker_live_table) <= self.route_limits.broker_count_max
        assert self._broker_slot_count() <= self.route_limits.broker_count_max
        assert len(self._topic_queue_table) <= self.route_limits.topic_count_max


def _utf8_size_bytes(text: str) -> int:
    """An upper bound of the bytes of `text` on the wire: a lone surrogate (an escaped byte the
    client sent, or a JSON escape) counts 3 bytes, and encoding never fails."""
    return len(text.encode("utf-8", "surrogatepass"))

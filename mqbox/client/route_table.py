"""The routes a client knows: topic routes, publish and subscribe queues, broker addresses.

Owns, restated from Java's MQClientInstance (docs/client.md A.1, B.3, B.7):

    RouteTable.routes          topicRouteTable: the last route the name server gave per topic
    RouteTable.publish         topicPublishInfoTable: one TopicPublishInfo per route (fault.py)
    RouteTable.broker_addrs    brokerAddrTable: broker name -> {broker id: address}
    master_address()           findBrokerAddressInPublish: the master (id 0) only
    read_address()             the master, else the lowest broker id (the CLI's reads)
    RouteTable.subscribe_address()  findBrokerAddressInSubscribe (a consumer's pulls)
    default_topic_route()      the route a topic borrows from TBW102 until it has its own
    subscribe_queues()         topicRouteData2TopicSubscribeInfo

Never: sockets, threads or clocks (instance.py asks the name server and holds the lock), and no
policy on when to ask.

Rules:

1. `update()` stores a route and reports whether it changed (Java's topicRouteDataIsChange, as
   plain equality). Only a change builds a new TopicPublishInfo, and with it a new round-robin
   counter, as Java does; an unchanged route keeps the counter going.
2. Broker addresses accumulate from every route stored, a later route's addresses for a broker
   name replacing the earlier ones, and `clean_offline_brokers()` drops the addresses no stored
   route names any more (Java's cleanOfflineBroker, run with the heartbeat).
3. A borrowed route (`default_topic_route`) has every QueueData's read and write counts set to
   min(queue_count, readQueueNums), as Java's updateTopicRouteInfoFromNameServer(topic, true, ..)
   does for TBW102; the producer uses it until the name server routes the topic itself, which the
   broker does once its first send auto-created the topic.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from mqbox.client.fault import TopicPublishInfo
from mqbox.protocol.codes import PERM_READ
from mqbox.protocol.headers import BrokerData, MessageQueue, TopicRouteData

MASTER_ID: Final = 0


def master_address(broker: BrokerData) -> str | None:
    """The broker's master address, or None when it has none (sends and writes need one)."""
    return broker.broker_addrs.get(MASTER_ID)


def read_address(broker: BrokerData) -> str | None:
    """The master, else the lowest broker id; None without any address."""
    if not broker.broker_addrs:
        return None
    return broker.broker_addrs[min(broker.broker_addrs)]


def default_topic_route(template: TopicRouteData, queue_count: int) -> TopicRouteData:
    """Rule 3: TBW102's route with each broker's queue counts capped at `queue_count`."""
    assert queue_count > 0
    return dataclasses.replace(
        template,
        queue_datas=tuple(
            dataclasses.replace(
                queue_data,
                read_queue_nums=min(queue_count, queue_data.read_queue_nums),
                write_queue_nums=min(queue_count, queue_data.read_queue_nums),
            )
            for queue_data in template.queue_datas
        ),
    )


def subscribe_queues(topic: str, route: TopicRouteData) -> tuple[MessageQueue, ...]:
    """The queues a consumer may read: for each QueueData with the READ perm, queue ids
    0..readQueueNums-1, in route order (the rebalance sorts them)."""
    return tuple(
        MessageQueue(topic, queue_data.broker_name, queue_id)
        for queue_data in route.queue_datas
        if queue_data.perm & PERM_READ
        for queue_id in range(queue_data.read_queue_nums)
    )


@dataclass(slots=True)
class RouteTable:
    """Routes, publish infos and broker addresses of one client (module docstring)."""

    rng: random.Random = field(default_factory=random.Random)
    routes: dict[str, TopicRouteData] = field(default_factory=dict)
    publish: dict[str, TopicPublishInfo] = field(default_factory=dict)
    broker_addrs: dict[str, dict[int, str]] = field(default_factory=dict)

    def update(self, topic: str, route: TopicRouteData) -> bool:
        """Store `route` for `topic` (rules 1 and 2); True when it differs from the last one.
        Raises fault.PublishRouteError for a malformed orderTopicConf, leaving the table as it
        was."""
        if self.routes.get(topic) == route:
            return False
        publish = TopicPublishInfo.from_route(topic, route, self.rng)
        self.routes[topic] = route
        self.publish[topic] = publish
        for broker in route.broker_datas:
            self.broker_addrs[broker.broker_name] = dict(broker.broker_addrs)
        return True

    def remove(self, topic: str) -> None:
        """Forget `topic` (its brokers stay until clean_offline_brokers)."""
        self.routes.pop(topic, None)
        self.publish.pop(topic, None)

    def publish_info(self, topic: str) -> TopicPublishInfo | None:
        return self.publish.get(topic)

    def master_address(self, broker_name: str) -> str | None:
        """findBrokerAddressInPublish: the master of `broker_name`, or None."""
        addresses = self.broker_addrs.get(broker_name)
        return None if addresses is None else addresses.get(MASTER_ID)

    def subscribe_address(
        self, broker_name: str, broker_id: int, only_this_broker: bool = False
    ) -> tuple[str, bool] | None:
        """findBrokerAddressInSubscribe: (address, is a slave) of broker id `broker_id`; else,
        unless `only_this_broker`, id + 1 when the id is not the master's, else the lowest id
        present. None when the broker name is unknown or nothing matches."""
        addresses = self.broker_addrs.get(broker_name)
        if not addresses:
            return None
        address = addresses.get(broker_id)
        chosen = broker_id
        if address is None and broker_id != MASTER_ID:
            chosen = broker_id + 1
            address = addresses.get(chosen)
        if address is None and not only_this_broker:
            chosen = min(addresses)
            address = addresses[chosen]
        if address is None:
            return None
        return address, chosen != MASTER_ID

    def addresses(self) -> Iterator[tuple[str, int, str]]:
        """(broker name, broker id, address) of every known broker address, by name and id."""
        for broker_name in sorted(self.broker_addrs):
            addresses = self.broker_addrs[broker_name]
            for broker_id in sorted(addresses):
                yield broker_name, broker_id, addresses[broker_id]

    def clean_offline_brokers(self) -> list[str]:
        """Rule 2: drop addresses that no stored route names; the addresses dropped."""
        named: set[tuple[str, int, str]] = {
            (broker.broker_name, broker_id, address)
            for route in self.routes.values()
            for broker in route.broker_datas
            for broker_id, address in broker.broker_addrs.items()
        }
        dropped: list[str] = []
        for broker_name in list(self.broker_addrs):
            addresses = self.broker_addrs[broker_name]
            offline = [
                broker_id
                for broker_id, address in addresses.items()
                if (broker_name, broker_id, address) not in named
            ]
            dropped.extend(addresses.pop(broker_id) for broker_id in offline)
            if not addresses:
                del self.broker_addrs[broker_name]
        return dropped

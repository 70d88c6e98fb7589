"""ClientInstance: what the producers and consumers of one client id share (Java's
MQClientInstance).

Owns: the client id (`ip@pid#nanotime`, facts B.1); the name servers of a `;`-separated list
(namesrv_api.NamesrvList over Transports: the one that answered last, else each in turn); the
route table (route_table.RouteTable) under one lock, each topic's route refreshed every
ROUTE_REFRESH_INTERVAL_MS and soon after a send failed; one transport.Transport per broker
address; HEART_BEAT (34) every HEARTBEAT_INTERVAL_MS to every broker address with the groups
registered here (facts B.11); UNREGISTER_CLIENT (35) when a group leaves; the scheduler thread of
the periodic tasks; and the requests brokers send (40, 220, 221, 307, 309), handed to the consumer
of the group they name. Never: choosing queues or retrying sends (producer.py), rebalancing or
pulling (the consumers).

The seam for consumers. A consumer registers its group with an object that has the three
methods of `ConsumerHooks`:

    instance.register_consumer(group, hooks)
        hooks.heartbeat_consumer() -> HeartbeatConsumer   its consumerDataSet entry, built at
                                                          every heartbeat (subscriptions included)
        hooks.topics() -> Iterable[str]                    topics whose routes to keep fresh
        hooks.on_broker_request(transport, request)        40/220/221/307/309 naming the group

`on_broker_request` runs on the instance's request thread, never in a transport's reading thread,
so it may block and make sync calls; it answers with `transport.respond(request, ...)` unless the
request is oneway (40 and 220 are). A request for a group nobody registered gets SYSTEM_ERROR, as
Java answers. Then, for its own work, a consumer uses:

    instance.scheduler.schedule_every(name, period_ms, task)   rebalance (20 s), offsets (5 s), ...
    instance.update_route(topic), instance.subscribe_queues(topic)   its topics' readable queues
    instance.subscribe_address(broker_name, broker_id)               where a pull goes
    instance.master_address(broker_name), instance.transport(address)
    instance.heartbeat_soon()                                        after a subscription changed
    instance.unregister_consumer(group)                              35 to every broker

Rules:

1. Heartbeats go to every known broker address: masters always, slaves only when a consumer is
   registered (Java). No group registered: no heartbeat. All brokers are asked at once
   (invoke_async), so a dead one costs the round its timeout once, not per broker.
2. Offline brokers (addresses no route names any more) are dropped with the heartbeat, and
   their transports closed.
3. shutdown() is bounded by its `timeout_ms`: the scheduler gets what is left of it, then every
   transport is closed (which never hangs). Groups unregister before that (Producer.shutdown
   and the consumers call unregister_*), each with its 35s sent to all brokers at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, Final, Protocol

import psutil

from mqbox.acl.signature import SessionCredentials
from mqbox.client.errors import (
    ClientError,
    ClientStateError,
    RemotingResponseError,
    RemotingTimeoutError,
)
from mqbox.client.fault import TopicPublishInfo
from mqbox.client.namesrv_api import NamesrvList, get_route
from mqbox.client.remoting import TIMEOUT_MS_DEFAULT
from mqbox.client.route_table import (
    MASTER_ID,
    RouteTable,
    default_topic_route,
    subscribe_queues,
)
from mqbox.client.scheduler import Scheduler, SchedulerStatistics
from mqbox.client.subscription import Subscription
from mqbox.client.transport import Transport, TransportStatistics
from mqbox.protocol.codes import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.headers import MessageQueue, TopicRouteData, UnregisterClientRequestHeader

log = logging.getLogger("mqbox.client.instance")

ROUTE_REFRESH_INTERVAL_MS: Final = 30_000  # pollNameServerInterval
HEARTBEAT_INTERVAL_MS: Final = 30_000  # heartbeatBrokerInterval
HEARTBEAT_INITIAL_DELAY_MS: Final = 1_000  # Java's first heartbeat, after start
SHUTDOWN_TIMEOUT_MS_DEFAULT: Final = 3_000
# A transport expires an async call within its check interval (0.1 s) after the deadline.
_ANSWER_SLACK_S: Final = 0.25
# The field naming the consumer group in each broker request a consumer serves.
GROUP_FIELD_BY_REQUEST_CODE: Final = {
    int(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED): "consumerGroup",
    int(RequestCode.RESET_CONSUMER_CLIENT_OFFSET): "group",
    int(RequestCode.GET_CONSUMER_RUNNING_INFO): "consumerGroup",
    int(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT): "group",
    int(RequestCode.CONSUME_MESSAGE_DIRECTLY): "consumerGroup",
}


def pick_client_ip(addresses: Iterable[str]) -> str:
    """Java's RemotingUtil.getLocalAddress over the host's non-loopback addresses, in interface
    order: the first IPv4 not starting 127.0 or 192.168, else the last IPv4, else the first
    IPv6, else 127.0.0.1."""
    ipv4: list[str] = []
    ipv6: list[str] = []
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            continue
        if address.is_loopback:
            continue
        (ipv4 if address.version == 4 else ipv6).append(str(address))
    for address_text in ipv4:
        if not address_text.startswith(("127.0", "192.168")):
            return address_text
    if ipv4:
        return ipv4[-1]
    return ipv6[0] if ipv6 else "127.0.0.1"


def local_ip() -> str:
    """pick_client_ip over this host's interfaces (psutil)."""
    return pick_client_ip(
        entry.address
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    )


def ipv4_bytes(ip: str) -> bytes:
    """The 4 bytes of an IPv4 address for UNIQ_KEYs; 127.0.0.1's for anything else."""
    with contextlib.suppress(ValueError):
        address = ipaddress.ip_address(ip)
        if address.version == 4:
            return address.packed
    return bytes((127, 0, 0, 1))


@dataclass(frozen=True, slots=True)
class HeartbeatConsumer:
    """One consumer group's entry of a heartbeat's consumerDataSet (Java's ConsumerData)."""

    group: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    subscriptions: tuple[Subscription, ...]
    unit_mode: bool = False

    def to_json_value(self) -> dict[str, Any]:
        """Java's spelling: enum names, and each subscription with its codeSet (subscription.py;
        protocol.headers.SubscriptionData leaves codeSet out)."""
        return {
            "consumeFromWhere": self.consume_from_where.name,
            "consumeType": self.consume_type.name,
            "groupName": self.group,
            "messageModel": self.message_model.name,
            "subscriptionDataSet": [item.to_json_value() for item in self.subscriptions],
            "unitMode": self.unit_mode,
        }


def heartbeat_body(
    client_id: str, producer_groups: Iterable[str], consumers: Iterable[HeartbeatConsumer]
) -> bytes:
    """The HEART_BEAT (34) body: Java's HeartbeatData, every key present, groups sorted."""
    return dumps_json(
        {
            "clientID": client_id,
            "consumerDataSet": [
                consumer.to_json_value() for consumer in sorted(consumers, key=lambda c: c.group)
            ],
            "producerDataSet": [{"groupName": group} for group in sorted(producer_groups)],
        }
    )


class ConsumerHooks(Protocol):
    """What a consumer gives the instance when it registers its group (module docstring)."""

    def heartbeat_consumer(self) -> HeartbeatConsumer: ...

    def topics(self) -> Iterable[str]: ...

    def on_broker_request(self, transport: Transport, request: RemotingCommand) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceStatistics:
    client_id: str
    topics: tuple[str, ...]
    broker_addresses: tuple[str, ...]
    route_updates: int  # routes stored that differed from the last
    heartbeats_sent: int  # HEART_BEAT requests answered 0
    heartbeat_failures: int
    broker_requests: int  # requests brokers sent that went to the request thread
    scheduler: SchedulerStatistics
    transports: tuple[TransportStatistics, ...]


class ClientInstance:
    """The shared client runtime of one client id (module docstring)."""

    def __init__(
        self,
        namesrv: str,
        *,
        instance_name: str | None = None,
        client_ip: str | None = None,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        route_refresh_interval_ms: int = ROUTE_REFRESH_INTERVAL_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
        rng: random.Random | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        """`credentials`: every request to name servers and brokers is signed with them (plain
        ACL, docs/acl.md)."""
        assert timeout_ms > 0
        self.credentials: Final = credentials
        self.client_ip: Final = client_ip or local_ip()
        # changeInstanceNameToPID: "DEFAULT" becomes pid#nanotime, so two clients of one
        # process (or of one pid after a restart) never share an id.
        self.instance_name: Final = instance_name or f"{os.getpid()}#{time.monotonic_ns()}"
        self.client_id: Final = f"{self.client_ip}@{self.instance_name}"
        self.timeout_ms: Final = timeout_ms
        self.route_refresh_interval_ms: Final = route_refresh_interval_ms
        self.heartbeat_interval_ms: Final = heartbeat_interval_ms
        self.rng: Final = rng if rng is not None else random.Random()
        self.namesrv: Final = NamesrvList(
            namesrv, lambda address: Transport(address, timeout_ms, credentials=credentials)
        )
        self.scheduler: Final = Scheduler(f"mqbox-client-{self.client_id}")
        self._lock = threading.Lock()
        self._routes = RouteTable(self.rng)
        self._transports: dict[str, Transport] = {}
        self._producer_groups: set[str] = set()
        self._consumers: dict[str, ConsumerHooks] = {}
        self._refreshing: set[str] = set()
        self._request_thread: Scheduler | None = None
        self._state = "created"
        self._route_updates = 0
        self._heartbeats_sent = 0
        self._heartbeat_failures = 0
        self._broker_requests = 0

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler: route refresh, heartbeats and offline-broker cleanup."""
        with self._lock:
            if self._state != "created":
                raise ClientStateError(f"client {self.client_id} is {self._state}")
            self._state = "running"
        self.scheduler.schedule_every(
            "refresh-routes", self.route_refresh_interval_ms, self.refresh_routes, 10
        )
        self.scheduler.schedule_every(
            "heartbeat", self.heartbeat_interval_ms, self.heartbeat, HEARTBEAT_INITIAL_DELAY_MS
        )
        self.scheduler.start()

    @property
    def running(self) -> bool:
        return self._state == "running"

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS_DEFAULT) -> None:
        """Rule 3: stop the threads within `timeout_ms`, close every connection. Idempotent."""
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
        with self._lock:
            if self._state == "shut down":
                return
            self._state = "shut down"
            transports = list(self._transports.values())
            self._transports.clear()
            request_thread = self._request_thread
        bug: BaseException | None = None
        for scheduler in (self.scheduler, request_thread):
            if scheduler is None:
                continue
            try:
                scheduler.shutdown(max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9))
            except BaseException as error:  # a task's bug: raised once everything is closed
                bug = bug or error
        for transport in transports:
            transport.close()
        self.namesrv.close()
        if bug is not None:
            raise bug

    # -- groups -----------------------------------------------------------------------------------

    def register_producer(self, group: str) -> None:
        """Add a producer group to the heartbeats; ClientStateError if it is here already."""
        with self._lock:
            if group in self._producer_groups:
                raise ClientStateError(f"producer group {group} is registered already")
            self._producer_groups.add(group)

    def unregister_producer(self, group: str, timeout_ms: int | None = None) -> None:
        """Drop a producer group and send UNREGISTER_CLIENT (35) for it to every broker."""
        with self._lock:
            self._producer_groups.discard(group)
        self._unregister(UnregisterClientRequestHeader(self.client_id, group, None), timeout_ms)

    def register_consumer(self, group: str, hooks: ConsumerHooks) -> None:
        """Add a consumer group (module docstring); ClientStateError if it is here already."""
        with self._lock:
            if group in self._consumers:
                raise ClientStateError(f"consumer group {group} is registered already")
            self._consumers[group] = hooks

    def unregister_consumer(self, group: str, timeout_ms: int | None = None) -> None:
        """Drop a consumer group and send UNREGISTER_CLIENT (35) for it to every broker."""
        with self._lock:
            self._consumers.pop(group, None)
        self._unregister(UnregisterClientRequestHeader(self.client_id, None, group), timeout_ms)

    def _unregister(self, header: UnregisterClientRequestHeader, timeout_ms: int | None) -> None:
        code = RequestCode.UNREGISTER_CLIENT
        answers = self._ask_all_brokers(
            code, header.to_ext(), b"", masters_only=False, timeout_ms=timeout_ms
        )
        for error in answers.values():
            if error is not None:
                log.info("%s: unregistering %s failed: %s", self.client_id, header, error)

    # -- routes -----------------------------------------------------------------------------------

    def update_route(
        self,
        topic: str,
        *,
        default_topic: str | None = None,
        default_queue_count: int = 4,
    ) -> bool:
        """Ask the name servers for `topic`'s route, or with `default_topic` borrow that topic's
        (route_table rule 3), and store it. True when the stored route changed; False when the
        name server has none (the table keeps what it had). Raises NamesrvUnreachableError or
        RemotingResponseError when no name server gives an answer."""
        asked = topic if default_topic is None else default_topic
        route = self.namesrv.call(get_route, asked, timeout_ms=self.timeout_ms)
        if route is None:
            return False
        if default_topic is not None:
            route = default_topic_route(route, default_queue_count)
        return self._store_route(topic, route)

    def _store_route(self, topic: str, route: TopicRouteData) -> bool:
        with self._lock:
            known = set(self._routes_addresses())
            changed = self._routes.update(topic, route)
            fresh = set(self._routes_addresses()) - known
        if changed:
            self._route_updates += 1
        if fresh and self.running:
            self.heartbeat_soon()  # C++ sends one as soon as it learns a broker's address
        return changed

    def _routes_addresses(self) -> Iterable[str]:
        return (address for _, _, address in self._routes.addresses())

    def publish_info(
        self, topic: str, default_topic: str | None, default_queue_count: int
    ) -> TopicPublishInfo | None:
        """The topic's publish queues (Java's tryToFindTopicPublishInfo): the cached ones if any
        is usable, else its route asked afresh, else, with `default_topic`, the route borrowed
        from it. None when neither exists. Raises as update_route."""
        info = self._routes.publish_info(topic)  # one dict read: atomic, no lock needed
        if info is not None and info.ok():
            return info
        self.update_route(topic)
        with self._lock:
            info = self._routes.publish_info(topic)
        if info is not None or default_topic is None:
            return info
        self.update_route(
            topic, default_topic=default_topic, default_queue_count=default_queue_count
        )
        with self._lock:
            return self._routes.publish_info(topic)

    def route(self, topic: str) -> TopicRouteData | None:
        """The route stored for `topic`, without asking anyone."""
        with self._lock:
            return self._routes.routes.get(topic)

    def subscribe_queues(self, topic: str) -> tuple[MessageQueue, ...]:
        """The readable queues of the stored route of `topic` (() without one)."""
        route = self.route(topic)
        return () if route is None else subscribe_queues(topic, route)

    def master_address(self, broker_name: str) -> str | None:
        # Dict reads only (RouteTable.update replaces a broker's address dict whole): no lock.
        return self._routes.master_address(broker_name)

    def subscribe_address(
        self, broker_name: str, broker_id: int, only_this_broker: bool = False
    ) -> tuple[str, bool] | None:
        with self._lock:
            return self._routes.subscribe_address(broker_name, broker_id, only_this_broker)

    def refresh_route_soon(self, topic: str) -> None:
        """Have the scheduler ask for `topic`'s route at once (after a send failed); one request
        per topic waits at a time."""
        with self._lock:
            if topic in self._refreshing or self._state != "running":
                return
            self._refreshing.add(topic)

        def refresh() -> None:
            with self._lock:
                self._refreshing.discard(topic)
            self.update_route(topic)

        self.scheduler.call_soon(f"refresh-route-{topic}", refresh)

    def refresh_routes(self) -> None:
        """Ask for the route of every topic in the table and of every consumer's topics (the
        periodic task). One topic's failure is logged and the others go on."""
        with self._lock:
            topics = set(self._routes.routes)
            consumers = list(self._consumers.values())
        for hooks in consumers:
            topics.update(hooks.topics())
        for topic in sorted(topics):
            try:
                self.update_route(topic)
            except ClientError as error:
                log.warning(
                    "%s: the route of %s was not refreshed: %s", self.client_id, topic, error
                )

    # -- connections ------------------------------------------------------------------------------

    def transport(self, address: str) -> Transport:
        """The connection to a broker address, made on first use; ClientStateError after
        shutdown."""
        transport = self._transports.get(address)  # the usual case, without the lock
        if transport is not None:
            return transport
        with self._lock:
            transport = self._transports.get(address)
            if transport is None:
                if self._state == "shut down":
                    raise ClientStateError(f"client {self.client_id} is shut down")
                transport = Transport(
                    address,
                    self.timeout_ms,
                    request_handler=self._on_broker_request,
                    credentials=self.credentials,
                )
                self._transports[address] = transport
            return transport

    # -- heartbeats -------------------------------------------------------------------------------

    def heartbeat_soon(self) -> None:
        if self.running:
            self.scheduler.call_soon("heartbeat-now", self.heartbeat)

    def heartbeat(self) -> None:
        """Rules 1 and 2: drop offline brokers, then HEART_BEAT to every broker address."""
        self._clean_offline_brokers()
        with self._lock:
            producers = sorted(self._producer_groups)
            consumers = list(self._consumers.values())
        if not producers and not consumers:
            return
        body = heartbeat_body(
            self.client_id, producers, [hooks.heartbeat_consumer() for hooks in consumers]
        )
        answers = self._ask_all_brokers(
            RequestCode.HEART_BEAT, {}, body, masters_only=not consumers, timeout_ms=None
        )
        for address, error in answers.items():
            if error is None:
                self._heartbeats_sent += 1
            else:
                self._heartbeat_failures += 1
                log.warning("%s: heartbeat to %s failed: %s", self.client_id, address, error)

    def _clean_offline_brokers(self) -> None:
        """Rule 2: drop the addresses no route names, and close every connection to an address
        the table no longer has (dropped here, or replaced by a later route)."""
        with self._lock:
            self._routes.clean_offline_brokers()
            known = set(self._routes_addresses())
            offline = [address for address in self._transports if address not in known]
            transports = [self._transports.pop(address) for address in offline]
        for transport in transports:
            transport.close()

    def _ask_all_brokers(
        self,
        code: int,
        ext: dict[str, str],
        body: bytes,
        *,
        masters_only: bool,
        timeout_ms: int | None,
    ) -> dict[str, ClientError | None]:
        """One request to every broker address at once, each answer awaited until one shared
        deadline: address -> None (answered 0) or the error."""
        with self._lock:
            targets = [
                address
                for _, broker_id, address in self._routes.addresses()
                if broker_id == MASTER_ID or not masters_only
            ]
        timeout_ms = timeout_ms or self.timeout_ms
        pending: dict[str, Future[RemotingCommand]] = {}
        answers: dict[str, ClientError | None] = {}
        for address in targets:
            try:
                transport = self.transport(address)
            except ClientStateError as error:
                answers[address] = error
                continue
            pending[address] = transport.invoke_async(code, dict(ext), body, timeout_ms)
        wait(pending.values(), timeout_ms / 1000 + _ANSWER_SLACK_S)
        for address, future in pending.items():
            if not future.done():
                answers[address] = RemotingTimeoutError("no answer in time", address)
                continue
            failure = future.exception()
            if failure is not None:
                if not isinstance(failure, ClientError):
                    raise failure  # a bug, not a broker's answer
                answers[address] = failure
                continue
            response = future.result()
            answers[address] = (
                None
                if response.code == ResponseCode.SUCCESS
                else RemotingResponseError(address, code, response.code, response.remark)
            )
        return answers

    # -- requests from brokers --------------------------------------------------------------------

    def _on_broker_request(self, transport: Transport, request: RemotingCommand) -> None:
        """In a transport's reading thread: hand a consumer's request to the request thread."""
        field = GROUP_FIELD_BY_REQUEST_CODE.get(request.code)
        if field is None:
            transport.respond(
                request,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"mqbox client: request code {request.code} not supported",
            )
            return
        self._broker_requests += 1
        runner = self._request_runner()
        if runner is not None:
            runner.call_soon(
                f"broker-request-{request.code}", lambda: self._serve(transport, request, field)
            )

    def _request_runner(self) -> Scheduler | None:
        with self._lock:
            if self._state != "running":
                return None
            if self._request_thread is None:
                self._request_thread = Scheduler(f"mqbox-client-requests-{self.client_id}")
                self._request_thread.start()
            return self._request_thread

    def _serve(self, transport: Transport, request: RemotingCommand, field: str) -> None:
        group = request.ext_fields.get(field, "")
        with self._lock:
            hooks = self._consumers.get(group)
        if hooks is None:
            transport.respond(
                request,
                ResponseCode.SYSTEM_ERROR,
                remark=f"The Consumer Group <{group}> not exist in this consumer",
            )
            return
        hooks.on_broker_request(transport, request)

    # -- inspection -------------------------------------------------------------------------------

    def statistics(self) -> InstanceStatistics:
        with self._lock:
            topics = tuple(sorted(self._routes.routes))
            addresses = tuple(address for _, _, address in self._routes.addresses())
            transports = tuple(t.statistics() for t in self._transports.values())
        return InstanceStatistics(
            self.client_id,
            topics,
            addresses,
            self._route_updates,
            self._heartbeats_sent,
            self._heartbeat_failures,
            self._broker_requests,
            self.scheduler.statistics(),
            transports,
        )

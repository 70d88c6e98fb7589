"""The wire commands behind the CLI: `mqbox topic|offset|cluster|message|send|tail`.

Owns: finding the brokers a command must ask (through the name server: a topic's route, or the
cluster table), asking them with mqbox.client.admin_api, merging the answers of several brokers
into one result, and turning every failure into an MqboxError whose message is one line a user
can act on. `send` is mqbox.client's Producer (its route lookup, queue choice and retries); the
name server list and the master and read addresses come from mqbox.client too
(namesrv_api.NamesrvList, route_table). Never: prints or exits (cli.py does), wire formats
(mqbox.client and mqbox.protocol), or business rules the broker owns (it checks queue counts,
group names, ...; its remark is passed on).

Rules:

1. A command opens one WireSession: one connection to the first name server of the list that
   answers, one per broker it asks, all closed at the end (`send` opens a Producer instead).
   `--namesrv` wins, then $MQBOX_NAMESRV, then the name server of the appliance running in the
   home, then namesrvAddr of etc/broker.conf (ops.resolve_namesrv); an unreachable name
   server's error says which of these gave its address.
2. Writes (topic create/update/delete, offset reset, send) go to a broker's master (broker id 0),
   as RocketMQ clients send them; reads (status, offsets, view, query, pull) to the master, else
   to the lowest broker id.
3. A topic the name server has no route for is unknown to every command that names one; topic
   create alone asks the cluster table, and creates on every master it lists.
4. A broker's refusal (BrokerAnswerError) carries its response code, so a command can treat an
   expected one as an answer (26 for a group a broker never saw, 17 for a topic a broker
   already dropped).

5. With credentials (`use_credentials`, from the CLI's --access-key/--secret-key or
   $MQBOX_ACCESS_KEY/$MQBOX_SECRET_KEY), every request of the command is signed: the name
   server's, the brokers', the Producer's and the PullConsumer's (plain ACL, docs/acl.md).

`tail` is mqbox.client's PullConsumer with every readable queue assigned and auto-commit off:
long polling on every queue at once, and nothing registered with a broker, so no group moves.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import string
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Final, ParamSpec, Self, TypeVar

from mqbox.acl.signature import SessionCredentials
from mqbox.admin import ops
from mqbox.client import admin_api, namesrv_api
from mqbox.client.errors import ClientError, NamesrvUnreachableError
from mqbox.client.namesrv_api import NamesrvList
from mqbox.client.remoting import (
    RemotingCaller,
    RemotingClient,
    RemotingError,
    RemotingResponseError,
)
from mqbox.client.route_table import master_address, read_address
from mqbox.errors import ConfigError, MessageIllegalError, MqboxError
from mqbox.message import (
    BODY_SIZE_BYTES_MAX_LIMIT,
    OFFSET_MSG_ID_SIZE_CHARS,
    PROPERTY_KEYS,
    PROPERTY_KEYS_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    StoredMessage,
    decode_offset_msg_id,
    decode_properties_str,
    decompress_body,
    encode_offset_msg_id,
    unpack_host,
)
from mqbox.protocol import mqbox_codes
from mqbox.protocol.codes import PERM_READ, PERM_WRITE, ResponseCode
from mqbox.protocol.command import INT64_MAX
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    BrokerData,
    ClusterInfo,
    MessageQueue,
    QueryMessageRequestHeader,
    TopicRouteData,
    UpdateAndCreateTopicRequestHeader,
    validate_topic,
)

# `send` and `tail` load the client's producer and consumer (and with them numba) when they run:
# every other command starts without them.
if TYPE_CHECKING:
    from mqbox.client.messages import ReceivedMessage
    from mqbox.client.producer import SendOptions


T = TypeVar("T")
P = ParamSpec("P")
# --namesrv as given (None: found by ops.resolve_namesrv), or already resolved with its source
Namesrv = str | ops.NamesrvAddress | None

TIMEOUT_MS_DEFAULT: Final = 5_000  # the C++ client's route-query timeout; every call here is quick
MASTER_ID: Final = 0
NOT_AVAILABLE: Final = "n/a"  # what a view shows for a figure nobody reports (yet)
PRODUCER_GROUP: Final = "mqbox_cli"
TAIL_GROUP_DEFAULT: Final = "mqbox_tail"
DEFAULT_TOPIC: Final = "TBW102"  # the template a send names, as every RocketMQ producer does
TAIL_POLL_INTERVAL_S: Final = 1.0  # the longest one poll() of tail waits
PULL_BATCH_MESSAGE_COUNT: Final = 32
QUERY_MESSAGE_COUNT_DEFAULT: Final = 32
ROUTE_WAIT_S_DEFAULT: Final = 10.0
ROUTE_POLL_INTERVAL_S: Final = 0.2
START_EARLIEST: Final = "earliest"
START_LATEST: Final = "latest"
PERM_NAMES: Final = {"rw": PERM_READ | PERM_WRITE, "r": PERM_READ, "w": PERM_WRITE, "none": 0}
PERM_MAX: Final = 0xF


# ---------------------------------------------------------------------------------------------
# Errors and option parsing


class BrokerAnswerError(MqboxError):
    """A broker answered a request with a code the command did not expect."""

    def __init__(self, broker_name: str, address: str, error: RemotingResponseError) -> None:
        remark = _clean_remark(error.remark) or "no remark"
        super().__init__(f"broker {broker_name} at {address}: {remark} (code {error.code})")
        self.broker_name = broker_name
        self.address = address
        self.code = error.code
        self.remark = error.remark


def _clean_remark(remark: str | None) -> str:
    """The broker's remark on one line, without the "mqbox: " its own remarks start with."""
    text = " ".join((remark or "").split())
    return text.removeprefix("mqbox: ")


def check_topic(topic: str) -> str:
    """`topic` if it is a legal topic name; ConfigError saying why not otherwise."""
    problem = validate_topic(topic)
    if problem is not None:
        raise ConfigError(problem)
    return topic


def parse_perm(text: str) -> int:
    """--perm: rw, r, w or none, or the PERM_* bits as a number 0 to 15."""
    value = text.strip().lower()
    if value in PERM_NAMES:
        return PERM_NAMES[value]
    if value.isdigit() and int(value) <= PERM_MAX:
        return int(value)
    raise ConfigError(f"--perm {text!r} is not rw, r, w, none or a number 0 to {PERM_MAX}")


def perm_text(perm: int) -> str:
    """ "rw", "r-", "-w" or "--": the read and write bits as `ls` shows them."""
    return ("r" if perm & PERM_READ else "-") + ("w" if perm & PERM_WRITE else "-")


def parse_time_ms(text: str, option: str) -> int:
    """An ISO 8601 time as ms since the epoch; without a zone it is local time."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{option} {text!r} is not an ISO 8601 time such as 2026-05-01T12:00:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return int(moment.timestamp() * 1000)


# ---------------------------------------------------------------------------------------------
# The session: name servers and brokers of one command


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerTarget:
    """One broker a command asks: its name and the address rule 2 chose."""

    name: str
    address: str


def master_target(broker: BrokerData) -> BrokerTarget | None:
    """The broker's master (route_table.master_address), or None: writes need one."""
    address = master_address(broker)
    return None if address is None else BrokerTarget(broker.broker_name, address)


def read_target(broker: BrokerData) -> BrokerTarget | None:
    """The master, else the lowest broker id (route_table.read_address); None without any."""
    address = read_address(broker)
    return None if address is None else BrokerTarget(broker.broker_name, address)


_credentials: SessionCredentials | None = None


def use_credentials(credentials: SessionCredentials | None) -> None:
    """Sign every request of the wire commands that follow with `credentials` (rule 5)."""
    global _credentials
    _credentials = credentials


class WireSession:
    """The connections one command uses (rule 1); a context manager that closes them."""

    def __init__(self, namesrv: Namesrv, *, timeout_ms: int = TIMEOUT_MS_DEFAULT) -> None:
        resolved = ops.resolve_namesrv(namesrv)
        self.namesrv_addr: Final = resolved.address
        self.namesrv_source: Final = resolved.source
        self._namesrvs = NamesrvList(
            self.namesrv_addr,
            lambda address: RemotingClient(address, timeout_ms, credentials=_credentials),
        )
        self.namesrv_addresses: Final = self._namesrvs.addresses
        self.timeout_ms: Final = timeout_ms
        self._brokers: dict[str, RemotingClient] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._namesrvs.close()
        for client in self._brokers.values():
            client.close()
        self._brokers.clear()

    # -- name server --------------------------------------------------------------------------

    def ask_namesrv(
        self,
        call: Callable[Concatenate[RemotingCaller, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`call(client, *args, **kwargs)` on the name server that answered last, else on each
        of the list in turn until one answers (namesrv_api.NamesrvList); MqboxError naming
        every address when none does, and for a refusal."""
        try:
            return self._namesrvs.call(call, *args, **kwargs)
        except RemotingResponseError as error:
            remark = _clean_remark(error.remark) or "no remark"
            raise MqboxError(f"name server {error.address}: {remark} (code {error.code})") from None
        except NamesrvUnreachableError as error:
            raise MqboxError(f"{error} (address from {self.namesrv_source})") from None

    def route(self, topic: str) -> TopicRouteData:
        """The topic's route (rule 3: MqboxError for a topic without one)."""
        check_topic(topic)
        route = self.ask_namesrv(namesrv_api.get_route, topic)
        if route is None or not route.queue_datas:
            raise MqboxError(f"topic {topic} does not exist: the name server has no route for it")
        return route

    def brokers(self) -> dict[str, BrokerData]:
        """Every broker the name server knows, by broker name."""
        return dict(self.ask_namesrv(namesrv_api.cluster_info).broker_addr_table)

    # -- brokers ------------------------------------------------------------------------------

    def ask_broker(
        self,
        target: BrokerTarget,
        call: Callable[Concatenate[RemotingCaller, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`call(client, *args, **kwargs)` on the broker; BrokerAnswerError for a refusal,
        MqboxError when it cannot be reached."""
        client = self._brokers.get(target.address)
        if client is None:
            client = RemotingClient(target.address, self.timeout_ms, credentials=_credentials)
            self._brokers[target.address] = client
        try:
            return call(client, *args, **kwargs)
        except RemotingResponseError as error:
            raise BrokerAnswerError(target.name, target.address, error) from None
        except RemotingError as error:
            raise MqboxError(f"cannot reach broker {target.name} at {error}") from None
        except (RemoteProtocolError, MessageIllegalError) as error:
            raise MqboxError(
                f"broker {target.name} at {target.address} sent an answer mqbox cannot read: "
                f"{error}"
            ) from None


def _route_brokers(
    route: TopicRouteData, pick: Callable[[BrokerData], BrokerTarget | None]
) -> list[BrokerTarget]:
    """The brokers of the route that serve queues of the topic, by name, chosen by `pick`."""
    serving = {queue.broker_name for queue in route.queue_datas}
    targets = [
        target
        for broker in sorted(route.broker_datas, key=lambda broker: broker.broker_name)
        if broker.broker_name in serving and (target := pick(broker)) is not None
    ]
    return targets


def _masters(route: TopicRouteData, topic: str) -> list[BrokerTarget]:
    targets = _route_brokers(route, master_target)
    if not targets:
        raise MqboxError(f"topic {topic}: no broker of its route has a master")
    return targets


def _readers(route: TopicRouteData, topic: str) -> list[BrokerTarget]:
    targets = _route_brokers(route, read_target)
    if not targets:
        raise MqboxError(f"topic {topic}: no broker of its route has an address")
    return targets


# ---------------------------------------------------------------------------------------------
# Results (frozen dataclasses; ops.config_as_dict makes them JSON, except MessageView.as_dict)


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerTopicConfig:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool


@dataclasses.dataclass(frozen=True, slots=True)
class TopicChange:
    """What `topic create` or `topic update` set on each broker."""

    topic: str
    action: str  # "created" or "updated"
    brokers: tuple[BrokerTopicConfig, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TopicDeleted:
    topic: str
    brokers: tuple[str, ...]  # broker names that held the topic's configuration
    namesrvs: tuple[str, ...]  # name servers that dropped its route


@dataclasses.dataclass(frozen=True, slots=True)
class RouteBroker:
    broker_name: str
    cluster: str
    addresses: dict[int, str]  # broker id -> ip:port; 0 is the master
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    brokers: tuple[RouteBroker, ...]
    order_topic_conf: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStatusRow:
    broker_name: str
    queue_id: int
    queue_index_min: int
    queue_index_max: int
    message_count: int  # queue_index_max - queue_index_min: the messages still stored
    last_update_timestamp_ms: int  # newest store time; 0 for an empty queue


@dataclasses.dataclass(frozen=True, slots=True)
class TopicStatus:
    topic: str
    message_count: int
    queues: tuple[QueueStatusRow, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterBroker:
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    # From the broker itself (MQBOX_BROKER_STATUS); NOT_AVAILABLE when it does not answer.
    role: str = NOT_AVAILABLE  # ASYNC_MASTER, SYNC_MASTER or SLAVE
    version: str = NOT_AVAILABLE
    ha_state: str = NOT_AVAILABLE  # replication's state (run/replication.json of the broker's home)
    slave_lag_bytes: int | None = None
    slave_lag_messages: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterList:
    brokers: tuple[ClusterBroker, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetRow:
    broker_name: str
    topic: str
    queue_id: int
    broker_queue_index: int  # the queue's entry count
    consumer_queue_index: int  # the group's next index; 0 when nothing is committed (Java)
    lag: int


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetShow:
    group: str
    client_ids: tuple[str, ...]
    total_lag: int
    queues: tuple[OffsetRow, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ResetRow:
    broker_name: str
    queue_id: int
    previous_queue_index: int  # -1 when nothing was committed
    queue_index: int


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetReset:
    group: str
    topic: str
    to: str  # "earliest", "latest" or "timestamp"
    timestamp_ms: int | None
    queues: tuple[ResetRow, ...]
    clients_notified: int = 0  # live consumers told to move (220), summed over the masters


@dataclasses.dataclass(frozen=True, slots=True)
class MessageView:
    """One stored message as the commands show it; `body` is inflated when it was compressed.
    The ids carry RocketMQ's names (docs/protocol.md): `msg_id` is the client-made UNIQ_KEY (the
    offset id for a message without one, as Java's MessageClientExt.getMsgId answers),
    `offset_msg_id` the broker's store host + commit log offset."""

    msg_id: str
    offset_msg_id: str
    broker_name: str
    broker_address: str
    topic: str
    queue_id: int
    queue_index: int
    log_offset_bytes: int
    size_bytes: int
    tags: str
    keys: str
    flag: int
    sysflag: int
    born_timestamp_ms: int
    born_host: str
    store_timestamp_ms: int
    store_host: str
    reconsume_times: int
    properties: dict[str, str]
    body: bytes

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the body as UTF-8 text (bad bytes replaced) and as base64."""
        document = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "body"
        }
        document["properties"] = dict(self.properties)
        document["body_size_bytes"] = len(self.body)
        document["body"] = self.body.decode("utf-8", "replace")
        document["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class SendResult:
    topic: str
    msg_id: str  # RocketMQ's msgId: the client-made UNIQ_KEY (`message get` takes either id)
    offset_msg_id: str  # RocketMQ's offsetMsgId: store host + commit log offset
    broker_name: str
    broker_address: str
    queue_id: int
    queue_index: int


def _host_text(host: bytes) -> str:
    ip, port = unpack_host(host)
    return f"{ip}:{port}"


def _view(
    target: BrokerTarget,
    properties: dict[str, str],
    body: bytes,
    offset_msg_id: str,
    **fields: Any,
) -> MessageView:
    """A MessageView of `target`'s message: the fields its properties give, and `fields`."""
    return MessageView(
        msg_id=properties.get(PROPERTY_UNIQ_KEY) or offset_msg_id,
        offset_msg_id=offset_msg_id,
        broker_name=target.name,
        broker_address=target.address,
        tags=properties.get(PROPERTY_TAGS, ""),
        keys=properties.get(PROPERTY_KEYS, ""),
        properties=properties,
        body=body,
        **fields,
    )


def received_message_view(message: ReceivedMessage, target: BrokerTarget) -> MessageView:
    """The view of a message mqbox.client received (tail)."""
    try:
        body = message.body
    except MessageIllegalError:  # shown as stored when it does not inflate
        body = message.stored_body
    born_ip, born_port = message.born_host
    store_ip, store_port = message.store_host
    return _view(
        target,
        dict(message.properties),
        body,
        message.offset_msg_id,
        topic=message.pulled_topic,
        queue_id=message.queue_id,
        queue_index=message.queue_offset,
        log_offset_bytes=message.commit_log_offset,
        size_bytes=message.size_bytes,
        flag=message.flag,
        sysflag=message.sysflag,
        born_timestamp_ms=message.born_timestamp_ms,
        born_host=f"{born_ip}:{born_port}",
        store_timestamp_ms=message.store_timestamp_ms,
        store_host=f"{store_ip}:{store_port}",
        reconsume_times=message.reconsume_times,
    )


def message_view(message: StoredMessage, target: BrokerTarget) -> MessageView:
    properties = decode_properties_str(message.properties)
    body = message.body
    if message.sysflag & SYSFLAG_COMPRESSED:
        # Shown as stored when it does not inflate: a view must not fail on a bad body.
        with contextlib.suppress(MessageIllegalError):
            body, _ = decompress_body(
                body, message.sysflag, size_bytes_max=BODY_SIZE_BYTES_MAX_LIMIT
            )
    return _view(
        target,
        properties,
        body,
        encode_offset_msg_id(message.store_host, message.log_offset_bytes),
        topic=message.topic,
        queue_id=message.queue_id,
        queue_index=message.queue_index,
        log_offset_bytes=message.log_offset_bytes,
        size_bytes=message.size_bytes,
        flag=message.flag,
        sysflag=message.sysflag,
        born_timestamp_ms=message.born_timestamp_ms,
        born_host=_host_text(message.born_host),
        store_timestamp_ms=message.store_timestamp_ms,
        store_host=_host_text(message.store_host),
        reconsume_times=message.reconsume_times,
    )


# ---------------------------------------------------------------------------------------------
# topic


def topic_list(namesrv: Namesrv) -> tuple[str, ...]:
    """Every topic the name server has a route for, sorted."""
    with WireSession(namesrv) as session:
        return tuple(sorted(session.ask_namesrv(namesrv_api.topic_list)))


def topic_route(namesrv: Namesrv, topic: str) -> TopicRoute:
    with WireSession(namesrv) as session:
        route = session.route(topic)
    by_name = {broker.broker_name: broker for broker in route.broker_datas}
    brokers = []
    for queue in sorted(route.queue_datas, key=lambda queue: queue.broker_name):
        broker = by_name.get(queue.broker_name)
        brokers.append(
            RouteBroker(
                queue.broker_name,
                broker.cluster if broker is not None else "",
                dict(sorted(broker.broker_addrs.items())) if broker is not None else {},
                queue.read_queue_nums,
                queue.write_queue_nums,
                queue.perm,
            )
        )
    return TopicRoute(topic, tuple(brokers), route.order_topic_conf)


def topic_status(namesrv: Namesrv, topic: str) -> TopicStatus:
    """Every queue of the topic on every broker of its route: offsets and newest store time."""
    rows: list[QueueStatusRow] = []
    with WireSession(namesrv) as session:
        for target in _readers(session.route(topic), topic):
            status = session.ask_broker(target, admin_api.topic_status, topic)
            rows.extend(
                QueueStatusRow(
                    target.name,
                    queue.queue_id,
                    queue.queue_index_min,
                    queue.queue_index_max,
                    max(0, queue.queue_index_max - queue.queue_index_min),
                    queue.last_update_timestamp_ms,
                )
                for queue in status.queues
            )
    return TopicStatus(topic, sum(row.message_count for row in rows), tuple(rows))


def create_topic(
    namesrv: Namesrv,
    topic: str,
    *,
    read_queue_nums: int,
    write_queue_nums: int,
    perm: int,
    order: bool,
    wait_s: float = ROUTE_WAIT_S_DEFAULT,
) -> TopicChange:
    """Create the topic on every master the name server knows (rule 3), then wait up to
    `wait_s` for its route to show it. MqboxError if a broker has it already."""
    check_topic(topic)
    with WireSession(namesrv) as session:
        targets = sorted(
            (
                target
                for broker in session.brokers().values()
                if (target := master_target(broker)) is not None
            ),
            key=lambda target: target.name,
        )
        if not targets:
            raise MqboxError("the name server knows no broker with a master to create it on")
        for target in targets:
            held = session.ask_broker(target, admin_api.all_topic_config).topic_config_table
            if topic in held:
                raise MqboxError(
                    f"topic {topic} exists on broker {target.name}; `mqbox topic update` changes it"
                )
        configs = []
        for target in targets:
            header = UpdateAndCreateTopicRequestHeader(
                topic, DEFAULT_TOPIC, read_queue_nums, write_queue_nums, perm, order=order
            )
            session.ask_broker(target, admin_api.update_and_create_topic, header)
            configs.append(
                BrokerTopicConfig(target.name, read_queue_nums, write_queue_nums, perm, order)
            )
        _wait_route(session, topic, configs, wait_s)
    return TopicChange(topic, "created", tuple(configs))


def update_topic(
    namesrv: Namesrv,
    topic: str,
    *,
    read_queue_nums: int | None = None,
    write_queue_nums: int | None = None,
    perm: int | None = None,
    order: bool | None = None,
    wait_s: float = ROUTE_WAIT_S_DEFAULT,
) -> TopicChange:
    """Change what is given (None keeps the broker's value) on every master of the route."""
    if read_queue_nums is None and write_queue_nums is None and perm is None and order is None:
        raise ConfigError(
            "nothing to change: give --read-queues, --write-queues, --perm or --order/--no-order"
        )
    configs = []
    with WireSession(namesrv) as session:
        for target in _masters(session.route(topic), topic):
            held = session.ask_broker(target, admin_api.all_topic_config).topic_config_table
            current = held.get(topic)
            if current is None:
                raise MqboxError(f"topic {topic} is routed to broker {target.name}, which lacks it")
            header = UpdateAndCreateTopicRequestHeader(
                topic,
                DEFAULT_TOPIC,
                current.read_queue_nums if read_queue_nums is None else read_queue_nums,
                current.write_queue_nums if write_queue_nums is None else write_queue_nums,
                current.perm if perm is None else perm,
                current.topic_filter_type,
                current.topic_sys_flag,
                current.order if order is None else order,
            )
            session.ask_broker(target, admin_api.update_and_create_topic, header)
            configs.append(
                BrokerTopicConfig(
                    target.name,
                    header.read_queue_nums,
                    header.write_queue_nums,
                    header.perm,
                    header.order,
                )
            )
        _wait_route(session, topic, configs, wait_s)
    return TopicChange(topic, "updated", tuple(configs))


def _wait_route(
    session: WireSession, topic: str, configs: list[BrokerTopicConfig], wait_s: float
) -> None:
    """Poll the name server until the topic's route shows every broker's new queue counts and
    permission (the broker registers again within about a second of a change)."""
    if wait_s <= 0:
        return
    expected = {
        config.broker_name: (config.read_queue_nums, config.write_queue_nums, config.perm)
        for config in configs
    }
    deadline = time.monotonic() + wait_s
    while True:
        route = session.ask_namesrv(namesrv_api.get_route, topic)
        shown = {
            queue.broker_name: (queue.read_queue_nums, queue.write_queue_nums, queue.perm)
            for queue in (route.queue_datas if route is not None else ())
        }
        if all(shown.get(name) == counts for name, counts in expected.items()):
            return
        if time.monotonic() >= deadline:
            raise MqboxError(
                f"topic {topic} is set on the broker, but the name server's route does not show "
                f"it after {wait_s:g} s"
            )
        time.sleep(ROUTE_POLL_INTERVAL_S)


def delete_topic(namesrv: Namesrv, topic: str) -> TopicDeleted:
    """Delete the topic's configuration on every master of its route (215), then its route on
    every name server that answers (216), as mqadmin's deleteTopic does. Stored messages and
    committed offsets stay (the broker's rule)."""
    deleted: list[str] = []
    with WireSession(namesrv) as session:
        for target in _masters(session.route(topic), topic):
            try:
                session.ask_broker(target, admin_api.delete_topic_in_broker, topic)
            except BrokerAnswerError as error:
                if error.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                continue
            deleted.append(target.name)
        namesrvs: list[str] = []
        for address in session.namesrv_addresses:
            with RemotingClient(address, session.timeout_ms, credentials=_credentials) as client:
                try:
                    namesrv_api.delete_topic(client, topic)
                except RemotingError:
                    continue  # a name server that is down has no route to drop
            namesrvs.append(address)
        if not namesrvs:
            raise MqboxError(f"topic {topic}: no name server answered the route's deletion")
    return TopicDeleted(topic, tuple(deleted), tuple(namesrvs))


# ---------------------------------------------------------------------------------------------
# cluster


def cluster_list(namesrv: Namesrv) -> ClusterList:
    """Every broker address the name server knows, by cluster, broker name and broker id, with
    what each broker says of itself (role, version, replication)."""
    with WireSession(namesrv) as session:
        info = session.ask_namesrv(namesrv_api.cluster_info)
        rows = _cluster_rows(info)
        return ClusterList(tuple(_with_broker_status(session, row) for row in rows))


def _with_broker_status(session: WireSession, row: ClusterBroker) -> ClusterBroker:
    """`row` completed by the broker's MQBOX_BROKER_STATUS; as it is if the broker does not
    answer (it may have just died: the name server keeps it up to 120 s)."""
    try:
        status = session.ask_broker(
            BrokerTarget(row.broker_name, row.address), admin_api.broker_status
        )
    except MqboxError:
        return row
    return dataclasses.replace(
        row,
        role=status.broker_role,
        version=status.version,
        ha_state=status.ha_state,
        slave_lag_bytes=status.slave_lag_bytes,
        slave_lag_messages=status.slave_lag_messages,
    )


def _cluster_rows(info: ClusterInfo) -> list[ClusterBroker]:
    cluster_of = {
        broker_name: cluster
        for cluster, names in info.cluster_addr_table.items()
        for broker_name in names
    }
    rows = [
        ClusterBroker(cluster_of.get(broker_name, broker.cluster), broker_name, broker_id, address)
        for broker_name, broker in info.broker_addr_table.items()
        for broker_id, address in broker.broker_addrs.items()
    ]
    rows.sort(key=lambda row: (row.cluster, row.broker_name, row.broker_id))
    return rows


# ---------------------------------------------------------------------------------------------
# offset


def offset_show(namesrv: Namesrv, group: str, topic: str | None = None) -> OffsetShow:
    """The group's committed index, the queue's entry count and the lag per queue, over the
    topic's brokers (or every broker). MqboxError when no broker knows the group."""
    rows: list[OffsetRow] = []
    client_ids: set[str] = set()
    total_lag = 0
    known = False
    with WireSession(namesrv) as session:
        if topic is not None:
            targets = _readers(session.route(topic), topic)
        else:
            targets = sorted(
                (
                    target
                    for broker in session.brokers().values()
                    if (target := read_target(broker)) is not None
                ),
                key=lambda target: target.name,
            )
        for target in targets:
            stats = session.ask_broker(target, admin_api.consume_stats, group, topic)
            members = session.ask_broker(target, admin_api.consumer_connections, group)
            if not stats.queues and not members:
                continue
            known = True
            client_ids.update(member.client_id for member in members)
            total_lag += stats.total_lag
            rows.extend(
                OffsetRow(
                    target.name,
                    queue.topic,
                    queue.queue_id,
                    queue.broker_queue_index,
                    queue.consumer_queue_index,
                    queue.lag,
                )
                for queue in stats.queues
            )
    if not known:
        raise MqboxError(
            f"consumer group {group} is unknown: no broker has an online member or a committed "
            "offset for it"
        )
    rows.sort(key=lambda row: (row.topic, row.broker_name, row.queue_id))
    return OffsetShow(group, tuple(sorted(client_ids)), total_lag, tuple(rows))


def parse_reset_target(text: str) -> tuple[str, int | None]:
    """--to: ("earliest", None), ("latest", None) or ("timestamp", ms) for an ISO 8601 time."""
    value = text.strip().lower()
    if value in (mqbox_codes.RESET_TO_EARLIEST, mqbox_codes.RESET_TO_LATEST):
        return value, None
    try:
        return mqbox_codes.RESET_TO_TIMESTAMP, parse_time_ms(text, "--to")
    except ConfigError:
        raise ConfigError(
            f"--to {text!r} is not earliest, latest or an ISO 8601 time such as 2026-05-01T12:00:00"
        ) from None


def offset_reset(namesrv: Namesrv, group: str, topic: str, to: str) -> OffsetReset:
    """Set the group's index of every read queue of the topic, on every master of its route, to
    the first or next message, or to the one stored nearest a time (parse_reset_target). Each
    broker tells the group's live consumers to move there too (220)."""
    target_kind, timestamp_ms = parse_reset_target(to)
    rows: list[ResetRow] = []
    notified = 0
    with WireSession(namesrv) as session:
        for target in _masters(session.route(topic), topic):
            result = session.ask_broker(
                target,
                admin_api.reset_consumer_offset,
                group,
                topic,
                target_kind,
                timestamp_ms,
            )
            rows.extend(
                ResetRow(target.name, queue.queue_id, queue.previous_queue_index, queue.queue_index)
                for queue in result.queues
            )
            notified += result.clients_notified
    return OffsetReset(group, topic, target_kind, timestamp_ms, tuple(rows), notified)


# ---------------------------------------------------------------------------------------------
# message


def _check_msg_id(msg_id: str) -> str:
    """`msg_id` in upper case if it is 32 hex characters (both of RocketMQ's ids are)."""
    text = msg_id.strip().upper()
    if len(text) != OFFSET_MSG_ID_SIZE_CHARS:
        raise ConfigError(f"msgId {msg_id!r} is not {OFFSET_MSG_ID_SIZE_CHARS} characters")
    if any(char not in string.hexdigits for char in text):
        raise ConfigError(f"msgId {msg_id!r} is not hexadecimal")
    return text


def _view_by_offset_msg_id(session: WireSession, msg_id: str) -> tuple[MessageView | None, str]:
    """The message `msg_id` names read as an offsetMsgId (store host + commit log offset, 33),
    or None and why not, when the host is no broker the name server knows or the broker has no
    message at that offset."""
    try:
        store_host, log_offset_bytes = decode_offset_msg_id(msg_id)
    except MessageIllegalError as error:
        return None, str(error)
    address = _host_text(store_host)
    target = None
    for broker_name, broker in sorted(session.brokers().items()):
        if address in broker.broker_addrs.values():
            target = BrokerTarget(broker_name, address)
            break
    if target is None:
        return None, f"as an offsetMsgId it names {address}, which the name server does not know"
    try:
        message = session.ask_broker(target, admin_api.view_message, log_offset_bytes)
    except BrokerAnswerError as error:
        if error.code != ResponseCode.SYSTEM_ERROR:
            raise
        return None, (
            f"as an offsetMsgId: broker {target.name} has no message at commit log offset "
            f"{log_offset_bytes}"
        )
    return message_view(message, target), ""


def _views_by_key(
    session: WireSession,
    topic: str,
    key: str,
    count_max: int,
    begin_ms: int = 0,
    end_ms: int = INT64_MAX,
    *,
    unique_key: bool = False,
) -> list[MessageView]:
    """Messages of `topic` whose UNIQ_KEY is `key` or (unless `unique_key`) whose KEYS hold it,
    stored within [begin_ms, end_ms], from every broker of its route (12)."""
    found: list[MessageView] = []
    for target in _readers(session.route(topic), topic):
        header = QueryMessageRequestHeader(topic, key, count_max, begin_ms, end_ms, unique_key)
        for message in session.ask_broker(target, admin_api.query_message, header):
            view = message_view(message, target)
            # The index matches hashes: check the key itself, as RocketMQ's clients do.
            keys = () if unique_key else view.keys.split(PROPERTY_KEYS_SEPARATOR)
            if key == view.properties.get(PROPERTY_UNIQ_KEY) or key in keys:
                found.append(view)
    return found


def message_get(namesrv: Namesrv, msg_id: str, topic: str | None = None) -> MessageView:
    """The message RocketMQ's msgId (the client's UNIQ_KEY) or offsetMsgId names. Tried first as
    an offsetMsgId of a broker the name server knows, as mqadmin's queryMsgById does; else as a
    UNIQ_KEY in the index of `topic`, or of every topic the name server lists."""
    text = _check_msg_id(msg_id)
    if topic is not None:
        check_topic(topic)
    with WireSession(namesrv) as session:
        view, why_not = _view_by_offset_msg_id(session, text)
        if view is not None:
            return view
        topics = (
            [topic] if topic is not None else sorted(session.ask_namesrv(namesrv_api.topic_list))
        )
        for name in topics:
            try:
                found = _views_by_key(session, name, text, 1, unique_key=True)
            except BrokerAnswerError as error:
                if error.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                continue
            except MqboxError:
                if topic is not None:
                    raise
                continue  # a listed topic without a route any more
            if found:
                return found[0]
    where = f"topic {topic}" if topic is not None else "any topic"
    raise MqboxError(f"no message of {where} has the msgId {msg_id}; {why_not}")


def message_query(
    namesrv: Namesrv,
    topic: str,
    key: str,
    *,
    count_max: int = QUERY_MESSAGE_COUNT_DEFAULT,
    begin: str | None = None,
    end: str | None = None,
) -> tuple[MessageView, ...]:
    """Messages of the topic whose KEYS hold `key` or whose UNIQ_KEY is `key`, stored between
    `begin` and `end` (ISO 8601; None: unbounded), oldest first, from every broker of its
    route. MqboxError when there is none."""
    if not key.strip():
        raise ConfigError("--key is empty")
    if count_max < 1:
        raise ConfigError(f"--max {count_max} is not a positive count")
    begin_ms = 0 if begin is None else parse_time_ms(begin, "--begin")
    end_ms = INT64_MAX if end is None else parse_time_ms(end, "--end")
    if begin_ms > end_ms:
        raise ConfigError(f"--begin {begin} is after --end {end}")
    with WireSession(namesrv) as session:
        found = _views_by_key(session, topic, key, count_max, begin_ms, end_ms)
    if not found:
        within = "" if begin is None and end is None else " stored in that time range"
        raise MqboxError(f"no message of topic {topic} carries the key {key}{within}")
    found.sort(key=lambda view: (view.store_timestamp_ms, view.broker_name, view.log_offset_bytes))
    return tuple(found[:count_max])


# ---------------------------------------------------------------------------------------------
# send and tail


def parse_properties(pairs: Sequence[str]) -> dict[str, str]:
    """--property NAME=VALUE, repeatable: user properties (the Producer refuses the names it
    owns, such as TAGS, KEYS and DELAY: they have their own options)."""
    properties: dict[str, str] = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator or not name.strip():
            raise ConfigError(f"--property {pair!r} is not NAME=VALUE")
        properties[name.strip()] = value
    return properties


def send(
    namesrv: Namesrv,
    topic: str,
    body: bytes,
    *,
    tags: str | None = None,
    keys: str | None = None,
    properties: Mapping[str, str] | None = None,
    delay_level: int = 0,
    queue_id: int | None = None,
) -> SendResult:
    """One message through mqbox.client's Producer (a sync send, retried as RocketMQ retries).
    A topic without a route is created by the broker from TBW102, as RocketMQ's clients ask
    (autoCreateTopicEnable decides). `queue_id` sends to that queue of the topic's first
    master broker (by name) that has it, once, with no retry on another queue."""
    check_topic(topic)
    if delay_level < 0:
        raise ConfigError(f"--delay-level {delay_level} is negative")
    if queue_id is not None and queue_id < 0:
        raise ConfigError(f"--queue {queue_id} is negative")
    resolved = ops.resolve_namesrv(namesrv)
    from mqbox.client.producer import Producer

    options: SendOptions = {
        "tags": tags,
        "keys": keys or (),
        "properties": properties or None,
        "delay_level": delay_level,
    }
    try:
        with Producer(PRODUCER_GROUP, resolved.address, credentials=_credentials) as producer:
            if queue_id is None:
                sent = producer.send(topic, body, **options)
            else:
                sent = producer.send_to_queue(topic, body, queue_id, **options)
            address = producer.instance.master_address(sent.queue.broker_name) or ""
    except NamesrvUnreachableError as error:
        raise MqboxError(f"{error} (address from {resolved.source})") from None
    return SendResult(
        topic,
        sent.msg_id,
        sent.offset_msg_id,
        sent.queue.broker_name,
        address,
        sent.queue.queue_id,
        sent.queue_offset,
    )


def tail(
    namesrv: Namesrv,
    topic: str,
    *,
    group: str | None = None,
    start: str | None = None,
    count: int | None = None,
    timeout_s: float | None = None,
    poll_interval_s: float = TAIL_POLL_INTERVAL_S,
    on_idle: Callable[[], None] | None = None,
) -> Generator[MessageView, None, None]:
    """Messages of every readable queue of the topic as they arrive, until `count` of them (None:
    no end) or `timeout_s` (None: no end). Each queue starts at `start`: "earliest", "latest",
    or an ISO 8601 time (the first message stored at or after it: the broker's nearest index
    (29), then what was stored before the time is skipped); without one, where the group's
    consumers would (QUERY_CONSUMER_OFFSET: its committed index, or 0 on a queue that still
    starts at 0), else at "latest". Nothing is committed: tail never moves a group. MqboxError
    when `timeout_s` ends it short of `count`. `on_idle` runs after each poll that brought
    nothing (the CLI's waiting indicator).

    The reading is mqbox.client's PullConsumer with the queues assigned (so it registers with no
    broker and never joins the group's rebalance) and auto-commit off; one poll waits at most
    `poll_interval_s`, so the deadline is kept."""
    from_ms: int | None = None
    if start is not None and start not in (START_EARLIEST, START_LATEST):
        try:
            from_ms = parse_time_ms(start, "--from")
        except ConfigError:
            raise ConfigError(
                f"--from {start!r} is not {START_EARLIEST}, {START_LATEST} or an ISO 8601 time "
                "such as 2026-05-01T12:00:00"
            ) from None
    if count is not None and count < 1:
        raise ConfigError(f"--count {count} is not a positive count")
    if timeout_s is not None and timeout_s < 0:
        raise ConfigError(f"--timeout-s {timeout_s:g} is negative")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with WireSession(namesrv) as session:
        route = session.route(topic)
        by_name = {broker.broker_name: broker for broker in route.broker_datas}
        queues = [
            (target, queue_id)
            for queue in sorted(route.queue_datas, key=lambda queue: queue.broker_name)
            if queue.perm & PERM_READ
            and queue.broker_name in by_name
            and (target := read_target(by_name[queue.broker_name])) is not None
            for queue_id in range(queue.read_queue_nums)
        ]
        if not queues:
            raise MqboxError(f"topic {topic} has no readable queue")
        positions = _tail_positions(session, topic, queues, group, start, from_ms)
        namesrv_addr = session.namesrv_addr
    targets = {target.name: target for target, _ in queues}
    from mqbox.client.pull_consumer import PullConsumer

    consumer = PullConsumer(
        group or TAIL_GROUP_DEFAULT,
        namesrv_addr,
        auto_commit=False,
        pull_batch_size=PULL_BATCH_MESSAGE_COUNT,
        timeout_ms=TIMEOUT_MS_DEFAULT,
        credentials=_credentials,
    )
    assigned = {
        MessageQueue(topic, name, queue_id): at for (name, queue_id), at in positions.items()
    }
    delivered = 0
    try:
        consumer.assign(assigned)
        consumer.start()
        for queue, at in assigned.items():
            consumer.seek(queue, at)
        while count is None or delivered < count:
            wait_s = poll_interval_s
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
                if wait_s <= 0:
                    break
            polled = consumer.poll(max(1, int(wait_s * 1000)))
            if not polled and on_idle is not None:
                on_idle()
            for message in polled:
                if from_ms is not None and message.store_timestamp_ms < from_ms:
                    continue  # the nearest index may be stored just before the time
                yield received_message_view(message, targets[message.broker_name])
                delivered += 1
                if count is not None and delivered >= count:
                    return
    except ClientError as error:
        raise MqboxError(f"tail of {topic}: {error}") from None
    finally:
        consumer.shutdown()
    if count is not None:
        raise MqboxError(
            f"tail: {delivered} of {count} messages of topic {topic} arrived within {timeout_s:g} s"
        )


def _tail_positions(
    session: WireSession,
    topic: str,
    queues: list[tuple[BrokerTarget, int]],
    group: str | None,
    start: str | None,
    from_ms: int | None,
) -> dict[tuple[str, int], int]:
    """Where tail starts on each queue (see `tail`)."""
    committed: dict[tuple[str, int], int] = {}
    if start is None and group is not None:
        for target, queue_id in queues:
            found = session.ask_broker(
                target, admin_api.query_consumer_offset, group, topic, queue_id
            )
            if found is not None:
                committed[(target.name, queue_id)] = found
    positions: dict[tuple[str, int], int] = {}
    for target, queue_id in queues:
        key = (target.name, queue_id)
        if key in committed:
            positions[key] = committed[key]
        elif from_ms is not None:
            positions[key] = session.ask_broker(
                target, admin_api.search_offset, topic, queue_id, from_ms
            )
        elif start == START_EARLIEST:
            positions[key] = session.ask_broker(target, admin_api.get_min_offset, topic, queue_id)
        else:
            positions[key] = session.ask_broker(target, admin_api.get_max_offset, topic, queue_id)
    return positions

"""The name server process: one thread, one selector loop, one RouteTable.

Owns: the listening socket, every accepted socket, one `mqbox.protocol.Connection` per socket,
the eviction timer, the ready file and the statistics file. Never: route rules (routes.py), frame
parsing (mqbox.protocol), or a second thread: the RouteTable is touched only by the loop thread
(routes.py, "Read/write discipline").

Theory of operation. `NamesrvServer.serve()` waits in `selector.select()` until a socket is
readable or writable, a signal arrives (signal.set_wakeup_fd writes to a socketpair the selector
watches), or the next scan is due. A readable socket is read once per wake-up (the selector is
level-triggered, so a busy peer is simply served again next turn, and no peer starves the
others); every complete request is answered at once by `NamesrvRequestHandler`, the pure part,
and the responses go into the peer's outbox, which is written straight away and, for what does
not fit the socket buffer, when the socket turns writable.

Bounds on everything from outside (docs/style.md section 3):

- a frame is at most `frame_size_bytes_max` bytes, checked by the codec before buffering;
- a peer breaking the protocol (garbage, an oversized length) is closed; nobody else notices;
- a peer that sends requests but never reads is closed once its unsent output passes
  `outbox_size_bytes_max`;
- at most `connection_count_max` connections (mqboxConnectionCountMax); more are accepted and
  closed at once, with a warning at most every 10 s;
- a connection that sends nothing for serverChannelMaxIdleTimeSeconds is closed, as RocketMQ's
  Netty server closes an idle channel (a broker's registrations, every 30 s, keep it alive);
- out of descriptors (accept fails with EMFILE or ENFILE), the listener rests for
  ACCEPT_BACKOFF_NS (mqbox/resources.py) instead of being polled again at once: a full backlog
  keeps it readable, and polling it again is a loop at 100 % of a core that serves nobody;
  `main` raises the soft descriptor limit to the hard one first;
- the KV table's entries and sizes (routes.KvLimits, from namesrv.conf), refused with
  SYSTEM_ERROR and a remark naming the key;
- the registered broker addresses and routed topics (routes.RouteLimits): a registration that
  would pass mqboxNamesrvBrokerCountMax gets SYSTEM_ERROR and a remark, topics past
  mqboxNamesrvTopicCountMax are left out of routes with a warning at most every 10 s.

Who may change the broker tables (docs/security.md): 103, 104 and 205 only from a peer in
mqboxNamesrvBrokerWhiteList (admission.py; `local` by default), else 16 NO_PERMISSION; and a
103 cannot take a (brokerName, brokerId) slot that a live broker at another address holds
(routes.slot_refusal), 16 too. Both refusals are counted and logged at most every 10 s. The
listener binds mqboxListenAddress (127.0.0.1 by default).

With an ACL (`aclEnable=true`, docs/acl.md section 6), the requests that change what clients are
told (acl.requests.NAMESRV_ADMIN_CODES: registration 103/104, permission wipes, topic deletion,
KV writes) must be signed by an admin account of the ACL file, or come from an address the file
white-lists; anything else is refused with SYSTEM_ERROR and the ACL's remark before any handler
sees it. Reads (routes, cluster info) stay open, as on a Java name server.

One request never stops the name server: `NamesrvRequestHandler.handle` is a request boundary.
An exception a handler did not expect becomes SYSTEM_ERROR with a remark naming it, and its
traceback is logged a few times a minute at most (resources.FailureLog); the tables are left as
the handler left them, which the handlers keep safe by checking before they change anything.

Logging goes to stderr: one line per broker registration that changes something, per
unregistration and per eviction; requests themselves are only counted (`statistics()`).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import selectors
import signal
import socket
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final, NoReturn

from mqbox.acl.requests import NAMESRV_ADMIN_CODES
from mqbox.acl.validator import AclStatistics, AclValidator
from mqbox.config import LOOPBACK_ADDRESS, NamesrvConfig, broker_white_list_of
from mqbox.errors import MqboxError
from mqbox.namesrv.admission import WHITE_LIST_KEY, BrokerWhiteList
from mqbox.namesrv.routes import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    KvLimits,
    RemovedBroker,
    RouteLimits,
    RouteTable,
)
from mqbox.protocol.admin_bodies import (
    GetKvListByNamespaceRequestHeader,
    GetTopicsByClusterRequestHeader,
)
from mqbox.protocol.codes import (
    DELETE_KV_CONFIG,
    GET_KV_CONFIG,
    PUT_KV_CONFIG,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.connection import CLOSED, NEED_DATA, Connection, Role
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import FRAME_SIZE_BYTES_MAX_DEFAULT, MiB
from mqbox.protocol.headers import (
    DataVersion,
    DeleteTopicRequestHeader,
    GetKvConfigResponseHeader,
    GetRouteInfoRequestHeader,
    KvConfigRequestHeader,
    KvTable,
    PutKvConfigRequestHeader,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    TopicList,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)
from mqbox.resources import (
    AcceptBackoff,
    FailureLog,
    RateLimitedLog,
    accept_out_of_resources,
    raise_file_limit,
)
from mqbox.run_files import write_json_atomically

log = logging.getLogger("mqbox.namesrv")

RECEIVE_SIZE_BYTES: Final = 256 * 1024
OUTBOX_SIZE_BYTES_MAX_DEFAULT: Final = 8 * MiB
LISTEN_BACKLOG: Final = 1024
# Accepting is bounded per wake-up so a connection storm cannot stall the answers to the others.
ACCEPT_COUNT_PER_TURN_MAX: Final = 64
RECENT_ROUTE_TOPIC_COUNT_MAX: Final = 32

_SUCCESS: Final = int(ResponseCode.SUCCESS)
# What only brokers and operators send; admission.py decides who may.
_BROKER_TABLE_CODES: Final = frozenset(
    {
        int(RequestCode.REGISTER_BROKER),
        int(RequestCode.UNREGISTER_BROKER),
        int(RequestCode.WIPE_WRITE_PERM_OF_BROKER),
    }
)
BROKER_EXPIRED_MS_DEFAULT: Final = 120_000  # brokerChannelExpiredTime


def monotonic_ms() -> int:
    """Milliseconds of the monotonic clock: eviction compares differences only, so wall-clock
    jumps (NTP, an operator's `date`) must not evict or keep brokers."""
    return time.monotonic_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# The pure part: one request in, one response out.


@dataclass(frozen=True, slots=True)
class HandlerStatistics:
    """Counters of the request handler since the process started."""

    request_count: int
    request_count_by_code: dict[int, int]  # a copy; keyed by request code
    route_found_count: int
    route_not_found_count: int
    recent_route_topics: tuple[str, ...]  # the last topics asked for with 105, oldest first
    registration_count: int
    unsupported_count: int
    bad_header_count: int
    registration_refused_count: int  # 103 refused: mqboxNamesrvBrokerCountMax was reached
    topic_refused_count: int  # topics left out of routes: mqboxNamesrvTopicCountMax was reached
    failure_count: int  # unexpected exceptions answered SYSTEM_ERROR at the request boundary
    broker_change_refused_count: int  # 103/104/205 from outside mqboxNamesrvBrokerWhiteList
    slot_refused_count: int  # 103 for a (brokerName, brokerId) a live broker elsewhere holds


class NamesrvRequestHandler:
    """Answers name server requests against one RouteTable; no sockets, the caller gives now_ms.

    Owned by the loop thread, like the RouteTable. `handle` returns the response to write, or None
    for a request marked oneway and for any response a peer sends (the namesrv sends no requests).
    """

    def __init__(
        self,
        routes: RouteTable,
        *,
        broker_white_list: BrokerWhiteList | None = None,
        broker_expired_ms: int = BROKER_EXPIRED_MS_DEFAULT,
    ) -> None:
        assert broker_expired_ms > 0
        self.routes = routes
        self.broker_white_list = broker_white_list or BrokerWhiteList()
        self.broker_expired_ms = broker_expired_ms
        self._broker_change_refused_count = 0
        self._slot_refused_count = 0
        self._refusal_log = RateLimitedLog(log)
        self._request_count = 0
        self._request_count_by_code: collections.Counter[int] = collections.Counter()
        self._route_found_count = 0
        self._route_not_found_count = 0
        self._recent_route_topics: collections.deque[str] = collections.deque(
            maxlen=RECENT_ROUTE_TOPIC_COUNT_MAX
        )
        self._registration_count = 0
        self._unsupported_count = 0
        self._bad_header_count = 0
        self._registration_refused_count = 0
        self._topic_refused_count = 0
        self._topic_refused_log = RateLimitedLog(log)
        self.failures = FailureLog(log)
        handlers: dict[int, Callable[[RemotingCommand, int, int], RemotingCommand]] = {
            RequestCode.REGISTER_BROKER: self._register_broker,
            RequestCode.UNREGISTER_BROKER: self._unregister_broker,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self._wipe_write_perm,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._topic_list,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
            PUT_KV_CONFIG: self._put_kv_config,
            GET_KV_CONFIG: self._get_kv_config,
            DELETE_KV_CONFIG: self._delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self._kv_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self._topics_by_cluster,
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: self._system_topic_list,
        }
        self._handlers: Final = {int(code): handler for code, handler in handlers.items()}

    def handle(
        self,
        request: RemotingCommand,
        connection_id: int,
        now_ms: int,
        *,
        peer_host: str = LOOPBACK_ADDRESS,
    ) -> RemotingCommand | None:
        """The response to `request`, which came on `connection_id` from `peer_host`."""
        if request.is_response:
            return None
        self._request_count += 1
        self._request_count_by_code[request.code] += 1
        handler = self._handlers.get(request.code)
        refusal = self._white_list_refusal(request, peer_host)
        if refusal is not None:
            response = refusal
        elif handler is None:
            self._unsupported_count += 1
            response = request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f" request type {request.code} not supported",
            )
        else:
            try:
                response = handler(request, connection_id, now_ms)
            except RemoteProtocolError as error:
                # The frame was sound and only its header or body was not: answer, keep the
                # connection, as the Java namesrv does for a header it cannot decode.
                self._bad_header_count += 1
                response = request.make_response(error.response_code, remark=str(error))
            except Exception as error:  # the request boundary: see the module docstring
                self.failures.record(f"handling request code {request.code}", error)
                response = request.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    remark=f"mqbox: unexpected {type(error).__name__} handling this request",
                )
        return None if request.is_oneway else response

    def _white_list_refusal(
        self, request: RemotingCommand, peer_host: str
    ) -> RemotingCommand | None:
        """16 NO_PERMISSION for a code that changes the broker tables (103, 104, 205) from a
        peer outside mqboxNamesrvBrokerWhiteList (admission.py), else None."""
        if request.code not in _BROKER_TABLE_CODES or self.broker_white_list.admits(peer_host):
            return None
        self._broker_change_refused_count += 1
        self._refusal_log.warning(
            "refused request code %d from %s: not in %s=%s",
            request.code,
            peer_host,
            WHITE_LIST_KEY,
            self.broker_white_list.describe(),
        )
        return request.make_response(
            ResponseCode.NO_PERMISSION,
            remark=(
                f"mqbox: request code {request.code} changes the broker tables and {peer_host} "
                f"is not in the name server's {WHITE_LIST_KEY}"
            ),
        )

    def statistics(self) -> HandlerStatistics:
        return HandlerStatistics(
            request_count=self._request_count,
            request_count_by_code=dict(self._request_count_by_code),
            route_found_count=self._route_found_count,
            route_not_found_count=self._route_not_found_count,
            recent_route_topics=tuple(self._recent_route_topics),
            registration_count=self._registration_count,
            unsupported_count=self._unsupported_count,
            bad_header_count=self._bad_header_count,
            registration_refused_count=self._registration_refused_count,
            topic_refused_count=self._topic_refused_count,
            failure_count=self.failures.failure_count,
            broker_change_refused_count=self._broker_change_refused_count,
            slot_refused_count=self._slot_refused_count,
        )

    # -- one method per request code ----------------------------------------------------------

    def _register_broker(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = RegisterBrokerRequestHeader.from_ext(request.ext_fields)
        if header.compressed:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, remark="compressed register bodies are not supported"
            )
        body_bytes = request.body
        if header.body_crc32 != 0 and zlib.crc32(body_bytes) & 0x7FFF_FFFF != header.body_crc32:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        if body_bytes:
            body = RegisterBrokerBody.from_json(body_bytes)
        else:
            body = RegisterBrokerBody(DataVersion(0, 0))
        refusal = self.routes.registration_refusal(header)
        if refusal is not None:
            self._registration_refused_count += 1
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=f"mqbox: {refusal}")
        taken = self.routes.slot_refusal(header, now_ms, self.broker_expired_ms)
        if taken is not None:
            self._slot_refused_count += 1
            self._refusal_log.warning("refused a registration: %s", taken)
            return request.make_response(ResponseCode.NO_PERMISSION, remark=f"mqbox: {taken}")
        result = self.routes.register_broker(
            header, body, connection_id=connection_id, now_ms=now_ms
        )
        self._registration_count += 1
        if result.topics_refused_count:
            self._topic_refused_count += result.topics_refused_count
            self._topic_refused_log.warning(
                "broker %s registered %d topics past mqboxNamesrvTopicCountMax=%d: not routed",
                header.broker_name,
                result.topics_refused_count,
                self.routes.route_limits.topic_count_max,
            )
        if result.first_registration:
            log.info(
                "broker registered: cluster=%s name=%s id=%d addr=%s ha=%s topics=%d",
                header.cluster_name,
                header.broker_name,
                header.broker_id,
                header.broker_addr,
                header.ha_server_addr,
                len(body.topic_config_table),
            )
        elif result.topics_updated:
            log.info(
                "broker topics updated: name=%s id=%d addr=%s dataVersion=%d topics=%d",
                header.broker_name,
                header.broker_id,
                header.broker_addr,
                body.data_version.counter,
                len(body.topic_config_table),
            )
        order_table = self.routes.kv_namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return request.make_response(
            _SUCCESS,
            RegisterBrokerResponseHeader(result.ha_server_addr, result.master_addr).to_ext(),
            body=b"" if order_table is None else KvTable(order_table).to_json(),
        )

    def _unregister_broker(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = UnregisterBrokerRequestHeader.from_ext(request.ext_fields)
        removed = self.routes.unregister_broker(header)
        if removed is not None:
            log_removed(removed, "unregistered")
        return request.make_response(_SUCCESS)

    def _get_route(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = GetRouteInfoRequestHeader.from_ext(request.ext_fields)
        self._recent_route_topics.append(header.topic)
        route = self.routes.route(header.topic)
        if route is None:
            self._route_not_found_count += 1
            return request.make_response(
                ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {header.topic}",
            )
        self._route_found_count += 1
        return request.make_response(_SUCCESS, body=route.to_json())

    def _cluster_info(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        return request.make_response(_SUCCESS, body=self.routes.cluster_info().to_json())

    def _wipe_write_perm(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = WipeWritePermOfBrokerRequestHeader.from_ext(request.ext_fields)
        wiped_count = self.routes.wipe_write_perm(header.broker_name)
        log.info("write permission wiped: name=%s topics=%d", header.broker_name, wiped_count)
        return request.make_response(
            _SUCCESS, WipeWritePermOfBrokerResponseHeader(wiped_count).to_ext()
        )

    def _topic_list(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        return request.make_response(_SUCCESS, body=TopicList(self.routes.topic_list()).to_json())

    def _delete_topic(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = DeleteTopicRequestHeader.from_ext(request.ext_fields)
        if self.routes.delete_topic(header.topic):
            log.info("topic deleted: %s", header.topic)
        return request.make_response(_SUCCESS)

    def _put_kv_config(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = PutKvConfigRequestHeader.from_ext(request.ext_fields)
        problem = self.routes.kv_put(header.namespace, header.key, header.value)
        if problem is not None:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=f"mqbox: {problem}")
        return request.make_response(_SUCCESS)

    def _get_kv_config(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = KvConfigRequestHeader.from_ext(request.ext_fields)
        value = self.routes.kv_get(header.namespace, header.key)
        if value is None:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace} Key: {header.key}",
            )
        return request.make_response(_SUCCESS, GetKvConfigResponseHeader(value).to_ext())

    def _delete_kv_config(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        header = KvConfigRequestHeader.from_ext(request.ext_fields)
        self.routes.kv_delete(header.namespace, header.key)
        return request.make_response(_SUCCESS)

    def _kv_list(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        """219 GET_KVLIST_BY_NAMESPACE: the namespace's KVTable; 22 with Java's remark when it
        holds nothing."""
        header = GetKvListByNamespaceRequestHeader.from_ext(request.ext_fields)
        table = self.routes.kv_namespace(header.namespace)
        if not table:
            return request.make_response(
                ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace}",
            )
        return request.make_response(_SUCCESS, body=KvTable(table).to_json())

    def _topics_by_cluster(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        """224 GET_TOPICS_BY_CLUSTER: TopicList of the topics any broker of the cluster routes
        (an unknown cluster: an empty list; Java fails there without a remark)."""
        header = GetTopicsByClusterRequestHeader.from_ext(request.ext_fields)
        topics = self.routes.topics_of_cluster(header.cluster)
        return request.make_response(_SUCCESS, body=TopicList(topics).to_json())

    def _system_topic_list(
        self, request: RemotingCommand, connection_id: int, now_ms: int
    ) -> RemotingCommand:
        """304 GET_SYSTEM_TOPIC_LIST_FROM_NS: Java's RouteInfoManager.getSystemTopicList, the
        cluster names and broker names (each is a topic a broker registers), and brokerAddr, one
        broker's address, which Java's admin then asks for its own system topics (305)."""
        names, broker_addr = self.routes.system_topic_list()
        return request.make_response(_SUCCESS, body=TopicList(names, broker_addr).to_json())


def log_removed(removed: RemovedBroker, why: str) -> None:
    log.info(
        "broker %s: cluster=%s name=%s id=%d addr=%s%s",
        why,
        removed.cluster,
        removed.broker_name,
        removed.broker_id,
        removed.broker_addr,
        " (its queue data removed)" if removed.broker_name_removed else "",
    )


# ---------------------------------------------------------------------------------------------
# The reactor.


@dataclass(frozen=True, slots=True)
class NamesrvStatistics:
    """Counters of one name server process; `handler` holds the per-request ones."""

    connection_accepted_count: int
    connection_refused_count: int  # closed at once: connection_count_max was reached
    connection_open_count: int
    protocol_error_close_count: int  # closed for breaking the protocol
    slow_reader_close_count: int  # closed for letting the outbox pass its bound
    idle_close_count: int  # closed after serverChannelMaxIdleTimeSeconds without a byte
    accept_backoff_count: int  # rests of the listener after EMFILE and friends
    broker_evicted_count: int  # by the scan
    broker_closed_count: int  # because their registering connection closed
    broker_registered_count: int  # broker addresses registered now
    handler: HandlerStatistics
    acl: AclStatistics | None = None  # None without an ACL


class _Peer:
    """One accepted socket and its codec; owned by the loop thread."""

    __slots__ = (
        "address",
        "connection",
        "connection_id",
        "host",
        "last_receive_ms",
        "outbox",
        "sock",
        "writing",
    )

    def __init__(
        self,
        sock: socket.socket,
        connection_id: int,
        address: str,
        frame_size_bytes_max: int,
        now_ms: int,
    ) -> None:
        self.sock = sock
        self.connection_id = connection_id
        self.address = address
        self.host = address.rsplit(":", 1)[0]  # the peer's IP, what admission.py checks
        self.connection = Connection(Role.BROKER, frame_size_bytes_max)
        self.outbox = bytearray()
        self.writing = False  # registered for EVENT_WRITE
        self.last_receive_ms = now_ms  # monotonic_ms() of the last bytes received


_LISTENER: Final = "listener"
_WAKEUP: Final = "wakeup"


class NamesrvServer:
    """The name server's sockets and loop.

    Build it, then call `serve()` in one thread, which from then on owns it and its RouteTable.
    `install_signal_handlers()` works only in the main thread; elsewhere (tests) `request_stop()`
    ends the loop. The socket listens from construction on, so `port` is known before `serve()`.
    """

    def __init__(
        self,
        config: NamesrvConfig,
        *,
        host: str | None = None,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        outbox_size_bytes_max: int = OUTBOX_SIZE_BYTES_MAX_DEFAULT,
        acl_file: Path | None = None,
    ) -> None:
        """`acl_file`: check NAMESRV_ADMIN_CODES against this plain_acl.yml (module docstring);
        AclConfigError when it is not valid."""
        assert config.scan_not_active_broker_interval_ms > 0
        if host is None:
            host = config.listen_address  # mqboxListenAddress
        assert config.broker_channel_expired_time_ms > 0
        assert outbox_size_bytes_max > 0
        assert config.connection_count_max > 0
        assert config.connection_idle_time_s > 0
        self.config = config
        kv_limits = KvLimits(
            config.kv_entry_count_max,
            config.kv_namespace_entry_count_max,
            config.kv_key_size_bytes_max,
            config.kv_value_size_bytes_max,
        )
        route_limits = RouteLimits(config.broker_count_max, config.topic_count_max)
        self.routes = RouteTable(
            order_message_enable=config.order_message_enable,
            kv_limits=kv_limits,
            route_limits=route_limits,
        )
        self.handler = NamesrvRequestHandler(
            self.routes,
            broker_white_list=BrokerWhiteList(broker_white_list_of(config, acl_file is not None)),
            broker_expired_ms=config.broker_channel_expired_time_ms,
        )
        self.acl = None if acl_file is None else AclValidator(acl_file, logger=log)
        self.frame_size_bytes_max = frame_size_bytes_max
        self.outbox_size_bytes_max = outbox_size_bytes_max
        self.connection_count_max = config.connection_count_max
        self.connection_idle_ms = config.connection_idle_time_s * 1000
        # Idle connections are looked for four times per idle period, so one is closed between
        # one and one and a quarter periods after its last request.
        self.idle_check_interval_ms = max(1, self.connection_idle_ms // 4)
        self._accept_backoff = AcceptBackoff(log)
        self._refused_log = RateLimitedLog(log)
        self._peers: dict[int, _Peer] = {}
        self._connection_ids = itertools.count(1)
        self._stopping = False
        self._closed = False
        self._connection_accepted_count = 0
        self._connection_refused_count = 0
        self._protocol_error_close_count = 0
        self._slow_reader_close_count = 0
        self._idle_close_count = 0
        self._broker_evicted_count = 0
        self._broker_closed_count = 0

        self._selector = selectors.DefaultSelector()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, config.listen_port))
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            self._selector.close()
            raise
        self._listener = listener
        self.host: str = host
        self.port: int = listener.getsockname()[1]
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        # Signals only set a flag; this pair wakes the selector so the flag is seen at once.
        self._wakeup_reader, self._wakeup_writer = socket.socketpair()
        self._wakeup_reader.setblocking(False)
        self._wakeup_writer.setblocking(False)
        self._selector.register(self._wakeup_reader, selectors.EVENT_READ, _WAKEUP)

    # -- control --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the loop to end; safe in a signal handler (it sets a flag and writes a byte)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wakeup_writer.send(b"\0")

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the loop; call from the main thread before `serve()`."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        # A signal that lands while select() sleeps must wake it, not wait for the next event.
        signal.set_wakeup_fd(self._wakeup_writer.fileno(), warn_on_full_buffer=False)

    def statistics(self) -> NamesrvStatistics:
        return NamesrvStatistics(
            connection_accepted_count=self._connection_accepted_count,
            connection_refused_count=self._connection_refused_count,
            connection_open_count=len(self._peers),
            protocol_error_close_count=self._protocol_error_close_count,
            slow_reader_close_count=self._slow_reader_close_count,
            idle_close_count=self._idle_close_count,
            accept_backoff_count=self._accept_backoff.rest_count,
            broker_evicted_count=self._broker_evicted_count,
            broker_closed_count=self._broker_closed_count,
            broker_registered_count=self.routes.broker_count(),
            handler=self.handler.statistics(),
            acl=None if self.acl is None else self.acl.statistics(),
        )

    # -- the loop -------------------------------------------------------------------------------

    def serve(self, *, on_scan: Callable[[], None] | None = None) -> None:
        """Run until `request_stop()`; then close every socket. `on_scan` runs after each scan."""
        interval_ms = self.config.scan_not_active_broker_interval_ms
        next_scan_ms = monotonic_ms() + interval_ms
        next_idle_check_ms = monotonic_ms() + self.idle_check_interval_ms
        try:
            while not self._stopping:
                now_ms = monotonic_ms()
                wait_ms = max(0, min(next_scan_ms, next_idle_check_ms) - now_ms)
                resume_in_ms = self._accept_backoff.resume_in_ms(now_ms * 1_000_000)
                if resume_in_ms is not None:
                    wait_ms = min(wait_ms, resume_in_ms)
                for key, mask in self._selector.select(wait_ms / 1000):
                    self._dispatch(key, mask)
                now_ms = monotonic_ms()
                if self._accept_backoff.resume_due(time.monotonic_ns()):
                    self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
                if now_ms >= next_idle_check_ms:
                    self.close_idle_connections(now_ms)
                    next_idle_check_ms = now_ms + self.idle_check_interval_ms
                if now_ms >= next_scan_ms:
                    self.scan(now_ms)
                    next_scan_ms = now_ms + interval_ms
                    if on_scan is not None:
                        on_scan()
        finally:
            self.close()

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        data = key.data
        if data is _LISTENER:
            self._accept()
        elif data is _WAKEUP:
            with contextlib.suppress(BlockingIOError):
                while self._wakeup_reader.recv(4096):
                    pass
        else:
            assert isinstance(data, _Peer)
            if data.connection_id not in self._peers:
                return  # closed earlier in this same turn
            if mask & selectors.EVENT_READ:
                self._receive(data)
            if mask & selectors.EVENT_WRITE and data.connection_id in self._peers:
                self._flush(data)

    def scan(self, now_ms: int) -> tuple[RemovedBroker, ...]:
        """Evict brokers silent for more than brokerChannelExpiredTime; close their connections."""
        evicted = self.routes.scan_not_active(now_ms, self.config.broker_channel_expired_time_ms)
        self._broker_evicted_count += len(evicted)
        for removed in evicted:
            log_removed(removed, "evicted after silence")
            if removed.connection_id is not None:
                peer = self._peers.get(removed.connection_id)
                if peer is not None:
                    self._close_peer(peer)
        return evicted

    def close_idle_connections(self, now_ms: int) -> int:
        """Close every connection that received nothing for serverChannelMaxIdleTimeSeconds;
        returns how many (a broker registered on one is removed, as on any close)."""
        deadline_ms = now_ms - self.connection_idle_ms
        idle = [peer for peer in self._peers.values() if peer.last_receive_ms < deadline_ms]
        for peer in idle:
            self._close_peer(peer)
        if idle:
            log.info(
                "closed %d connections idle for %d s (serverChannelMaxIdleTimeSeconds), %s first",
                len(idle),
                self.config.connection_idle_time_s,
                idle[0].address,
            )
        self._idle_close_count += len(idle)
        return len(idle)

    def _accept(self) -> None:
        for _ in range(ACCEPT_COUNT_PER_TURN_MAX):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if accept_out_of_resources(error):
                    self._accept_backoff.rest(error, len(self._peers))
                    self._selector.unregister(self._listener)  # module docstring
                    return
                continue  # a connection reset before accept: skip it, keep serving
            if len(self._peers) >= self.connection_count_max:
                self._connection_refused_count += 1
                self._refused_log.warning(
                    "refusing %s:%d: %d connections open, mqboxConnectionCountMax=%d",
                    address[0],
                    address[1],
                    len(self._peers),
                    self.connection_count_max,
                )
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _Peer(
                sock,
                next(self._connection_ids),
                f"{address[0]}:{address[1]}",
                self.frame_size_bytes_max,
                monotonic_ms(),
            )
            self._peers[peer.connection_id] = peer
            self._connection_accepted_count += 1
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _receive(self, peer: _Peer) -> None:
        try:
            chunk = peer.sock.recv(RECEIVE_SIZE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close_peer(peer)  # reset by the peer
            return
        connection = peer.connection
        connection.receive_data(chunk)
        now_ms = monotonic_ms()
        peer.last_receive_ms = now_ms
        handle = self.handler.handle
        try:
            while True:
                command = connection.next_command()
                if command is NEED_DATA:
                    break
                if command is CLOSED:
                    # The peer half-closed after its last request: answer what fits the socket
                    # now, without waiting for a peer that has said it is done.
                    if peer.outbox:
                        with contextlib.suppress(OSError):
                            peer.sock.send(peer.outbox)
                    self._close_peer(peer)
                    return
                if self.acl is not None and not self._acl_allows(command, peer):
                    continue
                response = handle(command, peer.connection_id, now_ms, peer_host=peer.host)
                if response is not None:
                    peer.outbox += connection.send(response)
        except RemoteProtocolError as error:
            self._protocol_error_close_count += 1
            log.warning("closing %s: %s", peer.address, error)
            self._close_peer(peer)
            return
        if peer.outbox:
            self._flush(peer)

    def _acl_allows(self, command: RemotingCommand, peer: _Peer) -> bool:
        """True if the ACL lets `command` through; else its refusal is in the peer's outbox."""
        assert self.acl is not None
        if command.is_response or command.code not in NAMESRV_ADMIN_CODES:
            return True
        host = peer.address.rpartition(":")[0]
        remark = self.acl.check(command.code, command.ext_fields, command.body, host)
        if remark is None:
            return True
        if not command.is_oneway:
            refusal = command.make_response(ResponseCode.SYSTEM_ERROR, remark=remark)
            peer.outbox += peer.connection.send(refusal)
        return False

    def _flush(self, peer: _Peer) -> None:
        outbox = peer.outbox
        try:
            while outbox:
                sent_size_bytes = peer.sock.send(outbox)
                del outbox[:sent_size_bytes]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close_peer(peer)
            return
        if len(outbox) > self.outbox_size_bytes_max:
            self._slow_reader_close_count += 1
            log.warning("closing %s: %d bytes of answers unread", peer.address, len(outbox))
            self._close_peer(peer)
            return
        want_write = bool(outbox)
        if want_write != peer.writing:
            peer.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._selector.modify(peer.sock, events, peer)

    def _close_peer(self, peer: _Peer) -> None:
        if self._peers.pop(peer.connection_id, None) is None:
            return
        self._selector.unregister(peer.sock)
        peer.sock.close()
        peer.outbox.clear()
        removed_brokers = self.routes.on_connection_closed(peer.connection_id)
        self._broker_closed_count += len(removed_brokers)
        for removed in removed_brokers:
            log_removed(removed, "removed: its connection closed")

    def close(self) -> None:
        """Close the listener and every connection; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        for peer in list(self._peers.values()):
            self._close_peer(peer)
        if not self._accept_backoff.resting:
            self._selector.unregister(self._listener)
        self._listener.close()
        self._selector.close()
        self._wakeup_reader.close()
        self._wakeup_writer.close()


# ---------------------------------------------------------------------------------------------
# Process entry


def statistics_document(statistics: NamesrvStatistics) -> dict[str, object]:
    document = dataclasses.asdict(statistics)
    handler = document["handler"]
    assert isinstance(handler, dict)
    # JSON object keys are strings; keep the codes readable as such.
    handler["request_count_by_code"] = {
        str(code): count for code, count in sorted(statistics.handler.request_count_by_code.items())
    }
    return document


def configure_logging() -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(process)d namesrv %(levelname)s %(message)s",
    )


def main(
    config: NamesrvConfig,
    *,
    host: str | None = None,
    ready_file: Path | None = None,
    stats_file: Path | None = None,
    acl_file: Path | None = None,
) -> NoReturn:
    """Run the name server in this process until SIGTERM or SIGINT, then exit 0.

    With `ready_file`, once the socket listens, writes `{"host", "pid", "port"}` there atomically:
    how a supervisor learns the port when `config.listen_port` is 0. With `stats_file`, writes
    `statistics()` as JSON after every scan and at exit. Exits 1 on an operating error at start
    (the port is taken, the ready file cannot be written).
    """
    configure_logging()
    soft_before, soft_now = raise_file_limit()
    if soft_now != soft_before:
        log.info("descriptor limit raised from %d to %d", soft_before, soft_now)
    if host is None:
        host = config.listen_address
    try:
        server = NamesrvServer(config, host=host, acl_file=acl_file)
    except OSError as error:
        log.error("cannot listen on %s:%d: %s", host, config.listen_port, error)
        raise SystemExit(1) from None
    except MqboxError as error:  # the ACL file
        log.error("cannot start: %s", error)
        raise SystemExit(1) from None
    server.install_signal_handlers()

    def write_statistics() -> None:
        if stats_file is not None:
            write_json_atomically(stats_file, statistics_document(server.statistics()))

    try:
        if ready_file is not None:
            ready = {"pid": os.getpid(), "port": server.port, "host": server.host}
            write_json_atomically(ready_file, ready)
        log.info(
            "listening on %s:%d (scan every %d ms, expire after %d ms)",
            server.host,
            server.port,
            config.scan_not_active_broker_interval_ms,
            config.broker_channel_expired_time_ms,
        )
        server.serve(on_scan=write_statistics)
    except (OSError, MqboxError) as error:
        log.error("stopping on error: %s", error)
        server.close()
        raise SystemExit(1) from None
    write_statistics()
    log.info("stopped")
    raise SystemExit(0)

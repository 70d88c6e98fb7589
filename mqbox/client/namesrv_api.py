"""Typed name server calls over a RemotingCaller (a RemotingClient or a Transport): one function per
request code.

Owns: building each name server request from typed headers and bodies, and reading its answer
into typed values (mqbox.protocol.headers); the `;`-separated namesrvAddr list
(`split_namesrv_addr`) and `NamesrvList`, which asks the name server that answered last, else each
of the list in turn. Never: sockets (remoting.py and transport.py), and no retries of one name
server: each call talks to the caller it is given.

Every function raises `RemotingResponseError` for a response code it does not expect, and the
`RemotingError` family of remoting.py for transport failures. A route that does not exist is not
an error: `get_route` returns None, as the C++ client treats code 17 and an empty body alike.
"""

from __future__ import annotations

import dataclasses
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

from mqbox.client.errors import NamesrvUnreachableError, RemotingError
from mqbox.client.remoting import RemotingCaller, RemotingResponseError, parse_address
from mqbox.errors import ConfigError
from mqbox.protocol.codes import (
    DELETE_KV_CONFIG,
    GET_KV_CONFIG,
    PUT_KV_CONFIG,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import (
    ClusterInfo,
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
    TopicRouteData,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)

T = TypeVar("T")
P = ParamSpec("P")


def split_namesrv_addr(namesrv_addr: str) -> tuple[str, ...]:
    """The addresses of a ';'-separated namesrvAddr, checked, blanks and repeats dropped."""
    addresses: list[str] = []
    for item in namesrv_addr.split(";"):
        address = item.strip()
        if address and address not in addresses:
            parse_address(address)
            addresses.append(address)
    if not addresses:
        raise ConfigError(f"namesrvAddr {namesrv_addr!r} names no name server")
    return tuple(addresses)


class NamesrvList:
    """The name servers of one namesrvAddr: a call goes to the one that answered last, else to
    each of the list in turn, in order, until one answers (Java and C++ also stick with a name
    server that works). One caller per address, made by `connect` on first use and kept."""

    def __init__(self, namesrv_addr: str, connect: Callable[[str], RemotingCaller]) -> None:
        self.addresses = split_namesrv_addr(namesrv_addr)
        self._connect = connect
        self._callers: dict[str, RemotingCaller] = {}
        self._current = 0  # index of the one that answered last
        self._lock = threading.Lock()

    def call(
        self,
        function: Callable[Concatenate[RemotingCaller, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`function(caller, *args, **kwargs)` on the current name server, then on the others
        when it cannot be reached. A name server's refusal (RemotingResponseError) is an answer
        and raised at once; NamesrvUnreachableError names every failure when none answers."""
        failures: list[str] = []
        count = len(self.addresses)
        start = self._current
        for step in range(count):
            index = (start + step) % count
            caller = self._caller(self.addresses[index])
            try:
                result = function(caller, *args, **kwargs)
            except RemotingResponseError:
                self._current = index
                raise
            except RemotingError as error:
                failures.append(str(error))
                continue
            self._current = index
            return result
        raise NamesrvUnreachableError(f"cannot reach the name server {'; '.join(failures)}")

    def _caller(self, address: str) -> RemotingCaller:
        with self._lock:
            caller = self._callers.get(address)
            if caller is None:
                caller = self._connect(address)
                self._callers[address] = caller
            return caller

    def close(self) -> None:
        with self._lock:
            callers = list(self._callers.values())
            self._callers.clear()
        for caller in callers:
            caller.close()


@dataclass(frozen=True, slots=True)
class RegisterBrokerOutcome:
    """What a name server answered to 103 REGISTER_BROKER."""

    ha_server_addr: str | None  # the master's HA address; given to slaves only
    master_addr: str | None  # the master's address; given to slaves only
    order_topic_conf: dict[str, str]  # the ORDER_TOPIC_CONFIG KV namespace ({} when empty)


def _expect(client: RemotingCaller, request_code: int, response: RemotingCommand, *ok: int) -> None:
    if response.code not in ok:
        raise RemotingResponseError(client.address, request_code, response.code, response.remark)


def get_route(
    client: RemotingCaller, topic: str, *, timeout_ms: int | None = None
) -> TopicRouteData | None:
    """105 GET_ROUTEINFO_BY_TOPIC: the route, or None when the name server knows no route."""
    code = RequestCode.GET_ROUTEINFO_BY_TOPIC
    response = client.invoke(code, GetRouteInfoRequestHeader(topic).to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST)
    if response.code == ResponseCode.TOPIC_NOT_EXIST or not response.body:
        return None
    return TopicRouteData.from_json(response.body)


def register_broker(
    client: RemotingCaller,
    header: RegisterBrokerRequestHeader,
    body: RegisterBrokerBody,
    *,
    timeout_ms: int | None = None,
) -> RegisterBrokerOutcome:
    """103 REGISTER_BROKER, uncompressed, with bodyCrc32 filled in from the body."""
    body_bytes = body.to_json()
    crc = zlib.crc32(body_bytes) & 0x7FFF_FFFF
    # crc 0 means "not checked" on the wire, which is harmless for the one body in 2**31 with it.
    sent = dataclasses.replace(header, compressed=False, body_crc32=crc)
    code = RequestCode.REGISTER_BROKER
    response = client.invoke(code, sent.to_ext(), body_bytes, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    answer = RegisterBrokerResponseHeader.from_ext(response.ext_fields)
    order_topic_conf = KvTable.from_json(response.body).table if response.body else {}
    return RegisterBrokerOutcome(answer.ha_server_addr, answer.master_addr, order_topic_conf)


def unregister_broker(
    client: RemotingCaller, header: UnregisterBrokerRequestHeader, *, timeout_ms: int | None = None
) -> None:
    """104 UNREGISTER_BROKER."""
    code = RequestCode.UNREGISTER_BROKER
    response = client.invoke(code, header.to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def cluster_info(client: RemotingCaller, *, timeout_ms: int | None = None) -> ClusterInfo:
    """106 GET_BROKER_CLUSTER_INFO."""
    code = RequestCode.GET_BROKER_CLUSTER_INFO
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return ClusterInfo.from_json(response.body)


def topic_list(client: RemotingCaller, *, timeout_ms: int | None = None) -> tuple[str, ...]:
    """206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER."""
    code = RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return TopicList.from_json(response.body).topic_list


def delete_topic(client: RemotingCaller, topic: str, *, timeout_ms: int | None = None) -> None:
    """216 DELETE_TOPIC_IN_NAMESRV: the topic's routes go until a broker registers it again."""
    code = RequestCode.DELETE_TOPIC_IN_NAMESRV
    response = client.invoke(code, DeleteTopicRequestHeader(topic).to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def wipe_write_perm(
    client: RemotingCaller, broker_name: str, *, timeout_ms: int | None = None
) -> int:
    """205 WIPE_WRITE_PERM_OF_BROKER: the number of topics whose write permission was cleared."""
    code = RequestCode.WIPE_WRITE_PERM_OF_BROKER
    ext = WipeWritePermOfBrokerRequestHeader(broker_name).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return WipeWritePermOfBrokerResponseHeader.from_ext(response.ext_fields).wipe_topic_count


def put_kv_config(
    client: RemotingCaller, namespace: str, key: str, value: str, *, timeout_ms: int | None = None
) -> None:
    """100 PUT_KV_CONFIG."""
    ext = PutKvConfigRequestHeader(namespace, key, value).to_ext()
    response = client.invoke(PUT_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, PUT_KV_CONFIG, response, ResponseCode.SUCCESS)


def get_kv_config(
    client: RemotingCaller, namespace: str, key: str, *, timeout_ms: int | None = None
) -> str | None:
    """101 GET_KV_CONFIG: the value, or None when the name server has no such key."""
    ext = KvConfigRequestHeader(namespace, key).to_ext()
    response = client.invoke(GET_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, GET_KV_CONFIG, response, ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return GetKvConfigResponseHeader.from_ext(response.ext_fields).value


def delete_kv_config(
    client: RemotingCaller, namespace: str, key: str, *, timeout_ms: int | None = None
) -> None:
    """102 DELETE_KV_CONFIG."""
    ext = KvConfigRequestHeader(namespace, key).to_ext()
    response = client.invoke(DELETE_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, DELETE_KV_CONFIG, response, ResponseCode.SUCCESS)

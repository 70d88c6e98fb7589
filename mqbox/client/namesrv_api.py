"""Typed name server calls over a RemotingClient: one function per request code.

Owns: building each name server request from typed headers and bodies, and reading its answer
into typed values (mqbox.protocol.headers). Never: sockets (remoting.py), retries, or choosing a
name server; each call talks to the client it is given.

Every function raises `RemotingResponseError` for a response code it does not expect, and the
`RemotingError` family of remoting.py for transport failures. A route that does not exist is not
an error: `get_route` returns None, as the C++ client treats code 17 and an empty body alike.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

from mqbox.client.remoting import RemotingClient, RemotingResponseError
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


@dataclass(frozen=True, slots=True)
class RegisterBrokerOutcome:
    """What a name server answered to 103 REGISTER_BROKER."""

    ha_server_addr: str | None  # the master's HA address; given to slaves only
    master_addr: str | None  # the master's address; given to slaves only
    order_topic_conf: dict[str, str]  # the ORDER_TOPIC_CONFIG KV namespace ({} when empty)


def _expect(client: RemotingClient, request_code: int, response: RemotingCommand, *ok: int) -> None:
    if response.code not in ok:
        raise RemotingResponseError(client.address, request_code, response.code, response.remark)


def get_route(
    client: RemotingClient, topic: str, *, timeout_ms: int | None = None
) -> TopicRouteData | None:
    """105 GET_ROUTEINFO_BY_TOPIC: the route, or None when the name server knows no route."""
    code = RequestCode.GET_ROUTEINFO_BY_TOPIC
    response = client.invoke(code, GetRouteInfoRequestHeader(topic).to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST)
    if response.code == ResponseCode.TOPIC_NOT_EXIST or not response.body:
        return None
    return TopicRouteData.from_json(response.body)


def register_broker(
    client: RemotingClient,
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
    client: RemotingClient, header: UnregisterBrokerRequestHeader, *, timeout_ms: int | None = None
) -> None:
    """104 UNREGISTER_BROKER."""
    code = RequestCode.UNREGISTER_BROKER
    response = client.invoke(code, header.to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def cluster_info(client: RemotingClient, *, timeout_ms: int | None = None) -> ClusterInfo:
    """106 GET_BROKER_CLUSTER_INFO."""
    code = RequestCode.GET_BROKER_CLUSTER_INFO
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return ClusterInfo.from_json(response.body)


def topic_list(client: RemotingClient, *, timeout_ms: int | None = None) -> tuple[str, ...]:
    """206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER."""
    code = RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
    response = client.invoke(code, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return TopicList.from_json(response.body).topic_list


def delete_topic(client: RemotingClient, topic: str, *, timeout_ms: int | None = None) -> None:
    """216 DELETE_TOPIC_IN_NAMESRV: the topic's routes go until a broker registers it again."""
    code = RequestCode.DELETE_TOPIC_IN_NAMESRV
    response = client.invoke(code, DeleteTopicRequestHeader(topic).to_ext(), timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)


def wipe_write_perm(
    client: RemotingClient, broker_name: str, *, timeout_ms: int | None = None
) -> int:
    """205 WIPE_WRITE_PERM_OF_BROKER: the number of topics whose write permission was cleared."""
    code = RequestCode.WIPE_WRITE_PERM_OF_BROKER
    ext = WipeWritePermOfBrokerRequestHeader(broker_name).to_ext()
    response = client.invoke(code, ext, timeout_ms=timeout_ms)
    _expect(client, code, response, ResponseCode.SUCCESS)
    return WipeWritePermOfBrokerResponseHeader.from_ext(response.ext_fields).wipe_topic_count


def put_kv_config(
    client: RemotingClient, namespace: str, key: str, value: str, *, timeout_ms: int | None = None
) -> None:
    """100 PUT_KV_CONFIG."""
    ext = PutKvConfigRequestHeader(namespace, key, value).to_ext()
    response = client.invoke(PUT_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, PUT_KV_CONFIG, response, ResponseCode.SUCCESS)


def get_kv_config(
    client: RemotingClient, namespace: str, key: str, *, timeout_ms: int | None = None
) -> str | None:
    """101 GET_KV_CONFIG: the value, or None when the name server has no such key."""
    ext = KvConfigRequestHeader(namespace, key).to_ext()
    response = client.invoke(GET_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, GET_KV_CONFIG, response, ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return GetKvConfigResponseHeader.from_ext(response.ext_fields).value


def delete_kv_config(
    client: RemotingClient, namespace: str, key: str, *, timeout_ms: int | None = None
) -> None:
    """102 DELETE_KV_CONFIG."""
    ext = KvConfigRequestHeader(namespace, key).to_ext()
    response = client.invoke(DELETE_KV_CONFIG, ext, timeout_ms=timeout_ms)
    _expect(client, DELETE_KV_CONFIG, response, ResponseCode.SUCCESS)

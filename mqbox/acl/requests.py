"""What each request code needs under the plain ACL: an admin account, and which resources.

Owns: the table of admin codes (broker and name server), and `needed_resources`, Java's
PlainAccessValidator.parse per request code (docs/acl.md section 4). Never: accounts or
signatures (validator.py).

Where mqbox is stricter than Java 4.9.x, on purpose (docs/acl.md says why):
- admin codes beyond Java's five (17, 25, 200, 207, 215): the broker's offset resets (222, and
  mqbox's own codes 10001-10099), its config and runtime views (26, 28), and on the name server
  registration (103, 104), permission wipes (205, 327), topic deletion (216) and KV writes
  (100, 102), which a Java name server does not check at all;
- 320 SEND_BATCH_MESSAGE needs PUB on its topic, as 310 does (Java checks only its signature);
- a 10 SEND_MESSAGE to a retry topic names its group in `producerGroup` (Java reads `group`,
  which that header does not have).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mqbox.acl.plain import PUB, SUB, retry_topic
from mqbox.protocol.codes import DELETE_KV_CONFIG, PUT_KV_CONFIG, RequestCode
from mqbox.protocol.command import Buffer
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import HeartbeatData
from mqbox.protocol.mqbox_codes import (
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_CODE_FIRST,
    MQBOX_CODE_LAST,
    MQBOX_NOOP,
)

# Java's RequestCode numbers mqbox classifies without serving all of them here (issue-admin adds
# the handlers): UPDATE_BROKER_CONFIG, GET_BROKER_CONFIG, GET_BROKER_RUNTIME_INFO,
# UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP, ADD_WRITE_PERM_OF_BROKER.
UPDATE_BROKER_CONFIG: Final = 25
GET_BROKER_CONFIG: Final = 26
GET_BROKER_RUNTIME_INFO: Final = 28
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Final = 200
DELETE_SUBSCRIPTIONGROUP: Final = 207
ADD_WRITE_PERM_OF_BROKER: Final = 327

BROKER_ADMIN_CODES: Final = frozenset(
    {
        int(RequestCode.UPDATE_AND_CREATE_TOPIC),
        int(RequestCode.DELETE_TOPIC_IN_BROKER),
        UPDATE_BROKER_CONFIG,
        GET_BROKER_CONFIG,
        GET_BROKER_RUNTIME_INFO,
        UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        DELETE_SUBSCRIPTIONGROUP,
        INVOKE_BROKER_TO_RESET_OFFSET,
    }
)
# Name server codes that change what clients are told; a namesrv checks only these.
NAMESRV_ADMIN_CODES: Final = frozenset(
    {
        int(RequestCode.REGISTER_BROKER),
        int(RequestCode.UNREGISTER_BROKER),
        int(RequestCode.WIPE_WRITE_PERM_OF_BROKER),
        ADD_WRITE_PERM_OF_BROKER,
        int(RequestCode.DELETE_TOPIC_IN_NAMESRV),
        PUT_KV_CONFIG,
        DELETE_KV_CONFIG,
    }
)
TRACE_TOPIC: Final = "RMQ_SYS_TRACE_TOPIC"  # PUB on it skips the permission check (Java)


def needs_admin(code: int) -> bool:
    """True if `code` needs an account with `admin: true`."""
    if code in BROKER_ADMIN_CODES or code in NAMESRV_ADMIN_CODES:
        return True
    return MQBOX_CODE_FIRST <= code <= MQBOX_CODE_LAST and code != MQBOX_NOOP


class ResourceError(ValueError):
    """The request's header or body does not say what it touches (a heartbeat body that is not
    one): refused, as Java refuses what its parse cannot read."""


def needed_resources(code: int, ext: Mapping[str, str], body: Buffer) -> dict[str, int]:
    """resource -> permission the request needs (groups as `%RETRY%<group>`); empty for codes
    that need only a valid signature. A field the request lacks adds nothing: the processor
    refuses the request for it."""
    needed: dict[str, int] = {}
    if code == RequestCode.SEND_MESSAGE:
        _send(needed, ext.get("topic"), ext.get("producerGroup"))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        _send(needed, ext.get("b"), ext.get("a"))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        _add_group(needed, ext.get("group"))
    elif code == RequestCode.PULL_MESSAGE:
        _add(needed, ext.get("topic"), SUB)
        _add_group(needed, ext.get("consumerGroup"))
    elif code == RequestCode.QUERY_MESSAGE:
        _add(needed, ext.get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        _heartbeat(needed, body)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        _add_group(needed, ext.get("consumerGroup"))
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        _add_group(needed, ext.get("consumerGroup"))
        _add(needed, ext.get("topic"), SUB)
    return needed


def _add(needed: dict[str, int], resource: str | None, perm: int) -> None:
    if resource:
        needed[resource] = needed.get(resource, 0) | perm


def _add_group(needed: dict[str, int], group: str | None) -> None:
    if group:
        _add(needed, retry_topic(group), SUB)


def _send(needed: dict[str, int], topic: str | None, group: str | None) -> None:
    """A send needs PUB on its topic; a send to a retry topic needs SUB on the group."""
    if topic is not None and topic.startswith("%RETRY%"):
        _add_group(needed, group)
    else:
        _add(needed, topic, PUB)


def _heartbeat(needed: dict[str, int], body: Buffer) -> None:
    """SUB on each consumer group and each topic it subscribes to."""
    try:
        heartbeat = HeartbeatData.from_json(bytes(body))
    except (RemoteProtocolError, ValueError) as error:
        raise ResourceError(f"cannot read the heartbeat body: {error}") from None
    for consumer in heartbeat.consumer_data_set:
        _add_group(needed, consumer.group_name)
        for subscription in consumer.subscription_data_set:
            _add(needed, subscription.topic, SUB)

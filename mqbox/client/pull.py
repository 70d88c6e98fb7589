"""Pulls and offset queries: the calls every consumer makes to a broker, typed.

Owns: PULL_MESSAGE (11) as one call, sync (`pull`), async (`pull_async`, a Future) or with a
callback (`pull_callback`, what the consumers use), its request built from typed arguments and
its answer read into a PullResult (status, next begin offset, min and max offsets, suggested
broker id, and the pulled records decoded by one kernel call, pull_decode.py); and the offset
calls around it: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15, oneway or answered),
SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31). Never: retries,
flow control, offsets kept between calls, threads (the consumers own those), and no Python
object per pulled message until someone asks for one.

    with Transport("127.0.0.1:10911") as broker:
        result = pull(broker, "broker-a", "Orders", 0, offset, 32, group="CG", subscription="A")
        for message in result.messages:       # lazy ReceivedMessage views, tag-checked
            ...
        offset = result.next_begin_offset

Rules (docs/protocol.md section 4.3, docs/client.md B.7):

1. A target is a Transport (its address; `broker` only names the broker in results and errors)
   or a ClientInstance, which finds the address of `broker` (by name) with id `broker_id`
   through findBrokerAddressInSubscribe, asking the name servers for the topic's route first when
   it knows no address. A pull that goes to a slave carries no commit offset (Java's
   PullAPIWrapper clears the COMMIT_OFFSET bit: a slave stores no commits).
2. The sysflag says what the arguments say: COMMIT_OFFSET with `commit_offset`, SUSPEND with
   `suspend_timeout_ms` > 0 (the broker holds the pull up to that long, so the call's timeout
   defaults to it plus PULL_TIMEOUT_MARGIN_MS), SUBSCRIPTION with `subscription` (the broker then
   filters by tag hash; without one the broker uses the group's heartbeat subscription, or sends
   everything for a group it does not know), LITE_PULL with `lite`.
3. Codes 0, 19, 20 and 21 are the four statuses; any other code raises BrokerError with the
   broker's code and remark, as Java's processPullResponse throws MQBrokerException.
4. The tag check is the client's (docs/client.md B.7 step 3): `messages` holds the records whose
   TAGS is one of the subscription's tags, exactly; `batch` holds every record the broker sent.
   A damaged body is not cut silently: `batch.complete` is False, `messages` holds the records
   before the damage, and `damaged_next_offset` says where to pull again (rather than skipping to
   next_begin_offset).
5. Every call has a timeout: `timeout_ms`, else the transport's (3000 ms), else for a suspended
   pull its suspend time plus the margin.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Final, TypedDict, Unpack

from mqbox.client.admin_api import PULL_TIMEOUT_MARGIN_MS, get_max_offset, get_min_offset
from mqbox.client.errors import BrokerError, ClientError, NoRouteError, RemotingResponseError
from mqbox.client.instance import ClientInstance
from mqbox.client.messages import MessageBatch
from mqbox.client.pull_decode import PulledBatch, decode_pull_body
from mqbox.client.remoting import RemotingCaller
from mqbox.client.route_table import MASTER_ID
from mqbox.client.subscription import Subscription, build_subscription
from mqbox.client.transport import Transport
from mqbox.clock import wall_clock_ms
from mqbox.message import BODY_SIZE_BYTES_MAX_DEFAULT
from mqbox.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_LITE_PULL,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    OffsetResponseHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

__all__ = [
    "PULL_TIMEOUT_MARGIN_MS",
    "PullOptions",
    "PullResult",
    "PullStatus",
    "max_offset",
    "min_offset",
    "pull",
    "pull_async",
    "pull_callback",
    "query_consumer_offset",
    "search_offset",
    "update_consumer_offset",
]

PULL_CODE: Final = int(RequestCode.PULL_MESSAGE)
_EMPTY_BODY: Final = b""


class PullStatus(enum.Enum):
    """A PULL answer's meaning (Java's PullStatus), by the broker's response code."""

    FOUND = int(ResponseCode.SUCCESS)
    NO_NEW_MSG = int(ResponseCode.PULL_NOT_FOUND)
    NO_MATCHED_MSG = int(ResponseCode.PULL_RETRY_IMMEDIATELY)
    OFFSET_ILLEGAL = int(ResponseCode.PULL_OFFSET_MOVED)


_STATUS_BY_CODE: Final = {status.value: status for status in PullStatus}


@dataclass(frozen=True, slots=True)
class PullResult:
    """One PULL answer (rules 3 and 4). Offsets are queue indexes."""

    status: PullStatus
    next_begin_offset: int  # nextBeginOffset: where the next pull of the queue starts
    min_offset: int  # minOffset
    max_offset: int  # maxOffset: the queue's entry count
    suggest_which_broker_id: int  # suggestWhichBrokerId: the broker id to pull from next
    batch: PulledBatch  # every record of the body (empty unless FOUND)
    messages: MessageBatch  # the records that passed the tag check, as lazy views

    @property
    def damaged_next_offset(self) -> int | None:
        """Where to pull again when the body held a damaged record (rule 4), else None."""
        if self.batch.complete:
            return None
        indexes = self.batch.queue_indexes()
        return int(indexes[-1]) + 1 if len(indexes) else None


PullCallback = Callable[[PullResult | None, ClientError | None], None]


def pull_request_ext(
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    *,
    subscription: Subscription | None,
    suspend_timeout_ms: int,
    commit_offset: int | None,
    lite: bool = False,
) -> dict[str, str]:
    """The PULL header's extFields for rule 2's flags."""
    assert max_count > 0
    assert suspend_timeout_ms >= 0
    sys_flag = 0
    if commit_offset is not None:
        sys_flag |= PULL_FLAG_COMMIT_OFFSET
    if suspend_timeout_ms > 0:
        sys_flag |= PULL_FLAG_SUSPEND
    if subscription is not None:
        sys_flag |= PULL_FLAG_SUBSCRIPTION
    if lite:
        sys_flag |= PULL_FLAG_LITE_PULL
    return PullMessageRequestHeader(
        group,
        topic,
        queue_id,
        offset,
        max_count,
        sys_flag,
        commit_offset if commit_offset is not None else 0,
        suspend_timeout_ms,
        subscription.sub_version_ms if subscription is not None else 0,
        subscription.sub_string if subscription is not None else None,
    ).to_ext()


def read_pull_response(
    response: RemotingCommand,
    broker: str,
    address: str,
    subscription: Subscription | None,
    body_size_bytes_max: int = BODY_SIZE_BYTES_MAX_DEFAULT,
) -> PullResult:
    """Rules 3 and 4 for one PULL answer. Raises BrokerError for a code that is no status and
    RemoteProtocolError for a header that does not parse."""
    status = _STATUS_BY_CODE.get(response.code)
    if status is None:
        raise BrokerError(broker, address, PULL_CODE, response.code, response.remark)
    header = PullMessageResponseHeader.from_ext(response.ext_fields)
    body = response.body if status is PullStatus.FOUND else _EMPTY_BODY
    batch = decode_pull_body(body, broker_name=broker, body_size_bytes_max=body_size_bytes_max)
    positions = None if subscription is None else batch.accepted_positions(subscription)
    return PullResult(
        status,
        header.next_begin_queue_index,
        header.queue_index_min,
        header.queue_index_max,
        header.suggest_which_broker_id,
        batch,
        MessageBatch(batch, range(len(batch)) if positions is None else positions),
    )


def as_subscription(topic: str, subscription: Subscription | str | None) -> Subscription | None:
    """An expression becomes FilterAPI's subscription of `topic`, versioned now."""
    if subscription is None or isinstance(subscription, Subscription):
        return subscription
    return build_subscription(topic, subscription, wall_clock_ms())


class PullOptions(TypedDict, total=False):
    """The optional keywords of every pull (rule 2 and rule 5): the subscription (an expression
    or a built Subscription; None pulls without one), the broker's hold in ms (0: none), the
    piggybacked commit offset, the broker id to pull from (0, the master), the LITE_PULL flag,
    the call's timeout, and the bound on each inflated body."""

    subscription: Subscription | str | None
    suspend_timeout_ms: int
    commit_offset: int | None
    broker_id: int
    lite: bool
    timeout_ms: int | None
    body_size_bytes_max: int


@dataclass(frozen=True, slots=True)
class _Prepared:
    """One pull, ready to send: where, what, and how to read its answer."""

    transport: Transport
    broker: str
    subscription: Subscription | None
    ext: dict[str, str]
    timeout_ms: int | None
    body_size_bytes_max: int

    def read(self, response: RemotingCommand) -> PullResult:
        """read_pull_response, a header that does not parse being a RemotingResponseError."""
        try:
            return read_pull_response(
                response,
                self.broker,
                self.transport.address,
                self.subscription,
                self.body_size_bytes_max,
            )
        except RemoteProtocolError as failure:
            address = self.transport.address
            raise RemotingResponseError(address, PULL_CODE, response.code, str(failure)) from None


def _prepare(
    target: Transport | ClientInstance,
    broker: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    group: str,
    options: PullOptions,
) -> _Prepared:
    """Rules 1, 2 and 5; raises NoRouteError or the name servers' errors (rule 1)."""
    subscription = as_subscription(topic, options.get("subscription"))
    suspend_timeout_ms = options.get("suspend_timeout_ms", 0)
    timeout_ms = options.get("timeout_ms")
    if timeout_ms is None and suspend_timeout_ms > 0:
        timeout_ms = suspend_timeout_ms + PULL_TIMEOUT_MARGIN_MS
    transport, to_slave = _target(target, broker, topic, options.get("broker_id", MASTER_ID))
    ext = pull_request_ext(
        group,
        topic,
        queue_id,
        offset,
        max_count,
        subscription=subscription,
        suspend_timeout_ms=suspend_timeout_ms,
        commit_offset=None if to_slave else options.get("commit_offset"),
        lite=options.get("lite", False),
    )
    return _Prepared(
        transport,
        broker,
        subscription,
        ext,
        timeout_ms,
        options.get("body_size_bytes_max", BODY_SIZE_BYTES_MAX_DEFAULT),
    )


def _target(
    target: Transport | ClientInstance, broker: str, topic: str, broker_id: int
) -> tuple[Transport, bool]:
    """Rule 1: (the transport of `target`, or the one of the broker's subscribe address; True
    when that address is a slave's)."""
    if isinstance(target, Transport):
        return target, False
    found = target.subscribe_address(broker, broker_id)
    if found is None:
        target.update_route(topic)
        found = target.subscribe_address(broker, broker_id)
    if found is None:
        raise NoRouteError(topic, f"broker {broker} of topic {topic} has no known address")
    address, is_slave = found
    return target.transport(address), is_slave


def pull_callback(
    target: Transport | ClientInstance,
    broker: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    callback: PullCallback,
    *,
    group: str,
    **options: Unpack[PullOptions],
) -> None:
    """Send one PULL; `callback(result, None)` or `callback(None, error)` runs once, in a
    transport's reading thread (it must not block: transport.py rule 5), or in this thread when
    no request could be sent. Errors: the RemotingError family, NoRouteError, BrokerError (rule
    3), and RemotingResponseError for a header that does not parse."""
    try:
        prepared = _prepare(target, broker, topic, queue_id, offset, max_count, group, options)
    except ClientError as error:
        callback(None, error)
        return

    def answered(response: RemotingCommand | None, error: ClientError | None) -> None:
        if error is not None:
            callback(None, error)
            return
        assert response is not None
        try:
            result = prepared.read(response)
        except ClientError as failure:
            callback(None, failure)
            return
        callback(result, None)

    prepared.transport.invoke_callback(PULL_CODE, prepared.ext, b"", answered, prepared.timeout_ms)


def pull_async(
    target: Transport | ClientInstance,
    broker: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    *,
    group: str,
    **options: Unpack[PullOptions],
) -> Future[PullResult]:
    """pull_callback with a Future: its PullResult or its ClientError. Done-callbacks of the
    Future run in a transport's reading thread and must not block."""
    future: Future[PullResult] = Future()
    future.set_running_or_notify_cancel()

    def done(result: PullResult | None, error: ClientError | None) -> None:
        with contextlib.suppress(InvalidStateError):
            if error is not None:
                future.set_exception(error)
            else:
                assert result is not None
                future.set_result(result)

    pull_callback(target, broker, topic, queue_id, offset, max_count, done, group=group, **options)
    return future


def pull(
    target: Transport | ClientInstance,
    broker: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_count: int,
    *,
    group: str,
    **options: Unpack[PullOptions],
) -> PullResult:
    """One PULL of up to `max_count` messages from `offset`, waited for in this thread
    (transport.py rule 2: a lone call costs no thread hop). Raises as pull_callback's errors
    say."""
    prepared = _prepare(target, broker, topic, queue_id, offset, max_count, group, options)
    response = prepared.transport.invoke(PULL_CODE, prepared.ext, b"", prepared.timeout_ms)
    return prepared.read(response)


# --- offsets ------------------------------------------------------------------------------------


def _expect_success(caller: RemotingCaller, code: int, response: RemotingCommand) -> None:
    if response.code != ResponseCode.SUCCESS:
        raise RemotingResponseError(caller.address, code, response.code, response.remark)


def query_consumer_offset(
    caller: RemotingCaller,
    group: str,
    topic: str,
    queue_id: int,
    *,
    timeout_ms: int | None = None,
) -> int | None:
    """14 QUERY_CONSUMER_OFFSET: the group's committed offset of the queue; None when the broker
    answers 22 QUERY_NOT_FOUND (nothing committed, and the queue no longer starts at 0: the
    consumer then starts where its consume_from says, docs/client.md B.6). Any other code
    raises RemotingResponseError."""
    code = int(RequestCode.QUERY_CONSUMER_OFFSET)
    ext = QueryConsumerOffsetRequestHeader(group, topic, queue_id).to_ext()
    response = caller.invoke(code, ext, timeout_ms=timeout_ms)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    _expect_success(caller, code, response)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def update_consumer_offset(
    transport: Transport,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    *,
    oneway: bool = True,
    timeout_ms: int | None = None,
) -> None:
    """15 UPDATE_CONSUMER_OFFSET: `offset` is the next queue index the group will consume. Oneway
    (Java's persistAll) returns once the socket took it; otherwise the broker's answer is awaited
    and a code other than 0 raises RemotingResponseError."""
    code = int(RequestCode.UPDATE_CONSUMER_OFFSET)
    ext = UpdateConsumerOffsetRequestHeader(group, topic, queue_id, offset).to_ext()
    if oneway:
        transport.invoke_oneway(code, ext, b"", timeout_ms)
        return
    _expect_success(transport, code, transport.invoke(code, ext, b"", timeout_ms))


def search_offset(
    caller: RemotingCaller,
    topic: str,
    queue_id: int,
    timestamp_ms: int,
    *,
    timeout_ms: int | None = None,
) -> int:
    """29 SEARCH_OFFSET_BY_TIMESTAMP: the queue index stored at `timestamp_ms` (ms since the
    epoch), or the nearer neighbour, as docs/protocol.md section 4.3 says."""
    code = int(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)
    ext = SearchOffsetRequestHeader(topic, queue_id, timestamp_ms).to_ext()
    response = caller.invoke(code, ext, timeout_ms=timeout_ms)
    _expect_success(caller, code, response)
    return OffsetResponseHeader.from_ext(response.ext_fields).queue_index


def max_offset(
    caller: RemotingCaller, topic: str, queue_id: int, *, timeout_ms: int | None = None
) -> int:
    """30 GET_MAX_OFFSET: the queue's entry count, the index its next message gets."""
    return get_max_offset(caller, topic, queue_id, timeout_ms=timeout_ms)


def min_offset(
    caller: RemotingCaller, topic: str, queue_id: int, *, timeout_ms: int | None = None
) -> int:
    """31 GET_MIN_OFFSET: the queue's first readable index."""
    return get_min_offset(caller, topic, queue_id, timeout_ms=timeout_ms)

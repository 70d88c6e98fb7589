"""The client's operating errors: every failure a caller of mqbox.client can catch, by kind.

Owns: the exception classes of the client package. Never: programmer errors, which are asserts
(docs/style.md section 3), and no behaviour beyond carrying the facts a caller needs (the peer's
address, the broker's response code and remark, the topic).

    MqboxError
    └── ClientError                      anything the client package raises on purpose
        ├── RemotingError                a call to one `ip:port` failed (`address`)
        │   ├── RemotingConnectError     refused, unreachable, or the connect timed out
        │   ├── RemotingTimeoutError     no answer within the call's time (or the send's budget)
        │   ├── RemotingClosedError      the connection closed or failed before the answer came
        │   └── RemotingResponseError    the peer answered a code the caller cannot accept
        │       └── BrokerError          ... a broker refusing a producer or consumer request
        ├── NamesrvUnreachableError      no name server of the list answered
        ├── NoRouteError                 a topic has no route, or no queue a send could use
        ├── ClientStateError             not started, shut down, or a call that would deadlock
        ├── InvalidMessageError          refused before sending (Java's Validators, code 13)
        └── OffsetOutOfRangeError        a consumer's seek outside the queue's offsets

`RemotingResponseError.code` and `.remark` are what the peer answered, so `except BrokerError as
e: if e.code == ResponseCode.TOPIC_NOT_EXIST` reads as RocketMQ's MQBrokerException does.
InvalidMessageError is also a `mqbox.errors.MessageIllegalError`, the appliance's error for the
same rule, and carries code 13 (MESSAGE_ILLEGAL) as Java's client-side MQClientException does.
"""

from __future__ import annotations

from typing import Final

from mqbox.errors import MessageIllegalError, MqboxError

MESSAGE_ILLEGAL_CODE: Final = 13  # ResponseCode.MESSAGE_ILLEGAL, restated: errors import no codec


class ClientError(MqboxError):
    """Base class of every operating error the client package raises."""


class RemotingError(ClientError):
    """A remote call failed; the subclass says how. `address` is the peer's `ip:port`."""

    def __init__(self, message: str, address: str) -> None:
        super().__init__(f"{address}: {message}")
        self.address = address


class RemotingConnectError(RemotingError):
    """The connection could not be made: refused, unreachable, or the connect timed out."""


class RemotingTimeoutError(RemotingError):
    """The peer did not answer (or take the request) within the time the call had."""


class RemotingClosedError(RemotingError):
    """The connection closed, failed or was closed by the client before the response arrived."""


class RemotingResponseError(RemotingError):
    """The peer answered with a response code the caller cannot accept."""

    def __init__(self, address: str, request_code: int, code: int, remark: str | None) -> None:
        super().__init__(f"request {request_code} answered {code}: {remark or ''}", address)
        self.request_code = request_code
        self.code = code
        self.remark = remark


class BrokerError(RemotingResponseError):
    """A broker refused a request (RocketMQ's MQBrokerException): `broker_name`, `code`, `remark`
    say which and why."""

    def __init__(
        self, broker_name: str, address: str, request_code: int, code: int, remark: str | None
    ) -> None:
        super().__init__(address, request_code, code, remark)
        self.broker_name = broker_name
        self.args = (f"broker {broker_name} at {address}: {remark or 'no remark'} (code {code})",)


class NamesrvUnreachableError(ClientError):
    """No name server of the list answered; the message names each address and its failure."""


class NoRouteError(ClientError):
    """`topic` has no route on the name server, or its route offers no queue the call can use."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


class ClientStateError(ClientError):
    """The client is not in a state to do this: not started, already shut down, or a blocking
    call from a thread that would wait for itself (a done-callback of the same connection)."""


class InvalidMessageError(ClientError, MessageIllegalError):
    """A message refused before it was sent (Java's Validators): empty or oversized body, a bad
    topic, a property the client owns. `code` is 13, MESSAGE_ILLEGAL, as in Java."""

    code: Final = MESSAGE_ILLEGAL_CODE


class OffsetOutOfRangeError(ClientError):
    """A seek outside the queue's readable offsets: `offset` is not in [`min_offset`,
    `max_offset`] of `queue` (Java's "Seek offset illegal")."""

    def __init__(self, queue: object, offset: int, min_offset: int, max_offset: int) -> None:
        super().__init__(f"{queue}: offset {offset} is outside [{min_offset}, {max_offset}]")
        self.queue = queue
        self.offset = offset
        self.min_offset = min_offset
        self.max_offset = max_offset

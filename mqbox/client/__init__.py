"""mqbox.client: a RocketMQ 4.x client for Python (issue 11), and the blocking calls the CLI, the
broker's registration and the tests use.

    from mqbox.client import Producer, PushConsumer, PullConsumer, Message, ConsumeResult

The runtime is ClientInstance (instance.py) over Transports (transport.py); ARCHITECTURE.md's code
map lists every module and what it must not import.

The names below are imported when first used (PEP 562): `from mqbox.client.admin_api import
...` then loads neither numba nor the consumers, so a CLI command that asks a broker starts in
about half the time (docs/style.md, section 6).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqbox.client.consume_rules import ConsumeFrom
    from mqbox.client.consumer_core import ConsumerStatistics
    from mqbox.client.errors import (
        BrokerError,
        ClientError,
        ClientStateError,
        InvalidMessageError,
        NamesrvUnreachableError,
        NoRouteError,
        OffsetOutOfRangeError,
        RemotingClosedError,
        RemotingConnectError,
        RemotingError,
        RemotingResponseError,
        RemotingTimeoutError,
    )
    from mqbox.client.instance import ClientInstance
    from mqbox.client.messages import ConsumeResult, MessageBatch, ReceivedMessage
    from mqbox.client.outgoing import Message, SendResult, SendStatus
    from mqbox.client.producer import Producer, ProducerStatistics, SendOptions
    from mqbox.client.pull import PullResult, PullStatus, pull, pull_async
    from mqbox.client.pull_consumer import PullConsumer
    from mqbox.client.push_consumer import PushConsumer
    from mqbox.protocol.headers import MessageQueue

# public name -> the module that defines it
_HOMES: dict[str, str] = {
    "ConsumeFrom": "mqbox.client.consume_rules",
    "ConsumerStatistics": "mqbox.client.consumer_core",
    "BrokerError": "mqbox.client.errors",
    "ClientError": "mqbox.client.errors",
    "ClientStateError": "mqbox.client.errors",
    "InvalidMessageError": "mqbox.client.errors",
    "NamesrvUnreachableError": "mqbox.client.errors",
    "NoRouteError": "mqbox.client.errors",
    "OffsetOutOfRangeError": "mqbox.client.errors",
    "RemotingClosedError": "mqbox.client.errors",
    "RemotingConnectError": "mqbox.client.errors",
    "RemotingError": "mqbox.client.errors",
    "RemotingResponseError": "mqbox.client.errors",
    "RemotingTimeoutError": "mqbox.client.errors",
    "ClientInstance": "mqbox.client.instance",
    "ConsumeResult": "mqbox.client.messages",
    "MessageBatch": "mqbox.client.messages",
    "ReceivedMessage": "mqbox.client.messages",
    "Message": "mqbox.client.outgoing",
    "SendResult": "mqbox.client.outgoing",
    "SendStatus": "mqbox.client.outgoing",
    "Producer": "mqbox.client.producer",
    "ProducerStatistics": "mqbox.client.producer",
    "SendOptions": "mqbox.client.producer",
    "PullResult": "mqbox.client.pull",
    "PullStatus": "mqbox.client.pull",
    "pull": "mqbox.client.pull",
    "pull_async": "mqbox.client.pull",
    "PullConsumer": "mqbox.client.pull_consumer",
    "PushConsumer": "mqbox.client.push_consumer",
    "MessageQueue": "mqbox.protocol.headers",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """Keeps a public name from being bound to the submodule of the same name: importing
    `mqbox.client.pull` binds `pull` on this package, which must stay the function."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "BrokerError",
    "ClientError",
    "ClientInstance",
    "ClientStateError",
    "ConsumeFrom",
    "ConsumeResult",
    "ConsumerStatistics",
    "InvalidMessageError",
    "Message",
    "MessageBatch",
    "MessageQueue",
    "NamesrvUnreachableError",
    "NoRouteError",
    "OffsetOutOfRangeError",
    "Producer",
    "ProducerStatistics",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "ReceivedMessage",
    "RemotingClosedError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingResponseError",
    "RemotingTimeoutError",
    "SendOptions",
    "SendResult",
    "SendStatus",
    "pull",
    "pull_async",
]

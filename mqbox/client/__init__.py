"""mqbox.client: a RocketMQ 4.x client for Python (issue 11), and the blocking calls the CLI, the
broker's registration and the tests use.

    from mqbox.client import Producer, PushConsumer, PullConsumer, Message, ConsumeResult

The runtime is ClientInstance (instance.py) over Transports (transport.py); ARCHITECTURE.md's code
map lists every module and what it must not import.
"""

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

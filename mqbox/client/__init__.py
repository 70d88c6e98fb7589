"""mqbox.client: a RocketMQ 4.x client for Python (issue 11), and the blocking calls the CLI, the
broker's registration and the tests use.

    from mqbox.client import Producer, Message, SendResult

The runtime is ClientInstance (instance.py) over Transports (transport.py); ARCHITECTURE.md's code
map lists every module and what it must not import.
"""

from mqbox.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    InvalidMessageError,
    NamesrvUnreachableError,
    NoRouteError,
    RemotingClosedError,
    RemotingConnectError,
    RemotingError,
    RemotingResponseError,
    RemotingTimeoutError,
)
from mqbox.client.instance import ClientInstance
from mqbox.client.outgoing import Message, SendResult, SendStatus
from mqbox.client.producer import Producer, ProducerStatistics, SendOptions

__all__ = [
    "BrokerError",
    "ClientError",
    "ClientInstance",
    "ClientStateError",
    "InvalidMessageError",
    "Message",
    "NamesrvUnreachableError",
    "NoRouteError",
    "Producer",
    "ProducerStatistics",
    "RemotingClosedError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingResponseError",
    "RemotingTimeoutError",
    "SendOptions",
    "SendResult",
    "SendStatus",
]

"""The two ways the remoting codec fails (docs/style.md section 5; h11's split).

Owns: `RemoteProtocolError` and `LocalProtocolError`. Never: I/O or logging.

- `RemoteProtocolError`: the peer sent something the protocol does not allow. This is an operating
  error (mqbox/errors.py): the caller answers with `response_code` where a request can still be
  answered (a typed header that does not parse), or closes the connection (a broken frame).
- `LocalProtocolError`: our own code asked the codec to do something impossible, such as encoding a
  non-string extFields value. That is a bug in mqbox, and the caller should let it stop the process.
"""

from __future__ import annotations

from mqbox.errors import MqboxError

# RocketMQ's SYSTEM_ERROR. The Java broker answers it for a request header it cannot decode;
# codes.py holds the full enum, and a test checks the two agree. Kept as a literal so this leaf
# module imports nothing from the rest of the package.
_SYSTEM_ERROR = 1


class ProtocolError(Exception):
    """Base class of both codec errors, for callers that treat them alike (tests, logging)."""


class RemoteProtocolError(ProtocolError, MqboxError):
    """The peer broke the remoting protocol.

    `response_code` is the RocketMQ response code to answer with when the frame itself was sound
    and only its contents were bad; after a framing error the connection must be closed instead.
    """

    def __init__(self, message: str, *, response_code: int = _SYSTEM_ERROR) -> None:
        super().__init__(message)
        self.response_code = response_code


class LocalProtocolError(ProtocolError):
    """mqbox misused the codec: a bug on our side, never the peer's fault."""

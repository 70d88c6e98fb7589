"""RemotingClient: a small blocking request/response client over one TCP connection.

Owns: one socket to one `ip:port`, its `mqbox.protocol.Connection`, and matching responses to
requests by opaque. Used by tests, the CLI, benches and the broker's name server registration.
Never: retries, routing or business meaning (namesrv_api.py and the producer decide those), and it
is not the data path: one request is in flight at a time.

Rules:

1. The connection is made on first use and made again on the next call after it failed; `close()`
   ends it. A name server ties a broker's routes to the connection that registered them, so
   callers that register keep one client open rather than one per call.
2. `invoke` waits for the response whose opaque it sent and skips every other frame: late answers
   to calls that timed out, and requests a broker sends its clients (NOTIFY_CONSUMER_IDS_CHANGED).
3. Failures are operating errors, each a `RemotingError` (errors.py, re-exported here): the peer
   cannot be reached (`RemotingConnectError`), did not answer in time (`RemotingTimeoutError`),
   or closed or reset the connection (`RemotingClosedError`, also when it closed inside a frame);
   a peer breaking the protocol raises the codec's `RemoteProtocolError`. After any of them the
   connection is closed, as the C++ client closes a connection whose call timed out, because the
   stream may be cut inside a frame.
4. One lock serialises calls, so threads may share a client; they then wait for each other.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Final, Protocol, Self

from mqbox.acl.signature import SessionCredentials, sign_request
from mqbox.client.errors import RemotingClosedError as RemotingClosedError
from mqbox.client.errors import RemotingConnectError as RemotingConnectError
from mqbox.client.errors import RemotingError as RemotingError
from mqbox.client.errors import RemotingResponseError as RemotingResponseError
from mqbox.client.errors import RemotingTimeoutError as RemotingTimeoutError
from mqbox.errors import ConfigError
from mqbox.protocol.command import RemotingCommand, make_request
from mqbox.protocol.connection import CLOSED, NEED_DATA, Connection, Role
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import FRAME_SIZE_BYTES_MAX_DEFAULT

RECEIVE_SIZE_BYTES: Final = 256 * 1024
TIMEOUT_MS_DEFAULT: Final = 3000  # the C++ client's default for most calls


class RemotingCaller(Protocol):
    """What namesrv_api.py and admin_api.py call through: a blocking RemotingClient here, or a
    multiplexed transport.Transport (the producer's and consumers' connections)."""

    @property
    def address(self) -> str: ...

    def invoke(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> RemotingCommand: ...

    def close(self) -> None: ...


def parse_address(address: str) -> tuple[str, int]:
    """`"ip:port"` as (host, port); ConfigError when it is not one."""
    host, separator, port_text = address.strip().rpartition(":")
    if not separator or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{address!r} is not an ip:port address")
    return host, int(port_text)


class RemotingClient:
    """Blocking remoting calls to one `ip:port`; see the module docstring for the rules."""

    def __init__(
        self,
        address: str,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        *,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        credentials: SessionCredentials | None = None,
    ) -> None:
        """With `credentials`, every request is signed (plain ACL, docs/acl.md)."""
        assert timeout_ms > 0
        self.credentials: Final = credentials
        self.address: Final = address.strip()
        self._host, self._port = parse_address(self.address)
        self.timeout_ms: Final = timeout_ms
        self.frame_size_bytes_max: Final = frame_size_bytes_max
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._connection = Connection(Role.CLIENT, frame_size_bytes_max)
        # Opaques keep counting across reconnections (not per Connection), so no late frame can
        # match a later request; 0, 1, 2, ... with the sign bit clear, as the C++ client's.
        self._opaque_next = 0
        self.skipped_frame_count = 0  # frames read and dropped by rule 2

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self, timeout_ms: int | None = None) -> None:
        """Open the connection now rather than on first use; nothing if it is open."""
        with self._lock:
            self._connect(_deadline_ns(timeout_ms or self.timeout_ms))

    def close(self) -> None:
        """Close the connection; the next call opens a new one."""
        sock = self._sock
        self._sock = None
        if sock is not None:
            sock.close()

    # -- calls ------------------------------------------------------------------------------------

    def invoke(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> RemotingCommand:
        """Send a request and wait for its response; `timeout_ms` covers connect, send and wait."""
        deadline_ns = _deadline_ns(timeout_ms or self.timeout_ms)
        with self._lock:
            sock = self._connect(deadline_ns)
            opaque = self._next_opaque()
            request = make_request(code, opaque, self._ext(ext, body), body=body)
            self._send(sock, self._connection.send(request), deadline_ns)
            return self._receive(sock, opaque, deadline_ns)

    def invoke_oneway(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> None:
        """Send a request flagged oneway and return once the socket took it; nothing is awaited."""
        deadline_ns = _deadline_ns(timeout_ms or self.timeout_ms)
        with self._lock:
            sock = self._connect(deadline_ns)
            opaque = self._next_opaque()
            request = make_request(code, opaque, self._ext(ext, body), body=body, oneway=True)
            self._send(sock, self._connection.send(request), deadline_ns)

    # -- internals (called with the lock held) -------------------------------------------------

    def _ext(self, ext: dict[str, str] | None, body: bytes) -> dict[str, str]:
        """A copy of the request's extFields, signed when this client has credentials."""
        if self.credentials is None:
            return dict(ext or {})
        return sign_request(self.credentials, ext, body)

    def _next_opaque(self) -> int:
        opaque = self._opaque_next
        self._opaque_next = (opaque + 1) & 0x7FFF_FFFF
        return opaque

    def _connect(self, deadline_ns: int) -> socket.socket:
        if self._sock is not None:
            return self._sock
        try:
            sock = socket.create_connection(
                (self._host, self._port), timeout=_remaining_s(deadline_ns)
            )
        except TimeoutError:
            raise RemotingConnectError("connect timed out", self.address) from None
        except OSError as error:
            raise RemotingConnectError(
                f"cannot connect: {error.strerror or error}", self.address
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._connection = Connection(Role.CLIENT, self.frame_size_bytes_max)
        return sock

    def _send(self, sock: socket.socket, frame: bytes, deadline_ns: int) -> None:
        try:
            sock.settimeout(_remaining_s(deadline_ns))
            sock.sendall(frame)
        except TimeoutError:
            self.close()
            raise RemotingTimeoutError("timed out sending the request", self.address) from None
        except OSError as error:
            self.close()
            raise RemotingClosedError(
                f"send failed: {error.strerror or error}", self.address
            ) from None

    def _receive(self, sock: socket.socket, opaque: int, deadline_ns: int) -> RemotingCommand:
        connection = self._connection
        chunk_was_eof = False
        while True:
            try:
                command = connection.next_command()
            except RemoteProtocolError as error:
                self.close()
                if chunk_was_eof:  # the peer went away inside a frame: closed, not a breach
                    raise RemotingClosedError(str(error), self.address) from None
                raise
            if command is CLOSED:
                self.close()
                raise RemotingClosedError("the peer closed the connection", self.address)
            if command is not NEED_DATA:
                if command.is_response and command.opaque == opaque:
                    return command
                self.skipped_frame_count += 1
                continue
            if time.monotonic_ns() >= deadline_ns:
                self.close()
                raise RemotingTimeoutError("no response in time", self.address)
            try:
                sock.settimeout(_remaining_s(deadline_ns))
                chunk = sock.recv(RECEIVE_SIZE_BYTES)
            except TimeoutError:
                self.close()
                raise RemotingTimeoutError("no response in time", self.address) from None
            except OSError as error:
                self.close()
                raise RemotingClosedError(
                    f"receive failed: {error.strerror or error}", self.address
                ) from None
            chunk_was_eof = not chunk
            connection.receive_data(chunk)


def _deadline_ns(timeout_ms: int) -> int:
    assert timeout_ms > 0
    return time.monotonic_ns() + timeout_ms * 1_000_000


def _remaining_s(deadline_ns: int) -> float:
    """Seconds left before the deadline; a tiny positive number once it passed, so that socket
    calls time out at once rather than switching to blocking mode (a timeout of 0 would make them
    non-blocking, which raises a different error)."""
    return max(deadline_ns - time.monotonic_ns(), 1_000) / 1e9

"""Transport: one multiplexed TCP connection to one `ip:port`, many requests in flight by opaque.

Owns: the socket of one address (made again on the next call after a failure), its sans-IO
`Connection`, the table of calls waiting for an answer, and one thread per connection that reads
when no caller does. Never: routing, retries or business meaning (instance.py and producer.py
decide those), and no blocking work in the reading thread: the callbacks and the request handler
it runs must return quickly.

Theory of operation:

1. Calls. `invoke` waits for its answer until a deadline; `invoke_async` returns a
   concurrent.futures.Future and `invoke_callback` calls back; `invoke_oneway` sets the ONEWAY
   flag and returns once the socket took the frame. Each request gets the transport's next opaque
   (0, 1, 2, ... with the sign bit clear, counted across reconnections, so a late answer can never
   match a later call). A call's connect, write and wait share its one deadline.
2. The reader role. At most one thread reads the socket at a time: the one holding the role. A
   sync caller that finds the role free takes it before writing and then reads until its own
   answer is in, completing any other call whose answer it reads on the way. A lone sync call
   therefore costs no thread hop: the caller sleeps in poll() and wakes with its answer, exactly
   as a blocking client would (bench/client_latency.py measures the difference). A sync caller
   that finds the role taken waits on the channel's condition until its call is done or the role
   is free, and then takes it.
3. The channel's own thread takes the role whenever calls are outstanding and nobody reads
   (async calls, or after a sync reader left with others still waiting); it is woken only then.
   Every IDLE_CHECK_INTERVAL_S it also expires async calls whose time is up and, on an idle
   connection, reads what the broker sent unasked (NOTIFY_CONSUMER_IDS_CHANGED and the other
   broker requests) or notices that the broker closed the connection.
4. Broker requests (frames without the RESPONSE flag) go to the `request_handler` in the reading
   thread; it answers with `respond()` unless the request is oneway. Without a handler, a request
   expecting an answer gets REQUEST_CODE_NOT_SUPPORTED.
5. Callbacks run in the reading thread, which may be a sync caller's. They must not block; a sync
   call on the same transport from a callback raises ClientStateError rather than wait for itself.
6. Failures. A connect error fails that call only. A read or write error, the end of the stream,
   a protocol error, or a write cut by its deadline fails the channel: every outstanding call gets
   its own RemotingClosedError, the socket is shut down (which wakes whoever polls it), and the
   next call connects again. A call's own timeout does not fail the channel, as in Java (the C++
   client closes it): the late answer is counted and dropped.
7. The socket is non-blocking and every wait is a poll() with the time left, so no thread changes
   a timeout under another. The channel's thread closes the descriptor once nobody can be polling
   it (the role free, the write lock held), so a number the kernel reuses for a new socket is
   never polled by an old waiter. close() fails every outstanding call and joins that thread
   within CLOSE_JOIN_TIMEOUT_S: it never hangs.
8. Async writes are coalesced. A sync call, a oneway call and an answer to the broker write their
   frame themselves; an async call (`invoke_callback`, `invoke_async`) queues its frame and
   returns, and the channel's writer thread (started with the first async call) writes every
   frame queued meanwhile with one send(). A producer keeping many sends in flight thus pays
   one syscall per batch of frames instead of one per frame, and its thread never waits on the
   socket; a lone async call pays one thread hand-off. A failed write fails the channel (rule
   6), which fails the queued calls with it; the batch's write deadline is its earliest call's.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Final, Self

from mqbox.acl.signature import SessionCredentials, sign_request
from mqbox.client.errors import (
    ClientError,
    ClientStateError,
    RemotingClosedError,
    RemotingConnectError,
    RemotingTimeoutError,
)
from mqbox.client.remoting import TIMEOUT_MS_DEFAULT, parse_address
from mqbox.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from mqbox.protocol.command import RemotingCommand, encode_command, make_request
from mqbox.protocol.connection import CLOSED, NEED_DATA, Connection, Role
from mqbox.protocol.errors import LocalProtocolError, RemoteProtocolError
from mqbox.protocol.frame import FRAME_SIZE_BYTES_MAX_DEFAULT

log = logging.getLogger("mqbox.client.transport")

RECEIVE_SIZE_BYTES: Final = 1 << 20
IDLE_CHECK_INTERVAL_S: Final = 0.1
CLOSE_JOIN_TIMEOUT_S: Final = 2.0
_OPAQUE_MASK: Final = 0x7FFF_FFFF
_POLL_READ: Final = select.POLLIN | select.POLLPRI
_POLL_WRITE: Final = select.POLLOUT

ResponseCallback = Callable[[RemotingCommand | None, ClientError | None], None]
RequestHandler = Callable[["Transport", RemotingCommand], None]


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """Counters of one transport since it was made (all connections)."""

    address: str
    connected: bool
    connects: int  # connections made
    channel_failures: int  # connections failed or closed (rule 6)
    frames_written: int  # requests (oneway included) and answers to broker requests
    writes: int  # send() calls that wrote them: fewer when async frames were coalesced (rule 8)
    outstanding: int  # calls waiting for an answer now
    timeouts: int  # calls that ran out of time
    late_responses: int  # answers matching no outstanding call (its caller timed out)
    broker_requests: int  # frames the broker sent unasked


class _Call:
    """One request waiting for its answer: a sync caller's (callback None) or a callback's."""

    __slots__ = ("callback", "deadline_ns", "done", "error", "opaque", "response")

    def __init__(self, opaque: int, deadline_ns: int, callback: ResponseCallback | None) -> None:
        self.opaque = opaque
        self.deadline_ns = deadline_ns
        self.callback = callback
        self.done = False
        self.response: RemotingCommand | None = None
        self.error: ClientError | None = None


def _remaining_ms(deadline_ns: int) -> int:
    """Whole ms left before the deadline, rounded up, at least 1 (poll() takes ms)."""
    return max(1, -((time.monotonic_ns() - deadline_ns) // 1_000_000))


class _Channel:
    """One TCP connection of a Transport: its socket, codec, outstanding calls and thread.

    `lock` guards pending, reading, reader_ident, waiting_sync and dead; `write_lock` orders
    frames on the socket. A channel is never reused after it failed (`dead` is set once).
    """

    def __init__(self, transport: Transport, sock: socket.socket, number: int) -> None:
        self.transport = transport
        self.address = transport.address
        self.sock = sock
        self.connection = Connection(Role.CLIENT, transport.frame_size_bytes_max)
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.write_lock = threading.Lock()
        self.pending: dict[int, _Call] = {}
        self.reading = False
        self.reader_ident = 0
        self.waiting_sync = 0
        self.dead: str | None = None  # why the channel failed; set once
        self.wake = threading.Event()
        self.read_poll = select.poll()
        self.read_poll.register(sock.fileno(), _POLL_READ)
        self.write_poll = select.poll()
        self.write_poll.register(sock.fileno(), _POLL_WRITE)
        self.buffer = bytearray(RECEIVE_SIZE_BYTES)
        self.view = memoryview(self.buffer)
        self.thread = threading.Thread(
            target=self._run, name=f"mqbox-transport-{self.address}-{number}", daemon=True
        )
        # Rule 8: frames of async calls wait here for the writer thread, which starts with the
        # first of them.
        self.queued: list[bytes] = []
        self.queued_deadline_ns = 0  # the earliest deadline of the queued frames
        self.queue_cond = threading.Condition(threading.Lock())
        self.writer: threading.Thread | None = None
        self.number = number

    # -- calls ------------------------------------------------------------------------------------

    def call_sync(self, call: _Call, frame: bytes) -> RemotingCommand:
        """Write `frame` and wait for the answer to `call` (rule 2); raises ClientError."""
        with self.lock:
            if self.dead is not None:
                raise RemotingClosedError(self.dead, self.address)
            if self.reading and self.reader_ident == threading.get_ident():
                raise ClientStateError(
                    "a sync call from a callback of the same connection would wait for itself"
                )
            self.pending[call.opaque] = call
            take = not self.reading
            if take:
                self.reading = True
                self.reader_ident = threading.get_ident()
        try:
            self.write(frame, call.deadline_ns)
            while not call.done:
                if take:
                    if time.monotonic_ns() >= call.deadline_ns:
                        break
                    self._read_once(_remaining_ms(call.deadline_ns))
                else:
                    take = self._wait_or_take(call)
                    if not take and not call.done:
                        break  # the deadline passed
        finally:
            if take:
                self._release_role()
        if not call.done:
            with self.lock:
                self.pending.pop(call.opaque, None)
            if not call.done:
                self.transport._timeout_count += 1
                raise RemotingTimeoutError("no response in time", self.address)
        if call.error is not None:
            raise call.error
        response = call.response
        assert response is not None
        return response

    def call_callback(self, call: _Call, frame: bytes) -> None:
        """Write `frame`; `call.callback` gets the answer or the failure (rule 1)."""
        with self.lock:
            dead = self.dead
            if dead is None:
                self.pending[call.opaque] = call
                if not self.reading:
                    self.wake.set()
        if dead is not None:
            self._finish(call, None, RemotingClosedError(dead, self.address))
            return
        with self.queue_cond:
            if not self.queued or call.deadline_ns < self.queued_deadline_ns:
                self.queued_deadline_ns = call.deadline_ns
            self.queued.append(frame)
            if self.writer is None:
                self.writer = threading.Thread(
                    target=self._write_queued,
                    name=f"mqbox-transport-writer-{self.address}-{self.number}",
                    daemon=True,
                )
                self.writer.start()
            elif len(self.queued) == 1:
                self.queue_cond.notify()

    def _write_queued(self) -> None:
        """Rule 8: the writer thread. Takes every frame queued meanwhile and writes them with one
        send() until the channel fails (which fails their calls: fail() wakes this thread)."""
        queue_cond = self.queue_cond
        while True:
            with queue_cond:
                while not self.queued and self.dead is None:
                    queue_cond.wait(IDLE_CHECK_INTERVAL_S)
                if self.dead is not None:
                    self.queued.clear()
                    return
                frames, self.queued = self.queued, []
                deadline_ns = self.queued_deadline_ns
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            with contextlib.suppress(ClientError):  # the calls learn it through fail()
                self.write(data, deadline_ns, len(frames))

    def write(self, frame: bytes, deadline_ns: int, frame_count: int = 1) -> None:
        """All of `frame` (`frame_count` frames) onto the socket by the deadline. A failure fails
        the channel (outside the write lock, so the callbacks it runs may write elsewhere) and
        raises: a frame cut half-way leaves nothing else to do with the stream."""
        error_kind: type[RemotingClosedError] | type[RemotingTimeoutError] = RemotingClosedError
        with self.write_lock:
            if self.dead is not None:
                raise RemotingClosedError(self.dead, self.address)
            try:
                sent = self.sock.send(frame)
                failure = None
                if sent < len(frame) and not self._write_rest(frame, sent, deadline_ns):
                    failure = "timed out writing a request, the stream cut inside a frame"
                    error_kind = RemotingTimeoutError
            except OSError as error:
                failure = f"send failed: {error.strerror or error}"
        if failure is not None:
            self.fail(failure)
            raise error_kind(failure, self.address)
        self.transport._frame_count += frame_count
        self.transport._write_count += 1

    def _write_rest(self, frame: bytes, sent: int, deadline_ns: int) -> bool:
        """Write what the first send() left; False when the deadline came first."""
        view = memoryview(frame)
        while sent < len(view):
            if time.monotonic_ns() >= deadline_ns:
                return False
            if not self.write_poll.poll(_remaining_ms(deadline_ns)):
                continue
            try:
                sent += self.sock.send(view[sent:])
            except BlockingIOError:
                continue
        return True

    # -- the reader role --------------------------------------------------------------------------

    def _wait_or_take(self, call: _Call) -> bool:
        """Wait until `call` is done (False), the role is free (taken: True), or the deadline
        or a failure (False)."""
        with self.cond:
            self.waiting_sync += 1
            try:
                while not call.done:
                    if self.dead is not None:
                        return False
                    if not self.reading:
                        self.reading = True
                        self.reader_ident = threading.get_ident()
                        return True
                    remaining_s = (call.deadline_ns - time.monotonic_ns()) / 1e9
                    if remaining_s <= 0:
                        return False
                    self.cond.wait(remaining_s)
                return False
            finally:
                self.waiting_sync -= 1

    def _release_role(self) -> None:
        with self.lock:
            self.reading = False
            self.reader_ident = 0
            if self.waiting_sync:
                self.cond.notify_all()
            elif self.pending or self.dead is not None:
                self.wake.set()

    def _read_once(self, timeout_ms: int) -> None:
        """One poll of up to `timeout_ms`, then one read and every command it completes.
        Called by the role's holder only."""
        if self.dead is not None:
            return
        if not self.read_poll.poll(timeout_ms):
            return
        try:
            count = self.sock.recv_into(self.buffer)
        except BlockingIOError:
            return
        except OSError as error:
            self.fail(f"receive failed: {error.strerror or error}")
            return
        if count == 0:
            self.fail("the peer closed the connection")
            return
        connection = self.connection
        connection.receive_data(self.view[:count])
        while True:
            try:
                command = connection.next_command()
            except RemoteProtocolError as error:
                self.fail(f"the peer broke the protocol: {error}")
                return
            if command is NEED_DATA:
                return
            if command is CLOSED:
                self.fail("the peer closed the connection")
                return
            if command.flag & FLAG_RESPONSE:
                call = self.pending.pop(command.opaque, None)
                if call is None:
                    self.transport._late_count += 1
                    continue
                self._finish(call, command, None)
            else:
                self.transport._on_request(command)

    def _finish(
        self, call: _Call, response: RemotingCommand | None, error: ClientError | None
    ) -> None:
        """Complete `call`: wake its sync waiter, or run its callback (rule 5)."""
        call.response = response
        call.error = error
        call.done = True
        callback = call.callback
        if callback is None:
            if self.waiting_sync:
                with self.cond:
                    self.cond.notify_all()
            return
        try:
            callback(response, error)
        except Exception:  # a bug in a callback must not stop the reading thread
            log.exception("a response callback of %s failed", self.address)

    # -- failure and the channel's thread ---------------------------------------------------------

    def fail(self, reason: str) -> None:
        """Rule 6: fail every outstanding call, shut the socket down, have the thread close it.
        Sync calls are failed under the lock, callbacks after it (each gets its own error)."""
        with self.lock:
            if self.dead is not None:
                return
            self.dead = reason
            calls = list(self.pending.values())
            self.pending.clear()
            for call in calls:
                if call.callback is None:
                    call.error = RemotingClosedError(reason, self.address)
                    call.done = True
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.wake.set()
        with self.queue_cond:
            self.queue_cond.notify()
        self.transport._failure_count += 1
        for call in calls:
            if call.callback is not None:
                self._finish(call, None, RemotingClosedError(reason, self.address))

    def failed(self) -> bool:
        """True once the channel failed (a method, so that loops read the field afresh)."""
        return self.dead is not None

    def _run(self) -> None:
        """Rule 3; then, once the channel failed, close the socket (rule 7)."""
        while not self.failed():
            self.wake.wait(IDLE_CHECK_INTERVAL_S)
            self.wake.clear()
            if self.failed():
                break
            self._expire()
            with self.lock:
                if self.reading or self.dead is not None:
                    continue
                self.reading = True
                self.reader_ident = threading.get_ident()
            try:
                if not self.pending:
                    self._read_once(0)  # idle: anything the broker sent, or its close
                while self.pending and self.dead is None:
                    self._read_once(int(IDLE_CHECK_INTERVAL_S * 1000))
                    self._expire()
            finally:
                self._release_role()
        self._close_socket()

    def _expire(self) -> None:
        """Fail the callback calls whose deadline passed (sync callers time themselves out)."""
        now_ns = time.monotonic_ns()
        with self.lock:
            expired = [
                call
                for call in self.pending.values()
                if call.callback is not None and call.deadline_ns <= now_ns
            ]
            for call in expired:
                del self.pending[call.opaque]
        for call in expired:
            self.transport._timeout_count += 1
            self._finish(call, None, RemotingTimeoutError("no response in time", self.address))

    def _close_socket(self) -> None:
        with self.cond:
            while self.reading:
                self.cond.wait(IDLE_CHECK_INTERVAL_S)
        with self.write_lock:
            self.sock.close()

    # -- broker requests --------------------------------------------------------------------------

    def respond(self, frame: bytes) -> None:
        with contextlib.suppress(ClientError):  # the broker gone: nothing to answer
            self.write(frame, time.monotonic_ns() + self.transport.timeout_ms * 1_000_000)


class Transport:
    """Remoting calls to one `ip:port` over one multiplexed connection (module docstring)."""

    def __init__(
        self,
        address: str,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        *,
        request_handler: RequestHandler | None = None,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        credentials: SessionCredentials | None = None,
    ) -> None:
        """With `credentials`, every request is signed (plain ACL, docs/acl.md); answers to
        the broker's requests are not, as in Java."""
        assert timeout_ms > 0
        self.credentials: Final = credentials
        self._address = address.strip()
        self._host, self._port = parse_address(self._address)
        self.timeout_ms: Final = timeout_ms
        self.frame_size_bytes_max: Final = frame_size_bytes_max
        self.request_handler = request_handler
        self._channel: _Channel | None = None
        self._connect_lock = threading.Lock()
        self._closed = False
        self._opaques = itertools.count()
        self._connect_count = 0
        self._failure_count = 0
        self._frame_count = 0
        self._write_count = 0
        self._timeout_count = 0
        self._late_count = 0
        self._request_count = 0

    @property
    def address(self) -> str:
        return self._address

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Transport({self._address!r})"

    # -- calls ------------------------------------------------------------------------------------

    def invoke(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> RemotingCommand:
        """Send a request and wait for its response; `timeout_ms` covers connect, write and wait.

        Raises RemotingConnectError, RemotingTimeoutError, RemotingClosedError, or
        ClientStateError when called from a callback of this transport's connection.
        """
        deadline_ns = time.monotonic_ns() + (timeout_ms or self.timeout_ms) * 1_000_000
        channel = self._channel_for(deadline_ns)
        opaque = next(self._opaques) & _OPAQUE_MASK
        frame = self._encode(make_request(code, opaque, self._signed(ext, body), body=body))
        return channel.call_sync(_Call(opaque, deadline_ns, None), frame)

    def invoke_callback(
        self,
        code: int,
        ext: dict[str, str] | None,
        body: bytes,
        callback: ResponseCallback,
        timeout_ms: int | None = None,
    ) -> None:
        """Send a request; `callback(response, None)` or `callback(None, error)` runs once, in the
        reading thread (rule 5), in the writer thread when the write fails (rule 8), or in this
        thread when the connect fails."""
        deadline_ns = time.monotonic_ns() + (timeout_ms or self.timeout_ms) * 1_000_000
        try:
            channel = self._channel_for(deadline_ns)
        except ClientError as error:
            callback(None, error)
            return
        opaque = next(self._opaques) & _OPAQUE_MASK
        frame = self._encode(make_request(code, opaque, self._signed(ext, body), body=body))
        channel.call_callback(_Call(opaque, deadline_ns, callback), frame)

    def invoke_async(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> Future[RemotingCommand]:
        """Send a request; the Future gets its response or its ClientError. The Future is running
        from the start, so it cannot be cancelled (the request is on its way)."""
        future: Future[RemotingCommand] = Future()
        future.set_running_or_notify_cancel()

        def done(response: RemotingCommand | None, error: ClientError | None) -> None:
            with contextlib.suppress(InvalidStateError):
                if error is not None:
                    future.set_exception(error)
                else:
                    assert response is not None
                    future.set_result(response)

        self.invoke_callback(code, ext, body, done, timeout_ms)
        return future

    def invoke_oneway(
        self,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout_ms: int | None = None,
    ) -> None:
        """Send a request flagged ONEWAY; return once the socket took it. Nothing is awaited."""
        deadline_ns = time.monotonic_ns() + (timeout_ms or self.timeout_ms) * 1_000_000
        channel = self._channel_for(deadline_ns)
        opaque = next(self._opaques) & _OPAQUE_MASK
        channel.write(
            self._encode(
                make_request(code, opaque, self._signed(ext, body), body=body, oneway=True)
            ),
            deadline_ns,
        )

    def respond(
        self,
        request: RemotingCommand,
        code: int,
        ext: dict[str, str] | None = None,
        *,
        remark: str | None = None,
        body: bytes = b"",
    ) -> None:
        """Answer a broker request on the connection it came on; nothing when that is gone, and
        nothing for a oneway request (rule 4)."""
        if request.flag & FLAG_ONEWAY:
            return
        channel = self._channel
        if channel is None or channel.dead is not None:
            return
        response = request.make_response(code, ext or {}, remark=remark, body=body)
        channel.respond(self._encode(response))

    def _signed(self, ext: dict[str, str] | None, body: bytes) -> dict[str, str] | None:
        """The request's extFields, signed when this transport has credentials."""
        if self.credentials is None:
            return ext
        return sign_request(self.credentials, ext, body)

    def _encode(self, command: RemotingCommand) -> bytes:
        try:
            return encode_command(command, self.frame_size_bytes_max)
        except LocalProtocolError as error:
            # Only a body over the frame limit gets here from outside: the caller's to fix.
            raise ClientError(f"{self._address}: cannot encode the request: {error}") from None

    # -- connections ------------------------------------------------------------------------------

    def _channel_for(self, deadline_ns: int) -> _Channel:
        """The live channel, or a new one (rule 6); RemotingConnectError when that fails."""
        channel = self._channel
        if channel is not None and channel.dead is None:
            return channel
        with self._connect_lock:
            if self._closed:
                raise RemotingClosedError("the transport is closed", self._address)
            channel = self._channel
            if channel is not None and channel.dead is None:
                return channel
            remaining_s = (deadline_ns - time.monotonic_ns()) / 1e9
            if remaining_s <= 0:
                raise RemotingTimeoutError("no time left to connect", self._address)
            try:
                sock = socket.create_connection((self._host, self._port), timeout=remaining_s)
            except TimeoutError:
                raise RemotingConnectError("connect timed out", self._address) from None
            except OSError as error:
                raise RemotingConnectError(
                    f"cannot connect: {error.strerror or error}", self._address
                ) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self._connect_count += 1
            channel = _Channel(self, sock, self._connect_count)
            self._channel = channel
            channel.thread.start()
            return channel

    def _on_request(self, request: RemotingCommand) -> None:
        self._request_count += 1
        handler = self.request_handler
        if handler is not None:
            try:
                handler(self, request)
            except Exception:  # a bug in the handler must not stop the reading thread
                log.exception("the request handler of %s failed", self._address)
            return
        self.respond(
            request,
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            remark=f"mqbox client: request code {request.code} not supported",
        )

    @property
    def connected(self) -> bool:
        channel = self._channel
        return channel is not None and channel.dead is None

    def close(self) -> None:
        """Fail every outstanding call, close the connection, join its thread (bounded); later
        calls raise RemotingClosedError."""
        with self._connect_lock:
            self._closed = True
            channel = self._channel
        if channel is None:
            return
        channel.fail("the client closed the connection")
        if channel.thread is not threading.current_thread() and channel.thread.is_alive():
            channel.thread.join(CLOSE_JOIN_TIMEOUT_S)

    def statistics(self) -> TransportStatistics:
        channel = self._channel
        return TransportStatistics(
            address=self._address,
            connected=channel is not None and channel.dead is None,
            connects=self._connect_count,
            channel_failures=self._failure_count,
            frames_written=self._frame_count,
            writes=self._write_count,
            outstanding=len(channel.pending) if channel is not None else 0,
            timeouts=self._timeout_count,
            late_responses=self._late_count,
            broker_requests=self._request_count,
        )

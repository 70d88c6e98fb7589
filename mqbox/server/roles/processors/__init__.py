"""Business processors: what every processor role shares. send.py, pull.py and admin.py hold the
business logic; this module holds the loop they run in.

Owns: `Request` (one decoded request and where it came from), `Processor` (the base class of a
processor role: drains its rings from the workers and from anyone else, decodes each COMMAND
parcel into a RemotingCommand with protocol.decode_command, writes REPLY parcels to
codec.(conn % C), forwards the workers' CLOSE_CONNECTION, answers their REQUEST_FAILED), and the
rule that a reply never exceeds the frame size limit. Never: a socket, a frame prefix (the codec
adds it), or routing (the worker chose this processor).

How a processor plugs in (send.py, pull.py and admin/ alike): each handler is a method marked
with the request codes it serves, its docstring beside it; `handle` finds it by code in
`self.handlers`, the table the marks make. routing.py says which pool a code goes to, and a pool's
handlers must serve exactly the codes routed to it (tests/unit/server/test_routing.py).

    class SendProcessor(Processor):
        kind = RoleKind.SEND

        @handles(RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2)
        def _send(self, request: Request) -> RemotingCommand | None:
            # its docstring here: what the code answers
            header = SendMessageRequestHeader.from_command(request.command)  # may raise
            ...                                  # RemoteProtocolError: answered with its code
            return request.make_response(0, ext)    # now; or None, and self.reply() later

    def main(ctx: RoleContext) -> NoReturn:
        run_processor(ctx, SendProcessor)

- `handle` is called once per request, in ring order. A handler may answer at once (return the
  response, or call `reply()`), or keep the Request and answer later (a held PULL, a SEND
  waiting for the store writer's ack), from `on_parcel` (parcels from rings that are not a
  worker's: the store writer's acks, the dispatcher's wake-ups) or from `on_tick`. Every
  request gets exactly one reply, except a client's response to a broker request (flag RESPONSE)
  and a request with flag ONEWAY, which get none: `reply()` drops those. The worker tracks each
  request until the codec saw its reply, and answers SYSTEM_ERROR for it if this process dies
  first.
- `reply_with_runs()` answers with a body the reactor sends from the commit log with
  os.sendfile: `runs` are (segment_start, file_offset, size) of the store's read plan, in order.
- A reply too big for the ring to the codec travels as spill files; when the instance's spill
  files fill mqboxSpillBytesMax (transport.py, "Spill budget"), `reply()` answers SYSTEM_BUSY (2)
  with a remark instead, which clients retry.
- The request boundary (`guarded`, around `handle` and around the later steps of a kept request:
  a woken pull, a send's APPEND_ACK): RemoteProtocolError (a typed header that does not parse)
  is answered with its response_code and message, any other MqboxError with SYSTEM_ERROR, and
  any other Exception, which is a bug that a request reached (a failed assert included), with
  SYSTEM_ERROR and a remark naming it; that one is counted and logged with its traceback
  (resources.FailureLog, at most a few a minute), and the process keeps serving. Why catch asserts
  here, against docs/style.md section 3's rule that a bug kills its process: a processor's state is
  its own request tables and read-only store views, so what dying would protect is little, and a
  request that reaches the bug would be replayed to every restarted process until the broker
  stops (issue 9). The commit log's writer catches nothing (store_writer.py). BaseException
  (SystemExit of an orderly stop, KeyboardInterrupt) passes. A parcel that kills the process
  anyway is delivered once more and then quarantined (runtime.py, supervisor.py).
- `next_deadline_ns()` tells the loop when `on_tick` must run next (held pulls time out); a
  processor whose `tick_interval_ns` is set (admin: once a second, for its client, lock and
  offset timers) also gets it that often, and one without (send, pull) sleeps until a parcel
  or its deadline: an idle broker's send and pull processors do not wake (issue 15). Every
  processor looks at the runtime keys (`_refresh_broker_config`) at most once a second, at the
  start of a turn, before the requests that woke it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, NoReturn, TypeVar

from mqbox import resources
from mqbox.config import BrokerConfig
from mqbox.errors import MqboxError
from mqbox.ipc.ring import Ring
from mqbox.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    VERSION_MQBOX,
    LanguageCode,
    ResponseCode,
    SerializeType,
)
from mqbox.protocol.command import (
    RemotingCommand,
    decode_command,
    encode_header,
    encode_response_header,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import FRAME_PREFIX_SIZE_BYTES, FRAME_SIZE_BYTES_MAX_DEFAULT
from mqbox.server import parcels, runtime, transport
from mqbox.server.parcels import Buffer, ConnectionEvent, Run
from mqbox.server.runtime import RoleContext
from mqbox.server.runtime_config import RuntimeConfigWatcher
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillBudget, SpillWriter

TICK_INTERVAL_NS: Final = 1_000_000_000
_COMMAND_HEAD: Final = parcels.COMMAND_HEAD_STRUCT
_SERIALIZE_TYPES: Final = (SerializeType.JSON, SerializeType.ROCKETMQ)
assert all(serialize_type.value == index for index, serialize_type in enumerate(_SERIALIZE_TYPES))
STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024
BACKED_UP_RETRY_MS: Final = 1

log = logging.getLogger(__name__)

Handler = Callable[["Request"], RemotingCommand | None]
_HandlerMethod = TypeVar("_HandlerMethod", bound=Callable[..., RemotingCommand | None])
_REQUEST_CODES_ATTRIBUTE: Final = "mqbox_request_codes"


def handles(*codes: int) -> Callable[[_HandlerMethod], _HandlerMethod]:
    """Mark a Processor method as the handler of `codes`: called with the Request, it returns the
    response, or None when it replied itself or keeps the request to answer later."""
    assert codes

    def mark(method: _HandlerMethod) -> _HandlerMethod:
        setattr(method, _REQUEST_CODES_ATTRIBUTE, tuple(int(code) for code in codes))
        return method

    return mark


class Request:
    """One request as a processor receives it.

    The fixed fields come from the COMMAND parcel's head. `command` decodes the header (with
    protocol.decode_command) on first use, so a handler that needs neither extFields nor the
    body (MQBOX_NOOP, a heartbeat acknowledgement) pays for neither; `make_response` builds the
    answer from the head alone. The header and body bytes are copied out of the ring, so a
    handler may keep the Request and answer later.
    """

    __slots__ = (
        "_body",
        "_command",
        "_header_size",
        "_payload",
        "code",
        "conn_id",
        "flag",
        "opaque",
        "peer_ipv4",
        "peer_port",
        "received_ns",
        "serialize_type",
    )

    def __init__(
        self,
        conn_id: int,
        opaque: int,
        code: int,
        flag: int,
        serialize_type: int,
        peer_ipv4: bytes,
        peer_port: int,
        header_size: int,
        payload: bytes,
        received_ns: int,
        body: bytes | None = None,
    ) -> None:
        """`payload` is the header, then the body; or the header alone when `body` is given
        (the worker's path: the body is copied out of the ring once, not sliced off again)."""
        self.conn_id = conn_id
        self.opaque = opaque
        self.code = code
        self.flag = flag
        self.serialize_type = serialize_type
        self.peer_ipv4 = peer_ipv4  # 4 octets, network order (0.0.0.0 if not IPv4): born host
        self.peer_port = peer_port
        self.received_ns = received_ns  # time.monotonic_ns() when the processor took it
        self._header_size = header_size
        self._payload = payload  # header, then body (unless _body holds it)
        self._body = body
        self._command: RemotingCommand | None = None

    @classmethod
    def of(cls, command: RemotingCommand, conn_id: int = 0) -> Request:
        """A Request around a command built in memory (processor unit tests)."""
        request = cls(
            conn_id,
            command.opaque,
            command.code,
            command.flag,
            int(command.serialize_type),
            b"\0\0\0\0",
            0,
            0,
            b"",
            0,
        )
        request._command = command
        return request

    @property
    def command(self) -> RemotingCommand:
        """The whole decoded command. The codec decoded these very bytes already, so this
        cannot fail; the asserts pair the codec's head with the header (docs/style.md section 3)."""
        command = self._command
        if command is None:
            with memoryview(self._payload) as view:
                command = decode_command(
                    self.serialize_type,
                    view[: self._header_size],
                    self._payload[self._header_size :] if self._body is None else self._body,
                )
            assert command.opaque == self.opaque
            assert command.code == self.code
            assert command.flag == self.flag
            self._command = command
            self._payload = b""
            self._body = None
        return command

    def make_response(
        self,
        code: int,
        ext_fields: dict[str, str] | None = None,
        *,
        remark: str | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request, as RemotingCommand.make_response makes it, without
        decoding the request."""
        assert self.flag & FLAG_RESPONSE == 0
        return RemotingCommand(
            code,
            LanguageCode.PYTHON,
            VERSION_MQBOX,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            ext_fields,
            body,
            _SERIALIZE_TYPES[self.serialize_type],
        )

    @property
    def wants_reply(self) -> bool:
        """False for a client's response to a broker request and for a ONEWAY request."""
        return self.flag & (FLAG_RESPONSE | FLAG_ONEWAY) == 0


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessorStatistics:
    requests: int
    replies: int
    replies_dropped: int  # to oneway requests and client responses
    protocol_errors: int  # requests answered with a RemoteProtocolError's code
    operating_errors: int  # requests answered SYSTEM_ERROR for an MqboxError
    unexpected_errors: int  # requests answered SYSTEM_ERROR for a bug they reached (logged)
    requests_failed: int  # REQUEST_FAILED answered for the worker
    stale_requests_dropped: int  # routed to an earlier process of this role: answered already
    closes_forwarded: int
    replies_too_large: int
    spill_count: int
    sleep_count: int
    turn_count: int


class Processor:
    """The base of every processor role; subclasses override `handle` and, if they need them,
    the other `on_*` hooks. `run_forever()` is the role; tests drive `run_once()`."""

    kind: ClassVar[RoleKind]
    # How often on_tick runs besides next_deadline_ns(); None: only at those deadlines.
    tick_interval_ns: ClassVar[int | None] = None
    handler_names: ClassVar[dict[int, str]] = {}  # code -> method, made by __init_subclass__

    def __init__(
        self,
        ctx: RoleContext,
        *,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        spin_ns_max: int = transport.REQUEST_SPIN_NS_MAX,
        wakeup_fd: int | None = None,
    ) -> None:
        assert ctx.role.kind is self.kind, f"{type(self).__name__} cannot run {ctx.role.role_id}"
        self.ctx = ctx
        self.role_id = ctx.role.role_id
        self.frame_size_bytes_max = frame_size_bytes_max
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        codec_ids = [role.role_id for role in topology.roles_of(RoleKind.CODEC)]
        assert codec_ids, "a broker has at least one codec"
        self.codec_outboxes = [
            Outbox(Ring.attach(topology.ring(self.role_id, codec_id).name), self.spill_writer)
            for codec_id in codec_ids
        ]
        from_workers, from_others = topology.rings_to_split(self.role_id, RoleKind.WORKER)
        self.worker_inboxes = transport.attach_inboxes(from_workers)
        for inbox in self.worker_inboxes:
            inbox.on_quarantined = self._on_quarantined
        self.other_inboxes = transport.attach_inboxes(from_others)
        self.spill_budget = SpillBudget(ctx.instance, ctx.broker.limits.spill_size_bytes_max)
        self.inline_size_bytes_max = min(
            outbox.payload_size_bytes_max for outbox in self.codec_outboxes
        )
        # Rings a subclass writes besides the codecs' (send: its store writer's): flushed with
        # the replies every turn, and back-pressure stops the worker rings when one backs up.
        self.extra_outboxes: list[Outbox] = []
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, [*self.worker_inboxes, *self.other_inboxes], spin_ns_max)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self._tick_due_ns = time.monotonic_ns() + TICK_INTERVAL_NS
        self._config_due_ns = self._tick_due_ns
        self._runtime_config = RuntimeConfigWatcher(ctx.home, ctx.broker)
        # Set by _flush: an outbox toward the codecs (replies) or another ring (extra) holds more
        # than STAGED_SIZE_BYTES_HIGH; the next turn then leaves the rings that feed it alone.
        self._replies_backed_up = False
        self._extra_backed_up = False
        self._requests = 0
        self._stale_requests_dropped = 0
        self._replies = 0
        self._replies_dropped = 0
        self._protocol_errors = 0
        self._operating_errors = 0
        self._unexpected_errors = 0
        self.failures = resources.FailureLog(log)
        self.handlers: dict[int, Handler] = {
            code: getattr(self, name) for code, name in self.handler_names.items()
        }
        self._requests_failed = 0
        self._closes_forwarded = 0
        self._replies_too_large = 0
        self._turn_count = 0

    # -- hooks for subclasses ---------------------------------------------------------------------

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Collect the methods marked with `handles` (the subclass's and its bases') into
        `handler_names`, request code -> method name; a code may have one handler only."""
        super().__init_subclass__(**kwargs)
        names: dict[int, str] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                for code in getattr(value, _REQUEST_CODES_ATTRIBUTE, ()):
                    assert names.get(code, name) == name, f"code {code}: two handlers"
                    names[code] = name
        cls.handler_names = names

    def handle(self, request: Request) -> None:
        """Serve one request by its code's handler (`handles`); a code without one is
        `unsupported`."""
        handler = self.handlers.get(request.code)
        if handler is None:
            self.unsupported(request)
            return
        response = handler(request)
        if response is not None:
            self.reply(request, response)

    def unsupported(self, request: Request) -> None:
        """Answer REQUEST_CODE_NOT_SUPPORTED, as the Java broker does for a code without a
        processor."""
        self.reply(
            request,
            request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                {},
                remark=f" request type {request.code} not supported",
            ),
        )

    def on_connection_opened(self, event: ConnectionEvent) -> None:
        """A client connected (conn id, peer, time)."""

    def on_connection_closed(self, event: ConnectionEvent) -> None:
        """A client's connection is gone: drop what is held for it (replies to it are dropped
        by the reactor anyway)."""

    def on_parcel(self, producer: str, parcel_type: int, payload: memoryview) -> None:
        """A parcel from a ring that is not a worker's (store writer, dispatcher). `payload` is
        valid only during the call."""
        raise AssertionError(f"{self.role_id} got parcel type {parcel_type} from {producer}")

    def on_broker_config(self, broker: BrokerConfig) -> None:
        """The runtime keys changed (server/runtime_config.py): `self.ctx.broker` is already
        the new configuration; a subclass that copied keys out of it copies them again."""

    def _refresh_broker_config(self) -> None:
        broker = self._runtime_config.refresh()
        if broker is not None and broker != self.ctx.broker:
            self.ctx = dataclasses.replace(self.ctx, broker=broker)
            self.on_broker_config(broker)

    def on_tick(self, now_ns: int) -> None:
        """Timers: runs every `tick_interval_ns` (if set) and when next_deadline_ns() is due."""

    def next_deadline_ns(self) -> int | None:
        """When on_tick must run next (monotonic ns), or None: nothing but the periodic tick."""
        return None

    def awaiting_answers(self) -> bool:
        """True while parcels this processor sent will be answered on its rings (the send
        processor's appends): its Sleeper then spins on the budget for answers."""
        return False

    # -- for subclasses ---------------------------------------------------------------------------

    def reply(self, request: Request, response: RemotingCommand) -> None:
        """Send `response` (made with request.make_response) to the client."""
        if not request.wants_reply:
            self._replies_dropped += 1
            return
        header = encode_header(response)
        body = response.body
        if FRAME_PREFIX_SIZE_BYTES + len(header) + len(body) > self.frame_size_bytes_max:
            self._reply_too_large(request, len(header) + len(body))
            return
        parcel_size_bytes = parcels.REPLY_HEAD_SIZE_BYTES + len(header) + len(body)
        if parcel_size_bytes > self.inline_size_bytes_max and not (
            self.spill_budget.has_room_nowait(parcel_size_bytes)
        ):
            self._reply_refused(
                request,
                ResponseCode.SYSTEM_BUSY,
                f"mqbox: [OVERLOAD] the broker's spill files are full (mqboxSpillBytesMax="
                f"{self.spill_budget.size_bytes_max}) for a response of {parcel_size_bytes} "
                f"bytes; try again later",
            )
            return
        self._append_reply(request.conn_id, response, header, b"", len(body), body)

    def reply_with_runs(
        self,
        request: Request,
        response: RemotingCommand,
        runs: Sequence[Run | tuple[int, int, int]],
    ) -> None:
        """Send `response` with a body of the commit-log `runs` (segment_start, file_offset,
        size), which the reactor sends with os.sendfile. response.body must be empty."""
        assert not response.body
        assert runs, "a read plan without runs is an empty body: use reply()"
        if not request.wants_reply:
            self._replies_dropped += 1
            return
        packed = parcels.pack_runs(runs)
        body_size = sum(run.size if isinstance(run, Run) else run[2] for run in runs)
        header = encode_header(response)
        if FRAME_PREFIX_SIZE_BYTES + len(header) + body_size > self.frame_size_bytes_max:
            self._reply_too_large(request, len(header) + body_size)
            return
        self._append_reply(request.conn_id, response, header, packed, body_size, b"")

    def close_connection(self, conn_id: int, reason: int = parcels.CLOSE_REASON_REQUESTED) -> None:
        """Ask the reactor to close `conn_id` once its queued output is written."""
        outbox = self.codec_outboxes[conn_id % len(self.codec_outboxes)]
        outbox.append(parcels.CLOSE_CONNECTION, parcels.pack_close_connection(conn_id, reason))

    def reply_fields(
        self,
        request: Request,
        code: int,
        ext_fields: dict[str, str],
        *,
        remark: str | None = None,
        body: bytes = b"",
    ) -> None:
        """`reply(request, request.make_response(code, ext_fields, remark=..., body=...))`
        without building the response command: the send path answers every message this way."""
        if not request.wants_reply:
            self._replies_dropped += 1
            return
        header = encode_response_header(
            request.opaque, request.serialize_type, code, ext_fields, remark
        )
        if FRAME_PREFIX_SIZE_BYTES + len(header) + len(body) > self.frame_size_bytes_max:
            self._reply_too_large(request, len(header) + len(body))
            return
        self._append_reply_header(
            request.conn_id, request.opaque, request.serialize_type, header, b"", len(body), body
        )

    def _append_reply(
        self,
        conn_id: int,
        response: RemotingCommand,
        header: bytes,
        runs: bytes,
        body_size: int,
        body: bytes,
        flags: int = 0,
    ) -> None:
        self._append_reply_header(
            conn_id, response.opaque, response.serialize_type, header, runs, body_size, body, flags
        )

    def _append_reply_header(
        self,
        conn_id: int,
        opaque: int,
        serialize_type: int,
        header: bytes,
        runs: bytes,
        body_size: int,
        body: bytes,
        flags: int = 0,
    ) -> None:
        """Stage one REPLY; `flags`: parcels.REPLY_FLAG_* (REQUEST for a broker request)."""
        run_count = len(runs) // parcels.RUN_SIZE_BYTES
        head = parcels.pack_reply_head(
            conn_id, opaque, serialize_type, flags, len(header), run_count, body_size
        )
        outbox = self.codec_outboxes[conn_id % len(self.codec_outboxes)]
        outbox.append(parcels.REPLY, head, runs, header, body)
        self._replies += 1

    def _reply_too_large(self, request: Request, size_bytes: int) -> None:
        self._replies_too_large += 1
        self._reply_refused(
            request,
            ResponseCode.SYSTEM_ERROR,
            f"mqbox: the response of {size_bytes} bytes exceeds the frame size limit",
        )

    def _reply_refused(self, request: Request, code: int, remark: str) -> None:
        """Answer `code` and `remark` instead of the response that could not go out."""
        response = request.make_response(code, {}, remark=remark)
        self._append_reply(request.conn_id, response, encode_header(response), b"", 0, b"")

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self._on_stop_requested)

    def _on_stop_requested(self) -> None:
        """What an orderly stop does before the exit: write the replies still staged."""
        self._flush()

    def run_once(self, timeout_ms: int) -> int:
        """One turn: every in-ring once, timers when due, replies out, then a wait of up to
        timeout_ms (negative: no limit) for more, which returns at once while a ring is readable
        (codec.py's run_once says why in the same turn). Returns the parcels handled."""
        self._turn_count += 1
        now_ns = time.monotonic_ns()
        if now_ns >= self._config_due_ns:
            self._config_due_ns = now_ns + TICK_INTERVAL_NS
            self._refresh_broker_config()
        work = 0
        if not self._replies_backed_up:
            for inbox in self.other_inboxes:
                if inbox.ring.readable():
                    work += self._drain_other(inbox)
            if not self._extra_backed_up:
                for inbox in self.worker_inboxes:
                    if inbox.ring.readable():
                        work += self._drain_worker(inbox)
        now_ns = time.monotonic_ns()
        deadline_ns = self.next_deadline_ns()
        periodic = self.tick_interval_ns is not None
        if (periodic and now_ns >= self._tick_due_ns) or (
            deadline_ns is not None and now_ns >= deadline_ns
        ):
            self._tick_due_ns = now_ns + (self.tick_interval_ns or 0)
            self.on_tick(now_ns)
            deadline_ns = self.next_deadline_ns()
        all_written = self._flush()
        if periodic:
            due_ns = self._tick_due_ns
            deadline_ns = due_ns if deadline_ns is None else min(deadline_ns, due_ns)
        wait_ms = -1  # no deadline: until a parcel or a signal
        if deadline_ns is not None:
            wait_ms = max(0, -(-(deadline_ns - time.monotonic_ns()) // 1_000_000))
        if timeout_ms >= 0:
            wait_ms = timeout_ms if wait_ms < 0 else min(wait_ms, timeout_ms)
        if not all_written:
            wait_ms = BACKED_UP_RETRY_MS if wait_ms < 0 else min(wait_ms, BACKED_UP_RETRY_MS)
        for fd, _mask in self.sleeper.wait(wait_ms, awaiting=self.awaiting_answers()):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
        return work

    def _flush(self) -> bool:
        """Write what the rings take; True if nothing is left staged. Notes which outboxes are
        backed up past STAGED_SIZE_BYTES_HIGH, which stops the next turn's drains."""
        all_written = True
        replies_backed_up = False
        for outbox in self.codec_outboxes:
            if outbox.pending_count and not outbox.flush_nowait():
                all_written = False
                replies_backed_up = (
                    replies_backed_up or outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH
                )
        extra_backed_up = False
        for outbox in self.extra_outboxes:
            if outbox.pending_count and not outbox.flush_nowait():
                all_written = False
                extra_backed_up = (
                    extra_backed_up or outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH
                )
        self._replies_backed_up = replies_backed_up
        self._extra_backed_up = extra_backed_up
        return all_written

    def _drain_worker(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        now_ns = time.monotonic_ns()
        for parcel_type, buffer, offset, size in inbox.parcels(batch):
            handled += 1
            if parcel_type == parcels.COMMAND:
                self._on_command(buffer, offset, size, now_ns)
            elif parcel_type == parcels.CONNECTION_OPENED:
                self.on_connection_opened(parcels.unpack_connection_event(buffer, offset))
            elif parcel_type == parcels.CONNECTION_CLOSED:
                self.on_connection_closed(parcels.unpack_connection_event(buffer, offset))
            elif parcel_type == parcels.CLOSE_CONNECTION:
                conn_id, reason = parcels.unpack_close_connection(buffer, offset)
                self.close_connection(conn_id, reason)
                self._closes_forwarded += 1
            elif parcel_type == parcels.REQUEST_FAILED:
                self._on_request_failed(parcels.unpack_request_failed(buffer, offset, size))
            else:
                raise AssertionError(f"{self.role_id} got parcel type {parcel_type} from a worker")
        inbox.release(batch)
        return handled

    def _drain_other(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        for parcel_type, buffer, offset, size in inbox.parcels(batch):
            handled += 1
            self.on_parcel(inbox.producer, parcel_type, memoryview(buffer)[offset : offset + size])
        inbox.release(batch)
        return handled

    def _own_generation(self) -> int:
        """This process's generation in the control block (odd; the next one if the supervisor
        has not written it yet); 0 without a control block (unit tests)."""
        control = self.ctx.control
        if control is None:
            return 0
        generation = control.generation(self.role_id)
        return generation if generation % 2 == 1 else generation + 1

    def _on_command(self, buffer: Buffer, offset: int, size: int, now_ns: int) -> None:
        (conn_id, opaque, code, flag, _version, peer_ipv4, peer_port, serialize_type, _language,
         header_size, serving_generation) = _COMMAND_HEAD.unpack_from(buffer, offset)  # fmt: skip
        if serving_generation and serving_generation < self._own_generation():
            # The worker answered it SYSTEM_ERROR when the process it went to died (worker.py);
            # serving it now would store a failed send once more.
            self._stale_requests_dropped += 1
            return
        header_start = offset + parcels.COMMAND_HEAD_SIZE_BYTES
        body_start = header_start + header_size
        assert body_start <= offset + size
        request = Request(
            conn_id,
            opaque,
            code,
            flag,
            serialize_type,
            peer_ipv4,
            peer_port,
            header_size,
            bytes(memoryview(buffer)[header_start:body_start]),
            now_ns,
            bytes(memoryview(buffer)[body_start : offset + size]),
        )
        self._requests += 1
        self.guarded(request, self.handle, request)

    def guarded(
        self, request: Request, step: Callable[..., object], *arguments: Any, **keywords: Any
    ) -> None:
        """Run `step(*arguments, **keywords)`, a step of serving `request`, inside the request
        boundary (module docstring): what it raises is answered to `request`, never fatal."""
        try:
            step(*arguments, **keywords)
        except RemoteProtocolError as error:
            self._protocol_errors += 1
            self.reply(request, request.make_response(error.response_code, {}, remark=str(error)))
        except MqboxError as error:
            self._operating_errors += 1
            self.reply(
                request, request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=str(error))
            )
        except Exception as error:
            self._unexpected_errors += 1
            self.failures.record(
                f"serving request code {request.code} (conn {request.conn_id})", error
            )
            self._reply_failed(request, error)

    def _reply_failed(self, request: Request, error: Exception) -> None:
        """SYSTEM_ERROR for a request whose serving raised `error`. Encoding that answer takes
        nothing from the request but its opaque, so it cannot fail the same way."""
        remark = (
            f"mqbox: {self.role_id} failed on this request ({type(error).__name__}); "
            "the broker logged it and serves on"
        )
        self.reply(request, request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=remark))

    def _on_quarantined(self, parcel_type: int, buffer: Buffer, offset: int, size: int) -> None:
        """A parcel that stopped this role twice (transport.Inbox): SYSTEM_ERROR if a request."""
        failed = transport.quarantined_request_failed(parcel_type, buffer, offset, self.role_id)
        if failed is not None:
            self._on_request_failed(failed)

    def _on_request_failed(self, failed: parcels.RequestFailed) -> None:
        response = RemotingCommand(
            failed.response_code,
            opaque=failed.opaque,
            flag=FLAG_RESPONSE,
            remark=failed.remark,
            serialize_type=SerializeType(failed.serialize_type),
        )
        self._append_reply(failed.conn_id, response, encode_header(response), b"", 0, b"")
        self._requests_failed += 1

    def statistics(self) -> ProcessorStatistics:
        return ProcessorStatistics(
            requests=self._requests,
            replies=self._replies,
            replies_dropped=self._replies_dropped,
            protocol_errors=self._protocol_errors,
            operating_errors=self._operating_errors,
            unexpected_errors=self._unexpected_errors,
            requests_failed=self._requests_failed,
            stale_requests_dropped=self._stale_requests_dropped,
            closes_forwarded=self._closes_forwarded,
            replies_too_large=self._replies_too_large,
            spill_count=self.spill_writer.spill_count,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
        )


def run_processor(ctx: RoleContext, factory: Callable[..., Processor]) -> NoReturn:
    """A processor role's main: build it, report ready, serve until SIGTERM (runtime.py)."""
    processor = factory(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    processor.run_forever()

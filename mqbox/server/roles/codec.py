"""The codec role: frames in, commands out; processor replies in, wire bytes out.

Owns: decoding each frame's header with mqbox.protocol (decode_command) and answering a peer
that broke the protocol; the COMMAND parcels toward worker.(conn % W); framing the processors'
REPLY parcels (prefix from protocol.frame, header as the processor encoded it) into RESPONSE
parcels toward reactor.(conn >> 56); the per-connection facts a processor needs and cannot get
elsewhere (the peer's address, from CONNECTION_OPENED); and the lazy COMPLETED notices that let
the worker stop tracking answered requests. RocketMQ's NettyServerCodecThread, as a process.
Never: touches a socket, routes by request code (the worker does), or looks inside extFields or
bodies (processors do, with protocol.headers), except for the ACL below.

With `aclEnable=true` the codec also checks each request against the plain ACL (mqbox/acl,
docs/acl.md) right after decoding its header, once per request (a batch is one request): it
already holds the extFields and the body that the signature covers. A refused request never
reaches the worker: it is answered SYSTEM_ERROR with the ACL's remark (a oneway one is only
counted as unanswered), and the validator counts and logs it, rate-limited. Clients' responses
to broker requests are not checked, as Java's hook runs on requests only.

Invariants:
- A connection's COMMANDs leave in the order its FRAMEs arrived: one ring from each reactor, one
  ring to each worker, both drained and written in order.
- After a RemoteProtocolError the connection's later frames are dropped until its
  CONNECTION_CLOSED: the reactor closes it once the error response is written.
- Every REPLY becomes exactly one RESPONSE (or is dropped, counted, when its reactor index is
  unknown), and one COMPLETED entry toward the worker that routed the request.
- Every frame that nobody will answer (flag ONEWAY, or a client's RESPONSE to a broker request)
  is reported to its reactor in a NO_ANSWER parcel, at most one per connection and batch: the
  reactor counts each connection's requests in flight as frames forwarded minus answers and
  these (reactor.py, mqboxConnectionInFlightCountMax).
- No frame stops the codec. A frame whose decoding raises anything but RemoteProtocolError (a
  bug a client reached, a failed assert included) is answered SYSTEM_ERROR when its opaque can
  be read, counted and logged with its traceback (resources.FailureLog, a few a minute); the
  connection stays open, since its framing is intact. processors/__init__.py says why such a
  bug is answered rather than fatal outside the store writer.

The frame size limit is protocol.frame's default (16 MiB, Java's as well); the reactor checked
each frame's length against the same limit before forwarding it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import socket
import time
from typing import Final, NoReturn

import orjson

from mqbox import resources
from mqbox.acl.validator import AclStatistics, AclValidator, acl_file_path
from mqbox.ipc.ring import Ring
from mqbox.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType
from mqbox.protocol.command import INT32_MAX, INT32_MIN, RemotingCommand, decode_command
from mqbox.protocol.command import encode_command as encode_whole_command
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import (
    FRAME_LENGTH_SIZE_BYTES,
    FRAME_PREFIX,
    FRAME_PREFIX_SIZE_BYTES,
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    HEADER_LENGTH_MASK,
    HEADER_SIZE_BYTES_MAX,
    HEADER_WORD_SIZE_BYTES,
    SERIALIZE_TYPE_JSON,
    SERIALIZE_TYPE_ROCKETMQ,
    SERIALIZE_TYPE_SHIFT,
    check_header_word,
    encode_frame_prefix,
)
from mqbox.server import parcels, runtime, transport
from mqbox.server.parcels import Buffer
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter

STAGED_SIZE_BYTES_HIGH: Final = 8 * 1024 * 1024
BACKED_UP_RETRY_MS: Final = 1
_NO_PEER: Final = (b"\0\0\0\0", 0)
_REPLY_HEAD: Final = parcels.REPLY_HEAD_STRUCT
_RESPONSE_HEAD: Final = parcels.RESPONSE_HEAD_STRUCT
_COMMAND_HEAD: Final = parcels.COMMAND_HEAD_STRUCT
_CONN_ID: Final = parcels.CONN_ID_STRUCT
# Where the opaque sits in a ROCKETMQ binary header: after code i16, language i8, version i16.
_BINARY_OPAQUE_OFFSET: Final = 5
_FLAG_NO_ANSWER: Final = FLAG_RESPONSE | FLAG_ONEWAY  # frames nobody answers

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class CodecStatistics:
    frames_decoded: int
    protocol_errors: int
    unexpected_errors: int  # frames answered SYSTEM_ERROR for a bug they reached (logged)
    frames_dropped: int  # of connections that failed already
    replies_encoded: int
    replies_dropped: int  # for a reactor index that does not exist
    completed_notices: int
    connections_known: int
    spill_count: int
    sleep_count: int
    turn_count: int
    acl: AclStatistics | None  # None when aclEnable is false


class Codec:
    """One codec process's state. `run_forever()` is the role; tests drive `run_once()`."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
        spin_ns_max: int = transport.REQUEST_SPIN_NS_MAX,
        wakeup_fd: int | None = None,
    ) -> None:
        assert ctx.role.kind is RoleKind.CODEC
        self.role_id = ctx.role.role_id
        self.frame_size_bytes_max = frame_size_bytes_max
        topology = ctx.topology
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        worker_ids = [role.role_id for role in topology.roles_of(RoleKind.WORKER)]
        assert worker_ids, "a broker has at least one worker"
        self.worker_outboxes = [
            Outbox(Ring.attach(topology.ring(self.role_id, worker_id).name), self.spill_writer)
            for worker_id in worker_ids
        ]
        self.reactor_outboxes: dict[int, Outbox] = {
            role.index: Outbox(
                Ring.attach(topology.ring(self.role_id, role.role_id).name), self.spill_writer
            )
            for role in topology.roles_of(RoleKind.REACTOR)
        }
        from_reactors, from_others = topology.rings_to_split(self.role_id, RoleKind.REACTOR)
        self.frame_inboxes = transport.attach_inboxes(from_reactors)
        for inbox in self.frame_inboxes:
            inbox.on_quarantined = self._on_quarantined
        self.reply_inboxes = transport.attach_inboxes(from_others)
        self.sleeper = Sleeper(
            select.epoll(), [*self.reply_inboxes, *self.frame_inboxes], spin_ns_max
        )
        self.wakeup_fd = wakeup_fd  # runtime.wakeup_fileno(): readable after SIGTERM, SIGUSR1
        if wakeup_fd is not None:
            self.sleeper.epoll.register(wakeup_fd, select.EPOLLIN)
        # Set by _flush_all: an outbox on that side holds more than STAGED_SIZE_BYTES_HIGH.
        self._frames_backed_up = False
        self._replies_backed_up = False
        self.peers: dict[int, tuple[bytes, int]] = {}
        self.failed: set[int] = set()
        self._no_answer_counts: dict[int, int] = {}  # conn id -> frames of this batch
        self._completed: list[list[tuple[int, int]]] = [[] for _ in worker_ids]
        self._completed_since_ns = [0] * len(worker_ids)
        self._frames_decoded = 0
        # Requests passed on whose REPLY has not come back (a lost one keeps it one higher): while
        # any is, the Sleeper spins on its budget for answers (transport.py, "Spinning").
        self._awaiting_count = 0
        self._protocol_errors = 0
        self._unexpected_errors = 0
        self.failures = resources.FailureLog(log)
        self._frames_dropped = 0
        self._replies_encoded = 0
        self._replies_dropped = 0
        self._completed_notices = 0
        self._turn_count = 0
        self.acl: AclValidator | None = None
        if ctx.broker.acl_enable:
            # `mqbox start` refused a bad file already; one that went bad since refuses all.
            path = acl_file_path(ctx.broker.acl_file, ctx.home)
            self.acl = AclValidator(path, fail_closed=True, logger=log)

    # -- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> NoReturn:
        runtime.run_until_stopped(self.run_once, self._flush_all)

    def run_once(self, timeout_ms: int) -> int:
        """One turn: replies to the reactors, frames to the workers, then a wait of up to
        timeout_ms (negative: no limit) for more, which returns at once while a ring is readable.
        Returns the parcels handled.

        Why wait in the same turn: a turn that did work used to return and come back for an
        idle turn (every ring looked at again, every outbox again) just to decide to sleep; at
        one request in flight that was a third of the codec's Python per request."""
        self._turn_count += 1
        work = 0
        if not self._replies_backed_up:
            for inbox in self.reply_inboxes:
                if inbox.ring.readable():
                    work += self._drain_replies(inbox)
        if not self._frames_backed_up:
            for inbox in self.frame_inboxes:
                if inbox.ring.readable():
                    work += self._drain_frames(inbox)
        completed_wait_ms = self._flush_completed(time.monotonic_ns())
        all_written = self._flush_all()
        wait_ms = timeout_ms
        if not all_written:
            wait_ms = BACKED_UP_RETRY_MS if wait_ms < 0 else min(wait_ms, BACKED_UP_RETRY_MS)
        if completed_wait_ms >= 0:
            wait_ms = completed_wait_ms if wait_ms < 0 else min(wait_ms, completed_wait_ms)
        for fd, _mask in self.sleeper.wait(wait_ms, awaiting=self._awaiting_count > 0):
            if fd == self.wakeup_fd:
                runtime.clear_wakeup_nowait()
        return work

    def _flush_all(self) -> bool:
        """Write every staged parcel the rings take; True if nothing is left staged. Also notes
        which side is backed up past the high-water mark, which the next turn does not read.
        Responses first: they are what a client waits for; a worker's COMPLETED notices can
        wait a few microseconds."""
        all_written = True
        replies_backed_up = False
        for outbox in self.reactor_outboxes.values():
            if outbox.pending_count and not outbox.flush_nowait():
                all_written = False
                replies_backed_up = replies_backed_up or self._backed_up(outbox)
        frames_backed_up = False
        for outbox in self.worker_outboxes:
            if outbox.pending_count and not outbox.flush_nowait():
                all_written = False
                frames_backed_up = frames_backed_up or self._backed_up(outbox)
        self._frames_backed_up = frames_backed_up
        self._replies_backed_up = replies_backed_up
        return all_written

    @staticmethod
    def _backed_up(outbox: Outbox) -> bool:
        return outbox.pending_size_bytes > STAGED_SIZE_BYTES_HIGH

    # -- requests ---------------------------------------------------------------------------------

    def _drain_frames(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        for parcel_type, buffer, offset, size in inbox.parcels(batch):
            handled += 1
            if parcel_type == parcels.FRAME:
                self._on_frame(buffer, offset, size)
            elif parcel_type == parcels.CONNECTION_OPENED:
                self._on_opened(buffer, offset, size)
            elif parcel_type == parcels.CONNECTION_CLOSED:
                conn_id = parcels.unpack_conn_id(buffer, offset)
                self.peers.pop(conn_id, None)
                self.failed.discard(conn_id)
                outbox = self.worker_outboxes[conn_id % len(self.worker_outboxes)]
                outbox.append(parcels.CONNECTION_CLOSED, memoryview(buffer)[offset : offset + size])
            else:
                raise AssertionError(f"codec got parcel type {parcel_type} from a reactor")
        inbox.release(batch)
        if self._no_answer_counts:
            self._send_no_answers()
        return handled

    def _send_no_answers(self) -> None:
        """One NO_ANSWER per connection for the frames of this batch nobody will answer."""
        for conn_id, count in self._no_answer_counts.items():
            reactor = self.reactor_outboxes.get(conn_id >> parcels.CONN_ID_REACTOR_SHIFT)
            if reactor is not None:
                reactor.append(parcels.NO_ANSWER, parcels.pack_no_answer(conn_id, count))
        self._no_answer_counts.clear()

    def _on_opened(self, buffer: Buffer, offset: int, size: int) -> None:
        event = parcels.unpack_connection_event(buffer, offset)
        self.peers[event.conn_id] = (_ipv4_octets(event.peer_host), event.peer_port)
        self.failed.discard(event.conn_id)
        outbox = self.worker_outboxes[event.conn_id % len(self.worker_outboxes)]
        outbox.append(parcels.CONNECTION_OPENED, memoryview(buffer)[offset : offset + size])

    def _on_frame(self, buffer: Buffer, offset: int, size: int) -> None:
        (conn_id,) = _CONN_ID.unpack_from(buffer, offset)
        if conn_id in self.failed:
            self._frames_dropped += 1
            return
        frame_start = offset + parcels.CONN_ID_SIZE_BYTES
        frame_end = offset + size
        # The reactor's check_frame_length admits frame_length >= 4: the header word is there.
        assert frame_end - frame_start >= FRAME_PREFIX_SIZE_BYTES
        view = memoryview(buffer)
        frame_length, header_word = FRAME_PREFIX.unpack_from(buffer, frame_start)
        assert frame_length == frame_end - frame_start - 4
        header_start = frame_start + FRAME_PREFIX_SIZE_BYTES
        # frame.check_header_word's two rules, inline for the usual case; it names the error.
        serialize_type = header_word >> SERIALIZE_TYPE_SHIFT
        header_size = header_word & HEADER_LENGTH_MASK
        header = view[header_start : header_start + header_size]
        try:
            if serialize_type > SERIALIZE_TYPE_ROCKETMQ or header_size > frame_length - 4:
                serialize_type = SERIALIZE_TYPE_JSON
                check_header_word(frame_length, header_word)
                raise AssertionError("unreachable")
            command = decode_command(serialize_type, header, b"")
            peer_ipv4, peer_port = self.peers.get(conn_id, _NO_PEER)
            head = _COMMAND_HEAD.pack(
                conn_id,
                command.opaque,
                command.code,
                command.flag,
                command.version,
                peer_ipv4,
                peer_port,
                serialize_type,
                int(command.language),
                header_size,
                0,  # the serving generation: the worker stamps it
            )
            if self.acl is not None and not command.flag & FLAG_RESPONSE:
                body = view[header_start + header_size : frame_end]
                remark = self.acl.check(
                    command.code, command.ext_fields, body, socket.inet_ntoa(peer_ipv4)
                )
                if remark is not None:
                    self._refuse(conn_id, command, serialize_type, remark)
                    return
        except RemoteProtocolError as error:
            self._on_protocol_error(conn_id, serialize_type, header, error)
            return
        except Exception as error:
            self._on_unexpected_error(conn_id, serialize_type, header, error)
            return
        self._frames_decoded += 1
        outbox = self.worker_outboxes[conn_id % len(self.worker_outboxes)]
        outbox.append(parcels.COMMAND, head, view[header_start:frame_end])
        if command.flag & _FLAG_NO_ANSWER:
            self._no_answer_counts[conn_id] = self._no_answer_counts.get(conn_id, 0) + 1
        else:
            self._awaiting_count += 1

    def _refuse(
        self, conn_id: int, command: RemotingCommand, serialize_type: int, remark: str
    ) -> None:
        """Answer a request the ACL refused, without passing it on (a oneway one: no answer,
        but the reactor learns that none will come)."""
        if command.flag & FLAG_ONEWAY:
            self._no_answer_counts[conn_id] = self._no_answer_counts.get(conn_id, 0) + 1
            return
        outbox = self.reactor_outboxes.get(parcels.reactor_of(conn_id))
        if outbox is None:
            return
        response = RemotingCommand(
            ResponseCode.SYSTEM_ERROR,
            opaque=command.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            serialize_type=SerializeType(serialize_type),
        )
        frame = encode_whole_command(response, self.frame_size_bytes_max)
        outbox.append(parcels.RESPONSE, parcels.pack_response_head(conn_id, 0, 0), frame)

    def _on_protocol_error(
        self, conn_id: int, serialize_type: int, header: memoryview, error: RemoteProtocolError
    ) -> None:
        """Answer with the error's code if the header still gives an opaque, then close."""
        self._protocol_errors += 1
        self.failed.add(conn_id)
        self._answer_frame(conn_id, serialize_type, header, error.response_code, str(error), True)

    def _on_quarantined(self, parcel_type: int, buffer: Buffer, offset: int, size: int) -> None:
        """A parcel that stopped this role twice (transport.Inbox): a frame is answered
        SYSTEM_ERROR if it lies whole in the ring, else its connection is closed (the rest of a
        spilled frame is in a file this role does not read again)."""
        if parcel_type & ~parcels.SPILLED_FLAG != parcels.FRAME:
            return
        remark = transport.quarantine_remark(self.role_id)
        if parcel_type != parcels.FRAME:
            head_offset = parcels.spill_head_view(buffer, offset)[0]
            (conn_id,) = _CONN_ID.unpack_from(buffer, head_offset)
            outbox = self.reactor_outboxes.get(parcels.reactor_of(conn_id))
            if outbox is not None:
                close = parcels.pack_close_connection(conn_id, parcels.CLOSE_REASON_PROTOCOL)
                outbox.append(parcels.CLOSE_CONNECTION, close)
            return
        (conn_id,) = _CONN_ID.unpack_from(buffer, offset)
        frame_start = offset + parcels.CONN_ID_SIZE_BYTES
        _frame_length, header_word = FRAME_PREFIX.unpack_from(buffer, frame_start)
        header_start = frame_start + FRAME_PREFIX_SIZE_BYTES
        header_end = min(header_start + (header_word & HEADER_LENGTH_MASK), offset + size)
        header = memoryview(buffer)[header_start:header_end]
        serialize_type = header_word >> SERIALIZE_TYPE_SHIFT
        if serialize_type > SERIALIZE_TYPE_ROCKETMQ:
            serialize_type = SERIALIZE_TYPE_JSON
        self._answer_frame(conn_id, serialize_type, header, ResponseCode.SYSTEM_ERROR, remark)

    def _on_unexpected_error(
        self, conn_id: int, serialize_type: int, header: memoryview, error: Exception
    ) -> None:
        """Answer SYSTEM_ERROR if the header still gives an opaque; keep the connection."""
        self._unexpected_errors += 1
        self.failures.record(f"decoding a frame of conn {conn_id}", error)
        remark = (
            f"mqbox: {self.role_id} failed on this frame ({type(error).__name__}); "
            "the broker logged it and serves on"
        )
        self._answer_frame(conn_id, serialize_type, header, ResponseCode.SYSTEM_ERROR, remark)

    def _answer_frame(
        self,
        conn_id: int,
        serialize_type: int,
        header: memoryview,
        code: int,
        remark: str,
        close: bool = False,
    ) -> None:
        """Answer `code` and `remark` to a frame that is not passed on, if its header still
        gives an opaque; with `close`, close the connection afterwards (or at once, without)."""
        opaque = _salvage_opaque(serialize_type, header)
        outbox = self.reactor_outboxes.get(parcels.reactor_of(conn_id))
        if outbox is None:
            return
        if opaque is None:
            if close:
                outbox.append(
                    parcels.CLOSE_CONNECTION,
                    parcels.pack_close_connection(conn_id, parcels.CLOSE_REASON_PROTOCOL),
                )
            return
        response = RemotingCommand(
            code,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            serialize_type=SerializeType(serialize_type),
        )
        frame = encode_whole_command(response, self.frame_size_bytes_max)
        flags = parcels.REPLY_FLAG_CLOSE_AFTER if close else 0
        outbox.append(parcels.RESPONSE, parcels.pack_response_head(conn_id, 0, flags), frame)

    # -- responses --------------------------------------------------------------------------------

    def _drain_replies(self, inbox: Inbox) -> int:
        batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
        handled = 0
        for parcel_type, buffer, offset, size in inbox.parcels(batch):
            handled += 1
            if parcel_type == parcels.REPLY:
                self._on_reply(buffer, offset, size)
            elif parcel_type == parcels.CLOSE_CONNECTION:
                conn_id, _reason = parcels.unpack_close_connection(buffer, offset)
                outbox = self.reactor_outboxes.get(parcels.reactor_of(conn_id))
                if outbox is not None:
                    outbox.append(
                        parcels.CLOSE_CONNECTION, memoryview(buffer)[offset : offset + size]
                    )
            else:
                raise AssertionError(f"codec got parcel type {parcel_type} from {inbox.producer}")
        inbox.release(batch)
        return handled

    def _on_reply(self, buffer: Buffer, offset: int, size: int) -> None:
        conn_id, opaque, serialize_type, flags, header_size, run_count, body_size = (
            _REPLY_HEAD.unpack_from(buffer, offset)
        )
        runs_start = offset + parcels.REPLY_HEAD_SIZE_BYTES
        header_start = runs_start + run_count * parcels.RUN_SIZE_BYTES
        header_end = header_start + header_size
        end = offset + size
        if run_count == 0:
            assert end - header_end == body_size
        else:
            assert end == header_end
        outbox = self.reactor_outboxes.get(conn_id >> parcels.CONN_ID_REACTOR_SHIFT)
        worker = conn_id % len(self.worker_outboxes)
        completed = self._completed[worker]
        if not completed:
            self._completed_since_ns[worker] = time.monotonic_ns()
        completed.append((conn_id, opaque))
        if not flags & parcels.REPLY_FLAG_REQUEST and self._awaiting_count > 0:
            self._awaiting_count -= 1
        if outbox is None:
            self._replies_dropped += 1
            return
        # The processor checked the size against the same limit: a refusal here is a bug there.
        # encode_frame_prefix's checks, inline for the usual case; it raises with the reason.
        frame_length = HEADER_WORD_SIZE_BYTES + header_size + body_size
        if (
            header_size > HEADER_SIZE_BYTES_MAX
            or frame_length + FRAME_LENGTH_SIZE_BYTES > self.frame_size_bytes_max
        ):
            encode_frame_prefix(serialize_type, header_size, body_size, self.frame_size_bytes_max)
            raise AssertionError("unreachable")
        prefix = FRAME_PREFIX.pack(
            frame_length, (serialize_type << SERIALIZE_TYPE_SHIFT) | header_size
        )
        view = memoryview(buffer)
        if run_count == 0:
            outbox.append(
                parcels.RESPONSE,
                _RESPONSE_HEAD.pack(conn_id, 0, flags),
                prefix,
                view[header_start:end],
            )
            self._replies_encoded += 1
            return
        outbox.append(
            parcels.RESPONSE,
            _RESPONSE_HEAD.pack(conn_id, run_count, flags),
            view[runs_start:header_start],
            prefix,
            view[header_start:end],
        )
        self._replies_encoded += 1

    def _flush_completed(self, now_ns: int) -> int:
        """Send COMPLETED notices that are due; returns ms until the next is due, or -1."""
        wait_ms = -1
        for worker, completed in enumerate(self._completed):
            if not completed:
                continue
            outbox = self.worker_outboxes[worker]
            age_ns = now_ns - self._completed_since_ns[worker]
            if (
                outbox.pending_count
                or len(completed) >= parcels.COMPLETED_FLUSH_COUNT
                or age_ns >= parcels.COMPLETED_FLUSH_INTERVAL_NS
            ):
                outbox.append(parcels.COMPLETED, parcels.pack_completed(completed))
                self._completed_notices += len(completed)
                completed.clear()
                continue
            due_ms = -(-(parcels.COMPLETED_FLUSH_INTERVAL_NS - age_ns) // 1_000_000)
            wait_ms = due_ms if wait_ms < 0 else min(wait_ms, due_ms)
        return wait_ms

    def statistics(self) -> CodecStatistics:
        return CodecStatistics(
            frames_decoded=self._frames_decoded,
            protocol_errors=self._protocol_errors,
            unexpected_errors=self._unexpected_errors,
            frames_dropped=self._frames_dropped,
            replies_encoded=self._replies_encoded,
            replies_dropped=self._replies_dropped,
            completed_notices=self._completed_notices,
            connections_known=len(self.peers),
            spill_count=self.spill_writer.spill_count,
            sleep_count=self.sleeper.sleep_count,
            turn_count=self._turn_count,
            acl=None if self.acl is None else self.acl.statistics(),
        )


def _ipv4_octets(host: str) -> bytes:
    """The 4 octets of an IPv4 peer (also IPv4-mapped IPv6); 0.0.0.0 for anything else."""
    try:
        return socket.inet_aton(host.removeprefix("::ffff:"))
    except OSError:
        return _NO_PEER[0]


def _salvage_opaque(serialize_type: int, header: memoryview) -> int | None:
    """The opaque of a header that failed to decode, if it can still be read; else None."""
    if serialize_type == SERIALIZE_TYPE_ROCKETMQ:
        if len(header) < _BINARY_OPAQUE_OFFSET + 4:
            return None
        return int.from_bytes(
            header[_BINARY_OPAQUE_OFFSET : _BINARY_OPAQUE_OFFSET + 4], "big", signed=True
        )
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(fields, dict):
        return None
    opaque = fields.get("opaque")
    if type(opaque) is not int or not INT32_MIN <= opaque <= INT32_MAX:
        return None
    return opaque


def main(ctx: RoleContext) -> NoReturn:
    """The codec role: serve until SIGTERM, then finish the turn and exit (runtime.py)."""
    codec = Codec(ctx, wakeup_fd=runtime.wakeup_fileno())
    ctx.report_ready({"role": ctx.role.role_id, "pid": os.getpid()})
    codec.run_forever()

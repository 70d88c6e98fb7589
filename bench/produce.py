"""bench/produce.py: how fast does one producer store messages through the whole broker?

One client process sends SEND_BATCH_MESSAGE (320) requests of `--batch` messages of
`--size-bytes` bytes each (plus a UNIQ_KEY property, as real producers send) over the raw
remoting protocol on one connection, `--inflight` requests outstanding, to the real appliance
(reactor -> codec -> worker -> send processor -> store writer -> dispatcher), ASYNC_FLUSH.
A message counts once its SEND answer (code 0) arrived. Reported: msgs_per_s, MB_per_s (message
bodies), and broker_cpu_us_per_msg = the CPU time (user + system) of every broker process
(supervisor and roles, name server excluded) during the run, divided by the messages. Targets:
>= 1,000,000 msgs/s at 128 B, >= 700 MB/s at 1 KiB, <= 1 us of broker CPU per message.

Unless --namesrv is given, the script starts its own appliance (`python -m mqbox.server.supervisor`
with the broker's real topology and name server, ports 0, a temporary home) and stops it after;
with --namesrv it sends to the broker that serves TBW102 there (no CPU figure then). The client
pre-encodes a pool of request frames and reads answers by their length prefix, checking code and
opaque from the header bytes, so its own cost stays small beside the broker's on a small machine
(it shares the cores). `checksum` covers every batch body sent; figures are the median of
`--repeat` runs.

Usage: python bench/produce.py [--size-bytes N] [--count N] [--batch N] [--inflight N]
                               [--repeat N] [--namesrv host:port] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
from _common import REPO_ROOT, emit, log  # bench/ is sys.path[0]

from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.message import BatchElement, encode_batch, encode_properties_str
from mqbox.protocol import make_request
from mqbox.protocol.codes import RequestCode
from mqbox.protocol.command import encode_command
from mqbox.protocol.headers import SendMessageRequestHeader

BENCH = "produce"
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
FRAME_HEAD = struct.Struct(">iI")
HEADER_LENGTH_MASK = 0xFFFFFF
OPAQUE_KEY = b'"opaque":'
SUCCESS_PREFIX = b'{"code":0,'
FRAME_POOL_SIZE = 32
RECEIVE_BUFFER_SIZE_BYTES = 16 << 20


# --- the appliance ------------------------------------------------------------------------------


@dataclasses.dataclass
class Appliance:
    broker_address: str
    namesrv_address: str
    startup_secs: float
    pids: list[int]  # supervisor and roles: whose CPU time counts; empty for --namesrv

    def cpu_secs(self) -> float:
        """CPU time (user + system, every thread) the broker's processes used so far."""
        total = 0.0
        for pid in self.pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
        return total


@contextlib.contextmanager
def appliance(namesrv: str | None, extra_conf: str = "") -> Iterator[Appliance]:
    """Our own appliance in a temporary home (module docstring), or the one behind `namesrv`."""
    if namesrv is not None:
        with RemotingClient(namesrv) as client:
            route = get_route(client, "TBW102")
        if route is None or not route.broker_datas:
            raise SystemExit(f"{BENCH}: the name server {namesrv} knows no broker for TBW102")
        yield Appliance(route.broker_datas[0].broker_addrs[0], namesrv, 0.0, [])
        return
    with tempfile.TemporaryDirectory(prefix=f"mqbox-{BENCH}-") as home_text:
        home = Path(home_text)
        conf = home / "broker.conf"
        conf.write_text(
            "brokerIP1=127.0.0.1\nflushDiskType=ASYNC_FLUSH\n" + extra_conf, encoding="utf-8"
        )
        read_fd, write_fd = os.pipe()
        command = [
            sys.executable,
            "-m",
            "mqbox.server.supervisor",
            *("--home", str(home), "--config", str(conf)),
            *("--broker-port", "0", "--namesrv-port", "0", "--ready-fd", str(write_fd)),
        ]
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr,
                stderr=sys.stderr,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPENBLAS_NUM_THREADS": "1"},
                pass_fds=(write_fd,),
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        role_pids: list[int] = []
        try:
            with os.fdopen(read_fd, "rb") as ready_pipe:
                line = ready_pipe.readline()
            if not line:
                raise SystemExit(
                    f"{BENCH}: the supervisor exited ({process.wait(READY_TIMEOUT_S)})"
                )
            ready = json.loads(line)
            if not ready.get("ok"):
                raise SystemExit(f"{BENCH}: the supervisor did not start: {ready.get('error')}")
            role_pids = [int(pid) for pid in ready["roles"].values()]
            yield Appliance(
                str(ready["broker"]),
                str(ready["namesrv"]),
                time.monotonic() - started,
                [process.pid, *role_pids],
            )
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            for pid in role_pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# --- a lean client connection -------------------------------------------------------------------


class Frames:
    """Reads remoting frames from a socket into one reused buffer; yields (header, body) views
    that stay valid until the next call of `frames()`."""

    def __init__(self, sock: socket.socket, buffer_size_bytes: int = RECEIVE_BUFFER_SIZE_BYTES):
        self.sock = sock
        self.buffer = bytearray(buffer_size_bytes)
        self.view = memoryview(self.buffer)
        self.start = 0
        self.end = 0

    def frames(self) -> list[tuple[memoryview, memoryview]]:
        """Receive once (blocking), then every complete frame in the buffer."""
        if self.start == self.end:
            self.start = self.end = 0
        elif self.start > 0 and len(self.buffer) - self.end < (1 << 20):
            remaining = self.end - self.start
            self.buffer[:remaining] = self.buffer[self.start : self.end]
            self.start, self.end = 0, remaining
        if self.end == len(self.buffer):
            raise SystemExit(f"{BENCH}: a frame is larger than the receive buffer")
        received = self.sock.recv_into(self.view[self.end :])
        if received == 0:
            raise SystemExit(f"{BENCH}: the broker closed the connection")
        self.end += received
        found: list[tuple[memoryview, memoryview]] = []
        position = self.start
        while self.end - position >= 8:
            frame_length, header_word = FRAME_HEAD.unpack_from(self.buffer, position)
            frame_end = position + 4 + frame_length
            if frame_end > self.end:
                if frame_end - self.start > len(self.buffer):
                    raise SystemExit(f"{BENCH}: a frame is larger than the receive buffer")
                break
            header_end = position + 8 + (header_word & HEADER_LENGTH_MASK)
            found.append((self.view[position + 8 : header_end], self.view[header_end:frame_end]))
            position = frame_end
        self.start = position
        return found


def opaque_of(header: memoryview) -> int:
    raw = bytes(header[:256]) if len(header) > 256 else bytes(header)
    at = raw.find(OPAQUE_KEY)
    if at < 0:
        raw = bytes(header)
        at = raw.index(OPAQUE_KEY)
    at += len(OPAQUE_KEY)
    return int(raw[at : raw.index(b",", at)])


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    return sock


# --- producing ----------------------------------------------------------------------------------


@dataclasses.dataclass
class ProduceResult:
    msgs: int
    secs: float
    broker_cpu_secs: float


def batch_bodies(size_bytes: int, batch: int, pool_size: int, keys: bool = True) -> list[bytes]:
    """`pool_size` distinct batch bodies of `batch` messages each (with a UNIQ_KEY each, unless
    `keys` is false)."""
    bodies = []
    for frame in range(pool_size):
        elements = []
        for number in range(batch):
            stamp = f"{frame:08d}{number:08d}".encode()
            body = (stamp * (size_bytes // len(stamp) + 1))[:size_bytes]
            key = hashlib.blake2b(stamp, digest_size=16).hexdigest().upper()
            properties = encode_properties_str({"UNIQ_KEY": key}) if keys else b""
            elements.append(BatchElement(body, 0, properties))
        bodies.append(encode_batch(elements))
    return bodies


def send_frames(
    topic: str, bodies: Sequence[bytes], queue_ids: Sequence[int], opaque_base: int
) -> list[bytes]:
    """One SEND_BATCH_MESSAGE frame per body, to queue_ids[i], opaques from opaque_base."""
    frames = []
    for index, body in enumerate(bodies):
        header = SendMessageRequestHeader(
            "bench_producer",
            topic,
            "TBW102",
            8,
            queue_ids[index % len(queue_ids)],
            0,
            int(time.time() * 1000),
            0,
            "",
            batch=True,
        )
        command = make_request(
            RequestCode.SEND_BATCH_MESSAGE, opaque_base + index, header.to_ext_v2(), body=body
        )
        frames.append(encode_command(command))
    return frames


def produce(
    address: str,
    frames: Sequence[bytes],
    opaque_base: int,
    batch: int,
    request_count: int,
    inflight: int,
    app: Appliance,
) -> ProduceResult:
    """Send request_count frames (cycling through `frames`), inflight outstanding; wait for
    every answer. Frame i carries opaque opaque_base + i % len(frames)."""
    assert inflight <= len(frames)
    sock = connect(address)
    reader = Frames(sock)
    cpu_before = app.cpu_secs()
    started = time.perf_counter()
    sent = 0
    answered = 0
    pool = len(frames)
    try:
        while answered < request_count:
            window = min(request_count, answered + inflight)
            if sent < window:
                sock.sendall(b"".join(frames[index % pool] for index in range(sent, window)))
                sent = window
            for header, _body in reader.frames():
                if bytes(header[: len(SUCCESS_PREFIX)]) != SUCCESS_PREFIX:
                    raise SystemExit(f"{BENCH}: a send failed: {bytes(header[:300])!r}")
                expected = opaque_base + answered % pool
                if opaque_of(header) != expected:
                    raise SystemExit(f"{BENCH}: answer {opaque_of(header)} for {expected}")
                answered += 1
    finally:
        sock.close()
    secs = time.perf_counter() - started
    return ProduceResult(request_count * batch, secs, app.cpu_secs() - cpu_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages per run")
    parser.add_argument("--batch", type=int, default=0, help="messages per request (0: auto)")
    parser.add_argument("--inflight", type=int, default=8, help="requests outstanding")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument(
        "--no-keys", action="store_true", help="no UNIQ_KEY property (nothing to index)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    batch = arguments.batch or max(16, min(1000, (512 * 1024) // (size_bytes + 80)))
    count = arguments.count
    repeat = arguments.repeat
    inflight = arguments.inflight
    if arguments.smoke:
        batch, count, repeat, inflight = 50, 1000, 1, 4
    assert size_bytes > 0
    assert batch > 0
    assert repeat > 0
    request_count = max(1, count // batch)
    pool_size = max(FRAME_POOL_SIZE, inflight)
    bodies = batch_bodies(size_bytes, batch, pool_size, keys=not arguments.no_keys)
    topic = f"BenchProduce{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    with appliance(arguments.namesrv, extra_conf) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        frames = send_frames(topic, bodies, [0], 1)
        produce(
            app.broker_address, frames, 1, batch, min(request_count, 2 * pool_size), inflight, app
        )
        results = []
        for index in range(repeat):
            result = produce(app.broker_address, frames, 1, batch, request_count, inflight, app)
            log(
                f"{BENCH}: run {index + 1}: {result.msgs / result.secs:,.0f} msgs/s, "
                f"{result.msgs * size_bytes / result.secs / 1e6:,.1f} MB/s, broker CPU "
                f"{result.broker_cpu_secs / result.msgs * 1e6:.2f} us/msg"
            )
            results.append(result)
    rates = [result.msgs / result.secs for result in results]
    median = sorted(results, key=lambda result: result.msgs / result.secs)[len(results) // 2]
    cpu_per_msg = (
        round(median.broker_cpu_secs / median.msgs * 1e6, 3) if app.pids and median.msgs else None
    )
    digest = hashlib.blake2b(digest_size=8)
    for body in bodies:
        digest.update(body)
    digest.update(str(request_count).encode())
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": request_count * batch,
            "batch": batch,
            "inflight": inflight,
            "repeat": repeat,
            "flush_disk_type": "ASYNC_FLUSH",
            "uniq_keys": not arguments.no_keys,
        },
        median.msgs,
        median.secs,
        size_bytes,
        msgs_per_s_runs=[round(rate, 1) for rate in rates],
        msgs_per_s_median=round(statistics.median(rates), 1),
        broker_cpu_us_per_msg=cpu_per_msg,
        startup_secs=round(app.startup_secs, 3),
        checksum=digest.hexdigest(),
    )


if __name__ == "__main__":
    main()

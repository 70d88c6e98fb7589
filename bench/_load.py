"""Shared by the benches that talk to a whole broker: the appliance and the raw-protocol load.

Owns: starting our own appliance in a temporary home on free ports (or finding the broker behind
`--namesrv`) and stopping it (SIGTERM to the supervisor, then SIGKILL by PID to every process it
had started, then a sweep of its /dev/shm objects, each left-over named on stderr); lean
connections that read frames by their length prefix into one reused buffer; pre-encoded request
frames (batched and single SENDs, topic creation). Never: figures or JSON lines (_common.py), or
the timing of a bench (each script decides what it times).

Used by produce.py, consume.py, latency.py, sync_flush.py and memory.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import psutil
from _common import REPO_ROOT, die_with_this_process  # bench/ is sys.path[0]

from mqbox.acl.signature import SessionCredentials, sign_request
from mqbox.client.admin_api import update_and_create_topic
from mqbox.client.namesrv_api import get_route
from mqbox.client.remoting import RemotingClient
from mqbox.message import BatchElement, encode_batch, encode_properties_str
from mqbox.protocol import make_request
from mqbox.protocol.codes import PERM_READ, PERM_WRITE, RequestCode
from mqbox.protocol.command import encode_command
from mqbox.protocol.headers import SendMessageRequestHeader, UpdateAndCreateTopicRequestHeader
from mqbox.resources import process_stat_fields
from mqbox.server import launch

READY_TIMEOUT_S: Final = 300.0
STOP_TIMEOUT_S: Final = 60.0
ROUTE_WAIT_S: Final = 30.0
FRAME_HEAD: Final = struct.Struct(">iI")
HEADER_LENGTH_MASK: Final = 0xFFFFFF
OPAQUE_KEY: Final = b'"opaque":'
SUCCESS_PREFIX: Final = b'{"code":0,'  # the response encoder writes the code first
RECEIVE_BUFFER_SIZE_BYTES: Final = 16 << 20
PRODUCER_GROUP: Final = "bench_producer"
DEFAULT_TOPIC: Final = "TBW102"
DEFAULT_TOPIC_QUEUE_COUNT: Final = 8
# --acl: the one account of our appliance's plain_acl.yml (an admin: it creates topics too)
BENCH_CREDENTIALS: Final = SessionCredentials("bench-admin", "bench-secret")
BENCH_ACL_TEXT: Final = (
    "accounts:\n"
    f"  - accessKey: {BENCH_CREDENTIALS.access_key}\n"
    f"    secretKey: {BENCH_CREDENTIALS.secret_key}\n"
    "    admin: true\n"
    "    defaultTopicPerm: PUB|SUB\n"
    "    defaultGroupPerm: PUB|SUB\n"
)


# --- the appliance ------------------------------------------------------------------------------


@dataclasses.dataclass
class Appliance:
    broker_address: str
    namesrv_address: str
    startup_secs: float
    pids: list[int]  # supervisor and roles: whose CPU time counts; empty for --namesrv
    home: Path | None = None  # our own appliance's home; None for --namesrv
    roles: dict[str, int] = dataclasses.field(default_factory=dict)  # role id -> pid

    def cpu_secs(self) -> float:
        """CPU time (user + system, every thread) the broker's processes used so far."""
        return sum(cpu_secs_of(self.pids).values())


def cpu_secs_of(pids: Sequence[int]) -> dict[int, float]:
    """CPU time (user + system) of each live process in `pids`."""
    found: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(pid).cpu_times()
            found[pid] = times.user + times.system
    return found


def role_cpu_secs(app: Appliance) -> dict[str, float]:
    """CPU time so far of each broker role (by role id) and of the supervisor."""
    by_pid = cpu_secs_of(app.pids)
    found = {role: by_pid.get(pid, 0.0) for role, pid in app.roles.items()}
    if app.pids:
        found["supervisor"] = by_pid.get(app.pids[0], 0.0)
    return found


def role_minor_faults(app: Appliance) -> dict[str, int]:
    """Minor page faults so far of each broker role (by role id): field 10 of /proc/PID/stat,
    every thread counted. A first write to a page of a fresh file or anonymous map is one."""
    found: dict[str, int] = {}
    for role, pid in app.roles.items():
        fields = process_stat_fields(pid)
        if fields is not None:
            found[role] = int(fields[7])
    return found


def per_role_kind(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each role kind (send.0 and send.1 -> send) used between two per-role readings."""
    by_kind: dict[str, float] = {}
    for role, value in after.items():
        kind = role.split(".", 1)[0]
        by_kind[kind] = by_kind.get(kind, 0.0) + value - before.get(role, 0.0)
    return by_kind


def cpu_percent(before: dict[str, float], after: dict[str, float], secs: float) -> dict[str, float]:
    """Per name: the CPU used between two role_cpu_secs() readings, in percent of one core."""
    if secs <= 0:
        return {}
    return {name: round((after[name] - before.get(name, 0.0)) / secs * 100, 1) for name in after}


@contextlib.contextmanager
def appliance(
    bench: str,
    namesrv: str | None,
    extra_conf: str = "",
    flush_disk_type: str = "ASYNC_FLUSH",
    acl: bool = False,
) -> Iterator[Appliance]:
    """Our own appliance in a temporary home (`python -m mqbox.server.supervisor` with the
    broker's real topology and name server, ports 0, `brokerIP1=127.0.0.1`, `flush_disk_type`,
    then `extra_conf` lines), or the broker serving TBW102 behind `namesrv`. With `acl`, our
    appliance checks every request (aclEnable=true, one account: BENCH_CREDENTIALS), and the
    benches sign what they send."""
    if namesrv is not None:
        with RemotingClient(namesrv) as client:
            route = get_route(client, DEFAULT_TOPIC)
        if route is None or not route.broker_datas:
            raise SystemExit(f"{bench}: the name server {namesrv} knows no broker for TBW102")
        yield Appliance(route.broker_datas[0].broker_addrs[0], namesrv, 0.0, [])
        return
    with tempfile.TemporaryDirectory(prefix=f"mqbox-{bench}-") as home_text:
        home = Path(home_text)
        conf = home / "broker.conf"
        if acl:
            (home / "conf").mkdir()
            (home / "conf" / "plain_acl.yml").write_text(BENCH_ACL_TEXT, encoding="utf-8")
            extra_conf += "aclEnable=true\n"
        conf.write_text(
            f"brokerIP1=127.0.0.1\nflushDiskType={flush_disk_type}\n{extra_conf}",
            encoding="utf-8",
        )
        arguments = ["--home", str(home), "--config", str(conf)]
        started = time.monotonic()
        try:
            with launch.supervised(
                [*arguments, "--broker-port", "0", "--namesrv-port", "0"],
                output=sys.stderr,
                ready_timeout_s=READY_TIMEOUT_S,
                stop_timeout_s=STOP_TIMEOUT_S,
                environment={"PYTHONPATH": str(REPO_ROOT)},
                cwd=REPO_ROOT,
                preexec_fn=die_with_this_process(signal.SIGTERM),
            ) as (process, ready):
                roles = {str(role): int(pid) for role, pid in ready["roles"].items()}
                yield Appliance(
                    str(ready["broker"]),
                    str(ready["namesrv"]),
                    time.monotonic() - started,
                    [process.pid, *roles.values()],
                    home,
                    roles,
                )
        except (launch.SupervisorNotReadyError, AssertionError) as error:
            raise SystemExit(f"{bench}: {error}") from None


def create_topic(
    app: Appliance,
    topic: str,
    queue_count: int = DEFAULT_TOPIC_QUEUE_COUNT,
    credentials: SessionCredentials | None = None,
) -> None:
    """UPDATE_AND_CREATE_TOPIC on the broker, then wait until the name server routes it (a C++
    client that finds no route falls back to TBW102's)."""
    header = UpdateAndCreateTopicRequestHeader(
        topic, DEFAULT_TOPIC, queue_count, queue_count, PERM_READ | PERM_WRITE
    )
    with RemotingClient(app.broker_address, credentials=credentials) as broker:
        update_and_create_topic(broker, header)
    deadline = time.monotonic() + ROUTE_WAIT_S
    with RemotingClient(app.namesrv_address) as namesrv:
        while get_route(namesrv, topic) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"the name server did not route {topic} in {ROUTE_WAIT_S} s")
            time.sleep(0.05)


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
            raise SystemExit("bench: a frame is larger than the receive buffer")
        received = self.sock.recv_into(self.view[self.end :])
        if received == 0:
            raise SystemExit("bench: the broker closed the connection")
        self.end += received
        found: list[tuple[memoryview, memoryview]] = []
        position = self.start
        while self.end - position >= 8:
            frame_length, header_word = FRAME_HEAD.unpack_from(self.buffer, position)
            frame_end = position + 4 + frame_length
            if frame_end > self.end:
                if frame_end - self.start > len(self.buffer):
                    raise SystemExit("bench: a frame is larger than the receive buffer")
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


def frame_body(frame: bytes) -> bytes:
    """The body of one encoded frame (what a checksum covers: headers carry born timestamps)."""
    _frame_length, header_word = FRAME_HEAD.unpack_from(frame, 0)
    return frame[8 + (header_word & HEADER_LENGTH_MASK) :]


def connect(address: str, buffer_size_bytes: int = 4 << 20) -> socket.socket:
    """A blocking TCP connection with TCP_NODELAY and socket buffers of `buffer_size_bytes`."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_size_bytes)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_size_bytes)
    return sock


# --- request frames -----------------------------------------------------------------------------


def message_body(stamp: bytes, size_bytes: int) -> bytes:
    """`size_bytes` of printable text repeating `stamp` (no NUL: the C++ wrapper cuts at one)."""
    return (stamp * (size_bytes // len(stamp) + 1))[:size_bytes]


def uniq_key(stamp: bytes) -> str:
    """A 32-hex-digit UNIQ_KEY, as producers set on every message."""
    return hashlib.blake2b(stamp, digest_size=16).hexdigest().upper()


def batch_bodies(
    size_bytes: int, batch: int, pool_size: int, keys: bool = True, first: int = 0
) -> list[bytes]:
    """`pool_size` distinct batch bodies of `batch` messages each (with a UNIQ_KEY each, unless
    `keys` is false); bodies numbered from `first`, so pools made with other numbers differ."""
    bodies = []
    for frame in range(first, first + pool_size):
        elements = []
        for number in range(batch):
            stamp = f"{frame:08d}{number:08d}".encode()
            properties = encode_properties_str({"UNIQ_KEY": uniq_key(stamp)}) if keys else b""
            elements.append(BatchElement(message_body(stamp, size_bytes), 0, properties))
        bodies.append(encode_batch(elements))
    return bodies


def send_header(
    topic: str, queue_id: int, properties: str = "", batch: bool = False
) -> dict[str, str]:
    """The V2 (310 / 320) header of a send to `queue_id`, the topic auto-created from TBW102."""
    header = SendMessageRequestHeader(
        PRODUCER_GROUP,
        topic,
        DEFAULT_TOPIC,
        DEFAULT_TOPIC_QUEUE_COUNT,
        queue_id,
        0,
        int(time.time() * 1000),
        0,
        properties,
        batch=batch,
    )
    return header.to_ext_v2()


def send_frames(
    topic: str,
    bodies: Sequence[bytes],
    queue_ids: Sequence[int],
    opaque_base: int,
    credentials: SessionCredentials | None = None,
) -> list[bytes]:
    """One SEND_BATCH_MESSAGE frame per body, to queue_ids[i], opaques from opaque_base; signed
    with `credentials` if given."""
    frames = []
    for index, body in enumerate(bodies):
        ext = send_header(topic, queue_ids[index % len(queue_ids)], batch=True)
        if credentials is not None:
            ext = sign_request(credentials, ext, body)
        request = make_request(RequestCode.SEND_BATCH_MESSAGE, opaque_base + index, ext, body=body)
        frames.append(encode_command(request))
    return frames


def single_send_frame(
    topic: str, queue_id: int, size_bytes: int, stamp: bytes, opaque: int
) -> bytes:
    """One SEND_MESSAGE_V2 (310) frame: a `size_bytes` body with its own UNIQ_KEY."""
    properties = encode_properties_str({"UNIQ_KEY": uniq_key(stamp), "WAIT": "true"}).decode()
    return encode_command(
        make_request(
            RequestCode.SEND_MESSAGE_V2,
            opaque,
            send_header(topic, queue_id, properties),
            body=message_body(stamp, size_bytes),
        )
    )

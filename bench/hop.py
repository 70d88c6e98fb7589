"""bench/hop.py: what does one request cost through the broker's process graph and back?

The MQBOX_NOOP request (admin.py: answered SUCCESS at once) makes the whole trip reactor -> codec
-> worker -> admin processor -> codec -> reactor over loopback, on one client connection, with
`--inflight N` requests outstanding at a time. Latency is measured per request (from the write of
its frame to the read of its response); the rate over the whole run. Targets: p50 <= 80 us and
p99 <= 500 us at --inflight 1; >= 100,000 requests/s at --inflight 64.

The appliance is the real one: `python -m mqbox.server.supervisor --no-namesrv` with the front
topology below (one reactor, codec, worker and admin processor; the store and the send and pull
pools left out, which this request never reaches), forked from the supervisor's warm parent as
`mqbox start` does. The client pre-encodes every request frame and reads responses by their
length prefix, checking the code and the opaque (in order) from the header bytes, so its own
cost stays small beside the broker's on a machine with few cores. `checksum` covers every
response header received; `startup_secs` is the supervisor's start (warm-up included).

Where the time goes: `cpu_us_per_request` is each role's on-CPU time per request during the
median run (and the client's own, `client`, its frame encoding left out), from
/proc/<pid>/schedstat (nanoseconds on a CPU; time waiting for one is not counted). On a shared
machine compare figures taken side by side, with the load average (`load_avg`) beside them.

Usage: python bench/hop.py [--inflight N] [--count N] [--repeat N] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (  # bench/ is sys.path[0]
    REPO_ROOT,
    die_with_this_process,
    emit,
    log,
    percentiles_us,
)

from mqbox.config import BrokerConfig
from mqbox.protocol import make_request
from mqbox.protocol.command import encode_command
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from mqbox.server import launch
from mqbox.server.topology import RoleKind, Topology, broker_topology

BENCH = "hop"
FRONT_KINDS = frozenset({RoleKind.REACTOR, RoleKind.CODEC, RoleKind.WORKER, RoleKind.ADMIN})
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
RESPONSE_PREFIX = b'{"code":0,'
OPAQUE_KEY = b'"opaque":'
FRAME_HEAD = struct.Struct(">iI")


def front_topology(instance: str, config: BrokerConfig) -> Topology:
    """The supervisor's --topology: the broker's front only (see the module docstring)."""
    pools = dataclasses.replace(config.pools, send_processor_count=0, pull_processor_count=0)
    full = broker_topology(instance, dataclasses.replace(config, pools=pools))
    roles = tuple(role for role in full.roles if role.kind in FRONT_KINDS)
    role_ids = {role.role_id for role in roles}
    rings = tuple(r for r in full.rings if r.producer in role_ids and r.consumer in role_ids)
    return Topology(roles, rings)


@dataclasses.dataclass
class Appliance:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    startup_secs: float
    roles: dict[str, int]


@contextlib.contextmanager
def appliance(home: Path) -> Iterator[Appliance]:
    """The supervisor with the front topology on port 0; SIGTERM (then SIGKILL) on the way out."""
    conf = home / "broker.conf"
    conf.write_text(
        "brokerIP1=127.0.0.1\nmqboxReactorCount=1\nmqboxCodecCount=1\n"
        "mqboxWorkerCount=1\nmqboxAdminProcessorCount=1\n",
        encoding="utf-8",
    )
    command = ["--home", str(home), "--config", str(conf), "--no-namesrv"]
    command += ["--broker-port", "0", "--topology", "hop:front_topology"]
    bench_dir = str(Path(__file__).resolve().parent)
    python_path = os.pathsep.join([bench_dir, str(REPO_ROOT)])
    started = time.monotonic()
    try:
        with launch.supervised(
            command,
            output=sys.stderr,
            ready_timeout_s=READY_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
            environment={"PYTHONPATH": python_path},
            preexec_fn=die_with_this_process(signal.SIGTERM),
        ) as (process, ready):
            host, port = str(ready["broker"]).rsplit(":", 1)
            yield Appliance(process, host, int(port), time.monotonic() - started, ready["roles"])
    except (launch.SupervisorNotReadyError, AssertionError) as error:
        raise SystemExit(f"hop: {error}") from None


@dataclasses.dataclass
class RunResult:
    secs: float
    latencies_ns: list[int]
    checksum: str
    cpu_us_per_request: dict[str, float] = dataclasses.field(default_factory=dict)


def cpu_ns(pid: int | str) -> int:
    """On-CPU nanoseconds of a process so far (/proc/<pid>/schedstat); 0 where unavailable."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def run_measured(
    host: str, port: int, count: int, inflight: int, roles: dict[str, int]
) -> RunResult:
    """run(), with each role's and the client's CPU time per request."""
    before = {role: cpu_ns(pid) for role, pid in roles.items()}
    result = run(host, port, count, inflight)
    for role, pid in roles.items():
        result.cpu_us_per_request[role] = round((cpu_ns(pid) - before[role]) / count / 1000, 2)
    return result


def run(host: str, port: int, count: int, inflight: int) -> RunResult:
    """`count` no-op requests with `inflight` outstanding; latency per request, total time."""
    frames = [encode_command(make_request(MQBOX_NOOP, opaque)) for opaque in range(count)]
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    digest = hashlib.blake2b(digest_size=8)
    sent_at: collections.deque[int] = collections.deque()
    latencies_ns: list[int] = []
    buffer = b""
    sent = 0
    received = 0
    clock = time.perf_counter_ns
    client_cpu_ns = cpu_ns("self")
    started_ns = clock()
    try:
        while received < count:
            window = min(count, received + inflight)
            if sent < window:
                sock.sendall(b"".join(frames[sent:window]))
                now_ns = clock()
                sent_at.extend([now_ns] * (window - sent))
                sent = window
            chunk = sock.recv(1 << 20)
            now_ns = clock()
            if not chunk:
                raise SystemExit("hop: the broker closed the connection")
            buffer = buffer + chunk if buffer else chunk
            position = 0
            while len(buffer) - position >= 8:
                frame_length, header_word = FRAME_HEAD.unpack_from(buffer, position)
                end = position + 4 + frame_length
                if end > len(buffer):
                    break
                header = buffer[position + 8 : position + 8 + (header_word & 0xFFFFFF)]
                if not header.startswith(RESPONSE_PREFIX):
                    raise SystemExit(f"hop: unexpected response {header[:120]!r}")
                opaque_at = header.index(OPAQUE_KEY) + len(OPAQUE_KEY)
                opaque = int(header[opaque_at : header.index(b",", opaque_at)])
                if opaque != received:
                    raise SystemExit(f"hop: response {opaque} arrived where {received} was due")
                digest.update(header)
                latencies_ns.append(now_ns - sent_at.popleft())
                received += 1
                position = end
            buffer = buffer[position:]
    finally:
        sock.close()
    secs = (clock() - started_ns) / 1e9
    client_us = round((cpu_ns("self") - client_cpu_ns) / count / 1000, 2)
    return RunResult(secs, latencies_ns, digest.hexdigest(), {"client": client_us})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inflight", type=int, default=1, help="requests outstanding")
    parser.add_argument("--count", type=int, default=20_000, help="requests per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters, about a second")
    arguments = parser.parse_args()
    count = 200 if arguments.smoke else arguments.count
    repeat = 1 if arguments.smoke else arguments.repeat
    inflight = arguments.inflight
    assert count > 0
    assert inflight > 0
    assert repeat > 0
    with tempfile.TemporaryDirectory(prefix="mqbox-hop-") as home, appliance(Path(home)) as app:
        log(f"hop: appliance up in {app.startup_secs:.2f} s on port {app.port}: {app.roles}")
        run(app.host, app.port, min(count, 2000), inflight)  # warm the roles' code paths
        results = []
        for index in range(repeat):
            result = run_measured(app.host, app.port, count, inflight, app.roles)
            log(
                f"hop: run {index + 1}: {count / result.secs:,.0f} requests/s, "
                f"p50 {percentiles_us(result.latencies_ns)['p50_us']} us"
            )
            results.append(result)
    rates = [count / result.secs for result in results]
    median = sorted(results, key=lambda result: count / result.secs)[len(results) // 2]
    extra: dict[str, Any] = percentiles_us(median.latencies_ns)
    emit(
        BENCH,
        {"inflight": inflight, "count": count, "repeat": repeat, "request_code": MQBOX_NOOP},
        count,
        median.secs,
        0,
        requests_per_s=round(statistics.median(rates), 1),
        requests_per_s_runs=[round(rate, 1) for rate in rates],
        startup_secs=round(app.startup_secs, 3),
        cpu_us_per_request=median.cpu_us_per_request,
        checksum=median.checksum,
        **extra,
    )


if __name__ == "__main__":
    main()

"""bench/produce.py: how fast does one producer store messages through the whole broker?

One client process sends SEND_BATCH_MESSAGE (320) requests of `--batch` messages of
`--size-bytes` bytes each (plus a UNIQ_KEY property, as real producers send) over the raw
remoting protocol on one connection, `--inflight` requests outstanding, to the real appliance
(reactor -> codec -> worker -> send processor -> store writer -> dispatcher), ASYNC_FLUSH.
A message counts once its SEND answer (code 0) arrived. Reported: msgs_per_s, MB_per_s (message
bodies), and broker_cpu_us_per_msg = the CPU time (user + system) of every broker process
(supervisor and roles, name server excluded) during the run, divided by the messages, also
split by role kind (`cpu_us_per_msg_by_role`), with each kind's minor page faults per 1,000
messages (`minor_faults_per_1000_msgs_by_role`, from /proc/PID/stat). Targets: >= 1,000,000
msgs/s at 128 B, >= 700 MB/s at 1 KiB, <= 1 us of broker CPU per message.

Unless --namesrv is given, the script starts its own appliance (`python -m mqbox.server.supervisor`
with the broker's real topology and name server, ports 0, a temporary home) and stops it after;
with --namesrv it sends to the broker that serves TBW102 there (no CPU figure then). The client
pre-encodes a pool of request frames and reads answers by their length prefix, checking code and
opaque from the header bytes, so its own cost stays small beside the broker's on a small machine
(it shares the cores). `checksum` covers every batch body sent; figures are the median of
`--repeat` runs.

With --acl the appliance runs with `aclEnable=true` (one admin account, _load.py) and every
request frame is signed: the broker verifies each request's HMAC over its header values and the
whole batch body (docs/acl.md section 8). The frames are signed once, with the pool, before any
timed run, so the client does the same work with and without --acl (its frames carry two more
header fields) and on a small machine, where it shares the cores, the difference between the two
runs is the broker's. Run it with and without, interleaved, to see what the ACL costs.

Usage: python bench/produce.py [--size-bytes N] [--count N] [--batch N] [--inflight N]
                               [--repeat N] [--namesrv host:port] [--acl] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import statistics
import time
from collections.abc import Sequence

from _common import emit, log  # bench/ is sys.path[0]
from _load import (
    BENCH_CREDENTIALS,
    SUCCESS_PREFIX,
    Appliance,
    Frames,
    appliance,
    batch_bodies,
    connect,
    opaque_of,
    per_role_kind,
    role_cpu_secs,
    role_minor_faults,
    send_frames,
)

BENCH = "produce"
FRAME_POOL_SIZE = 32


# --- producing ----------------------------------------------------------------------------------


@dataclasses.dataclass
class ProduceResult:
    msgs: int
    secs: float
    broker_cpu_secs: float
    cpu_secs_by_kind: dict[str, float]  # per role kind (and the supervisor); empty: --namesrv
    minor_faults_by_kind: dict[str, float]

    def per_msg(self, by_kind: dict[str, float], scale: float) -> dict[str, float]:
        """`by_kind` per message times `scale`, largest first."""
        ordered = sorted(by_kind.items(), key=lambda item: -item[1])
        return {kind: round(value / self.msgs * scale, 3) for kind, value in ordered}


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
    roles_cpu_before = role_cpu_secs(app)
    roles_faults_before = role_minor_faults(app)
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
    cpu_secs = app.cpu_secs() - cpu_before
    cpu_by_kind = per_role_kind(roles_cpu_before, role_cpu_secs(app))
    faults_by_kind = per_role_kind(
        {role: float(count) for role, count in roles_faults_before.items()},
        {role: float(count) for role, count in role_minor_faults(app).items()},
    )
    return ProduceResult(request_count * batch, secs, cpu_secs, cpu_by_kind, faults_by_kind)


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
    parser.add_argument("--acl", action="store_true", help="aclEnable=true; every request signed")
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
    credentials = BENCH_CREDENTIALS if arguments.acl else None
    with appliance(BENCH, arguments.namesrv, extra_conf, acl=arguments.acl) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        frames = send_frames(topic, bodies, [0], 1, credentials)
        produce(
            app.broker_address, frames, 1, batch, min(request_count, 2 * pool_size), inflight, app
        )
        results = []
        for index in range(repeat):
            result = produce(app.broker_address, frames, 1, batch, request_count, inflight, app)
            log(
                f"{BENCH}: run {index + 1}: {result.msgs / result.secs:,.0f} msgs/s, "
                f"{result.msgs * size_bytes / result.secs / 1e6:,.1f} MB/s, broker CPU "
                f"{result.broker_cpu_secs / result.msgs * 1e6:.2f} us/msg "
                f"{result.per_msg(result.cpu_secs_by_kind, 1e6)}"
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
            "acl": arguments.acl,
        },
        median.msgs,
        median.secs,
        size_bytes,
        msgs_per_s_runs=[round(rate, 1) for rate in rates],
        msgs_per_s_median=round(statistics.median(rates), 1),
        broker_cpu_us_per_msg=cpu_per_msg,
        cpu_us_per_msg_by_role=median.per_msg(median.cpu_secs_by_kind, 1e6),
        minor_faults_per_1000_msgs_by_role=median.per_msg(median.minor_faults_by_kind, 1000),
        startup_secs=round(app.startup_secs, 3),
        checksum=digest.hexdigest(),
    )


if __name__ == "__main__":
    main()

"""bench/sync_flush.py: how many messages per second does group commit acknowledge under SYNC_FLUSH?

A broker with flushDiskType=SYNC_FLUSH answers a send only once an msync covered it; group
commit makes one msync serve every send that waited for it. `--connections` senders (64), each
its own TCP connection with exactly one request in flight (the next goes out when its answer is
in), send `--size-bytes` messages (128 B, a UNIQ_KEY each) to a topic of 8 queues created up front
(sender i writes queue i % 8), over the raw remoting protocol:

- single: SEND_MESSAGE_V2 (310), one message per request, `--count` messages in all;
- batch: SEND_BATCH_MESSAGE (320), `--batch` (64) messages per request, `--batch-count` in all.

Every answer is checked: SEND_OK (code 0) and the opaque that sender is waiting for; anything
else is counted in `single_failures` / `batch_failures` (by code in `*_failure_codes`) and the
message is not counted as sent. Each phase first runs untimed for 4 requests per connection.
Reported: `single_msgs_per_s`, `batch_msgs_per_s` (acknowledged messages over the time from
the first send to the last answer), broker CPU per message (supervisor and roles, psutil), CPU
per role in percent of one core (`*_role_cpu_pct`), and the load generator's own CPU
(`*_client_cpu_pct`). Targets: >= 50,000 msgs/s single, >= 500,000 msgs/s in batches.

The load generator: pre-encoded frames (4 per connection), one `select.epoll` over all the
connections in one process, answers read by their length prefix and checked from the header
bytes. `--procs N` splits the connections over N forked processes that start together; their
counts are summed over the span from the first send to the last answer of any. The generator is
not the limit when its CPU (`*_client_cpu_pct`) stays well below 100 % and `--procs 2` gives the
same rate. The shared `msgs_per_s` keys describe the batch phase; `checksum` covers every frame
sent and the acknowledged counts.

Unless --namesrv is given, the script starts its own appliance (SYNC_FLUSH) in a temporary home
on free ports (_load.py's `appliance`) and stops it afterwards; with --namesrv the broker's own
flushDiskType applies.

Usage: python bench/sync_flush.py [--size-bytes N] [--count N] [--batch-count N] [--batch N]
                                  [--connections N] [--procs N] [--namesrv host:port] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier
from typing import Any, Final

import orjson
from _common import emit, log  # bench/ is sys.path[0]
from _load import (
    DEFAULT_TOPIC_QUEUE_COUNT,
    SUCCESS_PREFIX,
    Appliance,
    Frames,
    appliance,
    batch_bodies,
    connect,
    cpu_percent,
    create_topic,
    frame_body,
    opaque_of,
    role_cpu_secs,
    send_frames,
    single_send_frame,
)

BENCH: Final = "sync_flush"
FRAMES_PER_CONNECTION: Final = 4
WARMUP_REQUESTS_PER_CONNECTION: Final = 4
RECEIVE_BUFFER_SIZE_BYTES: Final = 1 << 20  # per connection; answers are a few hundred bytes
SOCKET_BUFFER_SIZE_BYTES: Final = 256 << 10
CHILD_TIMEOUT_S: Final = 600.0


# --- one load process ---------------------------------------------------------------------------


class Sender:
    """One connection with one request in flight, cycling through its pre-encoded frames."""

    def __init__(self, address: str, frames: Sequence[tuple[int, bytes]]) -> None:
        self.sock = connect(address, SOCKET_BUFFER_SIZE_BYTES)
        self.reader = Frames(self.sock, RECEIVE_BUFFER_SIZE_BYTES)
        self.frames = frames  # (opaque, frame)
        self.sent = 0
        self.waiting_for = -1  # the opaque in flight

    def send_next(self) -> None:
        opaque, frame = self.frames[self.sent % len(self.frames)]
        self.waiting_for = opaque
        self.sent += 1
        self.sock.sendall(frame)


@dataclasses.dataclass
class LoadResult:
    acknowledged_requests: int
    failures: int
    failure_codes: dict[int, int]
    first_send_s: float  # time.perf_counter(): one clock for every process of the machine
    last_answer_s: float
    client_cpu_secs: float


def sender_frames(
    topic: str, connection: int, phase: str, size_bytes: int, batch: int
) -> list[tuple[int, bytes]]:
    """The frames of one sender: opaques connection * FRAMES_PER_CONNECTION + k."""
    opaque_base = connection * FRAMES_PER_CONNECTION
    queue_id = connection % DEFAULT_TOPIC_QUEUE_COUNT
    if phase == "single":
        return [
            (
                opaque_base + k,
                single_send_frame(
                    topic,
                    queue_id,
                    size_bytes,
                    f"{connection:06d}{k:06d}".encode(),
                    opaque_base + k,
                ),
            )
            for k in range(FRAMES_PER_CONNECTION)
        ]
    bodies = batch_bodies(size_bytes, batch, FRAMES_PER_CONNECTION, first=opaque_base)
    frames = send_frames(topic, bodies, [queue_id], opaque_base)
    return list(enumerate(frames, opaque_base))


def drive(
    address: str,
    plans: Sequence[Sequence[tuple[int, bytes]]],
    request_count: int,
    start: Callable[[], object] = lambda: None,
) -> LoadResult:
    """One sender per plan; `request_count` requests over them all, one in flight per sender;
    `start()` is called once every connection is made, just before the first send."""
    senders = [Sender(address, frames) for frames in plans]
    poller = select.epoll()
    by_fd = {}
    for sender in senders:
        poller.register(sender.sock.fileno(), select.EPOLLIN)
        by_fd[sender.sock.fileno()] = sender
    sent = answered = failures = 0
    failure_codes: collections.Counter[int] = collections.Counter()
    start()
    cpu_started = time.process_time()
    first_send_s = time.perf_counter()
    try:
        for sender in senders[:request_count]:
            sender.send_next()
            sent += 1
        while answered < sent:
            for fd, _events in poller.poll():
                sender = by_fd[fd]
                for header, _body in sender.reader.frames():
                    if opaque_of(header) != sender.waiting_for:
                        raise SystemExit(
                            f"{BENCH}: answer {opaque_of(header)} for {sender.waiting_for}"
                        )
                    answered += 1
                    if bytes(header[: len(SUCCESS_PREFIX)]) != SUCCESS_PREFIX:
                        failures += 1
                        failure_codes[int(orjson.loads(bytes(header))["code"])] += 1
                    if sent < request_count:
                        sender.send_next()
                        sent += 1
        last_answer_s = time.perf_counter()
    finally:
        poller.close()
        for sender in senders:
            sender.sock.close()
    return LoadResult(
        answered - failures,
        failures,
        dict(failure_codes),
        first_send_s,
        last_answer_s,
        time.process_time() - cpu_started,
    )


def _child(
    results: SimpleQueue[LoadResult],
    barrier: Barrier,
    address: str,
    plans: Sequence[Sequence[tuple[int, bytes]]],
    request_count: int,
) -> None:
    results.put(drive(address, plans, request_count, barrier.wait))


def run_load(
    address: str, plans: Sequence[Sequence[tuple[int, bytes]]], request_count: int, procs: int
) -> list[LoadResult]:
    """drive() here (procs 1) or in `procs` forked processes, each with its share of the
    senders and requests, started together."""
    if procs == 1:
        return [drive(address, plans, request_count)]
    context = multiprocessing.get_context("fork")
    results: SimpleQueue[LoadResult] = context.SimpleQueue()
    barrier = context.Barrier(procs)
    children = []
    for index in range(procs):
        share = request_count // procs + (1 if index < request_count % procs else 0)
        child = context.Process(
            target=_child, args=(results, barrier, address, plans[index::procs], share)
        )
        child.start()
        children.append(child)
    try:
        found = [results.get() for _ in children]
        for child in children:
            child.join(CHILD_TIMEOUT_S)
    finally:
        for child in children:
            if child.is_alive() and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                child.join()
    return found


# --- the phases ---------------------------------------------------------------------------------


def phase(
    app: Appliance,
    name: str,
    plans: Sequence[Sequence[tuple[int, bytes]]],
    per_request: int,
    message_count: int,
    procs: int,
) -> dict[str, Any]:
    """Warm up, then send `message_count` messages; this phase's figures, keys prefixed."""
    run_load(app.broker_address, plans, WARMUP_REQUESTS_PER_CONNECTION * len(plans), procs)
    request_count = max(1, message_count // per_request)
    cpu_before = app.cpu_secs()
    roles_before = role_cpu_secs(app)
    results = run_load(app.broker_address, plans, request_count, procs)
    secs = max(r.last_answer_s for r in results) - min(r.first_send_s for r in results)
    roles_after = role_cpu_secs(app)
    broker_cpu_secs = app.cpu_secs() - cpu_before
    msgs = sum(r.acknowledged_requests for r in results) * per_request
    failures = sum(r.failures for r in results)
    failure_codes: collections.Counter[int] = collections.Counter()
    for result in results:
        failure_codes.update(result.failure_codes)
    client_cpu_pct = round(sum(r.client_cpu_secs for r in results) / secs * 100, 1)
    log(
        f"{BENCH}: {name}: {msgs:,} msgs in {secs:.2f} s = {msgs / secs:,.0f} msgs/s, "
        f"{failures} failed, client CPU {client_cpu_pct} %, broker CPU "
        f"{broker_cpu_secs / max(msgs, 1) * 1e6:.2f} us/msg"
    )
    return {
        f"{name}_msgs": msgs,
        f"{name}_secs": round(secs, 6),
        f"{name}_msgs_per_s": round(msgs / secs, 1),
        f"{name}_failures": failures,
        f"{name}_failure_codes": {str(code): n for code, n in sorted(failure_codes.items())},
        f"{name}_broker_cpu_us_per_msg": round(broker_cpu_secs / msgs * 1e6, 3)
        if app.pids and msgs
        else None,
        f"{name}_client_cpu_pct": client_cpu_pct,
        f"{name}_role_cpu_pct": cpu_percent(roles_before, roles_after, secs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=200_000, help="messages sent one by one")
    parser.add_argument("--batch-count", type=int, default=2_000_000, help="messages in batches")
    parser.add_argument("--batch", type=int, default=64, help="messages per batch request")
    parser.add_argument("--connections", type=int, default=64, help="senders, one in flight each")
    parser.add_argument("--procs", type=int, default=1, help="load processes")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    count = arguments.count
    batch_count = arguments.batch_count
    batch = arguments.batch
    connections = arguments.connections
    procs = arguments.procs
    if arguments.smoke:
        count, batch_count, connections = 1000, 16 * 1024, 16
    assert size_bytes > 0
    assert count > 0
    assert batch_count > 0
    assert batch > 0
    assert 1 <= procs <= connections
    topic = f"BenchSyncFlush{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    single_plans = [
        sender_frames(topic, index, "single", size_bytes, 1) for index in range(connections)
    ]
    batch_plans = [
        sender_frames(topic, connections + index, "batch", size_bytes, batch)
        for index in range(connections)
    ]
    with appliance(BENCH, arguments.namesrv, extra_conf, flush_disk_type="SYNC_FLUSH") as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        create_topic(app, topic)
        figures = phase(app, "single", single_plans, 1, count, procs)
        figures |= phase(app, "batch", batch_plans, batch, batch_count, procs)
    digest = hashlib.blake2b(digest_size=8)
    for plan in (*single_plans, *batch_plans):
        for _opaque, frame in plan:
            digest.update(frame_body(frame))
    digest.update(f"{figures['single_msgs']} {figures['batch_msgs']}".encode())
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": count,
            "batch_count": batch_count,
            "batch": batch,
            "connections": connections,
            "inflight_per_connection": 1,
            "procs": procs,
            "queues": DEFAULT_TOPIC_QUEUE_COUNT,
            "flush_disk_type": "SYNC_FLUSH" if arguments.namesrv is None else "the broker's",
        },
        figures["batch_msgs"],
        figures["batch_secs"],
        size_bytes,
        **figures,
        startup_secs=round(app.startup_secs, 3),
        checksum=digest.hexdigest(),
    )


if __name__ == "__main__":
    main()

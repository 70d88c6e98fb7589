"""bench/memory.py: how much memory does the appliance hold at idle, and after a million requests?

The figure is issue 4's: the sum of Pss_Anon + Pss_Shmem (/proc/PID/smaps_rollup; mapped store
files and shared libraries do not count) over every process of the appliance: name server,
supervisor and each role, as `mqbox status` measures it (`mqbox.admin.ops.status`, reused here).
The appliance runs with its default pools (from the CPU count) and ASYNC_FLUSH.

1. Idle: `--settle-secs` after every role reported ready, measure.
2. Fill: 8 queues of a topic created up front get 4,096 messages each (batched sends), so pulls
   have data to read.
3. Drive `--count` requests (1,000,000) over `--connections` connections (4), `--inflight`
   requests outstanding on each (32), pre-encoded frames cycling through a pool per connection.
   Every 16 requests of a connection are: 3 SEND_BATCH_MESSAGE (320, 16 messages each), 4
   SEND_MESSAGE_V2 (310), 4 PULL_MESSAGE (11, up to 32 messages, the subscription and
   commit-offset flags, no suspend, at offsets spread over the filled part), 1 HEART_BEAT (34, a
   producer and a push consumer of the connection's own group), 2 QUERY_CONSUMER_OFFSET (14), 1
   UPDATE_CONSUMER_OFFSET (15) and 1 GET_MAX_OFFSET (30); a connection is one client, as a real
   client's would be. Answers are matched by opaque and checked: sends and the rest must answer
   0; pulls 0, 19 or 20; offset queries 0 or 22. Anything else counts in `failures`.
   The first 1 % of them (at least 10,000, at most half) run first; `--settle-secs` later the
   "warm" figure is measured, then the rest run. The warm figure separates the one-time cost
   of a role's first requests (pages the zygote shared copy-on-write that the role's first
   work writes to, caches, buffers) from growth with the number of requests.
4. After: `--settle-secs` more, measure again.

Reported: `idle_pss_mb`, `after_pss_mb`, `ratio` (after / idle), `requests` (answered in step 3),
`failures`, `warm_pss_mb` and `ratio_to_warm` (after / warm), the per-process figures
(`idle_pss_by_process_mb`, `warm_...`, `after_...`) and the request rate of step 3 (`msgs` and
`secs` are the requests and the time of step 3). Targets (issue 4): idle <= 500 MB; after within
10 % of idle. `checksum` covers every frame body sent and the number of answers per kind.

Unless --namesrv is given, the script starts its own appliance in a temporary home on free ports
(_load.py's `appliance`) and stops it afterwards; with --namesrv it measures the appliance whose
home is `--home` (default ~/mqbox or $MQBOX_HOME, as `mqbox status`).

Usage: python bench/memory.py [--count N] [--size-bytes N] [--connections N] [--inflight N]
                              [--settle-secs S] [--namesrv host:port [--home DIR]] [--smoke]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import os
import select
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson
from _common import emit, log  # bench/ is sys.path[0]
from _load import (
    DEFAULT_TOPIC_QUEUE_COUNT,
    PRODUCER_GROUP,
    Appliance,
    Frames,
    appliance,
    batch_bodies,
    connect,
    create_topic,
    frame_body,
    send_frames,
    single_send_frame,
)
from produce import produce

from mqbox.admin import ops
from mqbox.protocol import make_request
from mqbox.protocol.codes import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    RequestCode,
)
from mqbox.protocol.command import encode_command
from mqbox.protocol.headers import (
    ConsumerData,
    HeartbeatData,
    ProducerData,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueueRequestHeader,
    SubscriptionData,
    UpdateConsumerOffsetRequestHeader,
)

BENCH: Final = "memory"
MB: Final = 1e6
POOL_SIZE: Final = 256  # pre-encoded frames per connection; opaques 0..255
BATCH: Final = 16  # messages per SEND_BATCH_MESSAGE of the mix
FILL_PER_QUEUE: Final = 4096
FILL_BATCH: Final = 64
PULL_COUNT_MAX: Final = 32
WARM_REQUESTS_MIN: Final = 10_000
# One connection's 16 requests (module docstring, step 3).
PATTERN: Final = (
    "batch",
    "single",
    "pull",
    "single",
    "query_offset",
    "batch",
    "pull",
    "single",
    "heartbeat",
    "pull",
    "batch",
    "single",
    "update_offset",
    "pull",
    "max_offset",
    "query_offset",
)
ACCEPTED_CODES: Final = {
    "batch": {0},
    "single": {0},
    "pull": {0, 19, 20},  # FOUND, NO_NEW_MSG, NO_MATCHED_MSG
    "heartbeat": {0},
    "query_offset": {0, 22},  # SUCCESS, QUERY_NOT_FOUND
    "update_offset": {0},
    "max_offset": {0},
}
FLAG_RESPONSE: Final = 1


# --- memory -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Memory:
    total_bytes: int
    by_process: dict[str, int]  # "supervisor", "namesrv" or a role id -> Pss_Anon + Pss_Shmem


def measure(home: Path) -> Memory:
    """Pss_Anon + Pss_Shmem of every process of the appliance in `home` (`mqbox status`)."""
    report = ops.status(home)
    if not report.running:
        raise SystemExit(f"{BENCH}: no appliance is running in {home}")
    by_process = {
        process.name: process.pss_anon_bytes + process.pss_shmem_bytes
        for process in report.processes
        if process.pid
    }
    return Memory(report.pss_bytes, by_process)


def in_mb(values: dict[str, int]) -> dict[str, float]:
    return {name: round(value / MB, 1) for name, value in values.items()}


# --- the request mix ----------------------------------------------------------------------------


def group_of(connection: int) -> str:
    return f"bench_memory_{connection}"


def mix_frame(topic: str, connection: int, slot: int, size_bytes: int) -> bytes:
    """The frame of one pool slot of one connection; the slot is its opaque."""
    kind = PATTERN[slot % len(PATTERN)]
    number = connection * POOL_SIZE + slot  # distinct over every connection's pool
    queue_id = number % DEFAULT_TOPIC_QUEUE_COUNT
    group = group_of(connection)
    queue_index = (number * PULL_COUNT_MAX) % FILL_PER_QUEUE
    ext: dict[str, str]
    body = b""
    if kind == "batch":
        bodies = batch_bodies(size_bytes, BATCH, 1, first=number)
        return send_frames(topic, bodies, [queue_id], slot)[0]
    if kind == "single":
        stamp = f"m{connection:04d}{slot:06d}".encode()
        return single_send_frame(topic, queue_id, size_bytes, stamp, slot)
    if kind == "pull":
        code = RequestCode.PULL_MESSAGE
        ext = PullMessageRequestHeader(
            group,
            topic,
            queue_id,
            queue_index,
            PULL_COUNT_MAX,
            PULL_FLAG_SUBSCRIPTION | PULL_FLAG_COMMIT_OFFSET,
            queue_index,
            0,
            0,
            "*",
        ).to_ext()
    elif kind == "heartbeat":
        code = RequestCode.HEART_BEAT
        ext = {}
        consumer = ConsumerData(
            group,
            ConsumeType.CONSUME_PASSIVELY,
            MessageModel.CLUSTERING,
            ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
            (SubscriptionData(topic, "*"),),
        )
        body = HeartbeatData(
            f"127.0.0.1@bench-memory-{connection}",
            (ProducerData(PRODUCER_GROUP),),
            (consumer,),
        ).to_json()
    elif kind == "query_offset":
        code = RequestCode.QUERY_CONSUMER_OFFSET
        ext = QueryConsumerOffsetRequestHeader(group, topic, queue_id).to_ext()
    elif kind == "update_offset":
        code = RequestCode.UPDATE_CONSUMER_OFFSET
        ext = UpdateConsumerOffsetRequestHeader(group, topic, queue_id, queue_index).to_ext()
    else:
        assert kind == "max_offset", kind
        code = RequestCode.GET_MAX_OFFSET
        ext = QueueRequestHeader(topic, queue_id).to_ext()
    return encode_command(make_request(code, slot, ext, body=body))


class Client:
    """One connection: its pool, the slots in flight, what came back."""

    def __init__(self, address: str, frames: Sequence[bytes]) -> None:
        self.sock = connect(address)
        self.reader = Frames(self.sock)
        self.frames = frames
        self.in_flight = bytearray(len(frames))  # 1 while that slot's opaque awaits its answer
        self.in_flight_count = 0
        self.sent = 0

    def send_more(self, inflight: int, budget: int) -> int:
        """Send up to `budget` more requests while fewer than `inflight` are out and the next
        slot is free; how many were sent."""
        batch: list[bytes] = []
        pool = len(self.frames)
        while len(batch) < budget and self.in_flight_count < inflight:
            slot = self.sent % pool
            if self.in_flight[slot]:
                break
            self.in_flight[slot] = 1
            self.in_flight_count += 1
            self.sent += 1
            batch.append(self.frames[slot])
        if batch:
            self.sock.sendall(b"".join(batch))
        return len(batch)


@dataclasses.dataclass
class DriveResult:
    requests: int
    secs: float
    failures: int
    by_kind: dict[str, int]
    codes: dict[str, dict[str, int]]
    broker_requests: int  # requests the broker sent us (NOTIFY_CONSUMER_IDS_CHANGED), skipped

    def plus(self, other: DriveResult) -> DriveResult:
        codes = {kind: dict(counts) for kind, counts in self.codes.items()}
        for kind, counts in other.codes.items():
            for code, n in counts.items():
                codes.setdefault(kind, {})[code] = codes.get(kind, {}).get(code, 0) + n
        return DriveResult(
            self.requests + other.requests,
            self.secs + other.secs,
            self.failures + other.failures,
            {kind: self.by_kind.get(kind, 0) + n for kind, n in other.by_kind.items()},
            {kind: dict(sorted(counts.items())) for kind, counts in codes.items()},
            self.broker_requests + other.broker_requests,
        )


def drive(
    address: str, pools: Sequence[Sequence[bytes]], request_count: int, inflight: int
) -> DriveResult:
    """`request_count` requests over one Client per pool, `inflight` outstanding on each."""
    clients = [Client(address, pool) for pool in pools]
    poller = select.epoll()
    by_fd = {client.sock.fileno(): client for client in clients}
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    codes: dict[str, collections.Counter[int]] = {
        kind: collections.Counter() for kind in ACCEPTED_CODES
    }
    sent = answered = failures = broker_requests = 0
    started = time.perf_counter()
    try:
        for client in clients:
            sent += client.send_more(inflight, request_count - sent)
        while answered < sent:
            for fd, _events in poller.poll():
                client = by_fd[fd]
                for header_view, _body in client.reader.frames():
                    header = orjson.loads(bytes(header_view))
                    if not int(header.get("flag", 0)) & FLAG_RESPONSE:
                        broker_requests += 1
                        continue
                    slot = int(header["opaque"])
                    if not 0 <= slot < len(client.frames) or not client.in_flight[slot]:
                        raise SystemExit(f"{BENCH}: an answer to opaque {slot}, not in flight")
                    client.in_flight[slot] = 0
                    client.in_flight_count -= 1
                    answered += 1
                    kind = PATTERN[slot % len(PATTERN)]
                    code = int(header["code"])
                    codes[kind][code] += 1
                    if code not in ACCEPTED_CODES[kind]:
                        failures += 1
                        if failures <= 10:
                            log(f"{BENCH}: {kind} answered {code}: {header.get('remark')}")
                sent += client.send_more(inflight, request_count - sent)
    finally:
        poller.close()
        for client in clients:
            client.sock.close()
    return DriveResult(
        answered,
        time.perf_counter() - started,
        failures,
        {kind: sum(counter.values()) for kind, counter in codes.items()},
        {
            kind: {str(code): n for code, n in sorted(counter.items())}
            for kind, counter in codes.items()
        },
        broker_requests,
    )


def fill(app: Appliance, topic: str, size_bytes: int) -> None:
    """FILL_PER_QUEUE messages in each queue of `topic`, so the mix's pulls find data."""
    request_count = FILL_PER_QUEUE * DEFAULT_TOPIC_QUEUE_COUNT // FILL_BATCH
    queue_ids = list(range(DEFAULT_TOPIC_QUEUE_COUNT))
    bodies = batch_bodies(size_bytes, FILL_BATCH, DEFAULT_TOPIC_QUEUE_COUNT, first=1 << 20)
    frames = send_frames(topic, bodies, queue_ids, 1)
    produce(app.broker_address, frames, 1, FILL_BATCH, request_count, len(frames), app)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="requests of the mix")
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--connections", type=int, default=4, help="client connections")
    parser.add_argument("--inflight", type=int, default=32, help="outstanding per connection")
    parser.add_argument("--settle-secs", type=float, default=5.0, help="wait before measuring")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--home", type=Path, help="with --namesrv: that appliance's home")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    count = arguments.count
    size_bytes = arguments.size_bytes
    connections = arguments.connections
    inflight = arguments.inflight
    settle_secs = arguments.settle_secs
    if arguments.smoke:
        count, settle_secs = 3200, 0.5
    assert count > 0
    assert size_bytes > 0
    assert connections > 0
    assert 0 < inflight <= POOL_SIZE
    topic = f"BenchMemory{os.getpid()}"
    pools = [
        [mix_frame(topic, connection, slot, size_bytes) for slot in range(POOL_SIZE)]
        for connection in range(connections)
    ]
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    with appliance(BENCH, arguments.namesrv, extra_conf) as app:
        home = app.home if app.home is not None else ops.home_dir(arguments.home)
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        time.sleep(settle_secs)
        idle = measure(home)
        log(f"{BENCH}: idle: {idle.total_bytes / MB:.1f} MB: {in_mb(idle.by_process)}")
        create_topic(app, topic)
        fill(app, topic, size_bytes)
        warm_count = min(count // 2, max(WARM_REQUESTS_MIN, count // 100))
        warm_result = drive(app.broker_address, pools, warm_count, inflight)
        time.sleep(settle_secs)
        warm = measure(home)
        log(f"{BENCH}: after {warm_count:,} requests: {warm.total_bytes / MB:.1f} MB")
        result = drive(app.broker_address, pools, count - warm_count, inflight).plus(warm_result)
        log(
            f"{BENCH}: {result.requests:,} requests in {result.secs:.1f} s "
            f"({result.requests / result.secs:,.0f}/s), {result.failures} failed: {result.codes}"
        )
        time.sleep(settle_secs)
        after = measure(home)
        log(f"{BENCH}: after: {after.total_bytes / MB:.1f} MB: {in_mb(after.by_process)}")
    digest = hashlib.blake2b(digest_size=8)
    for pool in pools:
        for frame in pool:
            digest.update(frame_body(frame))
    digest.update(orjson.dumps(result.by_kind, option=orjson.OPT_SORT_KEYS))
    extra: dict[str, Any] = {
        "idle_pss_mb": round(idle.total_bytes / MB, 1),
        "after_pss_mb": round(after.total_bytes / MB, 1),
        "ratio": round(after.total_bytes / idle.total_bytes, 4),
        "warm_pss_mb": round(warm.total_bytes / MB, 1),
        "warm_requests": warm_result.requests,
        "ratio_to_warm": round(after.total_bytes / warm.total_bytes, 4),
        "requests": result.requests,
        "failures": result.failures,
        "requests_per_s": round(result.requests / result.secs, 1),
        "requests_by_kind": result.by_kind,
        "codes_by_kind": result.codes,
        "broker_requests_skipped": result.broker_requests,
        "process_count": len(idle.by_process),
        "idle_pss_by_process_mb": in_mb(idle.by_process),
        "warm_pss_by_process_mb": in_mb(warm.by_process),
        "after_pss_by_process_mb": in_mb(after.by_process),
        "startup_secs": round(app.startup_secs, 3),
        "checksum": digest.hexdigest(),
    }
    emit(
        BENCH,
        {
            "count": count,
            "size_bytes": size_bytes,
            "connections": connections,
            "inflight": inflight,
            "settle_secs": settle_secs,
            "batch": BATCH,
            "pattern": list(PATTERN),
            "pools": "default",
            "flush_disk_type": "ASYNC_FLUSH" if arguments.namesrv is None else "the broker's",
        },
        result.requests,
        result.secs,
        0,
        **extra,
    )


if __name__ == "__main__":
    main()

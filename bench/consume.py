"""bench/consume.py: how fast does one consumer read a filled store through the broker?

The script fills a topic of `--queues` queues with `--count` messages of `--size-bytes` bytes (the
produce bench's batched sends), waits until the dispatcher has published them all, then one
client process pulls them back over the raw remoting protocol on one connection: one PULL
outstanding per queue, maxMsgNums 1024 (mqbox honours up to 1024 per pull and 4 MiB per answer),
no suspend bit, subscription "*". The broker answers from the consume queues and the reactor
sends each body from the commit-log files with os.sendfile; the client counts messages by
nextBeginOffset and folds every body byte into a CRC32 (`checksum`), so it touches all the data
it was sent without decoding it record by record. Targets: >= 1,000,000 msgs/s at 128 B, >=
1,000 MB/s at 1 KiB. Figures are the median of `--repeat` full reads of the same data;
broker_cpu_us_per_msg counts every broker process (supervisor and roles) as in produce.py.

Unless --namesrv is given, the script starts its own appliance in a temporary home on free ports
(_load.py's `appliance`) and stops it afterwards.

Usage: python bench/consume.py [--size-bytes N] [--count N] [--queues N] [--repeat N]
                               [--namesrv host:port] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import time
import zlib
from typing import Any

import orjson
from _common import emit, log  # bench/ is sys.path[0]
from _load import Appliance, Frames, appliance, batch_bodies, connect, send_frames
from produce import produce

from mqbox.protocol import make_request
from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION, RequestCode
from mqbox.protocol.command import encode_command
from mqbox.protocol.headers import PullMessageRequestHeader

BENCH = "consume"
PULL_MESSAGE_COUNT_MAX = 1024
CODE_SUCCESS = 0
CODE_NOT_FOUND = 19


@dataclasses.dataclass
class ConsumeResult:
    msgs: int
    body_bytes: int
    secs: float
    broker_cpu_secs: float
    checksum: int


def pull_frame(topic: str, queue_id: int, queue_index: int, opaque: int) -> bytes:
    header = PullMessageRequestHeader(
        "bench_consumer",
        topic,
        queue_id,
        queue_index,
        PULL_MESSAGE_COUNT_MAX,
        PULL_FLAG_SUBSCRIPTION,
        0,
        0,
        0,
        "*",
    )
    return encode_command(make_request(RequestCode.PULL_MESSAGE, opaque, header.to_ext()))


def consume(address: str, topic: str, queue_counts: list[int], app: Appliance) -> ConsumeResult:
    """Read every queue from 0 to its count, one pull outstanding per queue."""
    sock = connect(address)
    reader = Frames(sock)
    offsets = [0] * len(queue_counts)
    crc = 0
    msgs = 0
    body_bytes = 0
    active = {queue_id for queue_id, count in enumerate(queue_counts) if count > 0}
    cpu_before = app.cpu_secs()
    started = time.perf_counter()
    try:
        # The opaque is the queue id: one pull per queue is outstanding at a time.
        sock.sendall(b"".join(pull_frame(topic, queue_id, 0, queue_id) for queue_id in active))
        while active:
            requests: list[bytes] = []
            for header_view, body in reader.frames():
                header = orjson.loads(bytes(header_view))
                queue_id = int(header["opaque"])
                code = int(header["code"])
                ext = header.get("extFields") or {}
                if code == CODE_SUCCESS:
                    next_offset = int(ext["nextBeginOffset"])
                    msgs += next_offset - offsets[queue_id]
                    body_bytes += len(body)
                    crc = zlib.crc32(body, crc)
                    offsets[queue_id] = next_offset
                elif code != CODE_NOT_FOUND:
                    raise SystemExit(f"{BENCH}: pull answered {code}: {header.get('remark')}")
                if offsets[queue_id] >= queue_counts[queue_id]:
                    active.discard(queue_id)
                    continue
                requests.append(pull_frame(topic, queue_id, offsets[queue_id], queue_id))
            if requests:
                sock.sendall(b"".join(requests))
    finally:
        sock.close()
    secs = time.perf_counter() - started
    return ConsumeResult(msgs, body_bytes, secs, app.cpu_secs() - cpu_before, crc)


def fill(app: Appliance, topic: str, size_bytes: int, count: int, queue_count: int) -> list[int]:
    """Store `count` messages spread over the queues; the per-queue counts."""
    batch = max(16, min(1000, (512 * 1024) // (size_bytes + 80)))
    request_count = max(queue_count, count // batch)
    pool_size = max(32, queue_count)
    bodies = batch_bodies(size_bytes, batch, pool_size)
    queue_ids = list(range(queue_count))
    frames = send_frames(topic, bodies, queue_ids, 1)
    started = time.perf_counter()
    produce(app.broker_address, frames, 1, batch, request_count, min(8, pool_size), app)
    log(
        f"{BENCH}: stored {request_count * batch} messages in {time.perf_counter() - started:.1f} s"
    )
    counts = [0] * queue_count
    for index in range(request_count):
        counts[queue_ids[index % len(frames) % queue_count]] += batch
    return counts


def wait_dispatched(address: str, topic: str, queue_counts: list[int]) -> None:
    """Until a pull at each queue's last index finds its message (the dispatcher caught up)."""
    deadline = time.monotonic() + 120
    sock: socket.socket = connect(address)
    reader = Frames(sock)
    try:
        for queue_id, count in enumerate(queue_counts):
            while True:
                sock.sendall(pull_frame(topic, queue_id, count - 1, 1))
                found = reader.frames()
                while not found:
                    found = reader.frames()
                header = orjson.loads(bytes(found[0][0]))
                if int(header["code"]) == CODE_SUCCESS:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{BENCH}: queue {queue_id} was not dispatched in time")
                time.sleep(0.05)
    finally:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages stored and read")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic (<= 8)")
    parser.add_argument("--repeat", type=int, default=3, help="reads; the median is reported")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    count = arguments.count
    queue_count = arguments.queues
    repeat = arguments.repeat
    if arguments.smoke:
        count, queue_count, repeat = 2000, 2, 1
    assert size_bytes > 0
    assert 1 <= queue_count <= 8  # TBW102's write queues cap an auto-created topic
    assert repeat > 0
    topic = f"BenchConsume{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    with appliance(BENCH, arguments.namesrv, extra_conf) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        queue_counts = fill(app, topic, size_bytes, count, queue_count)
        wait_dispatched(app.broker_address, topic, queue_counts)
        results = []
        for index in range(repeat):
            result = consume(app.broker_address, topic, queue_counts, app)
            assert result.msgs == sum(queue_counts), (result.msgs, sum(queue_counts))
            log(
                f"{BENCH}: run {index + 1}: {result.msgs / result.secs:,.0f} msgs/s, "
                f"{result.msgs * size_bytes / result.secs / 1e6:,.1f} MB/s (bodies), "
                f"{result.body_bytes / result.secs / 1e6:,.1f} MB/s on the wire, broker CPU "
                f"{result.broker_cpu_secs / result.msgs * 1e6:.2f} us/msg"
            )
            results.append(result)
    rates = [result.msgs / result.secs for result in results]
    median = sorted(results, key=lambda result: result.msgs / result.secs)[len(results) // 2]
    assert len({result.checksum for result in results}) == 1, "reads of one store differ"
    extra: dict[str, Any] = {
        "msgs_per_s_runs": [round(rate, 1) for rate in rates],
        "msgs_per_s_median": round(statistics.median(rates), 1),
        "wire_MB_per_s": round(median.body_bytes / median.secs / 1e6, 1),
        "broker_cpu_us_per_msg": round(median.broker_cpu_secs / median.msgs * 1e6, 3)
        if app.pids
        else None,
        "startup_secs": round(app.startup_secs, 3),
        "checksum": f"{median.checksum:08x}",
    }
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": median.msgs,
            "queues": queue_count,
            "pull_message_count_max": PULL_MESSAGE_COUNT_MAX,
            "repeat": repeat,
        },
        median.msgs,
        median.secs,
        size_bytes,
        **extra,
    )


if __name__ == "__main__":
    main()

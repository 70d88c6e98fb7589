"""bench/client_produce.py: how fast does the Producer store messages, next to the raw protocol?

Two pipelines of `--size-bytes` (128 B) messages to a topic of 8 queues created up front, on an
ASYNC_FLUSH broker, each beside its raw-protocol twin in the same run:

- batch: Producer.send_batch_async of `--batch` plain bodies per request, `--inflight` requests
  outstanding, against bench/produce.py's `produce` with the same batch and inflight (its
  pre-encoded SEND_BATCH_MESSAGE frames, a UNIQ_KEY per message, one queue). The target is the
  issue's: the client at >= 80 % of the raw figure.
- async: Producer.send_async of one message per request, `--window` outstanding, against the
  same `produce` loop over pre-encoded SEND_MESSAGE_V2 (310) frames of one message each.

The raw side encodes a pool of frames once; the client encodes every request afresh (a UNIQ_KEY
per message, properties, batch body, header) from a pool of body lists built up front, which is
what a producer does. A message counts once its request was answered SEND_OK. Every run is done
`--repeat` times, raw and client alternating; the medians are reported: `msgs_per_s` (= the
client batch pipeline's), `batch_msgs_per_s_median`, `raw_batch_msgs_per_s_median`,
`batch_ratio`, `async_msgs_per_s_median`, `raw_single_msgs_per_s_median`, `async_ratio`,
`met_batch_80_percent`, the runs, and per message the broker's CPU and this process's (the
client's side, or the raw loop's). `checksum` covers every body the client sent and the counts.

Unless --namesrv is given, the script starts its own appliance (bench/_load.py) and stops it.

Usage: python bench/client_produce.py [--size-bytes N] [--count N] [--batch N] [--inflight N]
                                      [--single-count N] [--window N] [--repeat N]
                                      [--namesrv host:port] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Final

from _common import emit, log  # bench/ is sys.path[0]
from _load import (
    Appliance,
    appliance,
    batch_bodies,
    create_topic,
    message_body,
    send_frames,
    single_send_frame,
)
from produce import produce

from mqbox.client import Producer, SendResult, SendStatus

BENCH: Final = "client_produce"
FRAME_POOL_SIZE: Final = 32
TARGET_RATIO: Final = 0.8
DONE_WAIT_S: Final = 120.0


@dataclasses.dataclass
class Run:
    msgs: int
    secs: float
    broker_cpu_secs: float
    process_cpu_secs: float

    @property
    def rate(self) -> float:
        return self.msgs / self.secs


def timed(app: Appliance, work: Callable[[], int]) -> Run:
    """Run `work` (it returns the messages it stored) with wall, broker and process CPU clocks."""
    broker_before = app.cpu_secs()
    process_before = time.process_time()
    started = time.perf_counter()
    msgs = work()
    secs = time.perf_counter() - started
    return Run(msgs, secs, app.cpu_secs() - broker_before, time.process_time() - process_before)


def client_pipeline(
    send: Callable[[int], Future[SendResult]], request_count: int, inflight: int, per_request: int
) -> int:
    """`request_count` calls of `send(i)`, at most `inflight` unanswered; the messages stored.
    SystemExit on any failure: a failed send is not a figure."""
    window = threading.Semaphore(inflight)
    done = threading.Event()
    answered = [0]
    errors: list[BaseException] = []

    def on_done(future: Future[SendResult]) -> None:
        error = future.exception()
        if error is not None or future.result().status is not SendStatus.SEND_OK:
            errors.append(error or AssertionError(future.result().status))
        answered[0] += 1
        if answered[0] == request_count:
            done.set()
        window.release()

    for index in range(request_count):
        window.acquire()
        if errors:
            break
        send(index).add_done_callback(on_done)
    if not errors and not done.wait(DONE_WAIT_S):
        raise SystemExit(f"{BENCH}: {request_count - answered[0]} sends never finished")
    if errors:
        raise SystemExit(f"{BENCH}: a client send failed: {errors[0]!r}")
    return request_count * per_request


def median(runs: Sequence[Run]) -> Run:
    return sorted(runs, key=lambda run: run.rate)[len(runs) // 2]


def per_msg_us(run: Run, cpu_secs: float) -> float:
    return round(cpu_secs / run.msgs * 1e6, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=1_000_000, help="batched messages per run")
    parser.add_argument("--batch", type=int, default=0, help="messages per request (0: auto)")
    parser.add_argument("--inflight", type=int, default=8, help="batch requests outstanding")
    parser.add_argument("--single-count", type=int, default=20_000, help="single sends per run")
    parser.add_argument("--window", type=int, default=64, help="single sends outstanding")
    parser.add_argument("--repeat", type=int, default=3, help="runs; medians are reported")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    # produce.py's batch for the size: about 512 KiB of messages per request.
    batch = arguments.batch or max(16, min(1000, (512 * 1024) // (size_bytes + 80)))
    count, inflight, repeat = arguments.count, arguments.inflight, arguments.repeat
    single_count, window = arguments.single_count, arguments.window
    if arguments.smoke:
        batch, count, inflight, repeat, single_count, window = 50, 1000, 4, 1, 200, 16
    assert size_bytes > 0
    assert batch > 0
    assert repeat > 0
    request_count = max(1, count // batch)
    pool_size = max(FRAME_POOL_SIZE, inflight)
    topic = f"BenchClientProduce{os.getpid()}"
    raw_batch_frames_bodies = batch_bodies(size_bytes, batch, pool_size)
    client_pool = [
        [message_body(f"{frame:08d}{number:08d}".encode(), size_bytes) for number in range(batch)]
        for frame in range(pool_size)
    ]
    single_bodies = [body for bodies in client_pool for body in bodies][: max(pool_size, window)]
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    runs: dict[str, list[Run]] = {"raw_batch": [], "batch": [], "raw_single": [], "async": []}
    with appliance(BENCH, arguments.namesrv, extra_conf) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        create_topic(app, topic)
        batch_frames = send_frames(topic, raw_batch_frames_bodies, [0], 1)
        single_frames = [
            single_send_frame(topic, index % 8, size_bytes, f"s{index:08d}".encode(), 1 + index)
            for index in range(len(single_bodies))
        ]

        def raw(frames: list[bytes], per_request: int, requests: int, depth: int) -> Run:
            result = produce(app.broker_address, frames, 1, per_request, requests, depth, app)
            return Run(result.msgs, result.secs, result.broker_cpu_secs, result.secs)

        with Producer("bench_client_produce", app.namesrv_address) as producer:

            def client_batch() -> int:
                return client_pipeline(
                    lambda i: producer.send_batch_async(topic, client_pool[i % pool_size]),
                    request_count,
                    inflight,
                    batch,
                )

            def client_async() -> int:
                return client_pipeline(
                    lambda i: producer.send_async(topic, single_bodies[i % len(single_bodies)]),
                    single_count,
                    window,
                    1,
                )

            # Warm-ups: connections, routes, the broker's first segment pages.
            raw(batch_frames, batch, min(request_count, 2 * pool_size), inflight)
            timed(app, client_batch)
            for index in range(repeat):
                raw_batch = raw(batch_frames, batch, request_count, inflight)
                runs["raw_batch"].append(raw_batch)
                runs["batch"].append(timed(app, client_batch))
                runs["raw_single"].append(raw(single_frames, 1, single_count, window))
                runs["async"].append(timed(app, client_async))
                log(
                    f"{BENCH}: run {index + 1}: batch {runs['batch'][-1].rate:,.0f} vs raw "
                    f"{raw_batch.rate:,.0f} msgs/s; async {runs['async'][-1].rate:,.0f} vs raw "
                    f"{runs['raw_single'][-1].rate:,.0f} msgs/s"
                )
    medians = {name: median(found) for name, found in runs.items()}
    rates = {name: statistics.median(run.rate for run in found) for name, found in runs.items()}
    batch_ratio = rates["batch"] / rates["raw_batch"]
    digest = hashlib.blake2b(digest_size=8)
    for bodies in client_pool:
        for body in bodies:
            digest.update(body)
    digest.update(f"{request_count} {batch} {single_count}".encode())
    with_cpu = bool(app.pids)
    extra: dict[str, Any] = {
        "batch_msgs_per_s_median": round(rates["batch"], 1),
        "raw_batch_msgs_per_s_median": round(rates["raw_batch"], 1),
        "batch_ratio": round(batch_ratio, 3),
        "met_batch_80_percent": batch_ratio >= TARGET_RATIO,
        "async_msgs_per_s_median": round(rates["async"], 1),
        "raw_single_msgs_per_s_median": round(rates["raw_single"], 1),
        "async_ratio": round(rates["async"] / rates["raw_single"], 3),
        "runs_msgs_per_s": {
            name: [round(run.rate, 1) for run in found] for name, found in runs.items()
        },
        "broker_cpu_us_per_msg": {
            name: per_msg_us(run, run.broker_cpu_secs) if with_cpu else None
            for name, run in medians.items()
        },
        "client_cpu_us_per_msg": {
            name: per_msg_us(run, run.process_cpu_secs)
            for name, run in medians.items()
            if name in ("batch", "async")
        },
        "startup_secs": round(app.startup_secs, 3),
        "checksum": digest.hexdigest(),
    }
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": request_count * batch,
            "batch": batch,
            "inflight": inflight,
            "single_count": single_count,
            "window": window,
            "repeat": repeat,
            "flush_disk_type": "ASYNC_FLUSH" if arguments.namesrv is None else "the broker's",
            "latency_fault_enable": False,
        },
        medians["batch"].msgs,
        medians["batch"].secs,
        size_bytes,
        **extra,
    )


if __name__ == "__main__":
    main()

"""bench/client_latency.py: how long does one Producer.send take, next to the raw protocol?

One send at a time, `--size-bytes` bodies (128 B), to a topic of 8 queues created up front, on an
ASYNC_FLUSH broker, three ways in the same run:

- client: mqbox.client.Producer.send (SEND_MESSAGE_V2, 310; UNIQ_KEY and WAIT properties; queue
  round robin; latency fault avoidance off, RocketMQ's default), each call timed with
  time.perf_counter_ns around `send` alone;
- raw: bench/latency.py's raw part (RemotingClient, one SEND_MESSAGE (10) in flight), the
  figure the client is held to: the target is a client p50 within 30 us of the raw p50;
- cpp: bench/latency.py's C++ part (the official client of PyPI rocketmq==0.4.4 in a child
  process), which the client's p50 must beat.

The box is noisy and the broker's own figure drifts by tens, at times hundreds, of microseconds
from one minute to the next, so raw and client sends alternate one by one (the order swapped
every round) on two connections to the same broker: both ways see the same broker at the same
moment. The C++ child runs once, before them (bench/latency.py's way). The raw time covers
`invoke` alone, the client's the whole `send` (checks, UNIQ_KEY, encoding included). Every
answer must be SEND_OK; failed sends are counted and left out. Reported: `p50_us`, `p99_us`,
`p999_us` of the client; `client_*`, `raw_*` and `cpp_*` figures (as latency.py reports them);
`client_minus_raw_p50_us`; `met_raw_p50_within_30_us` and `met_below_cpp_p50`. `checksum`
covers the body and how many sends each way came back SEND_OK.

Usage: python bench/client_latency.py [--size-bytes N] [--count N] [--warmup N]
                                      [--namesrv host:port] [--no-cpp] [--smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any, Final

from _common import emit, log, percentiles_us  # bench/ is sys.path[0]
from _load import Appliance, appliance, create_topic, message_body, role_cpu_secs
from latency import Part, cpp_part, cpu_delta, figures, raw_send

from mqbox.client import ClientError, Producer, SendStatus
from mqbox.client.remoting import RemotingClient

BENCH: Final = "client_latency"
SEND_TIMEOUT_MS: Final = 3000
RAW_TARGET_US: Final = 30.0
FAILURES_MAX: Final = 20  # then the broker is down, not slow: stop and say so


def interleaved_parts(
    app: Appliance, producer: Producer, topic: str, body: bytes, count: int, warmup: int
) -> tuple[Part, Part]:
    """(raw, client): `warmup + count` rounds of one raw send and one Producer.send, their order
    swapped every round, each timed around the call alone; failures counted and left out."""
    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {"raw": [], "client": []}
    failures = {"raw": 0, "client": 0}
    cpu_before = app.cpu_secs()
    roles_before = role_cpu_secs(app)
    started = time.perf_counter()
    with RemotingClient(app.broker_address, SEND_TIMEOUT_MS) as raw_client:
        for number in range(warmup + count):
            for way in ("raw", "client") if number % 2 == 0 else ("client", "raw"):
                if way == "raw":
                    elapsed_ns = raw_send(raw_client, topic, body, number)
                else:
                    sent_ns = clock()
                    try:
                        ok = producer.send(topic, body).status is SendStatus.SEND_OK
                    except ClientError as error:
                        log(f"{BENCH}: client send failed: {error}")
                        ok = False
                    elapsed_ns = clock() - sent_ns if ok else None
                if elapsed_ns is None:
                    failures[way] += 1
                    if failures[way] >= FAILURES_MAX:
                        raise SystemExit(f"{BENCH}: {failures[way]} {way} sends failed")
                elif number >= warmup:
                    samples[way].append(elapsed_ns)
    secs = time.perf_counter() - started
    roles = cpu_delta(roles_before, role_cpu_secs(app))
    # Broker CPU cannot be told apart per way: each Part carries half of it.
    cpu_secs = (app.cpu_secs() - cpu_before) / 2
    halves = {role: value / 2 for role, value in roles.items()}
    sends = warmup + count
    return (
        Part(samples["raw"], failures["raw"], secs / 2, cpu_secs, sends, halves),
        Part(samples["client"], failures["client"], secs / 2, cpu_secs, sends, halves),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=10_000, help="timed sends each way")
    parser.add_argument("--warmup", type=int, default=1_000, help="untimed sends first")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--no-cpp", action="store_true", help="skip the official C++ client")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    count, warmup = arguments.count, arguments.warmup
    with_cpp = not arguments.no_cpp
    if arguments.smoke:
        count, warmup, with_cpp = 100, 20, False
    assert size_bytes > 0
    assert count > 0
    assert warmup >= 0
    body = message_body(b"mqbox client latency ", size_bytes)
    topic = f"BenchClientLatency{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    with appliance(BENCH, arguments.namesrv, extra_conf) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        create_topic(app, topic)
        cpp = cpp_part(app, topic, body, count, warmup) if with_cpp else None
        if cpp is not None:
            log(f"{BENCH}: cpp: {percentiles_us(cpp.samples_ns)}, {cpp.failures} failed")
        with Producer(
            "bench_client_latency", app.namesrv_address, send_timeout_ms=SEND_TIMEOUT_MS
        ) as producer:
            raw, client = interleaved_parts(app, producer, topic, body, count, warmup)
        log(f"{BENCH}: raw: {percentiles_us(raw.samples_ns)}, {raw.failures} failed")
        log(f"{BENCH}: client: {percentiles_us(client.samples_ns)}, {client.failures} failed")
    with_cpu = bool(app.pids)
    client_p50 = percentiles_us(client.samples_ns)["p50_us"]
    raw_p50 = percentiles_us(raw.samples_ns)["p50_us"]
    cpp_p50 = percentiles_us(cpp.samples_ns)["p50_us"] if cpp is not None else None
    difference = None if client_p50 is None or raw_p50 is None else client_p50 - raw_p50
    digest = hashlib.blake2b(body, digest_size=8)
    digest.update(f"{len(client.samples_ns)} {len(raw.samples_ns)}".encode())
    extra: dict[str, Any] = {
        **percentiles_us(client.samples_ns),
        **figures("client", client, with_cpu),
        **figures("raw", raw, with_cpu),
        "client_minus_raw_p50_us": None if difference is None else round(difference, 2),
        "met_raw_p50_within_30_us": None if difference is None else difference <= RAW_TARGET_US,
        "startup_secs": round(app.startup_secs, 3),
        "checksum": digest.hexdigest(),
    }
    if cpp is not None:
        extra.update(figures("cpp", cpp, with_cpu))
        extra["met_below_cpp_p50"] = (
            None if client_p50 is None or cpp_p50 is None else client_p50 < cpp_p50
        )
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": count,
            "warmup": warmup,
            "interleaved": True,
            "inflight": 1,
            "queues": 8,
            "cpp": cpp is not None,
            "latency_fault_enable": False,
            "flush_disk_type": "ASYNC_FLUSH" if arguments.namesrv is None else "the broker's",
        },
        len(client.samples_ns),
        client.secs,
        size_bytes,
        **extra,
    )


if __name__ == "__main__":
    main()

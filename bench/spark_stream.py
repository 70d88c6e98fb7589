"""bench/spark_stream.py: end to end through Structured Streaming, how long from a message being
stored in the input topic to its result being stored in the output topic?

A producer thread sends `--rate` messages/s (50,000) of `--size-bytes` (128 B) to a topic of
`--queues` queues for `--secs` seconds (batches of `--batch` every batch/rate seconds, paced by
the clock; it reports the rate it reached). A streaming query started before, with a
processingTime trigger of `--trigger-ms` (1000), copies each message to an output topic with the
input's store time as a property (exactly-once sink). A warm-up of one second at 1,000 msgs/s
comes out first (the first micro-batches with data start the Python workers: seconds each), and
only messages stored after it count. Once the output holds every message, a
batch read computes each message's latency, output storeTimestamp minus input storeTimestamp
(milliseconds, both stamped by the broker), and Spark's exact percentiles. Reported: `p50_us`,
`p99_us` (of that latency), `msgs_per_s` (the producer's achieved rate), `trigger_ms`,
`met_p99_under_trigger_plus_1s` (the issue's target).

Usage: python bench/spark_stream.py [--rate N] [--secs S] [--size-bytes N] [--queues N]
                                    [--batch N] [--trigger-ms N] [--smoke]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Final

from _common import checksum, emit, log  # bench/ is sys.path[0]
from _load import appliance, create_topic
from _spark import session

from mqbox.client import Producer, SendResult
from mqbox.client.pull import max_offset
from mqbox.client.transport import Transport

BENCH: Final = "spark_stream"
SOURCE: Final = "BenchStreamIn"
SINK: Final = "BenchStreamOut"
DRAIN_WAIT_S: Final = 300.0


def stored(broker_address: str, topic: str, queues: int) -> int:
    with Transport(broker_address) as broker:
        return sum(max_offset(broker, topic, queue) for queue in range(queues))


def produce_at_rate(
    namesrv: str, rate: int, secs: float, batch: int, body: bytes, out: dict[str, float]
) -> None:
    """Send `rate` msgs/s for `secs`; out["sent"], out["secs"]."""
    interval = batch / rate
    sent = 0
    with Producer("bench_spark_stream", namesrv) as producer:
        pending: deque[Future[SendResult]] = deque()
        begin = time.perf_counter()
        tick = 0
        while (now := time.perf_counter()) - begin < secs:
            due = begin + tick * interval
            if now < due:
                time.sleep(due - now)
            pending.append(producer.send_batch_async(SOURCE, [body] * batch))
            sent += batch
            tick += 1
            while pending and pending[0].done():
                pending.popleft().result()
        while pending:
            pending.popleft().result()
        out["secs"] = time.perf_counter() - begin
    out["sent"] = sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=int, default=50_000)
    parser.add_argument("--secs", type=float, default=20.0)
    parser.add_argument("--size-bytes", type=int, default=128)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--trigger-ms", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true")
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.rate, arguments.secs, arguments.batch = 1_000, 2.0, 50
    body = b"s" * arguments.size_bytes
    with appliance(BENCH, None) as app, tempfile.TemporaryDirectory() as checkpoint:
        create_topic(app, SOURCE, arguments.queues)
        create_topic(app, SINK, arguments.queues)
        spark, start_secs = session(BENCH)
        try:
            options = {"namesrvAddr": app.namesrv_address}
            query = (
                spark.readStream.format("mqbox")
                .options(**options, topic=SOURCE, startingOffsets="latest")
                .load()
                .selectExpr(
                    "body",
                    "map('inStore', cast(unix_millis(storeTimestamp) AS string)) AS properties",
                )
                .writeStream.format("mqbox")
                .options(**options, topic=SINK, checkpointLocation=checkpoint)
                .trigger(processingTime=f"{arguments.trigger_ms} milliseconds")
                .start()
            )
            while len(query.recentProgress) < 2:  # planned, and an empty batch ran
                assert query.exception() is None, query.exception()
                time.sleep(0.1)
            # Warm-up: the first micro-batches with data start the Python workers of the read
            # and the write (imports, kernels, the sink's Producer): seconds each. Measure after.
            warm: dict[str, float] = {}
            produce_at_rate(app.namesrv_address, 1_000, 1.0, 50, body, warm)
            deadline = time.monotonic() + DRAIN_WAIT_S
            while stored(app.broker_address, SINK, arguments.queues) < warm["sent"]:
                assert time.monotonic() < deadline, "the warm-up did not come out"
                time.sleep(0.1)
            measured_from_ms = time.time_ns() // 1_000_000
            produced: dict[str, float] = {}
            producer = threading.Thread(
                target=produce_at_rate,
                args=(
                    app.namesrv_address,
                    arguments.rate,
                    arguments.secs,
                    arguments.batch,
                    body,
                    produced,
                ),
            )
            producer.start()
            producer.join()
            sent = int(produced["sent"])
            deadline = time.monotonic() + DRAIN_WAIT_S
            while stored(app.broker_address, SINK, arguments.queues) < sent + warm["sent"]:
                assert query.exception() is None, query.exception()
                assert time.monotonic() < deadline, "the query did not catch up"
                time.sleep(0.2)
            query.stop()
            out = stored(app.broker_address, SINK, arguments.queues)
            latency = spark.read.format("mqbox").options(**options, topic=SINK).load()
            row = (
                latency.selectExpr(
                    "cast(properties['inStore'] AS bigint) AS stored_in",
                    "unix_millis(storeTimestamp) - cast(properties['inStore'] AS bigint) AS ms",
                )
                .where(f"stored_in >= {measured_from_ms}")
                .selectExpr(
                    "count(*) AS n", "percentile(ms, 0.5) AS p50", "percentile(ms, 0.99) AS p99"
                )
                .first()
            )
            assert row is not None
        finally:
            spark.stop()
    assert out == sent + warm["sent"], (out, sent, warm["sent"])
    assert row.n == sent, (row.n, sent)
    log(f"{sent} messages at {sent / produced['secs']:.0f}/s: p50 {row.p50} ms, p99 {row.p99} ms")
    emit(
        BENCH,
        vars(arguments),
        sent,
        produced["secs"],
        arguments.size_bytes,
        p50_us=float(row.p50) * 1000,
        p99_us=float(row.p99) * 1000,
        trigger_ms=arguments.trigger_ms,
        session_start_secs=round(start_secs, 2),
        met_p99_under_trigger_plus_1s=float(row.p99) < arguments.trigger_ms + 1000,
        checksum=checksum(repr((sent, out)).encode()),
    )


if __name__ == "__main__":
    main()

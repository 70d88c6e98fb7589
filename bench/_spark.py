"""Shared by the Spark bench scripts: filling a topic fast, and the local session.

Owns: `fill` (Producer.send_batch_async of 256 bodies a request, 16 requests outstanding) and
`session` (mqbox.spark.session.local_session, timed). Everything else is each script's own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from _common import log
from pyspark.sql import SparkSession

from mqbox.client import Producer, SendResult
from mqbox.spark.session import local_session

FILL_BATCH = 256
FILL_INFLIGHT = 16


def fill(namesrv: str, topic: str, count: int, body_of: Callable[[int], bytes]) -> float:
    """Send `count` messages `body_of(n)` to `topic`; the seconds it took."""
    begin = time.perf_counter()
    with Producer("bench_spark_fill", namesrv) as producer:
        pending: deque[Future[SendResult]] = deque()
        for first in range(0, count, FILL_BATCH):
            bodies = [body_of(n) for n in range(first, min(first + FILL_BATCH, count))]
            while len(pending) >= FILL_INFLIGHT:
                pending.popleft().result()
            pending.append(producer.send_batch_async(topic, bodies))
        while pending:
            pending.popleft().result()
    secs = time.perf_counter() - begin
    log(f"filled {topic} with {count} messages in {secs:.1f} s")
    return secs


def session(name: str) -> tuple[SparkSession, float]:
    """A local session (docs/spark.md section 6) and the seconds it took to start."""
    begin = time.perf_counter()
    spark = local_session(name)
    return spark, time.perf_counter() - begin

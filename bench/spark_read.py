"""bench/spark_read.py: how fast does a Spark batch job read a topic through format("mqbox")?

`--count` stored messages of `--size-bytes` (2,000,000 of 128 B) in a topic of `--queues` queues
(one Spark partition each), filled by the Producer before Spark starts; then, in a local[2]
session, `--repeat` batch reads computing `count(*)` and `sum(length(body))`. The first read of a
session pays for starting the Python data source machinery (about 7 s), so a small warm-up read
comes first and every timed read starts after it. Reported: `msgs_per_s` (the median read),
`reads_secs`, `session_start_secs`, `fill_secs`; the target is the issue's, >= 500,000 rows/s.
`checksum` covers the count and the byte sum of every read (they must all agree).

Usage: python bench/spark_read.py [--count N] [--size-bytes N] [--queues N] [--repeat N] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Final

from _common import checksum, emit, log  # bench/ is sys.path[0]
from _load import appliance, create_topic
from _spark import fill, session

BENCH: Final = "spark_read"
TOPIC: Final = "BenchSparkRead"
TARGET_ROWS_PER_S: Final = 500_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=2_000_000)
    parser.add_argument("--size-bytes", type=int, default=128)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.count, arguments.repeat = 2_000, 1
    size = arguments.size_bytes
    pad = b"x" * size

    def body_of(n: int) -> bytes:
        return bytes((b"%016d" % n + pad)[:size])

    with appliance(BENCH, None) as app:
        create_topic(app, TOPIC, arguments.queues)
        fill_secs = fill(app.namesrv_address, TOPIC, arguments.count, body_of)
        spark, start_secs = session(BENCH)
        try:
            options = {"namesrvAddr": app.namesrv_address, "topic": TOPIC}
            warm_up = {**options, "endingOffsets": f'{{"{TOPIC}": {{"0": 1}}}}'}
            spark.read.format("mqbox").options(**warm_up).load().count()
            results = []
            secs = []
            for _ in range(arguments.repeat):
                begin = time.perf_counter()
                frame = spark.read.format("mqbox").options(**options).load()
                row = frame.selectExpr("count(*) AS n", "sum(length(body)) AS b").first()
                secs.append(time.perf_counter() - begin)
                assert row is not None
                results.append((int(row.n), int(row.b)))
                log(f"read {row.n} rows in {secs[-1]:.2f} s")
        finally:
            spark.stop()
    assert all(result == (arguments.count, arguments.count * size) for result in results), results
    median = statistics.median(secs)
    emit(
        BENCH,
        vars(arguments),
        arguments.count,
        median,
        size,
        reads_secs=[round(s, 3) for s in secs],
        session_start_secs=round(start_secs, 2),
        fill_secs=round(fill_secs, 2),
        met_500k_rows_per_s=arguments.count / median >= TARGET_ROWS_PER_S,
        checksum=checksum(repr(results).encode()),
    )


if __name__ == "__main__":
    main()

"""The reference pipeline of the Spark connector: a clickstream (docs/spark.md section 7).

    bin/mqbox start
    .venv/bin/python -m examples.clickstream.pipeline --namesrv 127.0.0.1:9876 --out /tmp/clicks

Three steps, each a function of this module:
1. `produce_clicks`: synthetic click events (JSON: user, page, event time) into topic `clicks`,
   seeded, so the expected totals per (minute, page) are known. `wait_readable` then waits until
   the brokers have indexed them: a query plans its ends from the queues' max offsets, which
   count a send a moment after its answer (it waits again between the two queries below).
2. `run_jobs`: two Structured Streaming queries with Trigger.AvailableNow.
   - aggregate: `clicks` -> per 1-minute event-time window and page, the number of clicks, with a
     watermark, in append mode (a window is written once, when the watermark passed it) -> topic
     `click_counts` (JSON bodies, the page as sharding key), exactly once;
   - archive: `click_counts` -> Parquet files under `--out`.
   The producer's last event is a tick an hour after the others: it moves the watermark past
   every real window, so an AvailableNow run writes them all. The tick's own window is written
   by the next run, tagged `tick`; the archive and the check read the tag `count` only.
3. `check_totals`: reads `click_counts` (a batch read) and the Parquet files and compares both
   with the totals the producer made. Prints one JSON line; exits 1 when they differ.

Run it again with the same `--out`: the queries resume from their checkpoints there; the new
clicks (the next seed, later event times) are counted in new windows, nothing already written is
written twice, and the check covers every run's totals.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Final

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as func

from mqbox.client import Producer, admin_api, namesrv_api
from mqbox.client.remoting import RemotingClient
from mqbox.spark.session import local_session

CLICKS: Final = "clicks"
COUNTS: Final = "click_counts"
PAGES: Final = ("/home", "/search", "/item", "/cart", "/checkout")
TICK_PAGE: Final = "__tick__"
WINDOW: Final = "1 minute"
WATERMARK: Final = "30 seconds"
START_MS: Final = 1_767_225_600_000  # 2026-01-01 00:00 UTC: event times are synthetic
CLICK_SCHEMA: Final = "user STRING, page STRING, ts LONG"
COUNT_SCHEMA: Final = "window_start STRING, page STRING, clicks LONG"

READABLE_TIMEOUT_S: Final = 60.0

Totals = dict[tuple[str, str], int]  # (window start, page) -> clicks


def window_start(ms: int) -> str:
    """The start of the 1-minute window of `ms`, as the aggregate query formats it (UTC)."""
    minute = ms // 60_000 * 60
    at = datetime.datetime.fromtimestamp(minute, tz=datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def produce_clicks(namesrv: str, count: int, seed: int, minutes: int) -> Totals:
    """Send `count` clicks spread over `minutes` minutes from START_MS + 2 * seed hours, then the
    tick an hour later; the totals per (window, page)."""
    rng = random.Random(seed)
    base = START_MS + seed * 3_600_000 * 2
    totals: Counter[tuple[str, str]] = Counter()
    with Producer("clickstream_producer", namesrv) as producer:
        futures = []
        for number in range(count):
            ts = base + rng.randrange(minutes * 60_000)
            page = rng.choice(PAGES)
            event = {"user": f"u{rng.randrange(50)}", "page": page, "ts": ts}
            totals[(window_start(ts), page)] += 1
            futures.append(
                producer.send_async(
                    CLICKS, json.dumps(event).encode(), tags="click", keys=str(number)
                )
            )
            if len(futures) >= 256:
                for future in futures:
                    future.result()
                futures.clear()
        for future in futures:
            future.result()
        tick = {"user": "tick", "page": TICK_PAGE, "ts": base + 3_600_000}
        producer.send(CLICKS, json.dumps(tick).encode(), tags="tick")
    return dict(totals)


def wait_readable(namesrv: str) -> None:
    """Until every master broker has indexed what it stored (`dispatchBehindBytes` 0). A send is
    answered once stored and counted for readers a moment later (docs/store.md), so a query
    planned at once could end before the last sends, the tick among them. Every master, not the
    topic's route: a topic the sink just created may not be routed yet."""
    with RemotingClient(namesrv_api.split_namesrv_addr(namesrv)[0]) as names:
        cluster = namesrv_api.cluster_info(names)
    for data in cluster.broker_addr_table.values():
        master = data.broker_addrs.get(0)
        if master is None:
            continue
        with RemotingClient(master) as broker:
            admin_api.wait_dispatched(broker, READABLE_TIMEOUT_S)


def run_jobs(spark: SparkSession, namesrv: str, out: Path) -> None:
    """The aggregate query, then the archive query, each to the end of what is there."""
    clicks = (
        spark.readStream.format("mqbox")
        .option("namesrvAddr", namesrv)
        .option("topic", CLICKS)
        .option("startingOffsets", "earliest")
        .option("subExpression", "click || tick")
        .load()
        .select(func.from_json(func.col("body").cast("string"), CLICK_SCHEMA).alias("e"))
        .select("e.page", func.timestamp_millis("e.ts").alias("at"))
    )
    counts = (
        clicks.withWatermark("at", WATERMARK)
        .groupBy(func.window("at", WINDOW).alias("w"), "page")
        .count()
        .select(
            func.to_json(
                func.struct(
                    func.date_format("w.start", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias(
                        "window_start"
                    ),
                    "page",
                    func.col("count").alias("clicks"),
                )
            ).alias("body"),
            func.col("page").alias("shardingKey"),
            # The tick's own window is tagged apart: readers of the counts filter on the tag (a
            # filter in the query would be pushed below the watermark and hide the tick from it).
            func.when(func.col("page") == TICK_PAGE, "tick").otherwise("count").alias("tags"),
        )
    )
    aggregate = (
        counts.writeStream.format("mqbox")
        .option("namesrvAddr", namesrv)
        .option("topic", COUNTS)
        .option("checkpointLocation", str(out / "checkpoints" / "aggregate"))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    aggregate.awaitTermination()
    wait_readable(namesrv)
    archive = (
        spark.readStream.format("mqbox")
        .option("namesrvAddr", namesrv)
        .option("topic", COUNTS)
        .option("startingOffsets", "earliest")
        .option("subExpression", "count")
        .load()
        .select(func.from_json(func.col("body").cast("string"), COUNT_SCHEMA).alias("c"))
        .select("c.*")
        .writeStream.format("parquet")
        .option("path", str(out / "parquet"))
        .option("checkpointLocation", str(out / "checkpoints" / "archive"))
        .trigger(availableNow=True)
        .start()
    )
    archive.awaitTermination()


def check_totals(
    spark: SparkSession, namesrv: str, out: Path, expected: Totals
) -> dict[str, object]:
    """Both outputs against the producer's totals; the report's `ok` says if all three agree."""
    topic = (
        spark.read.format("mqbox")
        .option("namesrvAddr", namesrv)
        .option("topic", COUNTS)
        .option("subExpression", "count")
        .load()
        .select(func.from_json(func.col("body").cast("string"), COUNT_SCHEMA).alias("c"))
        .select("c.*")
        .collect()
    )
    parquet = spark.read.parquet(str(out / "parquet")).collect()

    def totals(rows: list[Row]) -> Counter[tuple[str, str]]:
        found: Counter[tuple[str, str]] = Counter()
        for row in rows:
            found[(row.window_start, row.page)] += row.clicks
        return found

    from_topic, from_parquet = totals(topic), totals(parquet)
    wanted = Counter(expected)
    return {
        "ok": from_topic == wanted and from_parquet == wanted and len(topic) == len(wanted),
        "windows": len(wanted),
        "clicks": sum(wanted.values()),
        "topic_messages": len(topic),
        "topic_clicks": sum(from_topic.values()),
        "parquet_clicks": sum(from_parquet.values()),
    }


def run(
    namesrv: str,
    out: Path,
    *,
    clicks: int,
    minutes: int,
    spark: SparkSession | None = None,
) -> dict[str, object]:
    """Produce, run both queries, check; the report. Each run of a pipeline (the same `out`)
    uses the next seed: its event times start after the previous run's tick, so no click
    arrives behind the watermark. A session given is used and left running."""
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "expected.json"
    state: dict[str, object] = {"runs": 0, "totals": []}
    if state_path.exists():
        state = json.loads(state_path.read_text(encoding="utf-8"))
    runs = int(str(state["runs"])) + 1
    expected: Totals = {(w, p): n for w, p, n in state["totals"]}  # type: ignore[attr-defined]
    for key, count in produce_clicks(namesrv, clicks, runs, minutes).items():
        expected[key] = expected.get(key, 0) + count
    state = {"runs": runs, "totals": [[w, p, n] for (w, p), n in sorted(expected.items())]}
    state_path.write_text(json.dumps(state), encoding="utf-8")
    wait_readable(namesrv)
    session = spark or local_session("mqbox-clickstream")
    try:
        run_jobs(session, namesrv, out)
        return {"run": runs, **check_totals(session, namesrv, out, expected)}
    finally:
        if spark is None:
            session.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--out", type=Path, default=Path("/tmp/mqbox-clickstream"))
    parser.add_argument("--clicks", type=int, default=20_000)
    parser.add_argument("--minutes", type=int, default=10)
    arguments = parser.parse_args(argv)
    report = run(
        arguments.namesrv, arguments.out, clicks=arguments.clicks, minutes=arguments.minutes
    )
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

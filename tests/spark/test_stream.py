"""Goal: `spark.readStream.format("mqbox")` into `writeStream.format("mqbox")`. (1) With
maxOffsetsPerTrigger=N and Trigger.AvailableNow, a query reads what was there when it started in
micro-batches of at most N rows (exactly N but the last), reports the queues' latest offsets in
its progress, and stops; (2) restarted from its checkpoint after more messages arrived, it reads
exactly the new ones: the output topic holds every input body once, transformed; (3) with
consumerGroup, the query's offsets are committed to the broker (QUERY_CONSUMER_OFFSET finds
them; they trail the checkpoint by a batch at most, as Spark commits lazily); (4) the sink
writes with deterministic UNIQ_KEYs: each output message carries one, and all differ.

Method: the real appliance (module fixture), the mqbox Producer for input, one SparkSession;
the output is read back with a batch read of the connector (checked by test_source.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from mqbox.client.pull import query_consumer_offset
from mqbox.client.transport import Transport
from tests.conftest import unique_name
from tests.spark.conftest import SPARK_MARKS, options_for, produce
from tests.support.appliance import Appliance
from tests.support.read_back import create_topic, wait_dispatched_at

pytestmark = SPARK_MARKS

QUEUES = 2
PER_TRIGGER = 10


def run_available_now(
    spark: SparkSession, appliance: Appliance, source: str, sink: str, checkpoint: Path, group: str
) -> list[dict[str, object]]:
    query = (
        spark.readStream.format("mqbox")
        .options(
            **options_for(
                appliance,
                source,
                startingOffsets="earliest",
                maxOffsetsPerTrigger=PER_TRIGGER,
                consumerGroup=group,
            )
        )
        .load()
        .selectExpr("concat(body, cast('!' as binary)) AS body", "tags")
        .writeStream.format("mqbox")
        .options(**options_for(appliance, sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the availableNow query did not end"
    assert query.exception() is None
    return [dict(progress) for progress in query.recentProgress]


def test_available_now_in_limited_batches_then_a_restart_reads_only_what_is_new(
    spark: SparkSession, appliance: Appliance, tmp_path: Path
) -> None:
    source = unique_name("StreamIn").replace("-", "_")
    sink = unique_name("StreamOut").replace("-", "_")
    group = unique_name("CG").replace("-", "_")
    create_topic(appliance, source, QUEUES)
    create_topic(appliance, sink, QUEUES)
    produce(appliance, source, [b"a%d" % n for n in range(35)], tags="T")
    checkpoint = tmp_path / "checkpoint"

    first = run_available_now(spark, appliance, source, sink, checkpoint, group)
    counts = [int(str(progress["numInputRows"])) for progress in first]
    assert sum(counts) == 35
    assert max(counts) == PER_TRIGGER
    assert counts.count(PER_TRIGGER) == 3  # 10, 10, 10, 5 (an empty batch may follow)
    latest = json.loads(str(first[-1]["sources"][0]["latestOffset"]))  # type: ignore[index]
    assert sum(latest[source]["broker-a"].values()) == 35

    produce(appliance, source, [b"b%d" % n for n in range(7)], tags="T")
    second = run_available_now(spark, appliance, source, sink, checkpoint, group)
    assert sum(int(str(progress["numInputRows"])) for progress in second) == 7

    wait_dispatched_at(appliance.broker_address)  # the sink's last sends, answered a moment ago
    out = spark.read.format("mqbox").options(**options_for(appliance, sink)).load().collect()
    bodies = sorted(row.body for row in out)
    assert bodies == sorted([b"a%d!" % n for n in range(35)] + [b"b%d!" % n for n in range(7)])
    assert {row.tags for row in out} == {"T"}
    msg_ids = [row.msgId for row in out]
    assert len(set(msg_ids)) == len(msg_ids)
    assert all(len(msg_id) == 32 for msg_id in msg_ids)

    committed = 0
    with Transport(appliance.broker_address) as broker:
        for queue_id in range(QUEUES):
            committed += query_consumer_offset(broker, group, source, queue_id) or 0
    assert 35 <= committed <= 42

"""Goal: `spark.read.format("mqbox")` reads exactly what a range holds. (1) With no offsets a
batch read returns every stored message once, with every column as stored: topic, broker,
queueId, queueOffset, msgId (the UNIQ_KEY), tags, keys, the user's properties, body, both
timestamps, reconsumeTimes; (2) startingOffsets / endingOffsets JSON (the short form and the
broker-named form) read exactly [start, end) of each queue they name, earliest for the others;
startingTimestamp starts each queue at its first message stored at or after the time;
(3) minPartitions splits the same rows over more partitions; (4) subExpression "TagA || TagB"
keeps exactly the rows with those tags; (5) bad options are refused with a message naming the
option, and a topic
without a route is named.

Method: the real appliance (module fixture), a 2-queue topic created up front, messages sent
one by one with the mqbox Producer (its SendResults say where each went); one SparkSession for
the Spark lane (tests/spark/conftest.py).
"""

from __future__ import annotations

import json
from datetime import UTC

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from mqbox.client import SendResult
from tests.conftest import unique_name
from tests.spark.conftest import SPARK_MARKS, options_for, produce
from tests.support.appliance import Appliance
from tests.support.read_back import create_topic

pytestmark = SPARK_MARKS

COUNT = 24


def where(results: list[SendResult]) -> dict[tuple[int, int], int]:
    """(queueId, queueOffset) -> index of the body sent there."""
    return {(r.queue.queue_id, r.queue_offset): index for index, r in enumerate(results)}


def test_batch_reads_every_column_exact_ranges_splits_and_the_tag_filter(
    spark: SparkSession, appliance: Appliance
) -> None:
    topic = unique_name("SparkRead").replace("-", "_")
    create_topic(appliance, topic, 2)
    tags = ["TagA", "TagB", "TagC"]
    results: list[SendResult] = []
    for index in range(COUNT):
        results += produce(
            appliance,
            topic,
            [b"body-%d" % index],
            tags=tags[index % 3],
            keys=f"k{index} x{index}",
            properties={"seq": str(index), "lang": "日本"},
        )
    placed = where(results)
    options = options_for(appliance, topic)

    rows = spark.read.format("mqbox").options(**options).load().collect()
    assert len(rows) == COUNT
    for row in rows:
        index = placed[(row.queueId, row.queueOffset)]
        assert row.topic == topic
        assert row.broker == "broker-a"
        assert row.body == b"body-%d" % index
        assert row.msgId == results[index].msg_id
        assert row.tags == tags[index % 3]
        assert row.keys == f"k{index} x{index}"
        assert row.properties == {"seq": str(index), "lang": "日本"}
        assert row.storeTimestamp >= row.bornTimestamp.replace(microsecond=0)
        assert row.reconsumeTimes == 0

    stored_ms = {
        row.body: int(row.storeTimestamp.replace(tzinfo=UTC).timestamp() * 1000) for row in rows
    }
    since = sorted(stored_ms.values())[COUNT // 2]
    from_time = (
        spark.read.format("mqbox").options(**options, startingTimestamp=since).load().collect()
    )
    assert sorted(row.body for row in from_time) == sorted(
        body for body, at in stored_ms.items() if at >= since
    )

    per_queue = {q: sum(1 for (queue, _) in placed if queue == q) for q in (0, 1)}
    assert min(per_queue.values()) >= 3
    starting = json.dumps({topic: {"0": 1, "1": -2}})
    ending = json.dumps({topic: {"broker-a": {"0": 3, "1": 2}}})
    ranged = (
        spark.read.format("mqbox")
        .options(**options, startingOffsets=starting, endingOffsets=ending)
        .load()
        .select("queueId", "queueOffset", "body")
        .collect()
    )
    got = sorted((row.queueId, row.queueOffset, row.body) for row in ranged)
    expected = sorted(
        (queue, offset, b"body-%d" % placed[(queue, offset)])
        for queue, offset in [(0, 1), (0, 2), (1, 0), (1, 1)]
    )
    assert got == expected

    split = spark.read.format("mqbox").options(**options, minPartitions=6).load()
    assert split.rdd.getNumPartitions() >= 6
    assert sorted(row.body for row in split.select("body").collect()) == sorted(
        b"body-%d" % index for index in range(COUNT)
    )

    filtered = (
        spark.read.format("mqbox")
        .options(**options, subExpression="TagA || TagB")
        .load()
        .select("tags", "body")
        .collect()
    )
    assert sorted(row.body for row in filtered) == sorted(
        b"body-%d" % index for index in range(COUNT) if index % 3 != 2
    )
    assert {row.tags for row in filtered} == {"TagA", "TagB"}


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"startingOffsets": "latest"}, "startingOffsets=latest"),
        ({"endingOffsets": "{not json"}, "endingOffsets is not JSON"),
        ({}, "topic AnyTopic has no route"),
        ({"minPartitions": "zero"}, "minPartitions"),
        ({"subExpression": "||"}, "subExpression"),
    ],
)
def test_a_bad_option_is_refused_with_its_name(
    spark: SparkSession, appliance: Appliance, extra: dict[str, str], named: str
) -> None:
    options = {**options_for(appliance, "AnyTopic"), **extra}
    with pytest.raises(PySparkException, match=named):
        spark.read.format("mqbox").options(**options).load().collect()

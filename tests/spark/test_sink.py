"""Goal: what `df.write.format("mqbox")` stores is what the official C++ client reads. A
DataFrame of string bodies with tags, keys (an array of strings), user properties (a map, Unicode
included) and a sharding key, written in one Spark partition, is delivered to the C++
PullConsumer (PyPI rocketmq==0.4.4) exactly once with the body, tags, keys (space-joined) and
properties it had; every message of one sharding key is in one queue, in the order of the rows;
each message id is the sink's 32-digit UNIQ_KEY.

Method: the module's real appliance; the DataFrame is made by the Spark lane's session; the C++
consumer runs in a child process (tests/interop/cpp_client.py) that pulls every queue from
offset 0 until the broker says there is nothing new.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SEQ_PROPERTY,
    SentMessage,
    assert_exactly_once,
    cpp_child,
    push_spec,
    received_view,
)
from tests.spark.conftest import SPARK_MARKS, options_for
from tests.support.appliance import Appliance
from tests.support.read_back import create_topic, wait_dispatched_at

pytestmark = [*SPARK_MARKS, pytest.mark.interop]

QUEUES = 4
TIMEOUT_S = 90.0
SCHEMA = StructType(
    [
        StructField("body", StringType()),
        StructField("tags", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("shardingKey", StringType()),
    ]
)


def test_the_cpp_consumer_reads_properties_and_sharded_order_the_sink_wrote(
    spark: SparkSession, appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("SparkSink").replace("-", "_")
    create_topic(appliance, topic, QUEUES)
    users = ["alice", "bob", "chloé"]
    messages = [
        SentMessage(
            seq=f"s{n:03d}",
            body=f"click {n} · ✓",
            tags=["TagA", "TagB"][n % 2],
            keys=f"a{n} b{n}",
            properties=(("user", users[n % 3]), ("page", f"/p/{n}")),
        )
        for n in range(30)
    ]
    rows = [
        (
            m.body,
            m.tags,
            m.keys.split(" "),
            m.user_properties(),
            dict(m.properties)["user"],
        )
        for m in messages
    ]
    frame = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    frame.write.format("mqbox").mode("append").options(**options_for(appliance, topic)).save()
    # The pull-mode consumer ends at the first NO_NEW_MSG of each queue: the sink's last sends
    # must be pullable by then.
    wait_dispatched_at(appliance.broker_address)

    spec = {**push_spec(appliance, unique_name("CG_spark"), topic, messages), "mode": "pull"}
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.finish(TIMEOUT_S)  # it ends once every queue said NO_NEW_MSG
    delivered = consumer.messages()
    assert_exactly_once([received_view(e) for e in delivered], messages, "pulled")
    assert all(len(e["msg_id"]) == 32 for e in delivered)
    assert len({e["msg_id"] for e in delivered}) == len(messages)
    for user in users:
        mine = [e for e in delivered if e["properties"]["user"] == user]
        assert len({e["queue_id"] for e in mine}) == 1, user
        in_queue_order = [
            e["properties"][SEQ_PROPERTY] for e in sorted(mine, key=lambda e: e["queue_offset"])
        ]
        assert in_queue_order == sorted(in_queue_order), user

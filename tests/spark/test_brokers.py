"""Goal: reads across brokers and after retention. (1) A batch job over a topic that lives on two
brokers reads every message once, each with the broker and queue it was stored on, and a
short-form offsets JSON (queue ids without a broker) is refused for it, naming both brokers;
(2) after retention removed the segments holding a queue's first offsets, a read that still
needs them fails with failOnDataLoss=true (the default), naming the topic, broker, queue and
the offsets lost, and with failOnDataLoss=false reads exactly what is left.

Method: real appliances: the module's (broker-a, with the name server) and a second one
(broker-b) registered with the same name server; for retention an appliance of its own with
64 KiB commit-log segments and RocketMQ's keys set to delete a segment as soon as the writer
has rolled past it (as tests/integration/test_retention.py). Messages go in through the mqbox
Producer; waits poll the broker's GET_MIN_OFFSET with a deadline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from mqbox.client.namesrv_api import get_route
from mqbox.client.pull import min_offset
from mqbox.client.remoting import RemotingClient
from mqbox.client.transport import Transport
from mqbox.message import decode_offset_msg_id
from tests.conftest import unique_name
from tests.spark.conftest import SPARK_MARKS, options_for, produce
from tests.support.appliance import (
    BROKER_CONF,
    RETENTION_BROKER_CONF,
    RETENTION_SEGMENT_SIZE_BYTES,
    Appliance,
    running_appliance,
)
from tests.support.read_back import create_topic

pytestmark = SPARK_MARKS

WAIT_S = 60.0


def test_a_batch_job_reads_a_topic_spread_over_two_brokers(
    spark: SparkSession, appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("TwoBrokers").replace("-", "_")
    with running_appliance(
        tmp_path / "b",
        reap_pids,
        BROKER_CONF + "brokerName=broker-b\n",
        namesrv_address=appliance.namesrv_address,
    ) as second:
        for broker in (appliance, second):
            create_topic(broker, topic, 2)
        deadline = time.monotonic() + WAIT_S
        with RemotingClient(appliance.namesrv_address) as namesrv:
            while len(getattr(get_route(namesrv, topic), "queue_datas", ())) < 2:
                assert time.monotonic() < deadline, "the route never named both brokers"
                time.sleep(0.1)
        results = produce(second, topic, [b"m%d" % n for n in range(24)])
        placed = {
            (r.queue.broker_name, r.queue.queue_id, r.queue_offset): b"m%d" % n
            for n, r in enumerate(results)
        }
        assert {broker for broker, _, _ in placed} == {"broker-a", "broker-b"}

        options = options_for(appliance, topic)
        rows = spark.read.format("mqbox").options(**options).load().collect()
        assert {(row.broker, row.queueId, row.queueOffset): row.body for row in rows} == placed
        assert len(rows) == len(placed)

        short = json.dumps({topic: {"0": 1}})
        with pytest.raises(PySparkException, match="broker-a, broker-b"):
            spark.read.format("mqbox").options(**options, startingOffsets=short).load().count()


def test_fail_on_data_loss_both_ways_after_retention_removed_segments(
    spark: SparkSession, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = "SparkRetention"
    with running_appliance(tmp_path / "home", reap_pids, RETENTION_BROKER_CONF) as retained:
        create_topic(retained, topic, 1)
        bodies = [f"message {n:06d} ".encode() * 50 for n in range(300)]
        results = produce(retained, topic, bodies)
        # Every segment but the one written last goes: the first offset left is the first
        # message of that segment (its commit-log offset is in the offset msgId).
        log_offsets = [decode_offset_msg_id(r.offset_msg_id)[1] for r in results]
        last_segment = log_offsets[-1] - log_offsets[-1] % RETENTION_SEGMENT_SIZE_BYTES
        first = next(n for n, at in enumerate(log_offsets) if at >= last_segment)
        assert first > 0
        deadline = time.monotonic() + WAIT_S
        with Transport(retained.broker_address) as broker:
            while min_offset(broker, topic, 0) != first:
                assert time.monotonic() < deadline, "retention never removed the old segments"
                time.sleep(0.1)
        options = options_for(retained, topic, startingOffsets=json.dumps({topic: {"0": 0}}))

        with pytest.raises(PySparkException) as refused:
            spark.read.format("mqbox").options(**options).load().count()
        message = str(refused.value)
        assert f"topic {topic}, broker broker-a, queue 0: offsets [0, {first}) are lost" in message
        assert "failOnDataLoss=false" in message

        rows = (
            spark.read.format("mqbox")
            .options(**options, failOnDataLoss="false")
            .load()
            .select("queueOffset", "body")
            .collect()
        )
        got = sorted((row.queueOffset, row.body) for row in rows)
        assert got == [(n, bodies[n]) for n in range(first, len(bodies))]

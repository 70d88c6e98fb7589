"""Goal: exactly once into mqbox. A streaming query (mqbox topic -> mqbox topic) whose driver
process is SIGKILLed in the middle of a micro-batch, with part of the batch already stored in
the output topic, and which is then restarted from its checkpoint, leaves every result in the
output topic exactly once: the replayed batch (same query id, batch id, range and rows) sends
the same deterministic UNIQ_KEYs, and the broker's idempotent window drops the ones it stored.

Method: the real appliance; the driver is a process of its own (tests/support/spark_driver.py,
a real local SparkSession) whose Python UDF blocks at the body `poison`: the task of the
poison's queue never ends, the other queue's task stores all its rows, so the kill comes when
the output holds exactly the other queue's rows (the wait is for that count, not a time). The
kill is SIGKILL to the driver's process group (the JVM and its Python workers are in it). The
checkpoint then holds the batch's offsets and no commit for it. The second driver runs without
poison. (Run with the sink's exactlyOnce=false, the same test finds the replayed rows twice.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from mqbox.client.pull import max_offset
from mqbox.client.transport import Transport
from tests.conftest import unique_name
from tests.spark.conftest import SPARK_MARKS, options_for, produce
from tests.support.appliance import REPO_ROOT, Appliance
from tests.support.read_back import create_topic, wait_dispatched_at

pytestmark = SPARK_MARKS

WAIT_S = 240.0


def stored(appliance: Appliance, topic: str, queues: int) -> int:
    with Transport(appliance.broker_address) as broker:
        return sum(max_offset(broker, topic, queue_id) for queue_id in range(queues))


def start_driver(
    directory: Path, spec: dict[str, object], reap_pids: list[int]
) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    with (directory / "stdout.txt").open("wb") as out, (directory / "stderr.txt").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_driver", str(spec_path)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    reap_pids.append(process.pid)
    return process


def test_a_driver_killed_mid_batch_and_restarted_leaves_each_result_once(
    spark: SparkSession, appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    source = unique_name("OnceIn").replace("-", "_")
    sink = unique_name("OnceOut").replace("-", "_")
    create_topic(appliance, source, 2)
    create_topic(appliance, sink, 2)
    bodies = [b"r%d" % n for n in range(40)]
    results = produce(appliance, source, bodies, tags="T")
    poison = produce(appliance, source, [b"poison"], tags="T")[0]
    later = produce(appliance, source, [b"s%d" % n for n in range(6)], tags="T")
    queue = poison.queue.queue_id
    before_kill = sum(1 for result in [*results, *later] if result.queue.queue_id != queue)
    total = len(bodies) + 1 + len(later)
    checkpoint = tmp_path / "checkpoint"
    spec = {
        "namesrv": appliance.namesrv_address,
        "source": source,
        "sink": sink,
        "checkpoint": str(checkpoint),
        "poison": True,
    }

    first = start_driver(tmp_path / "first", spec, reap_pids)
    deadline = time.monotonic() + WAIT_S
    while stored(appliance, sink, 2) < before_kill:
        assert first.poll() is None, "the first driver ended before it was killed"
        assert time.monotonic() < deadline, "the first driver never sent the rows before poison"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(60)
    assert 0 < stored(appliance, sink, 2) == before_kill < total
    assert (checkpoint / "offsets" / "0").exists()
    assert not (checkpoint / "commits" / "0").exists()

    second = start_driver(tmp_path / "second", {**spec, "poison": False}, reap_pids)
    second.wait(WAIT_S)
    assert second.returncode == 0, (tmp_path / "second" / "stderr.txt").read_text()[-3000:]
    out = (tmp_path / "second" / "stdout.txt").read_text(encoding="utf-8")
    assert json.loads(out.strip().splitlines()[-1])["rows"] == total

    # Every send of the second driver was answered; once the dispatcher has them all, a row
    # stored twice is read twice.
    wait_dispatched_at(appliance.broker_address)
    rows = spark.read.format("mqbox").options(**options_for(appliance, sink)).load().collect()
    expected = sorted([*bodies, b"poison", *(b"s%d" % n for n in range(6))])
    assert sorted(row.body for row in rows) == expected
    assert len({row.msgId for row in rows}) == total

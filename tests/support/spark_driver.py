"""A Spark driver in a process of its own, for the test that kills one mid-batch
(tests/spark/test_exactly_once.py): `python -m tests.support.spark_driver SPEC.json`.

Owns: one streaming query, mqbox topic to mqbox topic through a Python UDF on the body, run with
Trigger.AvailableNow from the spec's checkpoint. With `"poison": true` the UDF blocks for good at
the body `poison`: the task of that queue's partition never ends, while the other partitions'
tasks send all their rows, so the micro-batch is stuck half-stored until the test kills this
process group. Without it the UDF passes every body. Prints one JSON line when the query ended.

Never: a timer: the test decides when to kill, from what the output topic holds.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from pyspark.sql.functions import udf
from pyspark.sql.types import BinaryType

from mqbox.spark.session import local_session

POISON = b"poison"


def stop_at_poison(body: bytes) -> bytes:
    if body == POISON:
        threading.Event().wait()  # until the test kills the driver
    return body


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    spark = local_session("mqbox-killed-driver")
    step = udf(stop_at_poison if spec["poison"] else bytes, BinaryType(), useArrow=False)
    query = (
        spark.readStream.format("mqbox")
        .option("namesrvAddr", spec["namesrv"])
        .option("topic", spec["source"])
        .option("startingOffsets", "earliest")
        .load()
        .select(step("body").alias("body"), "tags")
        .writeStream.format("mqbox")
        .option("namesrvAddr", spec["namesrv"])
        .option("topic", spec["sink"])
        .option("checkpointLocation", spec["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = sum(int(progress["numInputRows"]) for progress in query.recentProgress)
    sys.stdout.write(json.dumps({"event": "done", "rows": rows}) + "\n")
    sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    main()

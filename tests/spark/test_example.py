"""Goal: the reference pipeline (examples/clickstream/pipeline.py, docs/spark.md section 7) does
what it says: clicks produced to `clicks` are counted per 1-minute window and page by a
streaming query into `click_counts`, archived to Parquet by a second one, and the reader finds
the producer's totals in both; run again on the same output directory, both queries resume from
their checkpoints and the totals of both runs are there, each window once.

Method: the module's real appliance (the pipeline's fixed topic names are the example's own, so
this module has its appliance to itself); the pipeline's own `run`, with the Spark lane's
session (main() only adds the argument parser and a session of its own).
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from examples.clickstream.pipeline import run
from tests.spark.conftest import SPARK_MARKS
from tests.support.appliance import Appliance

pytestmark = SPARK_MARKS


def test_the_clickstream_pipeline_counts_every_click_once_over_two_runs(
    spark: SparkSession, appliance: Appliance, tmp_path: Path
) -> None:
    first = run(appliance.namesrv_address, tmp_path, clicks=1500, minutes=4, spark=spark)
    assert first["ok"], repr(first)
    assert first["clicks"] == 1500
    second = run(appliance.namesrv_address, tmp_path, clicks=700, minutes=3, spark=spark)
    assert second["ok"], second
    assert second["clicks"] == 2200
    assert second["windows"] == second["topic_messages"]

"""Spark finds this module by its name (a top-level `pyspark_*` module defining DefaultSource)
and registers the mqbox data source, so `spark.read.format("mqbox")` needs no register call."""

from mqbox.spark.data_source import MqboxDataSource as DefaultSource

__all__ = ["DefaultSource"]

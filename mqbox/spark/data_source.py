"""The mqbox data source of Spark: `format("mqbox")` for reads and writes, batch and streaming.

Owns: MqboxDataSource, the class Spark instantiates with a query's options and asks for a
reader or writer (source.py, sink.py). pyspark_mqbox.py names it DefaultSource, so Spark
registers it by itself; `spark.dataSource.register(MqboxDataSource)` works too.

Never: talks to a broker (the readers and writers do).

Rules: the read schema is fixed (source.READ_STRUCT_TYPE); a `.schema(...)` that differs is
refused with the schema it should be. Writes append (a topic cannot be truncated): `overwrite` is
refused, and Spark itself refuses the default save mode for Python sinks, so batch writes say
`.mode("append")`.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from mqbox.spark.options import OptionError, ReadOptions, WriteOptions
from mqbox.spark.sink import MqboxArrowWriter, MqboxStreamArrowWriter
from mqbox.spark.source import READ_STRUCT_TYPE, MqboxBatchReader, MqboxStreamReader

FORMAT_NAME = "mqbox"


def _check_read_schema(schema: StructType) -> None:
    if schema != READ_STRUCT_TYPE:
        raise OptionError(
            f"the mqbox source's schema is fixed: {READ_STRUCT_TYPE.simpleString()}; "
            f"leave .schema(...) out (got {schema.simpleString()})"
        )


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError('a topic cannot be overwritten: write with .mode("append")')


class MqboxDataSource(DataSource):
    """format("mqbox"): docs/spark.md lists the options and columns."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return READ_STRUCT_TYPE

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_read_schema(schema)
        return MqboxBatchReader(ReadOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_read_schema(schema)
        return MqboxStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _refuse_overwrite(overwrite)
        return MqboxArrowWriter(WriteOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _refuse_overwrite(overwrite)
        return MqboxStreamArrowWriter(WriteOptions.parse(self.options))

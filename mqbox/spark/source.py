"""The source: `spark.read.format("mqbox")` and `spark.readStream.format("mqbox")`.

Owns: READ_STRUCT_TYPE (the schema, arrow_decode.READ_SCHEMA's Spark twin), QueuePartition (one
queue range per Spark partition), MqboxBatchReader and MqboxStreamReader, and the one function
both run in the executors, `read_partition`.

Never: keeps offsets of its own (the checkpoint holds the stream's; docs/spark.md section 3),
or holds a connection in what Spark pickles: the planner (routes and offset calls) lives on the
driver and is made again where needed; the executors reach brokers through broker_reads' table.

Theory of operation (pyspark 4.3's Python Data Source API, docs/spark.md section 1):
1. Batch: `partitions()` runs once, on the driver, and freezes every queue's [start, end); each
   partition is read by `read()` in a Python worker, which yields Arrow record batches.
2. Stream: the reader lives in one long-lived Python process on the driver. `initialOffset()`
   resolves startingOffsets (default latest) once per new query; `latestOffset(start, limit)`
   asks every queue's GET_MAX_OFFSET, caps at the AvailableNow target, and with ReadMaxRows (from
   maxOffsetsPerTrigger) pro-rates the rows over the queues; Spark writes the (start, end) of
   each micro-batch to its offset log before running it and replays the same pair after a crash,
   and a read of a range is deterministic (reading.py), so a replay reads the same records.
3. `commit(end)` (Spark calls it lazily, at the next batch) writes `end` as the consumerGroup's
   offsets when that option is set, for `mqbox offset show`; it lags a batch, and the checkpoint
   stays the truth.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqbox.spark.broker_reads import READ_GROUP_DEFAULT, broker_reads
from mqbox.spark.offsets import (
    QueueKey,
    QueueRange,
    limit_rows,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    split_ranges,
)
from mqbox.spark.options import ReadOptions
from mqbox.spark.planner import QueuePlanner
from mqbox.spark.reading import read_range

READ_STRUCT_TYPE = StructType(
    [
        StructField("topic", StringType()),
        StructField("broker", StringType()),
        StructField("queueId", IntegerType()),
        StructField("queueOffset", LongType()),
        StructField("msgId", StringType()),
        StructField("tags", StringType()),
        StructField("keys", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("bornTimestamp", TimestampType()),
        StructField("storeTimestamp", TimestampType()),
        StructField("reconsumeTimes", IntegerType()),
    ]
)


class QueuePartition(InputPartition):
    """One Spark partition: a range of one queue (offsets.QueueRange)."""

    def __init__(self, piece: QueueRange) -> None:
        super().__init__(piece)
        self.piece = piece

    def __repr__(self) -> str:
        return f"QueuePartition({self.piece.key}, [{self.piece.start}, {self.piece.end}))"


def read_partition(options: ReadOptions, piece: QueueRange) -> Iterator[pa.RecordBatch]:
    """Every record of the partition's range (reading.read_range), in an executor."""
    reads = broker_reads(
        piece.address, piece.key.broker, options.pull_timeout_ms, options.credentials
    )
    yield from read_range(
        reads,
        piece,
        subscription=options.sub_expression,
        accepted_tags=options.accepted_tags or None,
        pull_batch_size=options.pull_batch_size,
        fail_on_data_loss=options.fail_on_data_loss,
        include_properties=options.include_properties,
        group=options.consumer_group or READ_GROUP_DEFAULT,
        timeout_ms=options.pull_timeout_ms,
    )


def _partitions(ranges: Sequence[QueueRange], options: ReadOptions) -> list[QueuePartition]:
    return [QueuePartition(piece) for piece in split_ranges(ranges, options.min_partitions)]


class MqboxBatchReader(DataSourceReader):
    """A batch read: ranges frozen when Spark plans the job (rule 1)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = QueuePlanner(self.options)
        try:
            keys = planner.queues()
            start = planner.starting(keys, "earliest")
            end = planner.resolve(self.options.ending_offsets, "latest", keys, "endingOffsets")
            return _partitions(plan_ranges(start, end, planner.addresses), self.options)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueuePartition)
        return read_partition(self.options, partition.piece)


class MqboxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream's reader (rules 2 and 3). Pickled for the executors without its planner."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._planner: QueuePlanner | None = None
        self._latest: dict[QueueKey, int] | None = None
        self._target: dict[QueueKey, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_planner"] = None
        return state

    def _plan(self) -> QueuePlanner:
        if self._planner is None:
            self._planner = QueuePlanner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        planner = self._plan()
        keys = planner.queues()
        return offsets_to_json(planner.starting(keys, "latest"))

    def getDefaultReadLimit(self) -> ReadLimit:
        maximum = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if maximum is None else ReadMaxRows(maximum)

    def prepareForTriggerAvailableNow(self) -> None:
        planner = self._plan()
        self._target = planner.latest(planner.queues())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        planner = self._plan()
        keys = planner.queues()
        begin = offsets_from_json(start, what="the checkpoint's offsets")
        latest = planner.latest(keys)
        if self._target is not None:
            # AvailableNow: nothing past what was there at the start, and no queue found since.
            latest = {
                key: min(offset, self._target.get(key, begin.get(key, 0)))
                for key, offset in latest.items()
            }
        self._latest = latest
        ends = (
            limit_rows(begin, latest, limit.max_rows) if isinstance(limit, ReadMaxRows) else latest
        )
        merged = dict(begin)  # a queue that left the route keeps its offset
        for key, end in ends.items():
            merged[key] = max(end, begin.get(key, 0))
        return offsets_to_json(merged)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        planner = self._plan()
        planner.queues()  # the brokers' addresses, as the routes say now
        begin = offsets_from_json(start, what="the checkpoint's offsets")
        finish = offsets_from_json(end, what="the checkpoint's offsets")
        return _partitions(plan_ranges(begin, finish, planner.addresses), self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueuePartition)
        return read_partition(self.options, partition.piece)

    def commit(self, end: dict[str, Any]) -> None:
        group = self.options.consumer_group
        if group is None:
            return
        planner = self._plan()
        if not planner.addresses:
            planner.queues()
        planner.commit(group, offsets_from_json(end, what="the checkpoint's offsets"))

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None

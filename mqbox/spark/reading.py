"""One read partition: every record of a queue range [start, end), as Arrow record batches.

Owns: the loop of pulls over a range (docs/spark.md section 3, "Reads"), what each PULL answer
means for it, and DataLossError.

Never: Spark (source.py calls this from DataSourceReader.read and DataSourceStreamReader.read),
or a result that depends on when it runs: a range is planned below the queue's end, a queue is
append-only, so [start, end) always returns the same records in the same order, unless
retention deleted some (then DataLossError, or with failOnDataLoss=false the records left). This
is what makes a micro-batch replayed after a crash read what it read the first time.

One pull ahead: once an answer with records says where the next pull starts, that pull is sent
before these records are decoded and handed to Spark, so the broker reads while Spark works.

Answers (docs/protocol.md section 4.3):
- 0: records; those at or past `end` are dropped; the next pull starts at nextBeginOffset.
- 20: the broker's tag filter matched nothing up to nextBeginOffset: go on from there.
- 21 with the offset below minOffset: retention deleted [offset, minOffset). failOnDataLoss
  raises DataLossError naming the queue and the offsets lost; otherwise a warning, and the read
  goes on from minOffset.
- 21 above maxOffset, or 19: the queue holds fewer records than planned. The dispatcher may lag
  a moment behind what GET_MAX_OFFSET reported, so the read waits a little (up to
  `wait_ms`) before it counts this as data loss too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterator
from concurrent.futures import Future
from typing import Final

import pyarrow as pa

from mqbox.client.pull import PullResult, PullStatus
from mqbox.errors import MqboxError
from mqbox.spark.arrow_decode import decode_pull_to_arrow
from mqbox.spark.broker_reads import READ_GROUP_DEFAULT, BrokerReads
from mqbox.spark.offsets import QueueRange

log = logging.getLogger("mqbox.spark")

PULL_COUNT_MAX: Final = 1024  # the broker answers at most this many records per PULL
SHORT_QUEUE_WAIT_MS: Final = 5_000
_RETRY_SLEEP_S: Final = 0.02


class DataLossError(MqboxError):
    """Records a query still needed are gone; the message names the queue and the offsets."""


def lost_message(piece: QueueRange, first: int, end: int, why: str) -> str:
    key = piece.key
    return (
        f"mqbox source: topic {key.topic}, broker {key.broker}, queue {key.queue_id}: offsets "
        f"[{first}, {end}) are lost ({end - first} records; {why}) while the query reads "
        f"[{piece.start}, {piece.end}). Set failOnDataLoss=false to skip them."
    )


def read_range(
    reads: BrokerReads,
    piece: QueueRange,
    *,
    subscription: str = "*",
    accepted_tags: Collection[str] | None = None,
    pull_batch_size: int = PULL_COUNT_MAX,
    fail_on_data_loss: bool = True,
    include_properties: bool = True,
    group: str = READ_GROUP_DEFAULT,
    timeout_ms: int | None = None,
    wait_ms: int = SHORT_QUEUE_WAIT_MS,
) -> Iterator[pa.RecordBatch]:
    """Pull [piece.start, piece.end) of one queue, yielding each pull's records (see module)."""
    key = piece.key
    at = piece.start
    waited_since_ns: int | None = None

    def ask(offset: int) -> Future[PullResult]:
        count = min(pull_batch_size, PULL_COUNT_MAX, piece.end - offset)
        return reads.pull_async(
            key.topic, key.queue_id, offset, count, subscription, group=group, timeout_ms=timeout_ms
        )

    ahead: Future[PullResult] | None = None
    while at < piece.end:
        answer = (ahead if ahead is not None else ask(at)).result()
        ahead = None
        if (
            answer.status is PullStatus.FOUND
            and at < answer.next_begin_offset < piece.end
            and answer.batch.complete
        ):
            # One pull ahead: the broker reads the next records while these are decoded.
            ahead = ask(answer.next_begin_offset)
        status = answer.status
        if status is PullStatus.FOUND:
            batch, next_queue_index = decode_pull_to_arrow(
                answer.batch,
                topic=key.topic,
                broker=key.broker,
                queue_index_end=piece.end,
                accepted_tags=accepted_tags,
                include_properties=include_properties,
            )
            if batch.num_rows:
                yield batch
            following = max(answer.next_begin_offset, next_queue_index)
            if ahead is not None and following != answer.next_begin_offset:
                ahead.cancel()
                ahead = None
        elif status is PullStatus.NO_MATCHED_MSG:
            following = answer.next_begin_offset
        elif status is PullStatus.OFFSET_ILLEGAL and at < answer.min_offset:
            lost_end = min(answer.min_offset, piece.end)
            message = lost_message(piece, at, lost_end, "deleted by retention")
            if fail_on_data_loss:
                raise DataLossError(message)
            log.warning("%s; reading on from %d", message, lost_end)
            following = lost_end
        else:
            # 19, or 21 at or past maxOffset: fewer records than planned, so far.
            now_ns = time.monotonic_ns()
            if waited_since_ns is None:
                waited_since_ns = now_ns
            if now_ns - waited_since_ns < wait_ms * 1_000_000:
                time.sleep(_RETRY_SLEEP_S)
                continue
            message = lost_message(piece, at, piece.end, f"the queue ends at {answer.max_offset}")
            if fail_on_data_loss:
                raise DataLossError(message)
            log.warning("%s; the read stops there", message)
            return
        if following <= at:
            raise MqboxError(
                f"mqbox source: {key}: the broker sent the read back from {at} to {following}"
            )
        at = following
        waited_since_ns = None

"""BatchQueue: one consumed queue's messages between pull and acknowledgement, by batch.

Owns: the in-flight table of the concurrent push consumer and of the lite pull consumer, kept
per consume batch (an InFlight: first and last queue index, message count, body bytes) rather
than per message: Java's ProcessQueue (process_queue.py) with the same commit rule, counts and
flow control, at a cost per batch, so a consumer delivering a million messages a second makes
no object per message. process_queue.ProcessQueue stays the orderly consumer's table, which
consumes message by message anyway.

Never: threads, locks, clocks or I/O. The caller serialises access (one lock per queue, taken
once per batch) and passes `now_ms`.

Rules:

1. The committed offset never passes a message still being consumed: remove() answers the
   first index of the oldest batch still in flight, else the high-water mark (the largest
   nextBeginOffset of the pulls put so far: every message below it was pulled, and none is in
   flight), else -1 (nothing was ever put: commit nothing). Java answers the largest cached
   index + 1 where this answers the high-water mark; the two differ only by messages the tag
   check dropped, which nobody needs to consume, so a restart does not pull them again. While
   pulls bring increasing indexes, remove()'s answers never decrease.
2. cached_count and cached_size_bytes cover every batch put and not yet removed, as Java's
   msgCount and msgSize (stored body bytes, as process_queue.py rule 2 says).
3. max_span is the last index of the newest batch in flight minus the first index of the
   oldest (Java's getMaxSpan over cached messages).
4. Removing a batch twice, or one dropped by clear(), changes nothing and answers -1.

Data structure: a deque of InFlight in put order, with lazy deletion: remove() marks a batch
done and pops done batches from both ends, so the ends are always live and every batch is
popped once.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Final

from mqbox.client.process_queue import (
    CONSUME_MAX_SPAN_DEFAULT,
    PULL_MAX_IDLE_TIME_MS,
    PULL_THRESHOLD_COUNT_DEFAULT,
    PULL_THRESHOLD_SIZE_MIB_DEFAULT,
    FlowControl,
    flow_control_verdict,
)

NOTHING_TO_COMMIT: Final = -1


class InFlight:
    """One consume batch: queue indexes first..last (ascending, not necessarily contiguous:
    the tag check leaves gaps), `count` messages, `size_bytes` stored body bytes."""

    __slots__ = (
        "count",
        "done",
        "first_index",
        "last_index",
        "payload",
        "size_bytes",
        "started_ms",
    )

    def __init__(
        self, first_index: int, last_index: int, count: int, size_bytes: int, now_ms: int
    ) -> None:
        assert 0 <= first_index <= last_index
        assert 0 < count <= last_index - first_index + 1
        assert size_bytes >= 0
        self.first_index = first_index
        self.last_index = last_index
        self.count = count
        self.size_bytes = size_bytes
        self.started_ms = now_ms  # when it was put: the consume timeout counts from here
        self.done = False
        self.payload: Any = None  # the caller's (push: the handler and its messages)

    def __repr__(self) -> str:
        return (
            f"InFlight({self.first_index}..{self.last_index}, count={self.count}, done={self.done})"
        )


class BatchQueue:
    """The in-flight batches of one message queue (module docstring)."""

    __slots__ = (
        "_batches",
        "_count",
        "_size_bytes",
        "dropped",
        "high_water",
        "last_consume_timestamp_ms",
        "last_pull_timestamp_ms",
    )

    def __init__(self, now_ms: int) -> None:
        self._batches: deque[InFlight] = deque()
        self._count = 0
        self._size_bytes = 0
        self.high_water = NOTHING_TO_COMMIT  # the largest nextBeginOffset put (rule 1)
        self.dropped = False
        self.last_pull_timestamp_ms = now_ms
        self.last_consume_timestamp_ms = now_ms

    # --- counts -------------------------------------------------------------------------------

    @property
    def cached_count(self) -> int:
        return self._count

    @property
    def cached_size_bytes(self) -> int:
        return self._size_bytes

    def first_queue_index(self) -> int | None:
        """The first index of the oldest batch in flight, None when none is."""
        return self._batches[0].first_index if self._batches else None

    def max_span(self) -> int:
        """Rule 3; 0 when nothing is in flight."""
        batches = self._batches
        return batches[-1].last_index - batches[0].first_index if batches else 0

    def flow_control(
        self,
        *,
        count_max: int = PULL_THRESHOLD_COUNT_DEFAULT,
        size_mib_max: int = PULL_THRESHOLD_SIZE_MIB_DEFAULT,
        span_max: int = CONSUME_MAX_SPAN_DEFAULT,
    ) -> FlowControl | None:
        """Why the next pull must wait (Java's checks 4 to 6, in order), or None."""
        return flow_control_verdict(
            self._count,
            self._size_bytes,
            self.max_span(),
            count_max=count_max,
            size_mib_max=size_mib_max,
            span_max=span_max,
        )

    # --- pull side ----------------------------------------------------------------------------

    def advance(self, next_begin_offset: int) -> None:
        """A pull answered up to `next_begin_offset`: raise the high-water mark (rule 1). Call
        it before putting that pull's batches."""
        if next_begin_offset > self.high_water:
            self.high_water = next_begin_offset

    def put(
        self, first_index: int, last_index: int, count: int, size_bytes: int, now_ms: int
    ) -> InFlight:
        """Track one consume batch of a pull; the InFlight to hand to remove() once consumed."""
        batch = InFlight(first_index, last_index, count, size_bytes, now_ms)
        batches = self._batches
        assert not batches or batches[-1].last_index < first_index, "pulls go forward"
        batches.append(batch)
        self._count += count
        self._size_bytes += size_bytes
        return batch

    def mark_pulled(self, now_ms: int) -> None:
        self.last_pull_timestamp_ms = now_ms

    def is_pull_expired(self, now_ms: int) -> bool:
        """True when no pull for more than 120 s: rebalance drops the push queue."""
        return now_ms - self.last_pull_timestamp_ms > PULL_MAX_IDLE_TIME_MS

    # --- consume side -------------------------------------------------------------------------

    def remove(self, batch: InFlight, now_ms: int) -> int:
        """Forget a consumed batch; the offset to commit (rule 1), or -1 (rule 4)."""
        self.last_consume_timestamp_ms = now_ms
        if batch.done:
            return NOTHING_TO_COMMIT
        batch.done = True
        self._count -= batch.count
        self._size_bytes -= batch.size_bytes
        batches = self._batches
        while batches and batches[0].done:
            batches.popleft()
        while batches and batches[-1].done:
            batches.pop()
        return batches[0].first_index if batches else self.high_water

    def commit_offset(self) -> int:
        """What remove() would answer now, without removing anything."""
        batches = self._batches
        return batches[0].first_index if batches else self.high_water

    def oldest_expired(self, now_ms: int, consume_timeout_ms: int) -> InFlight | None:
        """The oldest batch in flight if it was put more than `consume_timeout_ms` ago (Java's
        cleanExpiredMsg: the caller sends it back and removes it)."""
        batches = self._batches
        if batches and now_ms - batches[0].started_ms > consume_timeout_ms:
            return batches[0]
        return None

    def clear(self) -> None:
        """Forget every batch (a dropped queue): later removes answer -1 (rule 4)."""
        for batch in self._batches:
            batch.done = True
        self._batches.clear()
        self._count = 0
        self._size_bytes = 0

    def check_invariants(self) -> None:
        """Assert the structure's invariants (tests call this after every operation)."""
        batches = self._batches
        if batches:
            assert not batches[0].done
            assert not batches[-1].done
        live = [batch for batch in batches if not batch.done]
        assert self._count == sum(batch.count for batch in live)
        assert self._size_bytes == sum(batch.size_bytes for batch in live)
        assert all(
            before.last_index < after.first_index for before, after in itertools.pairwise(batches)
        )
        if live:
            assert self.high_water > live[-1].last_index

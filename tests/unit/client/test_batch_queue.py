"""BatchQueue: the concurrent consumer's in-flight table, kept per batch.

Goal: remove() answers the first index of the oldest batch in flight, else the high-water mark
(the largest nextBeginOffset put), else -1, so the committed offset never passes a message
still being consumed and never goes back; counts, sizes, span and flow control follow Java's
checks 4 to 6; a batch removed twice or dropped by clear() changes nothing; the consume timeout
and pull expiry fire only past their limits.

Method: worked examples with explicit `now_ms`; a hypothesis state machine against a plain model
(the set of indexes in flight and the largest next offset) that pulls increasing runs of
indexes with gaps (the broker's tag filter), cuts them into batches of any size, acknowledges
any batch in any order (twice too), and checks after every step the invariants and that each
commit offset is at most the smallest index in flight and never decreases.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mqbox.client.batch_queue import NOTHING_TO_COMMIT, BatchQueue, InFlight
from mqbox.client.process_queue import MIB, PULL_MAX_IDLE_TIME_MS, FlowControl

NOW_MS = 1_700_000_000_000


def test_remove_answers_the_oldest_batch_in_flight_then_the_high_water_mark() -> None:
    queue = BatchQueue(NOW_MS)
    assert queue.commit_offset() == NOTHING_TO_COMMIT
    queue.advance(10)
    first = queue.put(0, 4, 5, 50, NOW_MS)
    second = queue.put(5, 9, 3, 30, NOW_MS)  # gaps: 3 messages between 5 and 9
    assert (queue.cached_count, queue.cached_size_bytes) == (8, 80)
    assert queue.remove(second, NOW_MS) == 0  # the first batch still holds index 0
    assert queue.remove(first, NOW_MS + 7) == 10  # nothing in flight: everything pulled
    assert queue.last_consume_timestamp_ms == NOW_MS + 7
    assert (queue.cached_count, queue.cached_size_bytes) == (0, 0)
    queue.check_invariants()


def test_a_batch_removed_twice_or_cleared_changes_nothing() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(3)
    batch = queue.put(0, 2, 3, 3, NOW_MS)
    assert queue.remove(batch, NOW_MS) == 3
    assert queue.remove(batch, NOW_MS) == NOTHING_TO_COMMIT
    queue.advance(6)
    other = queue.put(3, 5, 3, 3, NOW_MS)
    queue.clear()
    assert queue.remove(other, NOW_MS) == NOTHING_TO_COMMIT
    assert queue.cached_count == 0
    queue.check_invariants()


def test_the_high_water_mark_covers_pulls_whose_messages_the_tag_check_dropped() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(32)  # a pull of 32 where nothing passed the tag check
    assert queue.commit_offset() == 32
    queue.advance(20)  # never back
    assert queue.commit_offset() == 32


def test_flow_control_checks_count_then_size_then_span_as_java_does() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(5000)
    queue.put(0, 0, 1, 2 * MIB, NOW_MS)
    queue.put(10, 2500, 4, 1, NOW_MS)
    assert queue.max_span() == 2500
    assert queue.flow_control(count_max=4, size_mib_max=1, span_max=2000) is FlowControl.COUNT
    assert queue.flow_control(count_max=5, size_mib_max=1, span_max=2000) is FlowControl.SIZE
    assert queue.flow_control(count_max=5, size_mib_max=2, span_max=2000) is FlowControl.SPAN
    assert queue.flow_control(count_max=5, size_mib_max=2, span_max=2500) is None


def test_the_span_shrinks_when_the_newest_batch_is_acknowledged_first() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(100)
    old = queue.put(0, 9, 10, 10, NOW_MS)
    new = queue.put(90, 99, 10, 10, NOW_MS)
    queue.remove(new, NOW_MS)
    assert queue.max_span() == 9
    queue.remove(old, NOW_MS)
    assert queue.max_span() == 0


def test_consume_timeout_and_pull_expiry_fire_only_past_their_limits() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(1)
    batch = queue.put(0, 0, 1, 1, NOW_MS)
    assert queue.oldest_expired(NOW_MS + 1000, 1000) is None
    assert queue.oldest_expired(NOW_MS + 1001, 1000) is batch
    assert not queue.is_pull_expired(NOW_MS + PULL_MAX_IDLE_TIME_MS)
    assert queue.is_pull_expired(NOW_MS + PULL_MAX_IDLE_TIME_MS + 1)
    queue.mark_pulled(NOW_MS + PULL_MAX_IDLE_TIME_MS)
    assert not queue.is_pull_expired(NOW_MS + PULL_MAX_IDLE_TIME_MS + 1)


def test_batches_must_go_forward() -> None:
    queue = BatchQueue(NOW_MS)
    queue.advance(10)
    queue.put(5, 9, 5, 5, NOW_MS)
    with pytest.raises(AssertionError):
        queue.put(3, 4, 2, 2, NOW_MS)


class BatchQueueMachine(RuleBasedStateMachine):
    """BatchQueue against a model: the indexes in flight, and the largest next offset."""

    @initialize()
    def start(self) -> None:
        self.queue = BatchQueue(NOW_MS)
        self.next_index = 0
        self.in_flight: dict[int, set[int]] = {}  # id(batch) -> its indexes
        self.batches: list[InFlight] = []
        self.high_water = NOTHING_TO_COMMIT
        self.last_commit = NOTHING_TO_COMMIT

    @rule(
        gaps=st.lists(st.integers(0, 3), min_size=1, max_size=40),
        cut=st.integers(1, 8),
        trailing=st.integers(0, 5),
    )
    def pull(self, gaps: list[int], cut: int, trailing: int) -> None:
        indexes = []
        at = self.next_index
        for gap in gaps:
            at += gap
            indexes.append(at)
            at += 1
        next_offset = at + trailing
        self.queue.advance(next_offset)
        for start in range(0, len(indexes), cut):
            chunk = indexes[start : start + cut]
            batch = self.queue.put(chunk[0], chunk[-1], len(chunk), len(chunk) * 3, NOW_MS)
            self.in_flight[id(batch)] = set(chunk)
            self.batches.append(batch)
        self.next_index = next_offset
        self.high_water = max(self.high_water, next_offset)

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        batch = data.draw(st.sampled_from(self.batches))
        offset = self.queue.remove(batch, NOW_MS)
        if id(batch) not in self.in_flight:
            assert offset == NOTHING_TO_COMMIT  # removed before
            return
        del self.in_flight[id(batch)]
        waiting = set().union(*self.in_flight.values())
        assert offset == (min(waiting) if waiting else self.high_water)
        assert offset >= self.last_commit
        self.last_commit = offset

    @invariant()
    def holds(self) -> None:
        if not hasattr(self, "queue"):
            return
        self.queue.check_invariants()
        waiting = set().union(*self.in_flight.values()) if self.in_flight else set()
        assert self.queue.cached_count == len(waiting)
        assert self.queue.cached_size_bytes == 3 * len(waiting)
        commit = self.queue.commit_offset()
        if waiting:
            assert commit <= min(waiting)
            assert self.queue.max_span() >= max(waiting) - min(waiting)


TestBatchQueueMachine = BatchQueueMachine.TestCase

"""ProcessQueue: Java's in-flight table, its commit offset, orderly consuming set and clocks.

Goal: remove() answers what Java's removeMessage answers (smallest cached index, max + 1 when
empty, -1 when nothing was cached) so the committed offset never passes a message still being
consumed; counts, sizes, span and flow control follow Java's numbers; the orderly take / commit
/ rollback / make-again cycle re-delivers in order; pull and lock expiry happen exactly past
120 s and 30 s.

Method: worked examples with explicit `now_ms`; then two hypothesis state machines against a
plain model (a dict and min/max): one interleaves pulls of increasing indexes (with gaps, as a
broker's tag filter leaves) with acknowledgements of any subset in any order, and checks that
every commit offset is at most the smallest unacknowledged index and never decreases; the
other drives the orderly cycle. Both call check_invariants() after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqbox.client.process_queue import (
    FLOW_CONTROL_DELAY_MS,
    MIB,
    FlowControl,
    ProcessQueue,
)

NOW_MS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class Message:
    queue_index: int
    body_size_bytes: int = 10


def messages(*indexes: int, size_bytes: int = 10) -> list[Message]:
    return [Message(index, size_bytes) for index in indexes]


def new_queue() -> ProcessQueue[Message]:
    return ProcessQueue(NOW_MS)


# --- Concurrent ---------------------------------------------------------------------------------


def test_remove_answers_the_smallest_in_flight_then_max_plus_one() -> None:
    queue = new_queue()
    assert queue.remove([0], NOW_MS) == -1  # nothing cached: commit nothing
    queue.put(messages(0, 1, 2, 3, 4))
    assert queue.remove([2], NOW_MS) == 0
    assert queue.remove([0], NOW_MS) == 1
    assert queue.remove([1, 3, 4], NOW_MS + 5) == 5
    assert queue.last_consume_timestamp_ms == NOW_MS + 5
    assert queue.remove([4], NOW_MS) == -1
    queue.put(messages(9, 12))  # a gap the broker's filter left
    assert queue.remove([12], NOW_MS) == 9
    assert queue.remove([9], NOW_MS) == 13
    queue.check_invariants()


def test_counts_and_sizes_ignore_repeats_and_unknown_indexes() -> None:
    queue = new_queue()
    queue.put(messages(5, 6, size_bytes=100))
    queue.put([Message(6, 100), Message(7, 1)])
    assert (queue.cached_count, queue.cached_size_bytes) == (3, 201)
    assert queue.remove([6, 99], NOW_MS) == 5
    assert (queue.cached_count, queue.cached_size_bytes) == (2, 101)
    assert queue.max_span() == 2
    queue.check_invariants()


def test_flow_control_follows_javas_thresholds_and_order() -> None:
    queue = new_queue()
    queue.put(messages(*range(1_000)))
    assert queue.flow_control(orderly=False) is None
    queue.put(messages(2_000))
    assert queue.flow_control(orderly=False) is FlowControl.COUNT
    assert queue.flow_control(orderly=False, count_max=2_000) is None  # span 2000 is allowed
    queue.put(messages(2_001))
    assert queue.flow_control(orderly=False, count_max=2_000) is FlowControl.SPAN
    assert queue.flow_control(orderly=True, count_max=2_000) is None
    big = new_queue()
    big.put([Message(0, 100 * MIB), Message(1, MIB - 1)])
    assert big.flow_control(orderly=False) is None  # 100 MiB and change: still 100 in whole MiB
    big.put([Message(2, 1)])
    assert big.flow_control(orderly=False) is FlowControl.SIZE
    assert FLOW_CONTROL_DELAY_MS == 50


def test_accumulated_count_comes_from_the_last_message_and_max_offset() -> None:
    queue = new_queue()
    queue.put(messages(3, 4), max_offset=10)
    assert queue.accumulated_count == 6
    queue.put(messages(10), max_offset=10)  # 0 is not recorded
    assert queue.accumulated_count == 6


def test_oldest_expired_is_the_first_message_past_the_timeout() -> None:
    queue = new_queue()
    queue.put(messages(1, 2))
    assert queue.oldest_expired(NOW_MS, 1_000) is None  # not started
    queue.mark_consume_started([1, 2], NOW_MS)
    assert queue.oldest_expired(NOW_MS + 1_000, 1_000) is None
    assert queue.oldest_expired(NOW_MS + 1_001, 1_000) == Message(1)
    queue.remove([1], NOW_MS)
    assert queue.oldest_expired(NOW_MS + 1_001, 1_000) == Message(2)
    queue.check_invariants()


def test_pull_expires_after_120_seconds_and_lock_after_30() -> None:
    queue = new_queue()
    assert not queue.is_pull_expired(NOW_MS + 120_000)
    assert queue.is_pull_expired(NOW_MS + 120_001)
    queue.mark_pulled(NOW_MS + 100_000)
    assert not queue.is_pull_expired(NOW_MS + 220_000)
    assert not queue.holds_lock(NOW_MS)
    queue.set_locked(NOW_MS + 1)
    assert queue.holds_lock(NOW_MS + 30_001)
    assert queue.is_lock_expired(NOW_MS + 30_002)
    assert not queue.holds_lock(NOW_MS + 30_002)


def test_clear_forgets_everything() -> None:
    queue = new_queue()
    queue.put(messages(1, 2, 3))
    queue.take(1, NOW_MS)
    queue.clear()
    stats = queue.statistics()
    assert (stats.cached_count, stats.cached_size_bytes, stats.consuming_count) == (0, 0, 0)
    assert stats.queue_offset_max == 0
    assert queue.remove([2], NOW_MS) == -1
    queue.check_invariants()


# --- Orderly ------------------------------------------------------------------------------------


def test_orderly_take_commit_rollback_and_consume_again() -> None:
    queue = new_queue()
    assert queue.put(messages(0, 1, 2, 3, 4))  # first put: submit a consume task
    assert not queue.put(messages(5))  # one is already submitted
    assert queue.take(2, NOW_MS) == messages(0, 1)
    assert queue.cached_count == 6  # consuming ones still count
    assert queue.commit() == 2
    assert queue.cached_count == 4
    assert queue.take(2, NOW_MS) == messages(2, 3)
    queue.rollback()
    assert queue.take(3, NOW_MS) == messages(2, 3, 4)
    queue.make_message_to_consume_again(messages(2, 3, 4))  # SUSPEND: the whole batch
    assert queue.commit() == -1
    assert queue.take(3, NOW_MS) == messages(2, 3, 4)
    queue.make_message_to_consume_again(messages(2))  # part of it: Java's commit would say 5
    assert queue.commit() == 2
    assert queue.take(10, NOW_MS) == messages(2, 5)
    assert queue.commit() == 6
    assert queue.take(1, NOW_MS) == []
    assert not queue.consuming  # the next put submits again
    assert queue.put(messages(6))
    assert queue.commit() == -1
    queue.check_invariants()


def test_a_repeated_index_that_is_being_consumed_is_ignored() -> None:
    queue = new_queue()
    queue.put(messages(0, 1))
    queue.take(1, NOW_MS)
    queue.put(messages(0))
    assert queue.cached_count == 2
    assert queue.take(5, NOW_MS) == messages(1)
    queue.check_invariants()


def test_many_rounds_keep_the_order_list_compact() -> None:
    queue = new_queue()
    for start in range(0, 100_000, 32):
        queue.put(messages(*range(start, start + 32)))
        assert queue.remove(range(start, start + 32), NOW_MS) == start + 32
    queue.check_invariants()
    assert queue.statistics().cached_queue_index_min is None


# --- Properties ---------------------------------------------------------------------------------


class ConcurrentConsumer(RuleBasedStateMachine):
    """Pulls of increasing indexes, acknowledgements of any subset in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: ProcessQueue[Message] = new_queue()
        self.next_index = 0
        self.unacknowledged: set[int] = set()
        self.last_commit = -1
        self.max_put = -1

    @rule(gap=st.integers(0, 5), count=st.integers(1, 33), size_bytes=st.integers(0, 50))
    def pull(self, gap: int, count: int, size_bytes: int) -> None:
        start = self.next_index + gap
        batch = messages(*range(start, start + count), size_bytes=size_bytes)
        self.queue.put(batch)
        self.unacknowledged.update(message.queue_index for message in batch)
        self.next_index = start + count
        self.max_put = start + count - 1

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        pool = [*sorted(self.unacknowledged), self.next_index + 7]  # and one never pulled
        chosen = data.draw(st.lists(st.sampled_from(pool), max_size=12))
        was_empty = not self.unacknowledged
        offset = self.queue.remove(chosen, NOW_MS)
        self.unacknowledged.difference_update(chosen)
        if was_empty:
            assert offset == -1
            return
        if self.unacknowledged:
            assert offset == min(self.unacknowledged)
        else:
            assert offset == self.max_put + 1
        assert offset >= self.last_commit
        self.last_commit = offset

    @invariant()
    def table_matches_the_model(self) -> None:
        self.queue.check_invariants()
        assert self.queue.cached_count == len(self.unacknowledged)
        assert self.queue.first_queue_index() == min(self.unacknowledged, default=None)
        assert self.queue.last_queue_index() == max(self.unacknowledged, default=None)


class OrderlyConsumer(RuleBasedStateMachine):
    """Pulls, takes, commits, rollbacks and consume-again in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: ProcessQueue[Message] = new_queue()
        self.next_index = 0
        self.waiting: set[int] = set()
        self.consuming: set[int] = set()
        self.last_commit = -1

    @rule(gap=st.integers(0, 3), count=st.integers(1, 8))
    def pull(self, gap: int, count: int) -> None:
        start = self.next_index + gap
        self.queue.put(messages(*range(start, start + count)))
        self.waiting.update(range(start, start + count))
        self.next_index = start + count

    @rule(batch_size=st.integers(1, 5))
    def take(self, batch_size: int) -> None:
        taken = [message.queue_index for message in self.queue.take(batch_size, NOW_MS)]
        assert taken == sorted(self.waiting)[:batch_size]
        self.waiting.difference_update(taken)
        self.consuming.update(taken)

    @rule()
    def commit(self) -> None:
        offset = self.queue.commit()
        if not self.consuming:
            assert offset == -1
            return
        assert offset == min(max(self.consuming) + 1, min(self.waiting, default=offset))
        assert all(index >= offset for index in self.waiting)  # never passes a waiting one
        assert offset >= self.last_commit
        self.last_commit = offset
        self.consuming.clear()

    @precondition(lambda self: self.consuming)
    @rule()
    def rollback(self) -> None:
        self.queue.rollback()
        self.waiting.update(self.consuming)
        self.consuming.clear()

    @precondition(lambda self: self.consuming)
    @rule(data=st.data())
    def consume_again(self, data: st.DataObject) -> None:
        again = data.draw(st.sets(st.sampled_from(sorted(self.consuming)), min_size=1))
        self.queue.make_message_to_consume_again(messages(*sorted(again)))
        self.consuming.difference_update(again)
        self.waiting.update(again)

    @invariant()
    def table_matches_the_model(self) -> None:
        self.queue.check_invariants()
        assert self.queue.cached_count == len(self.waiting) + len(self.consuming)
        assert self.queue.first_queue_index() == min(self.waiting, default=None)
        assert self.queue.last_queue_index() == max(self.waiting, default=None)


TestConcurrentConsumer = ConcurrentConsumer.TestCase
TestOrderlyConsumer = OrderlyConsumer.TestCase


@pytest.mark.parametrize("batch", [1, 32])
def test_remove_after_a_rollback_below_the_head_finds_the_restored_index(batch: int) -> None:
    queue = new_queue()
    queue.put(messages(*range(300)))
    taken = queue.take(batch, NOW_MS)
    queue.take(250, NOW_MS)  # the head moves past the compaction threshold
    queue.rollback()
    assert queue.first_queue_index() == taken[0].queue_index
    queue.check_invariants()

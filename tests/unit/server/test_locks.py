"""Goal: queue locks of orderly consumers (processors/locks.py) grant a free or expired queue, renew
it for its holder, refuse it to anyone else for 60 s after the holder's last lock request,
release only on the holder's unlock, keep groups apart, and forget expired locks when swept.

Method: QueueLocks with explicit monotonic times; MessageQueue values as LOCK_BATCH_MQ bodies
carry them.
"""

from __future__ import annotations

from mqbox.protocol.headers import MessageQueue
from mqbox.server.roles.processors.locks import LOCK_LIFETIME_MS_DEFAULT, QueueLocks

SECOND_NS = 1_000_000_000
LIFETIME_NS = LOCK_LIFETIME_MS_DEFAULT * 1_000_000
Q0 = MessageQueue("T", "broker-a", 0)
Q1 = MessageQueue("T", "broker-a", 1)


def test_a_free_queue_is_granted_and_refused_to_another_client_until_it_expires() -> None:
    locks = QueueLocks()
    assert locks.lock("CG", "a", [Q0, Q1], 0) == [Q0, Q1]
    assert locks.lock("CG", "b", [Q0, Q1], 30 * SECOND_NS) == []
    assert locks.holder("CG", Q0, LIFETIME_NS - 1) == "a"
    assert locks.holder("CG", Q0, LIFETIME_NS) is None
    assert locks.lock("CG", "b", [Q0], LIFETIME_NS) == [Q0]
    assert locks.holder("CG", Q0, LIFETIME_NS) == "b"
    assert locks.statistics().refused_count == 2


def test_the_holder_renews_its_lock_with_every_request() -> None:
    locks = QueueLocks()
    locks.lock("CG", "a", [Q0], 0)
    assert locks.lock("CG", "a", [Q0], 50 * SECOND_NS) == [Q0]
    assert locks.lock("CG", "b", [Q0], 100 * SECOND_NS) == []  # 50 s after the renewal
    assert locks.lock("CG", "b", [Q0], 50 * SECOND_NS + LIFETIME_NS) == [Q0]


def test_unlock_releases_only_what_the_client_holds() -> None:
    locks = QueueLocks()
    locks.lock("CG", "a", [Q0], 0)
    locks.lock("CG", "b", [Q1], 0)
    assert locks.unlock("CG", "b", [Q0, Q1]) == 1
    assert locks.holder("CG", Q0, 0) == "a"
    assert locks.lock("CG", "c", [Q1], SECOND_NS) == [Q1]
    assert locks.unlock("NOBODY", "a", [Q0]) == 0


def test_groups_lock_the_same_queue_independently() -> None:
    locks = QueueLocks()
    assert locks.lock("G1", "a", [Q0], 0) == [Q0]
    assert locks.lock("G2", "b", [Q0], 0) == [Q0]
    assert locks.holder("G1", Q0, 0) == "a"
    assert locks.holder("G2", Q0, 0) == "b"


def test_a_queue_named_twice_is_granted_once_and_expired_locks_are_swept() -> None:
    locks = QueueLocks(lifetime_ns=10)
    assert locks.lock("CG", "a", [Q0, Q0, Q1], 0) == [Q0, Q1]
    assert locks.statistics().lock_count == 2
    assert locks.expire(9) == 0
    assert locks.expire(10) == 2
    assert locks.statistics().lock_count == 0

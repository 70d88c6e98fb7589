"""Queue locks of orderly consumers: LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42).

Owns: `QueueLocks`, which client of a consumer group holds which message queue and until when
(RocketMQ's RebalanceLockManager). Never: I/O, clocks (callers pass monotonic ns), or answering
(the admin processor does, quickly: the C++ client gives a lock request 1 s).

Rules (docs/protocol.md section 4.3, Java's RebalanceLockManager):
- A queue is granted to a client when nobody holds it, when its holder's lock expired
  (`lifetime_ns` after the last grant: mqboxRebalanceLockMaxLiveTimeMs, 60 s by default as
  Java's rocketmq.broker.rebalance.lockMaxLiveTime), or when
  the client holds it already; every grant renews the lock.
- Unlock releases only the queues the asking client holds.
- A closed connection releases nothing: the Java broker lets locks expire, and a client that
  reconnects at once keeps its queues.

Invariants: a queue has at most one holder per group; an entry whose lock expired is treated as
free and dropped by `expire` (so the table stays bounded by the live locks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final

from mqbox.protocol.headers import MessageQueue

LOCK_LIFETIME_MS_DEFAULT: Final = 60_000


@dataclasses.dataclass(slots=True)
class _Lock:
    client_id: str
    expires_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class QueueLocksStatistics:
    lock_count: int  # live or not yet swept
    granted_count: int
    refused_count: int
    released_count: int


class QueueLocks:
    """The lock table of every consumer group (module docstring)."""

    def __init__(self, *, lifetime_ns: int = LOCK_LIFETIME_MS_DEFAULT * 1_000_000) -> None:
        assert lifetime_ns > 0
        self.lifetime_ns = lifetime_ns
        self._groups: dict[str, dict[MessageQueue, _Lock]] = {}
        self._granted_count = 0
        self._refused_count = 0
        self._released_count = 0

    def lock(
        self, group: str, client_id: str, queues: Iterable[MessageQueue], now_ns: int
    ) -> list[MessageQueue]:
        """Grant or renew each queue the client may hold; the granted ones, in request order
        (each once)."""
        locks = self._groups.setdefault(group, {})
        granted: list[MessageQueue] = []
        for queue in dict.fromkeys(queues):
            held = locks.get(queue)
            if held is None or held.client_id == client_id or held.expires_ns <= now_ns:
                locks[queue] = _Lock(client_id, now_ns + self.lifetime_ns)
                granted.append(queue)
            else:
                self._refused_count += 1
        self._granted_count += len(granted)
        if not locks:
            del self._groups[group]
        return granted

    def unlock(self, group: str, client_id: str, queues: Iterable[MessageQueue]) -> int:
        """Release the queues the client holds; how many it released."""
        locks = self._groups.get(group)
        if locks is None:
            return 0
        released = 0
        for queue in queues:
            held = locks.get(queue)
            if held is not None and held.client_id == client_id:
                del locks[queue]
                released += 1
        if not locks:
            del self._groups[group]
        self._released_count += released
        return released

    def holder(self, group: str, queue: MessageQueue, now_ns: int) -> str | None:
        """The client holding the queue now, or None."""
        held = self._groups.get(group, {}).get(queue)
        if held is None or held.expires_ns <= now_ns:
            return None
        return held.client_id

    def expire(self, now_ns: int) -> int:
        """Drop every expired lock; how many."""
        dropped = 0
        for group in list(self._groups):
            locks = self._groups[group]
            doomed = [queue for queue, held in locks.items() if held.expires_ns <= now_ns]
            for queue in doomed:
                del locks[queue]
            dropped += len(doomed)
            if not locks:
                del self._groups[group]
        return dropped

    def statistics(self) -> QueueLocksStatistics:
        return QueueLocksStatistics(
            lock_count=sum(len(locks) for locks in self._groups.values()),
            granted_count=self._granted_count,
            refused_count=self._refused_count,
            released_count=self._released_count,
        )

"""What the two HA roles share: their link to the store writer and their view of the log.

Owns: `HaLink`, the plumbing of ha_service.0 (a master) and ha_client.0 (a slave): the
store-positions segment (they read the write position and write the replication line), a
read-only CommitLog over the broker's segments, the WRITTEN ring from the store writer (it only
wakes them) and the ring back to it, one epoll with the stop descriptor, and the close. Never:
sockets to the peer, or what the roles say on them (ha_service.py, ha_client.py).
"""

from __future__ import annotations

import select
import time
from typing import Final

from mqbox.ipc.ring import Ring
from mqbox.message import pack_host
from mqbox.server.parcels import Buffer
from mqbox.server.queue_counters import StorePositions, store_positions_name
from mqbox.server.runtime import RoleContext
from mqbox.server.transport import Inbox, Outbox, Sleeper, SpillWriter
from mqbox.store.commit_log import CommitLog
from mqbox.store.layout import StoreGeometry
from mqbox.store.message_store import StoreConfig

RETENTION_CHECK_INTERVAL_NS: Final = 1_000_000_000


def store_geometry(ctx: RoleContext) -> StoreGeometry:
    """The segment sizes of this broker's store."""
    return StoreConfig.from_broker_config(ctx.broker, pack_host("127.0.0.1", 0)).geometry


class HaLink:
    """The store-side plumbing of one HA role (module docstring)."""

    def __init__(self, ctx: RoleContext, wakeup_fd: int | None) -> None:
        self.role_id = ctx.role.role_id
        self.positions = StorePositions.attach(store_positions_name(ctx.instance))
        self.commit_log = CommitLog.open(
            ctx.store_root,
            store_geometry(ctx),
            writable=False,
            record_size_bytes_max=ctx.broker.max_message_size_bytes,
        )
        self.segment_size_bytes = self.commit_log.segment_size_bytes
        self.spill_writer = SpillWriter(ctx.instance, self.role_id)
        topology = ctx.topology
        self.inboxes = [
            Inbox(Ring.attach(spec.name), spec.producer) for spec in topology.rings_to(self.role_id)
        ]
        self.outboxes = [
            Outbox(Ring.attach(spec.name), self.spill_writer)
            for spec in topology.rings_from(self.role_id)
        ]
        self.epoll = select.epoll()
        self.sleeper = Sleeper(self.epoll, self.inboxes)
        self.wakeup_fd = wakeup_fd
        if wakeup_fd is not None:
            self.epoll.register(wakeup_fd, select.EPOLLIN)
        self._retention_due_ns = 0

    def follow_retention_nowait(self) -> None:
        """Drop this view's maps of segments the writer's retention deleted (at most once a
        second), so their disk space is freed."""
        now_ns = time.monotonic_ns()
        if now_ns < self._retention_due_ns:
            return
        self._retention_due_ns = now_ns + RETENTION_CHECK_INTERVAL_NS
        self.commit_log.follow_retention(self.positions.min_log_offset_bytes)

    def retention_check_in_ms(self, now_ns: int) -> int:
        """Milliseconds until `follow_retention_nowait` looks again (at least 1): how long a
        role with nothing else to wait for may sleep."""
        return max(1, -(-(self._retention_due_ns - now_ns) // 1_000_000))

    def drain_written(self) -> int:
        """Take the WRITTEN parcels: they only wake the role (positions are in shared memory).
        Returns how many there were."""
        count = 0
        for inbox in self.inboxes:
            if inbox.ring.readable():
                batch = inbox.drain_nowait()
                count += batch.count
                inbox.release(batch)
        return count

    def send(self, parcel_type: int, head: Buffer, *tail: Buffer) -> None:
        """One parcel to the store writer (staged; `flush_nowait` writes it)."""
        for outbox in self.outboxes:
            outbox.append(parcel_type, head, *tail)

    def flush_nowait(self) -> None:
        for outbox in self.outboxes:
            if outbox.pending_count:
                outbox.flush_nowait()

    @property
    def backed_up_bytes(self) -> int:
        """Bytes staged for the store writer that its ring has no room for yet."""
        return sum(outbox.pending_size_bytes for outbox in self.outboxes)

    def close(self) -> None:
        self.flush_nowait()
        self.epoll.close()
        self.commit_log.close()
        for inbox in self.inboxes:
            inbox.ring.close()
        for outbox in self.outboxes:
            outbox.ring.close()
        self.positions.close()

"""The admin processor: every request that is neither a SEND nor a PULL.

Owns, in admin.0 (the only process that holds them; routing.py sends it their codes, and
topology.py sends it the pulls' offset commits): the client tables (clients.py), consumer offsets
and queue locks (offsets.py), the calls to clients (307 and 309 relayed, 221 gathered for a
223, 40 and 220 sent), the subscription groups (groups.py) and, on a slave, the copy of the
master's metadata (slave_sync.py). In every admin processor: the store queries (queries.py), topic
admin (topic_admin.py), the broker's runtime figures and configuration (broker_info.py), broker
statistics (statistics.py: 315), REQUEST_CODE_NOT_SUPPORTED (3, with the Java broker's remark) for
every other code, and the admin pool's share of the base class's plumbing (the workers'
REQUEST_FAILED and idle CLOSE_CONNECTION). Each handler's docstring says what its code answers;
base.py holds the state they share.

Never: writes the store, or holds a request other than a 307, 309 or 223 waiting for its
clients (every other answer goes out at once: the C++ client gives a lock request 1 s and closes
its connection on a timeout). A held request is a table entry, not a wait: the loop keeps
serving everyone meanwhile. Should admin.k (k > 0) ever get a member-0 code, it answers
SYSTEM_ERROR with a remark (a worker bug; it holds no tables to answer from).

Bad input: a typed header or body that does not parse is answered SYSTEM_ERROR (1) with a remark
naming the field (RemoteProtocolError, answered by the base class); a group name outside
[A-Za-z0-9%|_-]{1,255} or a negative queue id, 1 as well; a topic that topics.json does not hold,
17 TOPIC_NOT_EXIST. Nothing from outside reaches an assert.

RocketMQ's statistics codes (202, 208, 317, 223...) answer in Java's fastjson text, whose maps
may be keyed by objects (protocol/admin_bodies.py); mqbox's own codes (protocol/mqbox_codes.py)
cover only what RocketMQ has no code for, with string ext values and standard JSON bodies.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from mqbox.protocol.codes import FLAG_RESPONSE, ResponseCode
from mqbox.protocol.headers import validate_topic
from mqbox.server import admin_parcels
from mqbox.server.parcels import ConnectionEvent
from mqbox.server.roles.processors import Request, run_processor
from mqbox.server.roles.processors.admin.base import (
    HOUSEKEEPING_INTERVAL_NS,
    AdminStatistics,
)
from mqbox.server.roles.processors.admin.broker_info import BrokerInfo
from mqbox.server.roles.processors.admin.broker_status import BrokerStatus
from mqbox.server.roles.processors.admin.clients import ClientManagement
from mqbox.server.roles.processors.admin.offsets import ConsumerOffsetHandlers
from mqbox.server.roles.processors.admin.queries import StoreQueries
from mqbox.server.roles.processors.admin.slave_sync import SlaveSync
from mqbox.server.roles.processors.admin.statistics import BrokerStatistics
from mqbox.server.roles.processors.admin.topic_admin import TopicAdmin
from mqbox.server.roles.processors.client_manager import group_name_problem
from mqbox.server.routing import MEMBER_ZERO_CODES
from mqbox.server.runtime import RoleContext

log = logging.getLogger("mqbox.admin")

__all__ = ["AdminProcessor", "main"]


class AdminProcessor(
    ClientManagement,
    ConsumerOffsetHandlers,
    StoreQueries,
    TopicAdmin,
    BrokerInfo,
    BrokerStatistics,
    BrokerStatus,
    SlaveSync,
):
    """The admin role: the sections of handlers (groups.py under slave_sync.py, which applies a
    slave's copy of its master's metadata) and the hooks of the loop."""

    def _on_stop_requested(self) -> None:
        """The base's stop, plus the offsets saved before an orderly exit (SIGTERM)."""
        self.on_stop()
        self._flush()

    def on_stop(self) -> None:
        """Save what must survive the stop: the offsets committed since the last save."""
        self.stop_slave_sync()
        self.offsets.persist_now()

    def handle(self, request: Request) -> None:
        """A client's answer to a broker request goes to the request waiting for it; a member-0
        code reaching admin.k (k > 0) is a worker bug, answered SYSTEM_ERROR; the rest by the
        handler tables."""
        if request.flag & FLAG_RESPONSE:
            self._on_client_response(request)
            return
        if not self.owns_state and request.code in MEMBER_ZERO_CODES:
            self.reply(
                request,
                request.make_response(
                    ResponseCode.SYSTEM_ERROR,
                    {},
                    remark=f"mqbox: {self.role_id} does not hold the client and offset tables; "
                    f"code {request.code} belongs to admin.0 (a routing bug in the worker)",
                ),
            )
            return
        super().handle(request)

    def unsupported(self, request: Request) -> None:
        self.unsupported_requests += 1
        super().unsupported(request)

    def on_connection_closed(self, event: ConnectionEvent) -> None:
        if self.owns_state:
            self._apply(self.clients.connection_closed(event.conn_id))
        if self._client_calls:
            for key in [key for key in self._client_calls if key[0] == event.conn_id]:
                call = self._client_calls.pop(key)
                self._fail_client_call(
                    key, call, ResponseCode.SYSTEM_ERROR, "its connection closed"
                )

    def on_parcel(self, producer: str, parcel_type: int, payload: memoryview) -> None:
        if parcel_type != admin_parcels.COMMIT_OFFSET:
            super().on_parcel(producer, parcel_type, payload)
            return
        assert self.owns_state, "COMMIT_OFFSET reaches admin.0 only (topology.py)"
        commit = admin_parcels.unpack_commit_offset(payload, 0, len(payload))
        self._commit_parcels += 1
        if (
            group_name_problem(commit.group) is not None
            or validate_topic(commit.topic) is not None
            or not self.offsets.commit(
                commit.group,
                commit.topic,
                commit.queue_id,
                commit.queue_index,
                self.clock_ns(),
                forward_only=True,  # relayed on another ring: maybe behind a later UPDATE
            )
        ):
            self._commit_parcels_refused += 1

    def on_tick(self, now_ns: int) -> None:
        self.start_slave_sync()  # admin.0 of a slave only; once
        self.apply_slave_sync_nowait()
        self._send_notifications()
        clock_now_ns = self.clock_ns()
        if self._client_calls:
            self._expire_client_calls(clock_now_ns)
        if clock_now_ns >= self._housekeeping_due_ns:
            self._housekeeping_due_ns = clock_now_ns + HOUSEKEEPING_INTERVAL_NS
            self.housekeeping(clock_now_ns)

    def next_deadline_ns(self) -> int | None:
        # Notifications wait for the end of the turn, so a burst of heartbeats sends one each.
        return 0 if self._notify_pending else None

    def housekeeping(self, now_ns: int) -> None:
        """Once a second (on_tick): silent clients, expired locks, the offsets' save schedule."""
        if not self.owns_state:
            return
        self._apply(self.clients.expire(now_ns))
        self.locks.expire(now_ns)
        self.offsets.persist_if_due(now_ns)
        self._send_notifications()

    def statistics_admin(self) -> AdminStatistics:
        clients = self.clients.statistics()
        return AdminStatistics(
            owns_state=self.owns_state,
            client_responses=self.client_responses,
            unsupported_requests=self.unsupported_requests,
            notifications_sent=self._notifications_sent,
            commit_parcels=self._commit_parcels,
            commit_parcels_refused=self._commit_parcels_refused,
            subscriptions_file_writes=self._subscriptions_file_writes,
            consumer_count=clients.consumer_count,
            producer_count=clients.producer_count,
            offsets_persisted=self.offsets.statistics().persist_count,
            locks_held=self.locks.statistics().lock_count,
            client_calls_pending=len(self._client_calls),
            client_calls_relayed=self._client_calls_relayed,
            client_calls_failed=self._client_calls_failed,
            reset_notices_sent=self._reset_notices_sent,
        )

    def close(self) -> None:
        """Release the store maps (tests; a role process just exits)."""
        self.store.close()


def main(ctx: RoleContext) -> NoReturn:
    """The admin processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, AdminProcessor)

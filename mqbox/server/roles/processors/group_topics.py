"""Which topics a consumer group consumes, as a processor that is not admin.0 can tell.

Owns: `GroupTopics`, the send processor's answer to "may group G send back a record of topic
T?" before CONSUMER_SEND_MSG_BACK (36) copies the record (send.py; docs/security.md). Without
it, any client could name any commit-log offset and have any topic's message copied into its
own group's retry or dead-letter topic, and read it there.

A group consumes a topic when either holds:
- live: the group's subscription table from its members' heartbeats names the topic; admin.0
  writes it to mqboxSubscriptions.json (admin_parcels.GroupSubscriptionsReader), so a group
  whose members all left or went silent (120 s) is absent;
- history: the group committed an offset for the topic (consumerOffset.json, written by admin.0
  at most every 5 s while something changed). This keeps retries working when the live table
  is empty for a legitimate consumer: after a broker restart or a reconnect, until the next
  heartbeat (every 30 s), and for a send-back that comes late. It matters most for the C++
  client, which drops a message whose send-back fails (the Java client falls back to a plain
  send to `%RETRY%<group>`).
`%RETRY%<group>` itself is always the group's own (the caller checks that first).

With ACL off this is hygiene, not a wall: anyone may heartbeat a subscription or commit an
offset, and pull the topic directly. With ACL on, both kinds of evidence need SUB on the topic
(heartbeat and offset commits are checked), so the send-back cannot read more than the account
may.

Never: writes (admin.0 owns both files), a lock, or a read of consumerOffset.json more than
once per OFFSETS_RELOAD_INTERVAL_NS (only a miss of the live table reads it at all).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from mqbox.errors import MqboxError
from mqbox.server.admin_parcels import GroupSubscriptionsReader
from mqbox.store import config_files
from mqbox.store.layout import CONSUMER_OFFSET_FILE_NAME, config_dir

OFFSETS_RELOAD_INTERVAL_NS: Final = 1_000_000_000


class GroupTopics:
    """One process's read-only view of what each consumer group consumes (module docstring)."""

    def __init__(
        self,
        store_root: Path,
        *,
        offsets_reload_interval_ns: int = OFFSETS_RELOAD_INTERVAL_NS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        assert offsets_reload_interval_ns >= 0
        self.subscriptions = GroupSubscriptionsReader(store_root)
        self._config_dir = config_dir(store_root)
        self._offsets_path = self._config_dir / CONSUMER_OFFSET_FILE_NAME
        self._offsets_reload_interval_ns = offsets_reload_interval_ns
        self._clock_ns = clock_ns
        self._committed: frozenset[tuple[str, str]] = frozenset()  # (topic, group)
        self._offsets_signature: tuple[int, int, int] | None = None
        self._offsets_check_due_ns = 0
        self.offsets_reload_count = 0

    def consumes_any(self, group: str, topics: Iterable[str]) -> bool:
        """True if the group subscribes to, or committed an offset for, one of `topics`."""
        wanted = tuple(topics)
        if any(self.subscriptions.get(group, topic) is not None for topic in wanted):
            return True
        if any(self.subscriptions.get_fresh(group, topic) is not None for topic in wanted):
            return True
        self._reload_offsets_if_due()
        return any((topic, group) in self._committed for topic in wanted)

    def _reload_offsets_if_due(self) -> None:
        now_ns = self._clock_ns()
        if now_ns < self._offsets_check_due_ns:
            return
        self._offsets_check_due_ns = now_ns + self._offsets_reload_interval_ns
        try:
            status = self._offsets_path.stat()
        except FileNotFoundError:
            self._committed = frozenset()
            self._offsets_signature = None
            return
        signature = (status.st_ino, status.st_size, status.st_mtime_ns)
        if signature == self._offsets_signature:
            return
        try:
            table = config_files.load_consumer_offsets(self._config_dir, use_backup_if_corrupt=True)
        except (OSError, MqboxError):
            return  # keep what was read last; admin.0 replaces the file whole
        self._committed = frozenset(table)
        self._offsets_signature = signature
        self.offsets_reload_count += 1

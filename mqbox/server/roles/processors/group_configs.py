"""A read-only view of config/subscriptionGroup.json for the processors that are not admin.0.

Owns: `SubscriptionGroupsView`, which the send processors (send-backs: retryQueueNums,
retryMaxTimes) and the pull processors (slaveReadEnable: brokerId, whichBrokerWhenConsumeSlowly)
read groups through. Never: writes the file (admin.0 is its one writer, admin/groups.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

from mqbox.store import config_files
from mqbox.store.config_files import SubscriptionGroupConfig, SubscriptionGroupTable
from mqbox.store.layout import SUBSCRIPTION_GROUP_FILE_NAME, config_dir

GROUPS_RELOAD_CHECK_INTERVAL_NS: Final = 1_000_000_000


class SubscriptionGroupsView:
    """This process's read-only view of subscriptionGroup.json (admin.0 writes it): the file is
    read again when its inode, size or mtime changed, looked at once a second, and at once for
    a group it does not hold (one a heartbeat just created)."""

    def __init__(self, store_root: Path) -> None:
        self._directory = config_dir(store_root)
        self._path = self._directory / SUBSCRIPTION_GROUP_FILE_NAME
        self._table = SubscriptionGroupTable()
        self._signature: tuple[int, int, int] | None = None
        self._check_due_ns = 0

    def get(self, group: str, *, fresh_on_miss: bool = True) -> SubscriptionGroupConfig | None:
        """The group's configuration; a group the view lacks makes it look at the file now,
        unless `fresh_on_miss` is False (a hot path that may meet groups nobody configured:
        the once-a-second look is enough there)."""
        now_ns = time.monotonic_ns()
        if now_ns >= self._check_due_ns:
            self._check_due_ns = now_ns + GROUPS_RELOAD_CHECK_INTERVAL_NS
            self._reload_if_changed()
        config = self._table.groups.get(group)
        if config is None and fresh_on_miss and self._reload_if_changed():
            config = self._table.groups.get(group)
        return config

    def _reload_if_changed(self) -> bool:
        try:
            status = self._path.stat()
        except FileNotFoundError:
            signature = None
        else:
            signature = (status.st_ino, status.st_size, status.st_mtime_ns)
        if signature == self._signature:
            return False
        self._table = config_files.load_subscription_groups(
            self._directory, use_backup_if_corrupt=True
        )
        self._signature = signature
        return True

"""Consumer offsets: the committed queue index of every (group, topic, queue), and its file.

Owns: `ConsumerOffsets`, the table the admin processor keeps (RocketMQ's ConsumerOffsetManager):
commits from UPDATE_CONSUMER_OFFSET (15) and from pulls (the commitOffset piggyback, which the
pull processors send to admin.0 as COMMIT_OFFSET parcels), answers to QUERY_CONSUMER_OFFSET (14)
through `starting_queue_index` (checklist rule 7), and the save schedule of
config/consumerOffset.json: at most every `persist_interval_ns` (5 s) while something changed,
and once more at an orderly stop. Never: a second writer of the file (admin.0 is the only one),
a write in place (config_files replaces it whole and keeps `.bak`), reads of the store (callers
pass the queue's min offset), or a clock of its own (callers pass monotonic ns).

Invariants:
- Only admin.0 holds a table that is saved, so the file has one writer and no lock.
- A committed queue index is >= 0; a negative one from outside is refused, not stored.
- Group and topic names in the table never contain "@" (the file's key is `<topic>@<group>`):
  callers check names first (client_manager.group_name_problem, headers.validate_topic), and
  `commit` asserts it.
- After `persist_now()` returns, the file holds every commit made before the call.
- A pull's commit (`forward_only`) never moves an index back; UPDATE_CONSUMER_OFFSET, resets
  and a slave's sync set it, whichever way.

Why pulls' commits only move forward: Java commits a pull's `commitOffset` on the pull thread
that takes the request, with no hop in between, so in practice it lands before the
UPDATE_CONSUMER_OFFSET the connection sends next. Here the pull processor relays it to admin.0
on its own ring, beside the worker's ring that brings admin.0 that UPDATE: a pull's commit sent
just before an UPDATE of the same queue was applied after it in 77 of 300 tries on an idle
broker (a PULL and an UPDATE pipelined on one connection, then a QUERY). A consumer that
persists a queue's offset as it hands the queue over (docs/client.md B.5, B.10) would see its
offset moved back by its own last pull, and the next owner would consume again what it had
consumed. A pull carries the offset the consumer held when it sent it, which its later UPDATE
never undercuts, so a commit below the stored index is stale: it is counted (`behind_count`) and
not stored. The periodic UPDATE (every 5 s) still sets the index whichever way, as Java's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from mqbox.store import config_files
from mqbox.store.config_files import TOPIC_GROUP_SEPARATOR

PERSIST_INTERVAL_MS_DEFAULT: Final = 5_000  # Java's flushConsumerOffsetInterval


def starting_queue_index(committed: int | None, min_queue_index: int) -> int | None:
    """QUERY_CONSUMER_OFFSET's answer: the committed index; with none committed, 0 when the
    queue starts at 0 (empty, missing or never cleaned: checklist rule 7, the Java broker's
    "not yet swapped out" case simplified); otherwise None, which the broker answers with 22
    QUERY_NOT_FOUND so the client falls back to its consumeFromWhere."""
    if committed is not None:
        return committed
    if min_queue_index <= 0:
        return 0
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerOffsetsStatistics:
    entry_count: int  # (group, topic, queue) triples
    commit_count: int
    refused_count: int  # negative indexes refused
    behind_count: int  # pulls' commits below the stored index, not stored (module docstring)
    persist_count: int
    dirty: bool


class ConsumerOffsets:
    """The offset table and its save schedule (module docstring)."""

    def __init__(
        self,
        config_dir: Path | None,
        *,
        persist_interval_ns: int = PERSIST_INTERVAL_MS_DEFAULT * 1_000_000,
    ) -> None:
        """`config_dir` None keeps the table in memory only (an admin processor that does not
        own the offsets, and tests)."""
        assert persist_interval_ns > 0
        self.config_dir = config_dir
        self.persist_interval_ns = persist_interval_ns
        # (topic, group) -> queue_id -> queue_index, the file's shape
        self._table: dict[tuple[str, str], dict[int, int]] = {}
        self._dirty = False
        self._persist_due_ns: int | None = None
        self._commit_count = 0
        self._refused_count = 0
        self._behind_count = 0
        self._persist_count = 0

    def load(self) -> int:
        """Read config/consumerOffset.json (its `.bak` if it is corrupt); the entries read.
        Raises ConfigError when neither is usable: the broker must not start with offsets it
        cannot read, or the next save would overwrite them with nothing."""
        assert self.config_dir is not None
        loaded = config_files.load_consumer_offsets(self.config_dir, use_backup_if_corrupt=True)
        self._table = {key: dict(queues) for key, queues in loaded.items()}
        self._dirty = False
        return sum(len(queues) for queues in self._table.values())

    # -- reading ----------------------------------------------------------------------------------

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed index of the queue, or None."""
        queues = self._table.get((topic, group))
        return None if queues is None else queues.get(queue_id)

    def topic_offsets(self, group: str, topic: str) -> dict[int, int]:
        """queue_id -> committed index of one topic of the group (a copy)."""
        return dict(self._table.get((topic, group), {}))

    def topics_of(self, group: str) -> list[str]:
        """The topics the group committed offsets for, sorted."""
        return sorted(topic for topic, owner in self._table if owner == group)

    def groups(self) -> list[str]:
        return sorted({group for _topic, group in self._table})

    def snapshot(self) -> dict[tuple[str, str], dict[int, int]]:
        """The whole table, copied, in the file's shape."""
        return {key: dict(queues) for key, queues in self._table.items()}

    @property
    def dirty(self) -> bool:
        return self._dirty

    # -- changing ---------------------------------------------------------------------------------

    def commit(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_index: int,
        now_ns: int,
        *,
        forward_only: bool = False,
    ) -> bool:
        """Store `queue_index` as the group's next index for the queue; False (nothing stored)
        for a negative index or queue id. `forward_only` (a pull's commit): an index below the
        stored one is stale, counted and not stored (module docstring), and answers True."""
        assert group
        assert topic
        assert TOPIC_GROUP_SEPARATOR not in group
        assert TOPIC_GROUP_SEPARATOR not in topic
        if queue_index < 0 or queue_id < 0:
            self._refused_count += 1
            return False
        queues = self._table.get((topic, group))
        if queues is None:
            queues = self._table[(topic, group)] = {}
        self._commit_count += 1
        stored = queues.get(queue_id)
        if stored == queue_index:
            return True
        if forward_only and stored is not None and queue_index < stored:
            self._behind_count += 1
            return True
        queues[queue_id] = queue_index
        self._mark_dirty(now_ns)
        return True

    def replace_topic(
        self, group: str, topic: str, offsets: Mapping[int, int], now_ns: int
    ) -> None:
        """Set the group's indexes of `topic` to `offsets` (queue_id -> index), as a reset does;
        queues not named keep their index."""
        for queue_id, queue_index in offsets.items():
            assert queue_id >= 0
            assert queue_index >= 0
        assert TOPIC_GROUP_SEPARATOR not in group
        queues = self._table.setdefault((topic, group), {})
        queues.update(offsets)
        self._mark_dirty(now_ns)

    def put_all(self, table: Mapping[tuple[str, str], Mapping[int, int]], now_ns: int) -> None:
        """A slave's sync from its master (Java's `offsetTable.putAll`): each (topic, group) of
        `table` replaces that entry whole; entries the master does not name stay. The caller
        checked the names and that no index is negative."""
        for (topic, group), queues in table.items():
            assert TOPIC_GROUP_SEPARATOR not in group
            assert TOPIC_GROUP_SEPARATOR not in topic
            assert all(
                queue_id >= 0 and queue_index >= 0 for queue_id, queue_index in queues.items()
            )
            self._table[(topic, group)] = dict(queues)
        if table:
            self._mark_dirty(now_ns)

    def remove_group(self, group: str, now_ns: int) -> int:
        """Forget every offset of `group` (DELETE_SUBSCRIPTIONGROUP with removeOffset, as
        Java's removeOffset); the (topic, group) entries removed."""
        keys = [key for key in self._table if key[1] == group]
        for key in keys:
            del self._table[key]
        if keys:
            self._mark_dirty(now_ns)
        return len(keys)

    def _mark_dirty(self, now_ns: int) -> None:
        if not self._dirty:
            self._dirty = True
            self._persist_due_ns = now_ns + self.persist_interval_ns

    # -- saving -----------------------------------------------------------------------------------

    def persist_if_due(self, now_ns: int) -> bool:
        """Save if something changed and the interval since the first unsaved change passed."""
        if not self._dirty or self.config_dir is None:
            return False
        assert self._persist_due_ns is not None
        if now_ns < self._persist_due_ns:
            return False
        self.persist_now()
        return True

    def persist_now(self) -> None:
        """Save the table now if anything changed since the last save (the stop path)."""
        if not self._dirty or self.config_dir is None:
            return
        config_files.save_consumer_offsets(self.config_dir, self._table)
        self._dirty = False
        self._persist_due_ns = None
        self._persist_count += 1

    def next_persist_ns(self) -> int | None:
        """When persist_if_due will save next (monotonic ns), or None while nothing changed."""
        return self._persist_due_ns if self._dirty and self.config_dir is not None else None

    def statistics(self) -> ConsumerOffsetsStatistics:
        return ConsumerOffsetsStatistics(
            entry_count=sum(len(queues) for queues in self._table.values()),
            commit_count=self._commit_count,
            refused_count=self._refused_count,
            behind_count=self._behind_count,
            persist_count=self._persist_count,
            dirty=self._dirty,
        )

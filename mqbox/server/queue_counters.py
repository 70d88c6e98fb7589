"""The store's published positions and per-queue entry counts, in shared memory.

Owns: two small posix_ipc segments per broker, their layouts (drawn below) and the hash that keys
a queue in them.

- `StorePositions` (`/mqbox.<instance>.store-positions.0`): created and written only by the store
  writer process: its main thread writes the write position and the dispatch start, its flush
  thread the flushed position, its housekeeping thread the commit log's minimum (retention moves
  it just before each unlink). The dispatcher and the pull and admin processors read it.
- `QueueCounters` (`/mqbox.<instance>.queue-counters.0`): created and written only by the
  dispatcher: the dispatched position, a change sequence, the log offsets and store times its
  last consume-queue flush and its last index flush covered (each published by its own flush,
  the index's far less often; the store writer puts them in the checkpoint, which it alone
  writes), the commit-log minimum the consume queues and index last followed, and a
  fixed-capacity open-addressing table from (topic, queue_id) to the queue's entry count
  (RocketMQ's max offset). The pull processors read it to learn how far a consume queue may be
  read and to see queues grow.

Never: a lock, a pickle, a message, or a second writer of any word. The supervisor's sweep removes
both segments with the instance's rings (their names follow ipc/names.py's scheme).

Invariants:
- Every shared word is an aligned int64 written whole, so a reader sees an old value or the new
  one (x86-64). Each writer's words sit on their own 128-byte line.
- A table slot is published by storing its key last: topic, queue id and count are written
  first, so under x86-64's store order a reader that finds the key also finds the rest. A reader
  still compares the topic bytes and the queue id, because two queues may share a 64-bit key (the
  second one then probes on). Slots are never moved or freed while the dispatcher lives, so a
  reader may keep a slot index it found.
- Entry counts and positions only grow.

Layouts (little-endian int64 words unless named otherwise):

    store-positions                      queue-counters
    +0    magic (stored last), version   +0    magic (stored last), version, slot_count,
                                               queue_capacity
    +128  writer line: write position,   +128  dispatcher line: dispatched position,
          appended record total,               change sequence, queue count, overflow count,
          dispatch start, writer pid,          dispatcher pid, logics flushed store time,
          state (0 opening, 1 ready)           index flushed store time, derived minimum,
    +256  flush line: flushed position,        logics and index flushed positions
          flushed store timestamp        +256  slot_count slots of SLOT (below)
    +384  retention line: commit-log
          minimum, segments deleted
    +512  replication line: state,
          slave count, acknowledged
          position (the slaves' greatest
          report; a slave: its last
          report), master position seen,
          report time ms, HA role pid

    SLOT, 160 bytes:
    +0 key u64 (0 = empty) | +8 entry_count i64 | +16 queue_id i32 | +20 topic_size i32 |
    +24 topic: 128 bytes, zero padded | +152 pad 8

A queue's key is the first 8 bytes of BLAKE2b over its topic's UTF-8 bytes, a zero byte and the
queue id as 4 little-endian bytes (0 is replaced by 1): stable across processes, unlike hash().
The table holds `queue_capacity` queues (16,384 by default) in twice as many slots, so it is at
most half full and every probe ends soon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import mmap
import os
from typing import Final

import numpy as np
import posix_ipc
from numpy.typing import NDArray

from mqbox.errors import ConfigError
from mqbox.ipc import names

STORE_POSITIONS_ROLE: Final = "store-positions"
QUEUE_COUNTERS_ROLE: Final = "queue-counters"
QUEUE_CAPACITY_DEFAULT: Final = 16_384
TOPIC_WIDTH_BYTES: Final = 128

_WORD: Final = 8
_LINE_WORDS: Final = 128 // _WORD
_SHM_MODE: Final = 0o600

POSITIONS_MAGIC: Final = 0x6D71_626F_7850_6F73  # "mqboxPos"
COUNTERS_MAGIC: Final = 0x6D71_626F_7843_6E74  # "mqboxCnt"
LAYOUT_VERSION: Final = 4

# store-positions words
_P_MAGIC: Final = 0
_P_VERSION: Final = 1
_P_WRITE: Final = _LINE_WORDS + 0
_P_APPENDED_TOTAL: Final = _LINE_WORDS + 1
_P_DISPATCH_START: Final = _LINE_WORDS + 2
_P_WRITER_PID: Final = _LINE_WORDS + 3
_P_STATE: Final = _LINE_WORDS + 4
_P_REPLICA_STOPPED: Final = _LINE_WORDS + 5
_P_FLUSHED: Final = 2 * _LINE_WORDS + 0
_P_FLUSHED_TIMESTAMP: Final = 2 * _LINE_WORDS + 1
_P_MIN_LOG_OFFSET: Final = 3 * _LINE_WORDS + 0
_P_DELETED_SEGMENT_TOTAL: Final = 3 * _LINE_WORDS + 1
_P_HA_STATE: Final = 4 * _LINE_WORDS + 0
_P_HA_SLAVE_COUNT: Final = 4 * _LINE_WORDS + 1
_P_HA_ACKED: Final = 4 * _LINE_WORDS + 2
_P_HA_MASTER_SEEN: Final = 4 * _LINE_WORDS + 3
_P_HA_REPORT_TIME: Final = 4 * _LINE_WORDS + 4
_P_HA_PID: Final = 4 * _LINE_WORDS + 5
_POSITIONS_SIZE_BYTES: Final = mmap.PAGESIZE
assert (5 * _LINE_WORDS) * _WORD <= _POSITIONS_SIZE_BYTES

STATE_OPENING: Final = 0
STATE_READY: Final = 1

# The replication line's state word (docs/replication.md).
HA_NONE: Final = 0  # no HA role runs (or it has not started)
HA_MASTER: Final = 1  # a master's HA service listens; slave count says who is connected
HA_SLAVE_CONNECTING: Final = 2  # a slave with no connection to its master
HA_SLAVE_CONNECTED: Final = 3  # a slave receiving its master's log
HA_SLAVE_DIVERGED: Final = 4  # a slave whose log disagrees with its master's: it stopped
HA_STATE_NAMES: Final = {
    HA_NONE: "none",
    HA_MASTER: "master",
    HA_SLAVE_CONNECTING: "connecting",
    HA_SLAVE_CONNECTED: "connected",
    HA_SLAVE_DIVERGED: "diverged",
}

# queue-counters words
_C_MAGIC: Final = 0
_C_VERSION: Final = 1
_C_SLOT_COUNT: Final = 2
_C_QUEUE_CAPACITY: Final = 3
_C_DISPATCHED: Final = _LINE_WORDS + 0
_C_CHANGE_SEQUENCE: Final = _LINE_WORDS + 1
_C_QUEUE_COUNT: Final = _LINE_WORDS + 2
_C_OVERFLOW_COUNT: Final = _LINE_WORDS + 3
_C_DISPATCHER_PID: Final = _LINE_WORDS + 4
_C_LOGICS_FLUSHED_TIMESTAMP: Final = _LINE_WORDS + 5
_C_INDEX_FLUSHED_TIMESTAMP: Final = _LINE_WORDS + 6
_C_DERIVED_MIN_LOG_OFFSET: Final = _LINE_WORDS + 7
_C_LOGICS_FLUSHED_LOG_OFFSET: Final = _LINE_WORDS + 8
_C_INDEX_FLUSHED_LOG_OFFSET: Final = _LINE_WORDS + 9
assert _C_INDEX_FLUSHED_LOG_OFFSET < 2 * _LINE_WORDS
_SLOTS_OFFSET_BYTES: Final = 2 * _LINE_WORDS * _WORD

SLOT = np.dtype(
    {
        "names": ["key", "entry_count", "queue_id", "topic_size", "topic"],
        "formats": ["<u8", "<i8", "<i4", "<i4", ("u1", TOPIC_WIDTH_BYTES)],
        "offsets": [0, 8, 16, 20, 24],
        "itemsize": 160,
    }
)
assert SLOT.itemsize % _WORD == 0
assert SLOT.fields is not None
assert SLOT.fields["entry_count"][1] % _WORD == 0
assert _SLOTS_OFFSET_BYTES % 128 == 0
EMPTY_KEY: Final = 0


def store_positions_name(instance: str) -> str:
    return names.shm_name(instance, STORE_POSITIONS_ROLE, 0)


def queue_counters_name(instance: str) -> str:
    return names.shm_name(instance, QUEUE_COUNTERS_ROLE, 0)


def queue_key(topic: bytes, queue_id: int) -> int:
    """The 64-bit key of (topic bytes, queue_id) in the table; never EMPTY_KEY."""
    assert queue_id >= 0
    digest = hashlib.blake2b(topic + b"\0" + queue_id.to_bytes(4, "little"), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    return key if key != EMPTY_KEY else 1


def _create_segment(name: str, size_bytes: int) -> mmap.mmap:
    try:
        memory_object = posix_ipc.SharedMemory(
            name, flags=posix_ipc.O_CREX, mode=_SHM_MODE, size=size_bytes
        )
    except posix_ipc.ExistentialError as error:
        raise FileExistsError(f"shared memory {name} already exists") from error
    try:
        return mmap.mmap(memory_object.fd, memory_object.size)
    finally:
        memory_object.close_fd()


def _attach_segment(name: str) -> mmap.mmap:
    try:
        memory_object = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError as error:
        raise FileNotFoundError(f"shared memory {name} does not exist") from error
    try:
        return mmap.mmap(memory_object.fd, memory_object.size)
    finally:
        memory_object.close_fd()


def _unlink_segment(name: str) -> None:
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


# ---------------------------------------------------------------------------------------------
# Store positions


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicationView:
    """The replication line as one reader saw it."""

    state: int  # HA_*
    slave_count: int  # a master's connected slaves
    acked_log_offset_bytes: int  # master: the slaves' greatest report; slave: its greatest
    master_log_offset_bytes: int  # slave: the master's offset in the newest frame
    report_time_ms: int  # when the acknowledged position last moved (wall clock)

    @property
    def state_name(self) -> str:
        return HA_STATE_NAMES.get(self.state, str(self.state))


class StorePositions:
    """The store writer's published positions (see the module docstring for who writes what)."""

    def __init__(self, name: str, memory: mmap.mmap) -> None:
        self.name = name
        self._memory = memory
        self._words: NDArray[np.int64] = np.frombuffer(memory, dtype=np.int64)
        if self._words[_P_MAGIC] != POSITIONS_MAGIC or self._words[_P_VERSION] != LAYOUT_VERSION:
            raise ConfigError(f"{name} is not an mqbox store-positions segment")

    @classmethod
    def create(cls, name: str) -> StorePositions:
        """Make the segment (the store writer, before it reports ready)."""
        memory = _create_segment(name, _POSITIONS_SIZE_BYTES)
        words = np.frombuffer(memory, dtype=np.int64)
        words[_P_VERSION] = LAYOUT_VERSION
        words[_P_WRITER_PID] = os.getpid()
        words[_P_MAGIC] = POSITIONS_MAGIC  # last: attach trusts the rest once it is set
        del words
        return cls(name, memory)

    @classmethod
    def attach(cls, name: str) -> StorePositions:
        return cls(name, _attach_segment(name))

    # -- the writer's main thread -----------------------------------------------------------------

    def publish_write(self, write_log_offset_bytes: int, appended_record_total: int) -> None:
        assert write_log_offset_bytes >= self._words[_P_WRITE]
        self._words[_P_APPENDED_TOTAL] = appended_record_total
        self._words[_P_WRITE] = write_log_offset_bytes

    def publish_ready(self, dispatch_start_log_offset_bytes: int) -> None:
        """Recovery is done: the dispatcher starts at `dispatch_start_log_offset_bytes`."""
        assert 0 <= dispatch_start_log_offset_bytes <= self._words[_P_WRITE]
        self._words[_P_DISPATCH_START] = dispatch_start_log_offset_bytes
        self._words[_P_STATE] = STATE_READY

    def publish_replica_stopped(self, log_offset_bytes: int) -> None:
        """A slave's writer refused its master's bytes at `log_offset_bytes` (diverged)."""
        self._words[_P_REPLICA_STOPPED] = log_offset_bytes + 1

    @property
    def replica_stopped(self) -> bool:
        return bool(self._words[_P_REPLICA_STOPPED])

    # -- the writer's flush thread ----------------------------------------------------------------

    def publish_flushed(self, flushed_log_offset_bytes: int, store_timestamp_ms: int) -> None:
        assert flushed_log_offset_bytes >= self._words[_P_FLUSHED]
        self._words[_P_FLUSHED_TIMESTAMP] = store_timestamp_ms
        self._words[_P_FLUSHED] = flushed_log_offset_bytes

    # -- the writer's housekeeping thread ---------------------------------------------------------

    def publish_min_log_offset(self, min_log_offset_bytes: int, deleted_segment_total: int) -> None:
        """The commit log's minimum moved (retention, just before the unlink), or was set at
        open; records below it are gone or going."""
        assert min_log_offset_bytes >= self._words[_P_MIN_LOG_OFFSET]
        self._words[_P_DELETED_SEGMENT_TOTAL] = deleted_segment_total
        self._words[_P_MIN_LOG_OFFSET] = min_log_offset_bytes

    # -- the HA role ------------------------------------------------------------------------------

    def publish_replication(
        self,
        state: int,
        slave_count: int,
        acked_log_offset_bytes: int,
        master_log_offset_bytes: int,
        report_time_ms: int,
    ) -> None:
        """The HA role's view (see HA_* above); every word is its own."""
        words = self._words
        words[_P_HA_PID] = os.getpid()
        words[_P_HA_SLAVE_COUNT] = slave_count
        words[_P_HA_ACKED] = acked_log_offset_bytes
        words[_P_HA_MASTER_SEEN] = master_log_offset_bytes
        words[_P_HA_REPORT_TIME] = report_time_ms
        words[_P_HA_STATE] = state

    def replication(self) -> ReplicationView:
        words = self._words
        return ReplicationView(
            int(words[_P_HA_STATE]),
            int(words[_P_HA_SLAVE_COUNT]),
            int(words[_P_HA_ACKED]),
            int(words[_P_HA_MASTER_SEEN]),
            int(words[_P_HA_REPORT_TIME]),
        )

    # -- everyone ---------------------------------------------------------------------------------

    @property
    def write_log_offset_bytes(self) -> int:
        return int(self._words[_P_WRITE])

    @property
    def appended_record_total(self) -> int:
        return int(self._words[_P_APPENDED_TOTAL])

    @property
    def flushed_log_offset_bytes(self) -> int:
        return int(self._words[_P_FLUSHED])

    @property
    def flushed_store_timestamp_ms(self) -> int:
        return int(self._words[_P_FLUSHED_TIMESTAMP])

    @property
    def dispatch_start_log_offset_bytes(self) -> int:
        return int(self._words[_P_DISPATCH_START])

    @property
    def min_log_offset_bytes(self) -> int:
        return int(self._words[_P_MIN_LOG_OFFSET])

    @property
    def deleted_segment_total(self) -> int:
        return int(self._words[_P_DELETED_SEGMENT_TOTAL])

    @property
    def ready(self) -> bool:
        return bool(self._words[_P_STATE] == STATE_READY)

    @property
    def writer_pid(self) -> int:
        return int(self._words[_P_WRITER_PID])

    def close(self) -> None:
        del self._words
        self._memory.close()

    def unlink(self) -> None:
        _unlink_segment(self.name)


# ---------------------------------------------------------------------------------------------
# Queue counters


@dataclasses.dataclass(frozen=True, slots=True)
class QueueCountersStatistics:
    queue_count: int
    queue_capacity: int
    slot_count: int
    overflow_count: int  # queues that found no room (their pulls see no growth)
    change_sequence: int
    dispatched_log_offset_bytes: int


def _slot_count_for(queue_capacity: int) -> int:
    slot_count = 16
    while slot_count < 2 * queue_capacity:
        slot_count *= 2
    return slot_count


class QueueCounters:
    """The dispatcher's per-queue entry counts (see the module docstring)."""

    def __init__(self, name: str, memory: mmap.mmap) -> None:
        self.name = name
        self._memory = memory
        self._words: NDArray[np.int64] = np.frombuffer(
            memory, dtype=np.int64, count=_SLOTS_OFFSET_BYTES // _WORD
        )
        if self._words[_C_MAGIC] != COUNTERS_MAGIC or self._words[_C_VERSION] != LAYOUT_VERSION:
            raise ConfigError(f"{name} is not an mqbox queue-counters segment")
        self.slot_count = int(self._words[_C_SLOT_COUNT])
        self.queue_capacity = int(self._words[_C_QUEUE_CAPACITY])
        assert self.slot_count & (self.slot_count - 1) == 0
        assert self.slot_count >= 2 * self.queue_capacity
        self._slots: NDArray[np.void] = np.frombuffer(
            memory, dtype=SLOT, count=self.slot_count, offset=_SLOTS_OFFSET_BYTES
        )
        self._keys: NDArray[np.uint64] = self._slots["key"]
        self._entry_counts: NDArray[np.int64] = self._slots["entry_count"]
        self._mask = self.slot_count - 1

    @classmethod
    def create(cls, name: str, queue_capacity: int = QUEUE_CAPACITY_DEFAULT) -> QueueCounters:
        """Make the segment (the dispatcher, before it reports ready)."""
        assert queue_capacity > 0
        slot_count = _slot_count_for(queue_capacity)
        memory = _create_segment(name, _SLOTS_OFFSET_BYTES + slot_count * SLOT.itemsize)
        words = np.frombuffer(memory, dtype=np.int64, count=_SLOTS_OFFSET_BYTES // _WORD)
        words[_C_VERSION] = LAYOUT_VERSION
        words[_C_SLOT_COUNT] = slot_count
        words[_C_QUEUE_CAPACITY] = queue_capacity
        words[_C_DISPATCHER_PID] = os.getpid()
        words[_C_MAGIC] = COUNTERS_MAGIC  # last
        del words
        return cls(name, memory)

    @classmethod
    def attach(cls, name: str) -> QueueCounters:
        return cls(name, _attach_segment(name))

    # -- the dispatcher ---------------------------------------------------------------------------

    def insert(self, topic: bytes, queue_id: int, entry_count: int) -> int:
        """The slot of (topic, queue_id), made and published with `entry_count` if new; -1 when
        the table holds queue_capacity queues already (counted in overflow_count)."""
        assert 0 < len(topic) <= TOPIC_WIDTH_BYTES
        assert entry_count >= 0
        key = queue_key(topic, queue_id)
        slot = self.find_slot(topic, queue_id, key)
        if slot >= 0:
            return slot
        queue_count = int(self._words[_C_QUEUE_COUNT])
        if queue_count >= self.queue_capacity:
            self._words[_C_OVERFLOW_COUNT] += 1
            return -1
        slot = key & self._mask
        keys = self._keys
        while keys[slot] != EMPTY_KEY:
            slot = (slot + 1) & self._mask
        entry = self._slots[slot]
        entry["topic"][: len(topic)] = np.frombuffer(topic, dtype=np.uint8)
        entry["topic_size"] = len(topic)
        entry["queue_id"] = queue_id
        entry["entry_count"] = entry_count
        keys[slot] = key  # publishes the slot
        self._words[_C_QUEUE_COUNT] = queue_count + 1
        return slot

    def publish_counts(self, slots: NDArray[np.int64], entry_counts: NDArray[np.int64]) -> None:
        """Store the new entry counts of `slots` (slots from insert(); counts never shrink)."""
        assert slots.size == entry_counts.size
        if slots.size:
            self._entry_counts[slots] = entry_counts

    def publish_count(self, slot: int, entry_count: int) -> None:
        """Store the new entry count of one slot (publish_counts for a lone queue)."""
        assert entry_count >= self._entry_counts[slot]
        self._entry_counts[slot] = entry_count

    def publish_dispatched(self, dispatched_log_offset_bytes: int) -> None:
        """The dispatched position moved; bumps the change sequence after it."""
        assert dispatched_log_offset_bytes >= self._words[_C_DISPATCHED]
        self._words[_C_DISPATCHED] = dispatched_log_offset_bytes
        self._words[_C_CHANGE_SEQUENCE] += 1

    def publish_logics_flushed(
        self, flushed_log_offset_bytes: int, logics_msg_timestamp_ms: int
    ) -> None:
        """After the consume-queue flush returned: every record below `flushed_log_offset_bytes`
        (the dispatched position taken before it began) has its entry durable, and the newest
        store time it made durable (0: none yet). The store writer copies both into the
        checkpoint. Time first, offset last; an older report never moves the offset back."""
        assert flushed_log_offset_bytes >= 0
        assert logics_msg_timestamp_ms >= 0
        if logics_msg_timestamp_ms > 0:
            self._words[_C_LOGICS_FLUSHED_TIMESTAMP] = logics_msg_timestamp_ms
        if flushed_log_offset_bytes > self._words[_C_LOGICS_FLUSHED_LOG_OFFSET]:
            self._words[_C_LOGICS_FLUSHED_LOG_OFFSET] = flushed_log_offset_bytes

    def publish_index_flushed(
        self, flushed_log_offset_bytes: int, index_msg_timestamp_ms: int
    ) -> None:
        """After an index flush returned (less often than the consume queues'): every record
        below `flushed_log_offset_bytes` has its keys durable, and the newest store time the
        flush made durable (0: none yet). Time first, offset last; never back."""
        assert flushed_log_offset_bytes >= 0
        assert index_msg_timestamp_ms >= 0
        if index_msg_timestamp_ms > 0:
            self._words[_C_INDEX_FLUSHED_TIMESTAMP] = index_msg_timestamp_ms
        if flushed_log_offset_bytes > self._words[_C_INDEX_FLUSHED_LOG_OFFSET]:
            self._words[_C_INDEX_FLUSHED_LOG_OFFSET] = flushed_log_offset_bytes

    def publish_derived_min_log_offset(self, min_log_offset_bytes: int) -> None:
        """The consume queues and the index now follow this commit-log minimum."""
        assert min_log_offset_bytes >= self._words[_C_DERIVED_MIN_LOG_OFFSET]
        self._words[_C_DERIVED_MIN_LOG_OFFSET] = min_log_offset_bytes

    # -- readers ----------------------------------------------------------------------------------

    def find_slot(self, topic: bytes, queue_id: int, key: int | None = None) -> int:
        """The slot of (topic, queue_id), or -1 if the dispatcher has not published it."""
        if key is None:
            key = queue_key(topic, queue_id)
        slot = key & self._mask
        keys = self._keys
        for _probe in range(self.slot_count):
            found = int(keys[slot])
            if found == EMPTY_KEY:
                return -1
            if found == key:
                entry = self._slots[slot]
                size = int(entry["topic_size"])
                if (
                    int(entry["queue_id"]) == queue_id
                    and size == len(topic)
                    and entry["topic"][:size].tobytes() == topic
                ):
                    return slot
            slot = (slot + 1) & self._mask
        return -1

    def entry_count_at(self, slot: int) -> int:
        """The published entry count of a slot find_slot() returned."""
        assert 0 <= slot < self.slot_count
        return int(self._entry_counts[slot])

    def entry_count(self, topic: bytes, queue_id: int) -> int | None:
        """The published entry count of (topic, queue_id), or None if it is not in the table."""
        slot = self.find_slot(topic, queue_id)
        return None if slot < 0 else int(self._entry_counts[slot])

    @property
    def dispatched_log_offset_bytes(self) -> int:
        return int(self._words[_C_DISPATCHED])

    @property
    def change_sequence(self) -> int:
        return int(self._words[_C_CHANGE_SEQUENCE])

    @property
    def logics_flushed_timestamp_ms(self) -> int:
        return int(self._words[_C_LOGICS_FLUSHED_TIMESTAMP])

    @property
    def index_flushed_timestamp_ms(self) -> int:
        return int(self._words[_C_INDEX_FLUSHED_TIMESTAMP])

    @property
    def logics_flushed_log_offset_bytes(self) -> int:
        """Every record below this has its consume-queue entry durable."""
        return int(self._words[_C_LOGICS_FLUSHED_LOG_OFFSET])

    @property
    def index_flushed_log_offset_bytes(self) -> int:
        """Every record below this has its index keys durable."""
        return int(self._words[_C_INDEX_FLUSHED_LOG_OFFSET])

    @property
    def derived_min_log_offset_bytes(self) -> int:
        return int(self._words[_C_DERIVED_MIN_LOG_OFFSET])

    @property
    def queue_count(self) -> int:
        return int(self._words[_C_QUEUE_COUNT])

    def statistics(self) -> QueueCountersStatistics:
        return QueueCountersStatistics(
            queue_count=self.queue_count,
            queue_capacity=self.queue_capacity,
            slot_count=self.slot_count,
            overflow_count=int(self._words[_C_OVERFLOW_COUNT]),
            change_sequence=self.change_sequence,
            dispatched_log_offset_bytes=self.dispatched_log_offset_bytes,
        )

    def close(self) -> None:
        del self._slots, self._keys, self._entry_counts, self._words
        self._memory.close()

    def unlink(self) -> None:
        _unlink_segment(self.name)

"""The broker's statistics block: counters the roles write in shared memory as events happen.

Owns: `StatisticsBlock` (one array of int64 words in anonymous MAP_SHARED memory, made by the
supervisor before the first fork, like the control block, so every role and every re-forked
role shares it; no name, nothing to unlink), its layout (below), `StatisticsWriter` (one role's
side: per-topic puts, per-group gets, scalars, latency histograms) and `read_totals` (a reader's
sum over every role). Never: rates or history (statistics_history.py keeps those from periodic
snapshots), a lock, a clock, or a second writer of any word.

One region per role of the topology, written only by that role's process (and, for the flush
histogram, only by the store writer's flush thread, which writes no other word), so every word
has one writer. A role that is re-forked keeps counting from where its predecessor stopped:
totals only grow while the broker lives (a whole-broker restart keeps the block too, since the
supervisor holds it).

Region layout (int64 words, REGION_WORD_COUNT of them):

    +0    key_count (published last), dropped_count (events whose key found no free slot),
          SCALAR words 2..15 (S_* below)
    +16   histogram 0: send latency, 16 bucket counts (BUCKET_BOUNDS_NS, then +Inf), sum ns,
          count (18 of 32 words)
    +48   histogram 1: commit-log flush latency, same shape
    +128  KEY_SLOT_COUNT slots of SLOT_WORD_COUNT words:
          kind (KIND_PUT: a topic's puts; KIND_GET: a group's gets of a topic), name size,
          messages, bytes, requests (RocketMQ's StatsItem "times"), 3 spare, then the name's
          UTF-8 bytes (topic, or topic "@" group, as RocketMQ's stats keys) in 56 words

A slot is published by writing its kind, name and zeroed counters first and key_count last, so a
reader that reads key_count first sees whole slots below it (x86-64 store order; every word is
aligned and written whole). A writer finds its slots through a dict of its own, so an event
costs one dict lookup and a few word increments: per request or per batch, never per message.
"""

from __future__ import annotations

import bisect
import dataclasses
import mmap
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

REGION_WORD_COUNT_HEADER: Final = 128
KEY_SLOT_COUNT: Final = 1024
SLOT_WORD_COUNT: Final = 64
SLOT_NAME_WORD: Final = 8
SLOT_NAME_SIZE_BYTES_MAX: Final = (SLOT_WORD_COUNT - SLOT_NAME_WORD) * 8
REGION_WORD_COUNT: Final = REGION_WORD_COUNT_HEADER + KEY_SLOT_COUNT * SLOT_WORD_COUNT

_KEY_COUNT: Final = 0
_DROPPED_COUNT: Final = 1

# Scalars (header words 2..15).
S_SEND_REQUESTS: Final = 2  # send requests answered (any code)
S_SEND_REFUSED: Final = 3  # answered with an error code
S_PUT_MESSAGES: Final = 4  # messages stored by the broker's sends (every topic)
S_PUT_BYTES: Final = 5  # their record bytes
S_PULL_REQUESTS: Final = 6  # pulls answered
S_PULL_FOUND: Final = 7  # pulls answered with messages
S_GET_MESSAGES: Final = 8  # messages handed to consumers
S_GET_BYTES: Final = 9
S_PULL_MISSED: Final = 10  # pulls answered without messages (RocketMQ's getMiss)
SCALAR_NAMES: Final = {
    S_SEND_REQUESTS: "send_requests",
    S_SEND_REFUSED: "send_refused",
    S_PUT_MESSAGES: "put_messages",
    S_PUT_BYTES: "put_bytes",
    S_PULL_REQUESTS: "pull_requests",
    S_PULL_FOUND: "pull_found",
    S_GET_MESSAGES: "get_messages",
    S_GET_BYTES: "get_bytes",
    S_PULL_MISSED: "pull_missed",
}
assert max(SCALAR_NAMES) < 16

HISTOGRAM_SEND: Final = 0
HISTOGRAM_FLUSH: Final = 1
HISTOGRAM_NAMES: Final = {HISTOGRAM_SEND: "send_latency", HISTOGRAM_FLUSH: "flush_latency"}
_HISTOGRAM_WORD: Final = (16, 48)
# Upper bounds of the finite buckets (Prometheus' "le"), from 0.1 ms to 10 s; one more +Inf.
BUCKET_BOUNDS_NS: Final = tuple(
    int(ms * 1_000_000)
    for ms in (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000)
)
BUCKET_COUNT: Final = len(BUCKET_BOUNDS_NS) + 1
_SUM: Final = BUCKET_COUNT
_COUNT: Final = BUCKET_COUNT + 1
assert _COUNT < 32

KIND_PUT: Final = 1
KIND_GET: Final = 2
_S_KIND: Final = 0
_S_NAME_SIZE: Final = 1
_S_MESSAGES: Final = 2
_S_BYTES: Final = 3
_S_REQUESTS: Final = 4


class StatisticsBlock:
    """Every role's statistics region (module docstring); created before the first fork."""

    def __init__(self, memory: mmap.mmap, role_ids: Sequence[str]) -> None:
        self._memory = memory
        self.role_ids = tuple(role_ids)
        self._index_of = {role_id: index for index, role_id in enumerate(self.role_ids)}
        self.words: NDArray[np.int64] = np.frombuffer(memory, dtype=np.int64)
        assert self.words.size >= REGION_WORD_COUNT * len(self.role_ids)

    @classmethod
    def create(cls, role_ids: Sequence[str]) -> StatisticsBlock:
        """Zeroed anonymous shared memory for `role_ids` (pages are touched only when used)."""
        size_bytes = max(mmap.PAGESIZE, REGION_WORD_COUNT * 8 * len(role_ids))
        memory = mmap.mmap(-1, size_bytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        return cls(memory, role_ids)

    def region_words(self, role_id: str) -> memoryview:
        """The role's region as 'q' items, for its own process to write (an item store moves
        the whole word)."""
        first = REGION_WORD_COUNT * self._index_of[role_id]
        return memoryview(self._memory).cast("q")[first : first + REGION_WORD_COUNT]

    def region_array(self, role_id: str) -> NDArray[np.int64]:
        first = REGION_WORD_COUNT * self._index_of[role_id]
        return self.words[first : first + REGION_WORD_COUNT]


class StatisticsWriter:
    """One role process's side: counts into its own region, finding slots by a dict."""

    def __init__(self, block: StatisticsBlock, role_id: str) -> None:
        self._words = block.region_words(role_id)
        self._slots: dict[tuple[int, str], int] = {}
        # A new process of the role adopts the slots its predecessors published.
        for index in range(self._words[_KEY_COUNT]):
            base = REGION_WORD_COUNT_HEADER + index * SLOT_WORD_COUNT
            self._slots[(self._words[base + _S_KIND], _slot_name(self._words, base))] = base

    def _slot(self, kind: int, name: str) -> int:
        """The base word of the slot of (kind, name); -1 when the region is full."""
        base = self._slots.get((kind, name))
        if base is not None:
            return base
        words = self._words
        index = words[_KEY_COUNT]
        encoded = name.encode("utf-8", "surrogatepass")
        if index >= KEY_SLOT_COUNT or len(encoded) > SLOT_NAME_SIZE_BYTES_MAX:
            return -1
        base = REGION_WORD_COUNT_HEADER + index * SLOT_WORD_COUNT
        padded = encoded + b"\0" * (-len(encoded) % 8)
        name_words = np.frombuffer(padded, dtype=np.int64) if padded else ()
        for offset, word in enumerate(name_words):
            words[base + SLOT_NAME_WORD + offset] = int(word)
        words[base + _S_KIND] = kind
        words[base + _S_NAME_SIZE] = len(encoded)
        words[base + _S_MESSAGES] = 0
        words[base + _S_BYTES] = 0
        words[base + _S_REQUESTS] = 0
        words[_KEY_COUNT] = index + 1  # published last
        self._slots[(kind, name)] = base
        return base

    def count_put(self, topic: str, message_count: int, size_bytes: int) -> None:
        """One acknowledged send (or batch) of `message_count` records into `topic`."""
        words = self._words
        words[S_PUT_MESSAGES] += message_count
        words[S_PUT_BYTES] += size_bytes
        self._count_key(KIND_PUT, topic, message_count, size_bytes)

    def count_get(self, group: str, topic: str, message_count: int, size_bytes: int) -> None:
        """One pull that handed `message_count` records of `topic` to `group`."""
        words = self._words
        words[S_GET_MESSAGES] += message_count
        words[S_GET_BYTES] += size_bytes
        self._count_key(KIND_GET, f"{topic}@{group}", message_count, size_bytes)

    def _count_key(self, kind: int, name: str, message_count: int, size_bytes: int) -> None:
        base = self._slot(kind, name)
        words = self._words
        if base < 0:
            words[_DROPPED_COUNT] += 1
            return
        words[base + _S_MESSAGES] += message_count
        words[base + _S_BYTES] += size_bytes
        words[base + _S_REQUESTS] += 1

    def add(self, scalar: int, count: int = 1) -> None:
        assert 2 <= scalar < 16
        self._words[scalar] += count

    def observe_ns(self, histogram: int, duration_ns: int) -> None:
        """One observation of `histogram` (HISTOGRAM_SEND, HISTOGRAM_FLUSH)."""
        base = _HISTOGRAM_WORD[histogram]
        words = self._words
        words[base + bisect.bisect_left(BUCKET_BOUNDS_NS, duration_ns)] += 1
        words[base + _SUM] += duration_ns
        words[base + _COUNT] += 1


def _slot_name(words: memoryview | NDArray[np.int64], base: int) -> str:
    size = int(words[base + _S_NAME_SIZE])
    first = base + SLOT_NAME_WORD
    raw = np.array(words[first : first + (size + 7) // 8], dtype=np.int64).tobytes()
    return raw[:size].decode("utf-8", "surrogatepass")


@dataclasses.dataclass(frozen=True, slots=True)
class KeyTotals:
    """One key's totals over every role: messages, bytes, requests (RocketMQ's "times")."""

    messages: int
    size_bytes: int
    requests: int


@dataclasses.dataclass(frozen=True, slots=True)
class Histogram:
    bucket_counts: tuple[int, ...]  # per bucket (not cumulative), the last one +Inf
    sum_ns: int
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    """The block summed over every role at one moment (each word read once)."""

    scalars: dict[str, int]
    puts: dict[str, KeyTotals]  # topic -> totals
    gets: dict[str, KeyTotals]  # "topic@group" -> totals
    histograms: dict[str, Histogram]
    dropped_count: int
    role_scalars: dict[str, dict[str, int]]  # role id -> its non-zero scalars


def read_totals(block: StatisticsBlock) -> Totals:
    """Sum every role's region (module docstring: key_count read first)."""
    scalars = dict.fromkeys(SCALAR_NAMES.values(), 0)
    role_scalars: dict[str, dict[str, int]] = {}
    tables: dict[int, dict[str, list[int]]] = {KIND_PUT: {}, KIND_GET: {}}
    histograms = {
        name: np.zeros(BUCKET_COUNT + 2, dtype=np.int64) for name in HISTOGRAM_NAMES.values()
    }
    dropped_count = 0
    for role_id in block.role_ids:
        region = block.region_array(role_id)
        key_count = min(int(region[_KEY_COUNT]), KEY_SLOT_COUNT)
        dropped_count += int(region[_DROPPED_COUNT])
        own = {name: int(region[word]) for word, name in SCALAR_NAMES.items() if region[word]}
        if own:
            role_scalars[role_id] = own
        for name, value in own.items():
            scalars[name] += value
        for histogram, name in HISTOGRAM_NAMES.items():
            first = _HISTOGRAM_WORD[histogram]
            histograms[name] += region[first : first + BUCKET_COUNT + 2]
        for index in range(key_count):
            base = REGION_WORD_COUNT_HEADER + index * SLOT_WORD_COUNT
            table = tables.get(int(region[base + _S_KIND]))
            if table is None:
                continue
            counts = table.setdefault(_slot_name(region, base), [0, 0, 0])
            counts[0] += int(region[base + _S_MESSAGES])
            counts[1] += int(region[base + _S_BYTES])
            counts[2] += int(region[base + _S_REQUESTS])
    return Totals(
        scalars=scalars,
        puts={name: KeyTotals(*counts) for name, counts in tables[KIND_PUT].items()},
        gets={name: KeyTotals(*counts) for name, counts in tables[KIND_GET].items()},
        histograms={
            name: Histogram(
                tuple(int(value) for value in words[:BUCKET_COUNT]),
                int(words[_SUM]),
                int(words[_COUNT]),
            )
            for name, words in histograms.items()
        },
        dropped_count=dropped_count,
        role_scalars=role_scalars,
    )

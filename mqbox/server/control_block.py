"""The control block: the supervisor's shared words about every role of the broker.

Owns: `ControlBlock` (one small array of int64 words in anonymous MAP_SHARED memory, created by
the supervisor before the first fork, so every role and every re-forked role shares it; it has
no name and nothing to unlink) and `ControlWatcher` (one role's view of its changes). Never:
imports anything of mqbox.server (every role and the supervisor import this leaf), sends
signals (the supervisor does), or decides anything: it is state, read by roles.

The supervisor writes one slot per role of the topology:

    word 0 magic   1 role_count   2 broker_state (STARTING, RUNNING, STOPPING)   3 change_sequence
    words 4-7 reserved
    slot i (words 8 + 8 i ...): generation, pid, state (DOWN, STARTING, READY), start_count,
        handling ring, handling position, quarantine ring, quarantine position
    then, from the next 128-byte line: one activity word per role, in slot order
    then, from the next 128-byte line: one holding word per role, in slot order

`generation` counts the role's transitions: +1 when a process is forked for it, +1 when that
process dies, so it is odd while a process is up and even while the role is down (0: never
started). A role that sends work to another keeps the generation it sent at; a different one
later means everything in flight to the old process is lost (the worker answers SYSTEM_ERROR for
it), and an even one means nobody is there to send to. `change_sequence` is bumped after every
change of any slot, so a role polls one word per loop turn and looks at the slots only when it
moved (`ControlWatcher`). After each change the supervisor sends SIGUSR1 to every live role, so
a role asleep on its doorbells wakes up and looks; the shared words, not the signal, carry the
news, so coalesced signals lose nothing. Each word means something on its own and is written
whole (aligned int64 stores are atomic on x86-64); the supervisor writes a slot's pid and state
before its generation, and the change sequence last, so under x86-64 store ordering a role that
saw the new sequence also sees the slot.

The two handling words of a slot are written by the role's own process, not the supervisor: the
ring parcel it is handling (runtime.py, "Quarantine"). The two quarantine words name the parcel
the role's next process must skip. A role's activity word is written by its process too: 1 while
it holds a core by choice (working or spinning), 0 while it sleeps in epoll; the roles' spin
policy counts them (transport.SpinGate). The supervisor zeroes it when the process dies, so a
role killed while busy does not keep a core counted. A role's holding word is written by its
process too: 1 while it holds requests that only a queue's growth answers (a pull processor's
held pulls), 0 when it holds none; the dispatcher sends QUEUES_GREW only to a pull processor
whose word is 1, each side fencing between its store and its load (pull.py, "Long polling"), so
a send to a broker without waiting consumers wakes no pull processor. The supervisor zeroes it
when the process dies, as the activity word.

Why not a ring per role: a ring needs a producer that outlives its consumer's restarts and a
parcel format; this is state, not a stream (a role that was asleep wants the latest state, not
every event), and one shared array answers "is send.1 up, and is it still the process I sent
to?" with two loads.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

CONTROL_MAGIC: Final = 0x6D71_626F_7843_746C  # "mqboxCtl"
_MAGIC_WORD: Final = 0
_ROLE_COUNT_WORD: Final = 1
_BROKER_STATE_WORD: Final = 2
_CHANGE_SEQUENCE_WORD: Final = 3
_HEADER_WORD_COUNT: Final = 8
_SLOT_WORD_COUNT: Final = 8
_GENERATION: Final = 0
_PID: Final = 1
_STATE: Final = 2
_START_COUNT: Final = 3
_HANDLING_RING: Final = 4  # written by the role (runtime.py, "Quarantine")
_HANDLING_POSITION: Final = 5
_QUARANTINE_RING: Final = 6
_QUARANTINE_POSITION: Final = 7
assert _CHANGE_SEQUENCE_WORD < _HEADER_WORD_COUNT
assert _QUARANTINE_POSITION < _SLOT_WORD_COUNT
assert _HANDLING_POSITION == _HANDLING_RING + 1
_LINE_WORD_COUNT: Final = 16  # 128 bytes: the activity words start on a line of their own

BROKER_STARTING: Final = 0
BROKER_RUNNING: Final = 1
BROKER_STOPPING: Final = 2

ROLE_DOWN: Final = 0
ROLE_STARTING: Final = 1
ROLE_READY: Final = 2
ROLE_STATE_NAMES: Final = {ROLE_DOWN: "down", ROLE_STARTING: "starting", ROLE_READY: "ready"}


class ControlBlock:
    """The supervisor's shared words about every role (module docstring).

    Written only by the supervisor, except each role's two handling words, which its process
    writes (ParcelMarks); roles read. Created before the first fork and inherited, so a role
    never attaches it by name.
    """

    def __init__(self, memory: mmap.mmap, role_ids: Sequence[str]) -> None:
        self._memory = memory
        self._words: NDArray[np.int64] = np.frombuffer(memory, dtype=np.int64)
        self.role_ids = tuple(role_ids)
        self._slot_of = {role_id: index for index, role_id in enumerate(self.role_ids)}
        assert len(self._slot_of) == len(self.role_ids), "role ids must be unique"
        assert self._words[_MAGIC_WORD] == CONTROL_MAGIC
        assert self._words[_ROLE_COUNT_WORD] == len(self.role_ids)

    @classmethod
    def create(cls, role_ids: Sequence[str]) -> ControlBlock:
        """Anonymous shared memory for `role_ids`, all down, broker starting."""
        word_count = _holding_first_word(len(role_ids)) + len(role_ids)
        size_bytes = max(mmap.PAGESIZE, word_count * 8)
        memory = mmap.mmap(-1, size_bytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        words = np.frombuffer(memory, dtype=np.int64)
        words[_ROLE_COUNT_WORD] = len(role_ids)
        words[_MAGIC_WORD] = CONTROL_MAGIC
        del words
        return cls(memory, role_ids)

    def _word(self, role_id: str, field: int) -> int:
        return _HEADER_WORD_COUNT + _SLOT_WORD_COUNT * self._slot_of[role_id] + field

    def _activity_word(self, role_id: str) -> int:
        return _activity_first_word(len(self.role_ids)) + self._slot_of[role_id]

    def _holding_word(self, role_id: str) -> int:
        return _holding_first_word(len(self.role_ids)) + self._slot_of[role_id]

    # Read side (any process).

    def change_sequence(self) -> int:
        """Bumped after every change; poll this one word per loop turn."""
        return int(self._words[_CHANGE_SEQUENCE_WORD])

    def broker_state(self) -> int:
        """BROKER_STARTING, BROKER_RUNNING or BROKER_STOPPING."""
        return int(self._words[_BROKER_STATE_WORD])

    def generation(self, role_id: str) -> int:
        """Odd while a process of the role is up, even while it is down; changes on each."""
        return int(self._words[self._word(role_id, _GENERATION)])

    def is_up(self, role_id: str) -> bool:
        return self.generation(role_id) % 2 == 1

    def pid(self, role_id: str) -> int:
        """The pid of the role's current process; 0 while it is down."""
        return int(self._words[self._word(role_id, _PID)])

    def state(self, role_id: str) -> int:
        """ROLE_DOWN, ROLE_STARTING or ROLE_READY."""
        return int(self._words[self._word(role_id, _STATE)])

    def start_count(self, role_id: str) -> int:
        """How many processes were forked for the role (1 + restarts)."""
        return int(self._words[self._word(role_id, _START_COUNT)])

    def handling(self, role_id: str) -> tuple[int, int] | None:
        """(ring number, position) of the parcel the role's process was handling, or None."""
        ring_number = int(self._words[self._word(role_id, _HANDLING_RING)])
        position = int(self._words[self._word(role_id, _HANDLING_POSITION)])
        if ring_number == 0 or position < 0:  # between batches, or before a batch's first
            return None
        return ring_number, position

    def quarantined(self, role_id: str) -> tuple[int, int] | None:
        """(ring number, position) of the parcel the role's next process must skip, or None."""
        ring_number = int(self._words[self._word(role_id, _QUARANTINE_RING)])
        if ring_number == 0:
            return None
        return ring_number, int(self._words[self._word(role_id, _QUARANTINE_POSITION)])

    def handling_words(self, role_id: str) -> memoryview:
        """The role's two handling words (ring number, position) as a memoryview of 'q' items,
        for its own process to write: an item store moves the whole word (ring.py)."""
        first = self._word(role_id, _HANDLING_RING)
        return memoryview(self._memory).cast("q")[first : first + 2]

    def activity_words(self, role_id: str) -> tuple[memoryview, int]:
        """Every role's activity word as a memoryview of 'q' items (sum() counts the roles on a
        core), and the index of `role_id`'s, which only its own process writes."""
        first = _activity_first_word(len(self.role_ids))
        words = memoryview(self._memory).cast("q")[first : first + len(self.role_ids)]
        return words, self._slot_of[role_id]

    def holding(self, role_id: str) -> int:
        """The role's holding word: 1 while it holds requests a queue's growth answers."""
        return int(self._words[self._holding_word(role_id)])

    def holding_words(self, role_id: str) -> memoryview:
        """The role's holding word as a one-item memoryview of 'q', for its own process."""
        first = self._holding_word(role_id)
        return memoryview(self._memory).cast("q")[first : first + 1]

    def active_count(self) -> int:
        """How many roles say they hold a core now (working or spinning)."""
        first = _activity_first_word(len(self.role_ids))
        return int(self._words[first : first + len(self.role_ids)].sum())

    # Write side (the supervisor only).

    def _changed(self) -> None:
        self._words[_CHANGE_SEQUENCE_WORD] += 1

    def set_broker_state(self, state: int) -> None:
        assert state in (BROKER_STARTING, BROKER_RUNNING, BROKER_STOPPING)
        self._words[_BROKER_STATE_WORD] = state
        self._changed()

    def role_started(self, role_id: str, pid: int) -> int:
        """A process was forked for the role; returns its generation (odd)."""
        assert pid > 0
        generation = self.generation(role_id)
        assert generation % 2 == 0, f"{role_id} is up already"
        self._words[self._word(role_id, _PID)] = pid
        self._words[self._word(role_id, _STATE)] = ROLE_STARTING
        self._words[self._word(role_id, _START_COUNT)] += 1
        self._words[self._word(role_id, _GENERATION)] = generation + 1
        self._changed()
        return generation + 1

    def role_ready(self, role_id: str) -> None:
        assert self.is_up(role_id)
        self._words[self._word(role_id, _STATE)] = ROLE_READY
        self._changed()

    def clear_handling(self, role_id: str) -> None:
        """Before a fork: the new process has handled nothing yet."""
        assert not self.is_up(role_id)
        self._words[self._word(role_id, _HANDLING_RING)] = 0
        self._words[self._word(role_id, _HANDLING_POSITION)] = 0

    def quarantine(self, role_id: str, parcel: tuple[int, int] | None) -> None:
        """The parcel (ring number, position) the role's next process must skip; None: none."""
        ring_number, position = parcel if parcel is not None else (0, 0)
        assert ring_number >= 0
        self._words[self._word(role_id, _QUARANTINE_POSITION)] = position
        self._words[self._word(role_id, _QUARANTINE_RING)] = ring_number

    def role_exited(self, role_id: str) -> int:
        """The role's process is gone; returns its generation (even)."""
        generation = self.generation(role_id)
        assert generation % 2 == 1, f"{role_id} is not up"
        self._words[self._word(role_id, _PID)] = 0
        self._words[self._word(role_id, _STATE)] = ROLE_DOWN
        self._words[self._activity_word(role_id)] = 0  # a killed process held no core after all
        self._words[self._holding_word(role_id)] = 0  # nor requests
        self._words[self._word(role_id, _GENERATION)] = generation + 1
        self._changed()
        return generation + 1


def _activity_first_word(role_count: int) -> int:
    slots_end = _HEADER_WORD_COUNT + _SLOT_WORD_COUNT * role_count
    return -(-slots_end // _LINE_WORD_COUNT) * _LINE_WORD_COUNT


def _holding_first_word(role_count: int) -> int:
    activity_end = _activity_first_word(role_count) + role_count
    return -(-activity_end // _LINE_WORD_COUNT) * _LINE_WORD_COUNT


class ControlWatcher:
    """One role's view of the control block: which roles changed since it last looked."""

    def __init__(self, control: ControlBlock) -> None:
        self.control = control
        self._sequence_seen = control.change_sequence()
        self._generations_seen = {
            role_id: control.generation(role_id) for role_id in control.role_ids
        }

    def generation_seen(self, role_id: str) -> int:
        return self._generations_seen[role_id]

    def changed_nowait(self) -> tuple[str, ...]:
        """Role ids whose generation moved since the last call (one load when nothing did)."""
        sequence = self.control.change_sequence()
        if sequence == self._sequence_seen:
            return ()
        self._sequence_seen = sequence
        changed: list[str] = []
        for role_id in self.control.role_ids:
            generation = self.control.generation(role_id)
            if generation != self._generations_seen[role_id]:
                self._generations_seen[role_id] = generation
                changed.append(role_id)
        return tuple(changed)

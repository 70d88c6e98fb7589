"""What every role process runs on: stop flag, logging, its rings, the control block, the loop.

Owns: the process set-up a forked role gets before its main() (signals, parent-death signal,
one rotated log file per role), attaching the role's rings by name, the supervisor's control
block (below) and `RoleLoop`, the drain-in-batches-then-sleep-on-doorbells main loop. Never:
what a record means (server/records.py and the roles do), starting or restarting processes
(supervisor.py does), or anything on the hot path beyond one counter read per loop turn.

The contract of a role's main(ctx) (supervisor.py calls it in a forked child):

- The supervisor has already called `enter_role_process(ctx)`: SIGTERM sets the stop flag,
  SIGUSR1 only wakes the process, SIGINT and SIGHUP are ignored (the supervisor turns a Ctrl-C
  into an orderly stop, role by role), logging goes to `<home>/logs/<role_id>.log`, and the
  process gets SIGTERM when the supervisor dies (so an orphan stops in an orderly way too).
- main() attaches its rings (`attach_rings(ctx)`), warms what it needs, calls
  `ctx.report_ready({...})` once, when it can serve, and then loops until
  `stop_requested()`: with `RoleLoop.run()`, or with its own epoll that includes
  `wakeup_fileno()` (readable after any signal) and its rings' doorbells.
- When the stop flag is set it finishes its batch, cleans up (the store writer flushes,
  checkpoints and removes `abort`) and calls `exit_stopped()`, which raises SystemExit(0).
  Returning from main() or raising anything else is a bug: the process exits non-zero, the
  supervisor re-forks it (or stops the broker, for a critical role).

The control channel (supervisor -> roles). The supervisor maps one small array of int64 words
(`ControlBlock`, anonymous MAP_SHARED memory created before the first fork, so every role and
every re-forked role shares it; it has no name and nothing to unlink) and writes one slot per
role of the topology:

    word 0 magic   1 role_count   2 broker_state (STARTING, RUNNING, STOPPING)   3 change_sequence
    words 4-7 reserved
    slot i (words 8 + 8 i ...): generation, pid, state (DOWN, STARTING, READY), start_count,
        handling ring, handling position, quarantine ring, quarantine position

`generation` counts the role's transitions: +1 when a process is forked for it, +1 when that
process dies, so it is odd while a process is up and even while the role is down (0: never
started). A role that sends work to another keeps the generation it sent at; a different one
later means everything in flight to the old process is lost (the worker answers SYSTEM_ERROR for
it), and an even one means nobody is there to send to. `change_sequence` is bumped after every
change of any slot, so a role polls one word per loop turn and looks at the slots only when it
moved (`ControlWatcher`). After each change the supervisor sends SIGUSR1 to every live role, so
a role asleep on its doorbells wakes up and looks; the shared words, not the signal, carry the
news, so coalesced signals lose nothing. (A signal interrupts a blocking system call; Python
retries it (PEP 475), and C code a role calls must do the same on EINTR.) Each word means
something on its own and is written whole (aligned int64 stores are atomic on x86-64); the
supervisor writes a slot's pid and state before its generation, and the change sequence last,
so under x86-64 store ordering a role that saw the new sequence also sees the slot.

Why not a ring per role: a ring needs a producer that outlives its consumer's restarts and a
record format; this is state, not a stream (a role that was asleep wants the latest state, not
every event), and one shared array answers "is send.1 up, and is it still the process I sent
to?" with two loads.

Quarantine (issue 9: one record must never stop the broker). A ring delivers the records a dead
consumer had drained but not released to its next process, so a record that kills its consumer
would kill every restarted process until the restart budget stops the broker. Two words of each
slot are therefore written by the role itself, not the supervisor (`RecordMarks`, used by
records.Inbox): while it handles a record, the ring's number (1 + its index in the topology's
rings) and the record's position in that ring (bytes since the ring was made; positions only
grow, so one names one record for the life of the ring); ring 0 between batches, position -1
from a batch's start to its first record. A SIGKILLed process
has made every store it made, so the supervisor reads both words after it reaped the process. A
process that died on the same record as the one before it (twice in a row) makes the supervisor
write that record into the slot's quarantine words before it forks the next process, whose Inbox
on that ring skips the record: it is answered SYSTEM_ERROR if it is a request (the role's
`on_quarantined` hook), logged and counted, and never handled. The supervisor clears the
handling words before each fork, and the quarantine words when it makes the rings anew.

Test hook (tests only, never set in production): the environment variable
MQBOX_TEST_DIE_ON_RECORD, "<role id>:<marker>[,<role id>:<marker>...]", makes that role SIGKILL
itself while it handles a record whose payload holds the marker bytes (records.Inbox), so tests
can make a role die on a chosen record.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import logging.handlers
import mmap
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

import numpy as np
from numpy.typing import NDArray

from mqbox.ipc.ring import RecordBatch, Ring

if TYPE_CHECKING:
    from mqbox.server.topology import RoleContext

LOG_FILE_SIZE_BYTES_MAX: Final = 16 << 20
LOG_FILE_BACKUP_COUNT: Final = 4
LOG_FORMAT: Final = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"

BATCH_COUNT_MAX_DEFAULT: Final = 256
TICK_INTERVAL_MS_DEFAULT: Final = 1000

# prctl(2) options: the signal this process gets when its parent dies; the thread's name.
_PR_SET_PDEATHSIG: Final = 1
_PR_SET_NAME: Final = 15
_PROCESS_NAME_SIZE_BYTES_MAX: Final = 15  # TASK_COMM_LEN - 1

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The control block
# ---------------------------------------------------------------------------------------------

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
_HANDLING_RING: Final = 4  # written by the role (quarantine, module docstring)
_HANDLING_POSITION: Final = 5
_QUARANTINE_RING: Final = 6
_QUARANTINE_POSITION: Final = 7
assert _CHANGE_SEQUENCE_WORD < _HEADER_WORD_COUNT
assert _QUARANTINE_POSITION < _SLOT_WORD_COUNT
assert _HANDLING_POSITION == _HANDLING_RING + 1

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
    writes (RecordMarks); roles read. Created before the first fork and inherited, so a role
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
        word_count = _HEADER_WORD_COUNT + _SLOT_WORD_COUNT * len(role_ids)
        size_bytes = max(mmap.PAGESIZE, word_count * 8)
        memory = mmap.mmap(-1, size_bytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        words = np.frombuffer(memory, dtype=np.int64)
        words[_ROLE_COUNT_WORD] = len(role_ids)
        words[_MAGIC_WORD] = CONTROL_MAGIC
        del words
        return cls(memory, role_ids)

    def _word(self, role_id: str, field: int) -> int:
        return _HEADER_WORD_COUNT + _SLOT_WORD_COUNT * self._slot_of[role_id] + field

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
        """(ring number, position) of the record the role's process was handling, or None."""
        ring_number = int(self._words[self._word(role_id, _HANDLING_RING)])
        position = int(self._words[self._word(role_id, _HANDLING_POSITION)])
        if ring_number == 0 or position < 0:  # between batches, or before a batch's first
            return None
        return ring_number, position

    def quarantined(self, role_id: str) -> tuple[int, int] | None:
        """(ring number, position) of the record the role's next process must skip, or None."""
        ring_number = int(self._words[self._word(role_id, _QUARANTINE_RING)])
        if ring_number == 0:
            return None
        return ring_number, int(self._words[self._word(role_id, _QUARANTINE_POSITION)])

    def handling_words(self, role_id: str) -> memoryview:
        """The role's two handling words (ring number, position) as a memoryview of 'q' items,
        for its own process to write: an item store moves the whole word (ring.py)."""
        first = self._word(role_id, _HANDLING_RING)
        return memoryview(self._memory).cast("q")[first : first + 2]

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

    def quarantine(self, role_id: str, record: tuple[int, int] | None) -> None:
        """The record (ring number, position) the role's next process must skip; None: none."""
        ring_number, position = record if record is not None else (0, 0)
        assert ring_number >= 0
        self._words[self._word(role_id, _QUARANTINE_POSITION)] = position
        self._words[self._word(role_id, _QUARANTINE_RING)] = ring_number

    def role_exited(self, role_id: str) -> int:
        """The role's process is gone; returns its generation (even)."""
        generation = self.generation(role_id)
        assert generation % 2 == 1, f"{role_id} is not up"
        self._words[self._word(role_id, _PID)] = 0
        self._words[self._word(role_id, _STATE)] = ROLE_DOWN
        self._words[self._word(role_id, _GENERATION)] = generation + 1
        self._changed()
        return generation + 1


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


# ---------------------------------------------------------------------------------------------
# Process set-up, stop flag, wake-up descriptor
# ---------------------------------------------------------------------------------------------


TEST_DIE_ON_RECORD_ENV: Final = "MQBOX_TEST_DIE_ON_RECORD"  # the test hook (module docstring)


class RecordMarks:
    """One role process's side of quarantine (module docstring): the two handling words it
    writes, the record its previous processes left it to skip, and the test hook's marker.
    records.Inbox uses it; roles never do."""

    def __init__(
        self,
        control: ControlBlock,
        role_id: str,
        ring_names: Sequence[str],
        die_on_marker: bytes | None = None,
    ) -> None:
        self.words = control.handling_words(role_id)  # [ring number, position]
        self._ring_numbers = {name: number for number, name in enumerate(ring_names, start=1)}
        self._skip = control.quarantined(role_id)
        self.die_on_marker = die_on_marker

    def ring_number(self, ring_name: str) -> int:
        """The number the handling words use for the ring named `ring_name`; 0 if unknown."""
        return self._ring_numbers.get(ring_name, 0)

    def skip_position(self, ring_number: int) -> int:
        """The position of the quarantined record in ring `ring_number`, or -1."""
        skip = self._skip
        if skip is None or skip[0] != ring_number:
            return -1
        return skip[1]


def die_on_marker_of(role_id: str, setting: str) -> bytes | None:
    """The marker TEST_DIE_ON_RECORD_ENV's `setting` names for `role_id`, or None."""
    for item in setting.split(","):
        target, _, marker = item.partition(":")
        if target == role_id and marker:
            return marker.encode()
    return None


@dataclasses.dataclass
class _ProcessState:
    role_id: str = ""
    stop_requested: bool = False
    wakeup_read_fd: int = -1
    wakeup_write_fd: int = -1
    record_marks: RecordMarks | None = None


_process = _ProcessState()


def _on_stop_signal(signal_number: int, frame: object) -> None:
    _process.stop_requested = True


def _on_wake_signal(signal_number: int, frame: object) -> None:
    """SIGUSR1: the supervisor changed the control block. The wake-up fd already woke us."""


def set_parent_death_signal(signal_number: int) -> None:
    """Ask Linux to send `signal_number` to this process when its parent dies (prctl(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal_number, 0, 0, 0) != 0:
        error_number = ctypes.get_errno()
        raise OSError(error_number, os.strerror(error_number))


def set_process_name(name: str) -> None:
    """Show `name` (cut to 15 bytes) for this process in ps -o comm, top and /proc/PID/comm,
    so the roles of one broker, which share a command line, can be told apart."""
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = name.encode()[:_PROCESS_NAME_SIZE_BYTES_MAX]
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0)


def _open_wakeup_pipe() -> None:
    """A fresh self-pipe for signal.set_wakeup_fd: Python writes a byte on every signal, so a
    poll or epoll that includes the read end returns when SIGTERM or SIGUSR1 arrives."""
    for fd in (_process.wakeup_read_fd, _process.wakeup_write_fd):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _process.wakeup_read_fd, _process.wakeup_write_fd = read_fd, write_fd
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)


def configure_logging(path: os.PathLike[str] | str, *, stderr_level: int | None = None) -> None:
    """Send the root logger to `path` (rotated), replacing every handler the process inherited;
    with `stderr_level`, also copy records of that level and above to stderr."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        with contextlib.suppress(Exception):
            handler.close()
    file_handler = logging.handlers.RotatingFileHandler(
        path, maxBytes=LOG_FILE_SIZE_BYTES_MAX, backupCount=LOG_FILE_BACKUP_COUNT
    )
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(file_handler)
    if stderr_level is not None:
        stream_handler = logging.StreamHandler(sys.stderr)
        stream_handler.setLevel(stderr_level)
        stream_handler.setFormatter(logging.Formatter("mqbox: %(levelname)s %(message)s"))
        root.addHandler(stream_handler)
    root.setLevel(logging.INFO)


def enter_role_process(ctx: RoleContext, supervisor_pid: int) -> None:
    """Make this freshly forked process a role process: signals, parent-death signal, logging.

    Called by the supervisor in the child, with the signals it blocked around fork() still
    blocked; this function installs the handlers and then unblocks them, so no signal finds
    the supervisor's handlers in a role.
    """
    _process.role_id = ctx.role.role_id
    _process.stop_requested = False
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    signal.signal(signal.SIGUSR1, _on_wake_signal)
    _open_wakeup_pipe()
    set_parent_death_signal(signal.SIGTERM)
    set_process_name(ctx.role.role_id)
    signal.pthread_sigmask(
        signal.SIG_UNBLOCK,
        {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1},
    )
    if os.getppid() != supervisor_pid:
        # The supervisor died before prctl took effect: nobody will send the signal.
        _process.stop_requested = True
    logs_dir = ctx.home / "logs"
    configure_logging(logs_dir / f"{ctx.role.role_id}.log")
    control = getattr(ctx, "control", None)
    if control is not None:
        ring_names = [spec.name for spec in ctx.topology.rings]
        marker = die_on_marker_of(ctx.role.role_id, os.environ.get(TEST_DIE_ON_RECORD_ENV, ""))
        if marker is not None:
            log.warning(
                "test hook %s: dying on records that hold %r", TEST_DIE_ON_RECORD_ENV, marker
            )
        _process.record_marks = RecordMarks(control, ctx.role.role_id, ring_names, marker)


def record_marks() -> RecordMarks | None:
    """This role process's RecordMarks; None outside a role process (unit tests)."""
    return _process.record_marks


def stop_requested() -> bool:
    """True once SIGTERM arrived (or request_stop() was called): finish the batch and stop."""
    return _process.stop_requested


def request_stop() -> None:
    """Set the stop flag from inside the role (tests, or a role that must stop itself)."""
    _process.stop_requested = True
    if _process.wakeup_write_fd >= 0:
        with contextlib.suppress(BlockingIOError):
            os.write(_process.wakeup_write_fd, b"\0")


def wakeup_fileno() -> int:
    """A descriptor that becomes readable when a signal arrives (SIGTERM, SIGUSR1), for a
    role's own epoll. Call clear_wakeup_nowait() after it fired."""
    assert _process.wakeup_read_fd >= 0, "enter_role_process() has not run in this process"
    return _process.wakeup_read_fd


def clear_wakeup_nowait() -> None:
    """Take the pending bytes out of the wake-up pipe."""
    while True:
        try:
            if not os.read(_process.wakeup_read_fd, 4096):
                return
        except BlockingIOError:
            return


def exit_stopped() -> NoReturn:
    """Leave main() after an orderly stop: the supervisor counts exit status 0 as clean."""
    assert _process.stop_requested, "exit_stopped() without a stop request"
    raise SystemExit(0)


def run_until_stopped(run_once: Callable[[int], int], on_stop: Callable[[], object]) -> NoReturn:
    """A role's main loop: turns of `run_once(-1)` (each sleeps only when it found no work)
    until a stop is requested, then `on_stop()` (flush, save, close) and the orderly exit."""
    while True:
        if _process.stop_requested:
            on_stop()
            exit_stopped()
        run_once(-1)


# ---------------------------------------------------------------------------------------------
# Rings
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RoleRings:
    """The rings of one role, attached by name in this process. `inbound` maps each producer's
    role id to the ring this role drains from it, `outbound` each consumer's role id to the ring
    this role writes to it; both in the topology's order."""

    inbound: Mapping[str, Ring]
    outbound: Mapping[str, Ring]

    def close(self) -> None:
        for ring in (*self.inbound.values(), *self.outbound.values()):
            ring.close()


def attach_rings(ctx: RoleContext) -> RoleRings:
    """Attach every ring the topology gives `ctx.role` (the supervisor created them all)."""
    role_id = ctx.role.role_id
    inbound: dict[str, Ring] = {}
    outbound: dict[str, Ring] = {}
    try:
        for spec in ctx.topology.rings_to(role_id):
            inbound[spec.producer] = Ring.attach(spec.name)
        for spec in ctx.topology.rings_from(role_id):
            outbound[spec.consumer] = Ring.attach(spec.name)
    except BaseException:
        RoleRings(inbound, outbound).close()
        raise
    return RoleRings(inbound, outbound)


# ---------------------------------------------------------------------------------------------
# The main loop
# ---------------------------------------------------------------------------------------------

BatchHandler = Callable[[str, Ring, RecordBatch], None]


@dataclasses.dataclass(frozen=True, slots=True)
class LoopStatistics:
    turn_count: int
    record_count: int
    batch_count: int
    sleep_count: int
    tick_count: int
    control_change_count: int


class RoleLoop:
    """Drain every inbound ring in batches, then sleep on their doorbells; until stopped.

    Each turn drains at most `batch_count_max` records per ring (docs/style.md section 9) and hands
    each non-empty batch to `on_batch(producer_role_id, ring, batch)`; the loop releases the
    batch when the handler returns, so the handler must copy what it keeps. `on_tick()` runs
    every `tick_interval_ms` (timers, idle checks), `on_control(role_ids)` when the control
    block says those roles changed generation, `on_fds(fds)` when any of `extra_fds` is
    readable, and `on_stop()` once, when the stop flag is seen, just before the loop exits with
    status 0. A turn that drained nothing sleeps until a doorbell rings, a signal arrives, an
    extra descriptor is readable or the next tick is due.
    """

    def __init__(
        self,
        ctx: RoleContext,
        rings: RoleRings,
        on_batch: BatchHandler,
        *,
        batch_count_max: int = BATCH_COUNT_MAX_DEFAULT,
        tick_interval_ms: int = TICK_INTERVAL_MS_DEFAULT,
        on_tick: Callable[[], None] | None = None,
        on_control: Callable[[tuple[str, ...]], None] | None = None,
        extra_fds: Sequence[int] = (),
        on_fds: Callable[[list[int]], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        assert batch_count_max > 0
        assert tick_interval_ms > 0
        assert not extra_fds or on_fds is not None
        self.ctx = ctx
        self.rings = rings
        self._inbound = tuple(rings.inbound.items())
        self._inbound_rings = tuple(ring for _, ring in self._inbound)
        self._on_batch = on_batch
        self._batch_count_max = batch_count_max
        self._tick_interval_ns = tick_interval_ms * 1_000_000
        self._on_tick = on_tick
        self._on_control = on_control
        self._extra_fds = frozenset(extra_fds)
        self._on_fds = on_fds
        self._on_stop = on_stop
        control = getattr(ctx, "control", None)
        self._watcher = ControlWatcher(control) if control is not None else None
        self._poller = select.poll()
        for _, ring in self._inbound:
            self._poller.register(ring.doorbell_fileno(), select.POLLIN)
        self._poller.register(wakeup_fileno(), select.POLLIN)
        for fd in self._extra_fds:
            self._poller.register(fd, select.POLLIN)
        self._turn_count = 0
        self._record_count = 0
        self._batch_count = 0
        self._sleep_count = 0
        self._tick_count = 0
        self._control_change_count = 0

    def statistics(self) -> LoopStatistics:
        return LoopStatistics(
            turn_count=self._turn_count,
            record_count=self._record_count,
            batch_count=self._batch_count,
            sleep_count=self._sleep_count,
            tick_count=self._tick_count,
            control_change_count=self._control_change_count,
        )

    def run(self) -> NoReturn:
        """Loop until the stop flag is set; then on_stop(), close the rings, exit status 0."""
        next_tick_ns = time.monotonic_ns() + self._tick_interval_ns
        while True:
            if stop_requested():
                self._stop()
            self._turn_count += 1
            if self._watcher is not None:
                changed = self._watcher.changed_nowait()
                if changed:
                    self._control_change_count += 1
                    if self._on_control is not None:
                        self._on_control(changed)
            drained_count = self._drain_once()
            now_ns = time.monotonic_ns()
            if now_ns >= next_tick_ns:
                self._tick_count += 1
                if self._on_tick is not None:
                    self._on_tick()
                next_tick_ns = now_ns + self._tick_interval_ns
            if drained_count == 0:
                self._sleep(next_tick_ns)
            elif self._extra_fds:
                self._dispatch_fds(self._poller.poll(0))  # busy: look without sleeping
        raise AssertionError("unreachable")

    def _drain_once(self) -> int:
        drained_count = 0
        for producer, ring in self._inbound:
            batch = ring.drain_nowait(self._batch_count_max)
            if batch.count == 0:
                continue
            try:
                self._on_batch(producer, ring, batch)
            finally:
                ring.release(batch)
            drained_count += batch.count
            self._batch_count += 1
        self._record_count += drained_count
        assert drained_count <= self._batch_count_max * len(self._inbound)
        return drained_count

    def _sleep(self, deadline_ns: int) -> None:
        """Arm every doorbell, sleep, disarm. Does not sleep if a record is readable already or
        a stop was requested between the check and the arming."""
        rings = self._inbound_rings
        if not Ring.arm_doorbells_nowait(rings):
            return  # readable now: nothing stays armed
        events: list[tuple[int, int]] | None = None
        try:
            if stop_requested():
                return
            timeout_ms = max(0, -(-(deadline_ns - time.monotonic_ns()) // 1_000_000))
            self._sleep_count += 1
            events = self._poller.poll(timeout_ms)
        finally:
            # Read a doorbell's FIFO only if poll said it fired (Ring.disarm_doorbell).
            fired = None if events is None else {fd for fd, _ in events}
            for ring in rings:
                ring.disarm_doorbell(rung=fired is None or ring.doorbell_fileno() in fired)
        assert events is not None
        clear_wakeup_nowait()
        self._dispatch_fds(events)

    def _dispatch_fds(self, events: list[tuple[int, int]]) -> None:
        if not self._extra_fds or self._on_fds is None:
            return
        ready = [fd for fd, _ in events if fd in self._extra_fds]
        if ready:
            self._on_fds(ready)

    def _stop(self) -> NoReturn:
        log.info("stop requested: leaving the main loop")
        try:
            if self._on_stop is not None:
                self._on_stop()
        finally:
            self.rings.close()
        exit_stopped()


def ready_line(role_id: str, info: Mapping[str, Any]) -> bytes:
    """The one JSON line a role writes to its ready pipe (supervisor.py reads it)."""
    document = {**info, "role_id": role_id, "pid": os.getpid()}
    return json.dumps(document, sort_keys=True).encode() + b"\n"

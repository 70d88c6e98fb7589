"""What every role process runs on: its context, stop flag, logging, rings, the loop.

Owns: `RoleContext` (everything a role's main() gets from the supervisor), the process set-up a
forked role gets before its main() (signals, parent-death signal, one rotated log file per
role), attaching the role's rings by name, the role's side of quarantine (`ParcelMarks`, below)
and `RoleLoop`, the drain-in-batches-then-sleep-on-doorbells main loop. Never:
what a parcel means (server/parcels.py and the roles do), starting or restarting processes
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

Quarantine (issue 9: one parcel must never stop the broker). A ring delivers the parcels a dead
consumer had drained but not released to its next process, so a parcel that kills its consumer
would kill every restarted process until the restart budget stops the broker. Two words of each
slot of the control block (control_block.py) are therefore written by the role itself, not the
supervisor (`ParcelMarks`, used by
transport.Inbox): while it handles a parcel, the ring's number (1 + its index in the topology's
rings) and the parcel's position in that ring (bytes since the ring was made; positions only
grow, so one names one parcel for the life of the ring); ring 0 between batches, position -1
from a batch's start to its first parcel. A SIGKILLed process
has made every store it made, so the supervisor reads both words after it reaped the process. A
process that died on the same parcel as the one before it (twice in a row) makes the supervisor
write that parcel into the slot's quarantine words before it forks the next process, whose Inbox
on that ring skips the parcel: it is answered SYSTEM_ERROR if it is a request (the role's
`on_quarantined` hook), logged and counted, and never handled. The supervisor clears the
handling words before each fork, and the quarantine words when it makes the rings anew.

Test hook (tests only, never set in production): the environment variable
MQBOX_TEST_DIE_ON_PARCEL, "<role id>:<marker>[,<role id>:<marker>...]", makes that role SIGKILL
itself while it handles a parcel whose payload holds the marker bytes (transport.Inbox), so tests
can make a role die on a chosen parcel.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import logging.handlers
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from mqbox.config import BrokerConfig
from mqbox.ipc.ring import ParcelBatch, Ring
from mqbox.server.control_block import ControlBlock, ControlWatcher
from mqbox.server.statistics import StatisticsBlock, StatisticsWriter
from mqbox.server.topology import RoleSpec, Topology

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


@dataclasses.dataclass(frozen=True, slots=True)
class RoleContext:
    """Everything a role's main() gets from the supervisor (by fork, never pickled)."""

    instance: str  # shared-memory instance name of this broker
    home: Path  # the appliance's --home
    store_root: Path  # this broker's store directory
    broker: BrokerConfig
    topology: Topology
    role: RoleSpec
    # The broker's listening socket.socket, non-blocking: reactors accept on it; the supervisor
    # closes it in every other role, so it closes for good when the reactors stop.
    listen_socket: Any
    broker_address: str  # "ip:port" clients are told to use (brokerIP1 + the bound port)
    report_ready: Callable[[Mapping[str, Any]], None]  # call once, when the role can serve
    # The supervisor's shared words about every role: generations, pids, states, broker state
    # (control_block.py). None only in contexts built by unit tests.
    control: ControlBlock | None = None
    # A master's HA listening socket (haListenPort), kept only by ha_service.0; None elsewhere.
    ha_socket: Any = None
    # The roles' shared statistics counters (statistics.py); None only in unit tests' contexts.
    statistics: StatisticsBlock | None = None


def statistics_writer(ctx: RoleContext) -> StatisticsWriter:
    """This role's writer of the broker's statistics block; a private block of its own when
    the context has none (unit tests), so counting never needs a branch."""
    block = getattr(ctx, "statistics", None)
    if block is None:
        block = StatisticsBlock.create([ctx.role.role_id])
    return StatisticsWriter(block, ctx.role.role_id)


# ---------------------------------------------------------------------------------------------
# Process set-up, stop flag, wake-up descriptor
# ---------------------------------------------------------------------------------------------


TEST_DIE_ON_PARCEL_ENV: Final = "MQBOX_TEST_DIE_ON_PARCEL"  # the test hook (module docstring)


class ParcelMarks:
    """One role process's side of quarantine (module docstring): the two handling words it
    writes, the parcel its previous processes left it to skip, and the test hook's marker.
    transport.Inbox uses it; roles never do."""

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
        """The position of the quarantined parcel in ring `ring_number`, or -1."""
        skip = self._skip
        if skip is None or skip[0] != ring_number:
            return -1
        return skip[1]


def die_on_marker_of(role_id: str, setting: str) -> bytes | None:
    """The marker TEST_DIE_ON_PARCEL_ENV's `setting` names for `role_id`, or None."""
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
    parcel_marks: ParcelMarks | None = None
    activity: tuple[memoryview, int] | None = None  # ControlBlock.activity_words


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
        marker = die_on_marker_of(ctx.role.role_id, os.environ.get(TEST_DIE_ON_PARCEL_ENV, ""))
        if marker is not None:
            log.warning(
                "test hook %s: dying on parcels that hold %r", TEST_DIE_ON_PARCEL_ENV, marker
            )
        _process.parcel_marks = ParcelMarks(control, ctx.role.role_id, ring_names, marker)
        _process.activity = control.activity_words(ctx.role.role_id)


def parcel_marks() -> ParcelMarks | None:
    """This role process's ParcelMarks; None outside a role process (unit tests)."""
    return _process.parcel_marks


def activity_words() -> tuple[memoryview, int] | None:
    """Every role's activity word and this process's index (control_block.py), for its
    transport.SpinGate; None outside a role process (unit tests)."""
    return _process.activity


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

BatchHandler = Callable[[str, Ring, ParcelBatch], None]


@dataclasses.dataclass(frozen=True, slots=True)
class LoopStatistics:
    turn_count: int
    parcel_count: int
    batch_count: int
    sleep_count: int
    tick_count: int
    control_change_count: int


class RoleLoop:
    """Drain every inbound ring in batches, then sleep on their doorbells; until stopped.

    Each turn drains at most `batch_count_max` parcels per ring (docs/style.md section 9) and hands
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
        self._parcel_count = 0
        self._batch_count = 0
        self._sleep_count = 0
        self._tick_count = 0
        self._control_change_count = 0

    def statistics(self) -> LoopStatistics:
        return LoopStatistics(
            turn_count=self._turn_count,
            parcel_count=self._parcel_count,
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
        self._parcel_count += drained_count
        assert drained_count <= self._batch_count_max * len(self._inbound)
        return drained_count

    def _sleep(self, deadline_ns: int) -> None:
        """Arm every doorbell, sleep, disarm. Does not sleep if a parcel is readable already or
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

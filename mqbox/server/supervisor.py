"""The broker's supervisor and zygote: starts every role, watches them, stops them in order.

Owns: what the appliance's run files say (`<home>/run/`: the lock, the pid file, `state.json`;
home.py knows where they are and how they are read), the name-server child, the broker's listening
socket, the shared-memory objects of the instance (created before the first fork, swept after the
last exit), the control block (control_block.py) and every role process. Never: a role's work, a
socket's bytes, or the store's files (apart from re-creating `abort` after a critical role died,
below).

Theory of operation. One process (`Supervisor.run`) loads the configuration, creates the home
directories, takes the home's lock, sweeps shared memory a dead earlier run of the same home
left behind, binds the broker's port, imports every role module and warms every numba kernel,
starts the name server (`python -m mqbox.namesrv`, a separate interpreter: it needs no numba),
creates every ring of the topology, then calls `gc.collect(); gc.freeze()` and forks the roles
in START_ORDER, one kind at a time, each kind only after the one before has reported ready. The
children share the warmed-up parent's pages copy-on-write, which is what keeps the appliance
inside its memory budget (about 140 MB per process that loads numba on its own), and forking
takes milliseconds, so a role that dies is re-forked from the same warm parent. Nothing in a
RoleContext is pickled. Measured with the stand-in roles of tests/support/roles.py (numba and
the store kernels loaded), default pools on 2 cores: 11 processes, about 115 MB of Pss_Anon +
Pss_Shmem in all, 10 MB per role; a role that loads the cached kernels on its own costs 63 MB.

Entry points: `Supervisor(options).run()` in the caller's process (`mqbox start`, foreground),
or `python -m mqbox.server.supervisor` (`mqbox start --daemon` runs it in a session of its own
and waits for the JSON line on --ready-fd). `ApplianceOptions.topology` (`--topology`) swaps
the broker's process graph for another "module:function" factory: the tests run the process
mechanics with trivial roles that way.

Rules:

1. No threads in the supervisor: a fork copies only the calling thread, so a lock another
   thread held stays locked forever in the child. `_fork_role` asserts it. Signals are handled
   with flags and `signal.set_wakeup_fd`; children are reaped with `waitpid(pid, WNOHANG)`
   after SIGCHLD wakes the loop.
2. The signals a fresh child must not handle with the supervisor's handlers (TERM, INT, HUP,
   CHLD, USR1) are blocked around fork(); the child installs its own (runtime.py) and unblocks.
3. A role reports ready by writing one JSON line to a pipe made for it (`ctx.report_ready`).
   End-of-file first means it died; the start waits with a deadline per kind.
4. A dead non-critical role is re-forked (its rings still exist and accept a restarted consumer
   or producer), with a growing delay (config.RestartConfig); if two processes in a row died on
   the same ring parcel, that parcel is quarantined first (runtime.py). A dead critical role
   (store writer, dispatcher) restarts the broker: every other role stops in reverse order,
   `abort` is made so that the store writer's MessageStore.open runs the full recovery, the
   instance's shared memory is made anew (rings, counters, spill files: what was in flight
   belonged to connections that are gone), and every role starts again in START_ORDER, after
   the same growing delay; clients reconnect to the listening socket, which stays bound. Too
   many deaths of one role, or too many broker restarts, within the window stop the broker: the
   exit status is EXIT_ROLE_FAILED, and the reason is in the log, in state.json while running
   (`last_failure`) and in `run/last-stop.json` after the exit, which `mqbox status` shows.
5. Every change of a role's process is written to the control block and followed by SIGUSR1 to
   every live role (the control channel, runtime.py), and to `run/state.json` for `mqbox status`.
6. The orderly stop (SIGTERM, SIGINT, SIGHUP): SIGTERM to the roles in reverse START_ORDER, one
   kind at a time, each kind waited for (SIGKILL after its timeout); the listening socket is
   closed once the reactors are gone; then the name server; then every shared-memory object of
   the instance is unlinked and the run files are removed. A second signal shortens every
   remaining wait to nothing.
7. Any failure while starting stops what was started, in the same order, and raises one
   MqboxError whose message is the line the CLI prints. Nothing is left running.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gc
import importlib
import inspect
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TypeGuard

import psutil

from mqbox import _jit
from mqbox.acl.validator import acl_file_path, load_acl_file
from mqbox.clock import wall_clock_ms
from mqbox.config import (
    BrokerConfig,
    BrokerRole,
    NamesrvConfig,
    RestartConfig,
    broker_listen_address,
    effective_ha_listen_port,
    ignored_keys_warning,
    key_values,
    load_broker_config,
    load_namesrv_config,
)
from mqbox.errors import ConfigError, MqboxError
from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.resources import keep_large_allocations, raise_file_limit
from mqbox.run_files import write_json_atomically
from mqbox.server import control_block, runtime
from mqbox.server.home import (
    NAMESRV_OUTPUT_FILE_NAME,
    NAMESRV_READY_FILE_NAME,
    STATE_VERSION,
    SUPERVISOR_LOG_FILE_NAME,
    HomeLayout,
    instance_name,
    lock_home,
    prepare_home,
    process_alive,
    read_http,
    read_state,
    recorded_processes,
    store_root_of,
)
from mqbox.server.runtime import RoleContext
from mqbox.server.runtime_config import apply_home_overrides
from mqbox.server.statistics import StatisticsBlock
from mqbox.server.topology import START_ORDER, RoleKind, RoleSpec, Topology, broker_topology
from mqbox.store.layout import DIRECTORY_MODE, abort_path

log = logging.getLogger("mqbox.supervisor")

EXIT_OK: Final = 0  # stopped on request, every role exited cleanly
EXIT_START_FAILED: Final = 1  # nothing was left running
EXIT_ROLE_FAILED: Final = 2  # a critical role died, or a role kept dying
EXIT_STOP_UNCLEAN: Final = 3  # a role had to be killed, or exited non-zero, during the stop
EXIT_ROLE_BUG: Final = 70  # a role's main() returned or raised (EX_SOFTWARE)


LISTEN_BACKLOG: Final = 1024
FREE_PORT_PAIR_ATTEMPTS: Final = 20  # port 0: tries at a port whose HA port (+1) is free too
PRIVATE_UMASK: Final = 0o077
# Starting: the store writer and the dispatcher may run a long recovery before they are ready.
READY_TIMEOUT_S_DEFAULT: Final = 60.0
READY_TIMEOUT_S_STORE: Final = 900.0
NAMESRV_READY_TIMEOUT_S: Final = 30.0
# Stopping: the store writer flushes and checkpoints; the dispatcher flushes the consume queues
# and up to a minute of the index (mqboxFlushIntervalIndexMs).
STOP_TIMEOUT_S_DEFAULT: Final = 10.0
STOP_TIMEOUT_S_STORE: Final = 60.0
STALE_PROCESS_WAIT_S: Final = 10.0
KILL_WAIT_S: Final = 10.0  # a process that outlives SIGKILL this long is stuck in the kernel
_NEVER_NS: Final = 2**63 - 1
BROKER_RESTART_KEY: Final = "broker"  # the broker restarts' history, beside the roles' deaths
QUARANTINE_DEATH_COUNT: Final = 2  # deaths in a row on one parcel that quarantine it
WATCH_INTERVAL_MS: Final = 1000
WARM_UP_FUNCTION_NAMES: Final = ("warm_up", "warm_up_kernels")
READY_LINE_SIZE_BYTES_MAX: Final = 4096  # one write of at most PIPE_BUF bytes is atomic

_FORK_SIGNALS: Final = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1}
)
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_STORE_KINDS: Final = frozenset({RoleKind.STORE_WRITER, RoleKind.DISPATCHER})

TopologyFactory = Callable[[str, BrokerConfig], Topology]


def resolve_callable(reference: str) -> Callable[..., Any]:
    """The function named by "module:function" (importing the module)."""
    module_name, _, function_name = reference.partition(":")
    if not module_name or not function_name:
        raise ConfigError(f"{reference!r} is not 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"cannot load {module_name}: {error}") from None
    except Exception as error:  # a module that fails while importing: show the first cause
        raise ConfigError(f"cannot load {module_name}: {type(error).__name__}: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"{module_name} has no function {function_name}")
    return function  # type: ignore[no-any-return]


def describe_wait_status(status: int) -> str:
    """'exit status 1' or 'signal SIGKILL' for a waitpid status."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit status {code}"
    with contextlib.suppress(ValueError):
        return f"signal {signal.Signals(-code).name}"
    return f"signal {-code}"


def _close_quietly(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


# ---------------------------------------------------------------------------------------------
# Options and processes
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ApplianceOptions:
    """What one `mqbox start` runs. Ports: None = the configuration's, 0 = any free port."""

    home: Path
    broker_config_path: Path | None = None
    namesrv_config_path: Path | None = None
    namesrv_port: int | None = None
    broker_port: int | None = None
    # The HTTP endpoint's port instead of mqboxHttpPort (0 = any free), unless that is -1 (none):
    # `mqbox start --broker-port 0` passes 0, so the brokers of a layout never want one port.
    http_port: int | None = None
    # "module:function" building the topology from (instance, BrokerConfig); None = the broker's.
    # Tests pass tests/support/roles.py here to test the process mechanics with trivial roles.
    topology: str | None = None
    run_namesrv: bool = True
    namesrv_module: str = "mqbox.namesrv"
    # With run_namesrv False: the name server(s) to register with instead of namesrvAddr (a
    # layout's brokers get the address of the name server `mqbox start --layout` started).
    namesrv_addr: str | None = None
    ready_timeout_s: float | None = None  # None = per kind (long for the store roles)
    stop_timeout_s: float | None = None  # None = per kind (long for the store writer)
    # Deaths of one role within the restart window; None = mqboxRoleRestartCountMax.
    restart_count_max: int | None = None
    log_to_stderr: bool = True  # warnings and errors also to stderr (foreground, daemon .out)


@dataclasses.dataclass(slots=True)
class _RoleProcess:
    spec: RoleSpec
    pid: int
    generation: int
    started_at_ms: int
    create_time: float | None
    ready_fd: int  # read end of the ready pipe until the line arrived; then -1
    ready_deadline_ns: int
    ready_buffer: bytes = b""
    ready: bool = False
    exit_status: int | None = None


@dataclasses.dataclass(slots=True)
class _Namesrv:
    popen: subprocess.Popen[bytes]
    port_requested: int
    ready_path: Path
    deadline_ns: int
    host: str = ""
    port: int = 0
    ready: bool = False
    create_time: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Failure:
    """Why the watch loop cannot go on as it was: restart the broker's roles, or stop."""

    reason: str
    restart_broker: bool


class _StartInterruptedError(Exception):
    """A stop signal arrived while the appliance was starting."""


class Supervisor:
    """Runs one appliance (name server plus one broker) until it is stopped; see the module
    docstring. Use: `Supervisor(options, on_ready=...).run()` returns the exit status."""

    def __init__(
        self,
        options: ApplianceOptions,
        *,
        on_ready: Callable[[Mapping[str, Any]], None] | None = None,
        close_in_children: Sequence[int] = (),
    ) -> None:
        self.options = options
        self.layout = HomeLayout(options.home.expanduser().resolve())
        self._on_ready = on_ready
        self._stop_signal: int | None = None
        self._hurry = False
        self._wakeup_read_fd = -1
        self._wakeup_write_fd = -1
        self._previous_handlers: dict[int, Any] = {}
        self._previous_wakeup_fd: int | None = None
        self._lock_fd = -1
        self._listen_socket: socket.socket | None = None
        self._ha_socket: socket.socket | None = None
        self.ha_address = ""
        self._namesrv: _Namesrv | None = None
        self._namesrv_output: Path | None = None
        self._namesrv_restart_due_ns: int | None = None
        self._namesrv_port_to_reuse = 0
        self._namesrv_listen_address = "127.0.0.1"  # what the name server binds
        self.namesrv_acl_path: Path | None = None  # set by _check_acl when it checks the ACL
        self._instances_to_sweep: set[str] = set()
        self._processes: dict[str, _RoleProcess] = {}  # live or starting, by role id
        self._restart_due_ns: dict[str, int] = {}
        self._death_history: dict[str, collections.deque[int]] = {}
        # role id -> (parcel its last process died handling, deaths in a row on it)
        self._deaths_on_parcel: dict[str, tuple[tuple[int, int], int]] = {}
        self._quarantined_counts: dict[str, int] = {}
        self._restarts = RestartConfig()  # the broker's, once its configuration is loaded
        self._broker_restart_count = 0
        self._last_failure: dict[str, Any] | None = None  # reason, at_ms
        self._started_at_ms = wall_clock_ms()
        self._status = "starting"
        self._stop_unclean = False
        # Descriptors of this process no role may keep: the lock, the wake-up pipe, other roles'
        # ready pipes, the caller's own ready pipe.
        self._child_close_fds: set[int] = set(close_in_children)
        self.instance = ""
        self.broker: BrokerConfig | None = None
        self.topology: Topology | None = None
        self.control: control_block.ControlBlock | None = None
        self.statistics: StatisticsBlock | None = None
        self.store_root: Path | None = None
        self.broker_address = ""
        self._base_ctx: RoleContext | None = None
        self._supervisor_pid = os.getpid()

    # -- the whole life ------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, watch until stopped; returns the exit status (EXIT_*). Raises
        MqboxError (after cleaning up) if the appliance could not start."""
        self._install_signal_handlers()
        try:
            try:
                self._start()
            except _StartInterruptedError:
                log.info("stop requested while starting")
                self._stop_everything()
                return EXIT_OK
            except BaseException:
                self._stop_everything()
                raise
            try:
                return self._watch()
            except BaseException:
                log.exception("the supervisor failed: stopping everything")
                self._stop_everything()
                raise
        finally:
            self._release_home()
            self._restore_signal_handlers()

    # -- signals -------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        self._wakeup_read_fd, self._wakeup_write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._child_close_fds.update((self._wakeup_read_fd, self._wakeup_write_fd))
        for signal_number in (*_STOP_SIGNALS, signal.SIGCHLD):
            self._previous_handlers[signal_number] = signal.signal(signal_number, self._on_signal)
        self._previous_wakeup_fd = signal.set_wakeup_fd(
            self._wakeup_write_fd, warn_on_full_buffer=False
        )

    def _restore_signal_handlers(self) -> None:
        if self._previous_wakeup_fd is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signal_number, handler in self._previous_handlers.items():
            signal.signal(signal_number, handler)
        self._previous_handlers.clear()
        for fd in (self._wakeup_read_fd, self._wakeup_write_fd):
            _close_quietly(fd)
        self._wakeup_read_fd = self._wakeup_write_fd = -1

    def _on_signal(self, signal_number: int, frame: object) -> None:
        if signal_number == signal.SIGCHLD:
            return  # the wake-up fd already woke the loop; it reaps
        if self._stop_signal is not None:
            self._hurry = True
        self._stop_signal = signal_number

    def _clear_wakeup(self) -> None:
        while True:
            try:
                if not os.read(self._wakeup_read_fd, 4096):
                    return
            except BlockingIOError:
                return

    def _poll(self, fds: Sequence[int], timeout_ms: int) -> list[int]:
        """Sleep until one of `fds` or the wake-up pipe is readable or timeout_ms passes;
        returns the readable ones among `fds`."""
        poller = select.poll()
        poller.register(self._wakeup_read_fd, select.POLLIN)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        events = poller.poll(max(0, timeout_ms))
        self._clear_wakeup()
        return [fd for fd, _ in events if fd != self._wakeup_read_fd]

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        options = self.options
        # Everything the appliance creates is its user's alone (issue 9): the roles, the name
        # server and the libraries they call (logging, tempfile) inherit this umask; the store
        # and the run files also pass modes 0600 and 0700 explicitly.
        os.umask(PRIVATE_UMASK)
        prepare_home(self.layout.home)
        # The runtime keys UPDATE_BROKER_CONFIG persisted in the home win (runtime_config.py).
        broker = apply_home_overrides(
            load_broker_config(options.broker_config_path), self.layout.home
        )
        if options.namesrv_addr is not None:
            broker = dataclasses.replace(broker, namesrv_addr=options.namesrv_addr)
        if options.http_port is not None and broker.http_port >= 0:
            broker = dataclasses.replace(broker, http_port=options.http_port)
        namesrv_config = load_namesrv_config(options.namesrv_config_path)
        broker = self._check_acl(broker, namesrv_config)
        # The lock first: a second supervisor of this home must not even write to its log.
        self._lock_home()
        runtime.configure_logging(
            self.layout.logs_dir / SUPERVISOR_LOG_FILE_NAME,
            stderr_level=logging.WARNING if options.log_to_stderr else None,
        )
        log.info("starting in %s (pid %d)", self.layout.home, os.getpid())
        ignored = ignored_keys_warning(options.broker_config_path or "", broker.unknown_keys)
        if ignored is not None:
            log.info("%s", ignored)
        # Every role and the name server inherit the limit: each connection is a descriptor, and
        # the usual soft limit (1024) is far below what mqboxConnectionCountMax allows.
        soft_before, soft_now = raise_file_limit()
        log.info("descriptor limit: soft %d (was %d)", soft_now, soft_before)
        for stale in (
            self.layout.last_stop_path,
            self.layout.http_path,
            self.layout.replication_path,
        ):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        self._restarts = broker.restarts
        self.instance = instance_name(self.layout.home, broker.broker_name)
        self._sweep_stale(self.instance)
        self.store_root = store_root_of(self.layout.home, broker)
        try:
            self.store_root.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(f"cannot create store {self.store_root}: {error.strerror}") from None
        broker_port = options.broker_port if options.broker_port is not None else broker.listen_port
        self._listen_socket = self._bind_broker(broker_listen_address(broker), broker_port)
        bound_port = int(self._listen_socket.getsockname()[1])
        self.broker_address = f"{broker.broker_ip1 or '127.0.0.1'}:{bound_port}"
        broker = dataclasses.replace(broker, listen_port=bound_port)
        # RocketMQ's BrokerStartup sets haListenPort to listenPort + 1 whatever the file says
        # (_bind_broker chose a port whose successor is free when asked for any port).
        ha_port = effective_ha_listen_port(broker, bound_port)
        broker = dataclasses.replace(broker, ha_listen_port=ha_port)
        if broker.broker_role is not BrokerRole.SLAVE:
            # A master serves its slaves on haListenPort, where the broker listens.
            self._ha_socket = self._bind_ha(broker_listen_address(broker), ha_port, broker_port)
            ha_bound_port = int(self._ha_socket.getsockname()[1])
            self.ha_address = (
                f"{broker.broker_ip2 or broker.broker_ip1 or '127.0.0.1'}:{ha_bound_port}"
            )
            broker = dataclasses.replace(broker, ha_listen_port=ha_bound_port)
        factory: TopologyFactory = broker_topology
        if options.topology is not None:
            factory = resolve_callable(options.topology)
        self.topology = factory(self.instance, broker)
        self._check_topology(self.topology)
        self._warm_up(self.topology)
        self._check_stop()
        if options.run_namesrv:
            namesrv_port = (
                options.namesrv_port
                if options.namesrv_port is not None
                else namesrv_config.listen_port
            )
            namesrv = self._start_namesrv(namesrv_port, namesrv_config.listen_address, wait=True)
            client_host = namesrv.host if namesrv.host not in ("", "0.0.0.0") else "127.0.0.1"
            broker = dataclasses.replace(broker, namesrv_addr=f"{client_host}:{namesrv.port}")
        self.broker = broker
        self._write_run_config(broker, namesrv_config)
        self._check_stop()
        self._instances_to_sweep.add(self.instance)
        self._create_rings()
        self.control = control_block.ControlBlock.create(
            [role.role_id for role in self.topology.roles]
        )
        if self.statistics is None:  # kept across whole-broker restarts: totals only grow
            self.statistics = StatisticsBlock.create([role.role_id for role in self.topology.roles])
        self._base_ctx = RoleContext(
            instance=self.instance,
            home=self.layout.home,
            store_root=self.store_root,
            broker=broker,
            topology=self.topology,
            role=self.topology.roles[0],
            listen_socket=self._listen_socket,
            ha_socket=self._ha_socket,
            broker_address=self.broker_address,
            report_ready=_report_ready_outside_a_role,
            control=self.control,
            statistics=self.statistics,
        )
        self._write_state()
        # Everything the roles share is loaded: keep the collector's hands off it, so the
        # children's copies of these pages stay shared (gc.freeze moves every object to a
        # generation the collector never scans, and never writes to).
        gc.collect()
        gc.freeze()
        if not keep_large_allocations():
            log.warning("mallopt refused: large payload copies map fresh pages each time")
        native_thread_count = sum(1 for _ in Path("/proc/self/task").iterdir())
        if native_thread_count > 1:
            log.warning(
                "%d native threads in the zygote (a BLAS pool?): they cost memory and are not "
                "copied into the roles; set OPENBLAS_NUM_THREADS=1",
                native_thread_count,
            )
        self._start_roles()
        info = self.ready_info()
        log.info("ready: %s", json.dumps(info, sort_keys=True))
        if self._on_ready is not None:
            self._on_ready(info)

    def _write_run_config(self, broker: BrokerConfig, namesrv_config: NamesrvConfig) -> None:
        """run/config.json: the configuration in force by RocketMQ key (ports as bound, the name
        server address the broker registers with), for `mqbox config --home`."""
        namesrv = self._namesrv
        if namesrv is not None:
            namesrv_config = dataclasses.replace(namesrv_config, listen_port=namesrv.port)
        options = self.options
        document = {
            "broker_config_path": str(options.broker_config_path or ""),
            "namesrv_config_path": str(options.namesrv_config_path or ""),
            "broker": key_values(broker),
            "namesrv": key_values(namesrv_config) if namesrv is not None else None,
            "ignored": {
                "broker": list(broker.unknown_keys),
                "namesrv": list(namesrv_config.unknown_keys),
            },
        }
        write_json_atomically(self.layout.run_config_path, document)

    def _create_rings(self) -> None:
        """Every ring of the topology, empty (none of them may exist)."""
        assert self.topology is not None
        for spec in self.topology.rings:
            try:
                Ring.create(spec.name, spec.capacity_bytes).close()
            except OSError as error:
                raise MqboxError(f"cannot create ring {spec.name}: {error}") from None

    def _start_roles(self) -> None:
        """Fork every role in START_ORDER, a kind after the one before it is ready; then the
        broker runs. MqboxError if one dies or misses its ready deadline (rule 7 at the first
        start; a failed broker restart otherwise)."""
        assert self.topology is not None
        assert self.control is not None
        for kind in START_ORDER:
            specs = self.topology.roles_of(kind)
            if not specs:
                continue
            started = [self._fork_role(spec, self._ready_timeout_s(kind)) for spec in specs]
            self._wait_ready_at_start(started)
        self._status = "running"
        self.control.set_broker_state(control_block.BROKER_RUNNING)
        self._notify_roles()
        self._write_state()

    def ready_info(self) -> dict[str, Any]:
        """What `mqbox start` prints once everything is ready."""
        namesrv = self._namesrv
        return {
            "home": str(self.layout.home),
            "pid": os.getpid(),
            "instance": self.instance,
            "broker": self.broker_address,
            "ha": self.ha_address,
            "broker_name": self.broker.broker_name if self.broker else "",
            "namesrv": f"{namesrv.host}:{namesrv.port}" if namesrv is not None else "",
            "namesrv_addr": self.broker.namesrv_addr if self.broker else "",
            "roles": {role_id: process.pid for role_id, process in self._processes.items()},
            "http": (read_http(self.layout.home) or {}).get("url", ""),
        }

    def _check_stop(self) -> None:
        if self._stop_signal is not None:
            raise _StartInterruptedError

    def _lock_home(self) -> None:
        """Take the home's lock for the life of this process: one appliance per home."""
        fd = lock_home(self.layout)
        self._lock_fd = fd
        self._child_close_fds.add(fd)
        self.layout.pid_path.write_text(f"{os.getpid()}\n", encoding="utf-8")

    def _release_home(self) -> None:
        if self._lock_fd < 0:
            return
        for path in (self.layout.pid_path, self.layout.state_path, self.layout.http_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        _close_quietly(self._lock_fd)  # releases the flock
        self._lock_fd = -1

    def _sweep_stale(self, instance: str) -> None:
        """Remove what a dead earlier run of this home left: its shared memory and run state.
        Refuses if processes of that run still live (the lock says its supervisor is gone, but a
        role or the name server may still be stopping)."""
        state = read_state(self.layout.home)
        instances = {instance}
        if state is not None:
            deadline_ns = time.monotonic_ns() + int(STALE_PROCESS_WAIT_S * 1e9)
            alive = [
                (name, pid)
                for name, pid, create_time in recorded_processes(state)
                if pid != os.getpid() and process_alive(pid, create_time)
            ]
            while alive and time.monotonic_ns() < deadline_ns:
                time.sleep(0.1)
                alive = [
                    (name, pid)
                    for name, pid, create_time in recorded_processes(state)
                    if pid != os.getpid() and process_alive(pid, create_time)
                ]
            if alive:
                listed = ", ".join(f"{name} pid {pid}" for name, pid in alive)
                raise MqboxError(
                    f"processes of an earlier run in {self.layout.home} are still alive "
                    f"({listed}); `mqbox stop --home {self.layout.home}` ends them"
                )
            if isinstance(state.get("instance"), str) and state["instance"]:
                with contextlib.suppress(ConfigError):
                    names.check_part("instance", state["instance"])
                    instances.add(state["instance"])
            with contextlib.suppress(FileNotFoundError):
                self.layout.state_path.unlink()
        for stale in sorted(instances):
            removed = names.unlink_instance(stale)
            if removed:
                log.warning(
                    "swept %d shared-memory objects of a dead run (instance %s)",
                    len(removed),
                    stale,
                )

    def _bind_broker(self, host: str, port: int) -> socket.socket:
        """The broker's listening socket on host:port. With port 0, a free port whose successor
        (the HA port, listenPort + 1) is free too, as far as a probe can tell."""
        for _ in range(FREE_PORT_PAIR_ATTEMPTS if port == 0 else 1):
            sock = self._bind_broker_once(host, port)
            if port != 0 or _port_free(host, int(sock.getsockname()[1]) + 1):
                break
            sock.close()
        return sock

    def _bind_ha(self, host: str, port: int, broker_port: int) -> socket.socket:
        """A master's HA listening socket; when any broker port was asked for and another
        process took listenPort + 1 since _bind_broker's probe, any free port instead."""
        try:
            return self._bind_broker_once(host, port)
        except MqboxError:
            if broker_port != 0:
                raise
            return self._bind_broker_once(host, 0)

    def _bind_broker_once(self, host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
        except OSError as error:
            sock.close()
            reason = error.strerror or str(error)
            raise MqboxError(f"broker cannot listen on {host}:{port}: {reason}") from None
        # Reactors share this socket in epoll; a blocking accept would hang the loser of a race.
        sock.setblocking(False)
        log.info("broker listening on %s:%d", host, sock.getsockname()[1])
        return sock

    def _check_acl(self, broker: BrokerConfig, namesrv: NamesrvConfig) -> BrokerConfig:
        """Refuse to start with an ACL file that is not valid (ConfigError naming it), decide
        the name server's ACL (on when either configuration turns it on, with the broker's
        file unless namesrv.conf names one), and give the broker the account it signs its
        registrations with: mqboxNamesrvAccessKey, else the first admin account of the file the
        name server checks (docs/acl.md section 6)."""
        home = self.layout.home
        broker_path = acl_file_path(broker.acl_file, home)
        namesrv_path = acl_file_path(namesrv.acl_file, home) if namesrv.acl_file else broker_path
        if broker.acl_enable:
            load_acl_file(broker_path)
        if self.options.run_namesrv and (namesrv.acl_enable or broker.acl_enable):
            self.namesrv_acl_path = namesrv_path
        if broker.namesrv_access_key or not (broker.acl_enable or namesrv.acl_enable):
            return broker
        account = load_acl_file(namesrv_path).admin_account()
        if account is None:
            raise ConfigError(
                f"aclEnable: the broker signs its name server requests with an admin account: "
                f"add one to {namesrv_path} or set mqboxNamesrvAccessKey/mqboxNamesrvSecretKey"
            )
        return dataclasses.replace(
            broker, namesrv_access_key=account.access_key, namesrv_secret_key=account.secret_key
        )

    def _check_topology(self, topology: Topology) -> None:
        role_ids = [role.role_id for role in topology.roles]
        assert len(set(role_ids)) == len(role_ids), "role ids must be unique"
        assert topology.roles, "a topology without roles"
        for spec in topology.rings:
            parsed = names.parse_shm_name(spec.name)
            if parsed.instance != self.instance:
                raise ConfigError(f"ring {spec.name} is not in instance {self.instance}")

    def _warm_up(self, topology: Topology) -> None:
        """Compile (or load) every kernel here, so the children inherit the machine code
        instead of compiling it each (`warm_up_roles`)."""
        warm_up_roles(spec.main for spec in topology.roles)

    # -- the name server -----------------------------------------------------------------------

    def _start_namesrv(self, port: int, host: str, *, wait: bool) -> _Namesrv:
        """Spawn `python -m <namesrv_module>`; with `wait`, until it wrote its ready file.
        `host`: the address it binds (its config's mqboxListenAddress, which it reads too)."""
        self._namesrv_listen_address = host
        if port != 0:
            _check_port_free("name server", host, port)
        ready_path = self.layout.run_dir / NAMESRV_READY_FILE_NAME
        with contextlib.suppress(FileNotFoundError):
            ready_path.unlink()
        self._namesrv_output = self.layout.logs_dir / NAMESRV_OUTPUT_FILE_NAME
        command = [
            sys.executable,
            "-m",
            self.options.namesrv_module,
            "--listen-port",
            str(port),
            "--ready-file",
            str(ready_path),
        ]
        if self.options.namesrv_config_path is not None:
            command += ["--config", str(self.options.namesrv_config_path)]
        if self.namesrv_acl_path is not None:
            command += ["--acl-file", str(self.namesrv_acl_path)]
        with self._namesrv_output.open("ab") as output:
            # Its own process group: a Ctrl-C in the terminal reaches the supervisor, which
            # stops the name server last, after the broker unregistered.
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_namesrv_preexec,
            )
        namesrv = _Namesrv(
            popen=popen,
            port_requested=port,
            ready_path=ready_path,
            deadline_ns=time.monotonic_ns() + int(NAMESRV_READY_TIMEOUT_S * 1e9),
            create_time=_create_time(popen.pid),
        )
        self._namesrv = namesrv
        log.info("name server starting (pid %d): %s", popen.pid, " ".join(command))
        if wait:
            while not self._check_namesrv_ready(namesrv):
                if time.monotonic_ns() >= namesrv.deadline_ns:
                    raise MqboxError(
                        f"name server did not report ready within {NAMESRV_READY_TIMEOUT_S:.0f} s"
                        f"; see {self._namesrv_output}"
                    )
                self._check_stop()
                self._poll((), 20)
        return namesrv

    def _check_namesrv_ready(self, namesrv: _Namesrv) -> bool:
        """True once the ready file is there; MqboxError if the name server exited first."""
        if namesrv.ready:
            return True
        try:
            document = json.loads(namesrv.ready_path.read_text(encoding="utf-8"))
            namesrv.host = str(document["host"])
            namesrv.port = int(document["port"])
        except (OSError, ValueError, KeyError, TypeError):
            code = namesrv.popen.poll()
            if code is not None:
                raise MqboxError(
                    f"name server exited with status {code} before it was ready: "
                    f"{_last_line(self._namesrv_output)}"
                ) from None
            return False
        namesrv.ready = True
        log.info(
            "name server ready on %s:%d (pid %d)", namesrv.host, namesrv.port, namesrv.popen.pid
        )
        return True

    def _stop_namesrv(self) -> None:
        namesrv, self._namesrv = self._namesrv, None
        if namesrv is None:
            return
        popen = namesrv.popen
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=0 if self._hurry else STOP_TIMEOUT_S_DEFAULT)
            except subprocess.TimeoutExpired:
                log.error("name server (pid %d) ignored SIGTERM: killing it", popen.pid)
                popen.kill()
                popen.wait()
                self._stop_unclean = True
        log.info("name server stopped (status %s)", popen.returncode)
        with contextlib.suppress(FileNotFoundError):
            namesrv.ready_path.unlink()

    # -- roles ---------------------------------------------------------------------------------

    def _ready_timeout_s(self, kind: RoleKind) -> float:
        if self.options.ready_timeout_s is not None:
            return self.options.ready_timeout_s
        return READY_TIMEOUT_S_STORE if kind in _STORE_KINDS else READY_TIMEOUT_S_DEFAULT

    def _stop_timeout_s(self, kind: RoleKind) -> float:
        if self._hurry:
            return 0.0
        if self.options.stop_timeout_s is not None:
            return self.options.stop_timeout_s
        return STOP_TIMEOUT_S_STORE if kind in _STORE_KINDS else STOP_TIMEOUT_S_DEFAULT

    def _fork_role(self, spec: RoleSpec, ready_timeout_s: float) -> _RoleProcess:
        """Fork one process for `spec` from this warm parent; it runs spec.main(ctx)."""
        assert spec.role_id not in self._processes, f"{spec.role_id} runs already"
        assert self.control is not None
        assert threading.active_count() == 1, "the zygote must have no threads when it forks"
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        self.control.clear_handling(spec.role_id)
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:
                self._child(spec, read_fd, write_fd)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._child_close_fds.add(read_fd)
        generation = self.control.role_started(spec.role_id, pid)
        process = _RoleProcess(
            spec=spec,
            pid=pid,
            generation=generation,
            started_at_ms=wall_clock_ms(),
            create_time=_create_time(pid),
            ready_fd=read_fd,
            ready_deadline_ns=time.monotonic_ns() + int(ready_timeout_s * 1e9),
        )
        self._processes[spec.role_id] = process
        log.info("started %s (pid %d, generation %d)", spec.role_id, pid, generation)
        return process

    def _child(self, spec: RoleSpec, read_fd: int, write_fd: int) -> NoReturn:
        """The forked child: become the role, run its main, never return."""
        status = EXIT_ROLE_BUG
        try:
            os.close(read_fd)
            for fd in self._child_close_fds:
                _close_quietly(fd)
            assert self._base_ctx is not None
            listen_socket = self._base_ctx.listen_socket
            if spec.kind is not RoleKind.REACTOR and listen_socket is not None:
                # Only reactors keep the listener, so it closes when they stop (rule 6).
                listen_socket.close()
            ha_socket = self._base_ctx.ha_socket
            if spec.kind is not RoleKind.HA_SERVICE and ha_socket is not None:
                ha_socket.close()
            ctx = dataclasses.replace(
                self._base_ctx, role=spec, report_ready=_ready_reporter(spec.role_id, write_fd)
            )
            runtime.enter_role_process(ctx, self._supervisor_pid)
            main = resolve_callable(spec.main)
            main(ctx)
            logging.getLogger("mqbox.role").error(
                "%s: main() returned; a role's main must not return", spec.role_id
            )
        except SystemExit as exit_request:
            code = exit_request.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if status != 0 or not runtime.stop_requested():
                logging.getLogger("mqbox.role").error(
                    "%s: exited with status %d without a stop request", spec.role_id, status
                )
                status = status or EXIT_ROLE_BUG
        except BaseException:
            logging.getLogger("mqbox.role").exception("%s: main() failed", spec.role_id)
        finally:
            with contextlib.suppress(BaseException):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    def _wait_ready_at_start(self, started: Sequence[_RoleProcess]) -> None:
        """Wait until every process in `started` reported ready; any death or timeout of a role
        while starting is a start failure (rule 7)."""
        pending = list(started)
        while pending:
            self._check_stop()
            self._reap_at_start()
            now_ns = time.monotonic_ns()
            for process in pending:
                if now_ns >= process.ready_deadline_ns:
                    timeout_s = self._ready_timeout_s(process.spec.kind)
                    raise MqboxError(
                        f"role {process.spec.role_id} did not report ready within "
                        f"{timeout_s:g} s; see {self._log_path(process.spec.role_id)}"
                    )
            deadline_ns = min(process.ready_deadline_ns for process in pending)
            timeout_ms = -(-(deadline_ns - now_ns) // 1_000_000)
            fds = [process.ready_fd for process in pending if process.ready_fd >= 0]
            readable = self._poll(fds, timeout_ms)
            for process in list(pending):
                if process.ready_fd in readable and self._read_ready(process):
                    pending.remove(process)

    def _reap_at_start(self) -> None:
        for process in list(self._processes.values()):
            status = self._reap(process)
            if status is not None:
                raise MqboxError(
                    f"role {process.spec.role_id} exited ({describe_wait_status(status)}) "
                    f"while starting; see {self._log_path(process.spec.role_id)}"
                )

    def _read_ready(self, process: _RoleProcess) -> bool:
        """Read what the ready pipe holds; True once the line is complete. End-of-file first:
        the role died, and the reaper reports how."""
        try:
            chunk = os.read(process.ready_fd, READY_LINE_SIZE_BYTES_MAX)
        except BlockingIOError:
            return False
        if chunk:
            process.ready_buffer += chunk
            assert len(process.ready_buffer) <= READY_LINE_SIZE_BYTES_MAX
            if not process.ready_buffer.endswith(b"\n"):
                return False
            info = json.loads(process.ready_buffer)
            assert info["role_id"] == process.spec.role_id
            process.ready = True
            self._close_ready_fd(process)
            assert self.control is not None
            self.control.role_ready(process.spec.role_id)
            log.info("%s ready (pid %d)", process.spec.role_id, process.pid)
            self._notify_roles()
            self._write_state()
            return True
        # End-of-file before the line: the role died (the reaper reports how), or it closed the
        # pipe without reporting, and then its ready deadline ends it.
        self._close_ready_fd(process)
        return False

    def _close_ready_fd(self, process: _RoleProcess) -> None:
        if process.ready_fd >= 0:
            self._child_close_fds.discard(process.ready_fd)
            _close_quietly(process.ready_fd)
            process.ready_fd = -1

    def _reap(self, process: _RoleProcess) -> int | None:
        """The wait status if `process` exited (it is then forgotten), else None."""
        if process.exit_status is None:
            try:
                pid, status = os.waitpid(process.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = process.pid, 0
            if pid == 0:
                return None
            process.exit_status = status
        status = process.exit_status
        self._forget(process)
        return status

    def _forget(self, process: _RoleProcess) -> None:
        self._close_ready_fd(process)
        del self._processes[process.spec.role_id]
        assert self.control is not None
        self.control.role_exited(process.spec.role_id)

    def _log_path(self, role_id: str) -> Path:
        return self.layout.logs_dir / f"{role_id}.log"

    def _notify_roles(self) -> None:
        """SIGUSR1 to every live role: the control block changed (runtime.py)."""
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGUSR1)

    # -- watching ------------------------------------------------------------------------------

    def _watch(self) -> int:
        """Reap, restart, read ready lines, until a stop signal or a failure that stops it."""
        while True:
            if self._stop_signal is not None:
                log.info("signal %s: stopping", signal.Signals(self._stop_signal).name)
                return self._stop_everything()
            failure = self._watch_roles()
            fatal = None if failure is None else failure.reason
            if failure is not None and failure.restart_broker:
                try:
                    fatal = self._restart_broker(failure.reason)
                except _StartInterruptedError:
                    log.info("stop requested while the broker restarted")
                    return self._stop_everything()
            if fatal is not None:
                return self._stop_after_failure(fatal, role_failed=True)
            fatal = self._watch_namesrv()
            if fatal is not None:
                return self._stop_after_failure(fatal, role_failed=False)
            self._restart_due_roles()
            now_ns = time.monotonic_ns()
            deadlines = [now_ns + WATCH_INTERVAL_MS * 1_000_000]
            deadlines += list(self._restart_due_ns.values())
            deadlines += [p.ready_deadline_ns for p in self._processes.values() if not p.ready]
            if self._namesrv_restart_due_ns is not None:
                deadlines.append(self._namesrv_restart_due_ns)
            if self._namesrv is not None and not self._namesrv.ready:
                deadlines.append(now_ns + 20_000_000)
            timeout_ms = -(-(min(deadlines) - now_ns) // 1_000_000)
            pending = [p for p in self._processes.values() if p.ready_fd >= 0]
            readable = self._poll([p.ready_fd for p in pending], timeout_ms)
            for process in pending:
                if process.ready_fd in readable:
                    self._read_ready(process)
        raise AssertionError("unreachable")

    def _watch_roles(self) -> _Failure | None:
        """Reap dead roles; schedule restarts; a critical death or a role out of restarts."""
        now_ns = time.monotonic_ns()
        for process in list(self._processes.values()):
            if not process.ready and now_ns >= process.ready_deadline_ns:
                log.error(
                    "%s (pid %d) did not report ready in time: killing it",
                    process.spec.role_id,
                    process.pid,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.ready_deadline_ns = _NEVER_NS  # reaped once SIGCHLD says it is gone
            status = self._reap(process)
            if status is None:
                continue
            spec = process.spec
            how = describe_wait_status(status)
            self._note_death_parcel(spec)
            self._notify_roles()
            self._write_state()
            if spec.critical:
                reason = f"critical role {spec.role_id} (pid {process.pid}) died ({how})"
                return _Failure(reason, restart_broker=True)
            death_count = self._count_death(spec.role_id, now_ns)
            if death_count > self._role_restart_count_max():
                reason = (
                    f"role {spec.role_id} died {death_count} times within "
                    f"{self._restarts.window_ms / 1000:g} s (last: {how})"
                )
                return _Failure(reason, restart_broker=False)
            delay_ms = self._restarts.delay_ms(death_count)
            log.warning(
                "role %s (pid %d) died (%s): restarting in %d ms; see %s",
                spec.role_id,
                process.pid,
                how,
                delay_ms,
                self._log_path(spec.role_id),
            )
            self._restart_due_ns[spec.role_id] = now_ns + delay_ms * 1_000_000
        return None

    def _role_restart_count_max(self) -> int:
        if self.options.restart_count_max is not None:
            return self.options.restart_count_max
        return self._restarts.role_restart_count_max

    def _count_death(self, key: str, now_ns: int) -> int:
        """Add a death of `key` (a role id, "namesrv" or BROKER_RESTART_KEY) at `now_ns` to its
        history; how many of its deaths lie within the restart window, this one included."""
        history = self._death_history.setdefault(key, collections.deque())
        history.append(now_ns)
        window_ns = self._restarts.window_ms * 1_000_000
        while history and now_ns - history[0] > window_ns:
            history.popleft()
        return len(history)

    def _restart_broker(self, reason: str) -> str | None:
        """A critical role died (`reason`): restart every role of the broker (rule 4), after the
        backoff, until all are ready again; or a reason to stop when the broker restarted too
        often within the window. _StartInterruptedError if a stop signal arrives meanwhile."""
        assert self.control is not None
        window_s = self._restarts.window_ms / 1000
        while True:
            restart_count = self._count_death(BROKER_RESTART_KEY, time.monotonic_ns())
            if restart_count > self._restarts.broker_restart_count_max:
                times = "once" if restart_count == 2 else f"{restart_count - 1} times"
                return f"{reason}; the broker restarted {times} within {window_s:g} s"
            delay_ms = self._restarts.delay_ms(restart_count)
            log.error(
                "%s: restarting every role of the broker in %d ms (restart %d within %g s)",
                reason,
                delay_ms,
                restart_count,
                window_s,
            )
            self._last_failure = {"reason": reason, "at_ms": wall_clock_ms()}
            self._status = "restarting"
            unclean = self._stop_unclean  # a role killed now says nothing of the final stop
            self._stop_roles(close_listener=False)
            self._stop_unclean = unclean
            self._mark_abort()
            self._sleep_unless_stopped(delay_ms)
            self._renew_shared_memory()
            self.control.set_broker_state(control_block.BROKER_STARTING)
            self._status = "starting"
            self._write_state()
            try:
                self._start_roles()
            except MqboxError as error:
                reason = f"the broker's roles did not start again: {error}"
                continue
            self._broker_restart_count += 1
            self._write_state()
            log.warning("every role of the broker runs again (broker restart %d)", restart_count)
            return None

    def _sleep_unless_stopped(self, delay_ms: int) -> None:
        """Wait `delay_ms`; _StartInterruptedError as soon as a stop signal arrives."""
        deadline_ns = time.monotonic_ns() + delay_ms * 1_000_000
        while True:
            self._check_stop()
            remaining_ns = deadline_ns - time.monotonic_ns()
            if remaining_ns <= 0:
                return
            self._poll((), -(-remaining_ns // 1_000_000))

    def _renew_shared_memory(self) -> None:
        """With every role stopped: the instance's shared memory made anew, no quarantine."""
        assert self.control is not None
        assert self.topology is not None
        assert not self._processes
        names.unlink_instance(self.instance)
        self._create_rings()
        for role in self.topology.roles:
            self.control.quarantine(role.role_id, None)
        self._deaths_on_parcel.clear()

    def _stop_after_failure(self, reason: str, *, role_failed: bool) -> int:
        """Stop everything for `reason`; keep the reason for `mqbox status` (rule 4)."""
        log.error("%s: stopping the broker", reason)
        self._last_failure = {"reason": reason, "at_ms": wall_clock_ms()}
        self._stop_everything()
        if role_failed:
            self._mark_abort()
        document = {
            "reason": reason,
            "stopped_at_ms": wall_clock_ms(),
            "exit_status": EXIT_ROLE_FAILED,
        }
        with contextlib.suppress(OSError):
            write_json_atomically(self.layout.last_stop_path, document)
        return EXIT_ROLE_FAILED

    def _note_death_parcel(self, spec: RoleSpec) -> None:
        """A process of `spec` died: if it died handling a parcel, and the process before it
        died on the same one, quarantine that parcel (runtime.py) so the next one skips it. A
        critical role's death makes the rings anew, so its parcel is only logged."""
        assert self.control is not None
        assert self.topology is not None
        role_id = spec.role_id
        parcel = self.control.handling(role_id)
        if parcel is None:
            self._deaths_on_parcel.pop(role_id, None)
            return
        previous = self._deaths_on_parcel.get(role_id)
        deaths = previous[1] + 1 if previous is not None and previous[0] == parcel else 1
        self._deaths_on_parcel[role_id] = (parcel, deaths)
        ring_number, position = parcel
        rings = self.topology.rings
        ring_name = rings[ring_number - 1].name if ring_number <= len(rings) else str(ring_number)
        if spec.critical:
            log.error(
                "%s died handling the parcel at position %d of %s", role_id, position, ring_name
            )
            return
        if deaths < QUARANTINE_DEATH_COUNT:
            log.warning(
                "%s died handling the parcel at position %d of %s; its next process gets it again",
                role_id,
                position,
                ring_name,
            )
            return
        self.control.quarantine(role_id, parcel)
        self._quarantined_counts[role_id] = self._quarantined_counts.get(role_id, 0) + 1
        log.error(
            "%s died %d times in a row handling the parcel at position %d of %s: quarantined, "
            "its next process skips it",
            role_id,
            deaths,
            position,
            ring_name,
        )

    def _restart_due_roles(self) -> None:
        assert self.topology is not None
        now_ns = time.monotonic_ns()
        for role_id, due_ns in list(self._restart_due_ns.items()):
            if due_ns > now_ns:
                continue
            del self._restart_due_ns[role_id]
            spec = next(role for role in self.topology.roles if role.role_id == role_id)
            self._fork_role(spec, self._ready_timeout_s(spec.kind))
            self._notify_roles()
            self._write_state()

    def _watch_namesrv(self) -> str | None:
        """Restart a dead name server on the same port; a reason to stop, or None."""
        namesrv = self._namesrv
        now_ns = time.monotonic_ns()
        if namesrv is not None:
            if not namesrv.ready:
                try:
                    became_ready = self._check_namesrv_ready(namesrv)
                except MqboxError as error:
                    log.error("%s", error)
                    became_ready = False
                if became_ready:
                    self._write_state()
                elif namesrv.popen.poll() is None:
                    if now_ns < namesrv.deadline_ns:
                        return None
                    log.error(
                        "name server (pid %d) did not report ready: killing it", namesrv.popen.pid
                    )
                    namesrv.popen.kill()
            code = namesrv.popen.poll()
            if code is None:
                return None
            self._namesrv = None
            death_count = self._count_death("namesrv", now_ns)
            if death_count > self._role_restart_count_max():
                window_s = self._restarts.window_ms / 1000
                return f"the name server died {death_count} times within {window_s:g} s"
            delay_ms = self._restarts.delay_ms(death_count)
            log.warning(
                "name server (pid %d) exited with status %d: restarting in %d ms",
                namesrv.popen.pid,
                code,
                delay_ms,
            )
            self._namesrv_restart_due_ns = now_ns + delay_ms * 1_000_000
            self._namesrv_port_to_reuse = namesrv.port or namesrv.port_requested
            self._write_state()
            return None
        if self._namesrv_restart_due_ns is not None and self._namesrv_restart_due_ns <= now_ns:
            self._namesrv_restart_due_ns = None
            try:
                self._start_namesrv(
                    self._namesrv_port_to_reuse, self._namesrv_listen_address, wait=False
                )
            except MqboxError as error:
                return f"the name server cannot restart: {error}"
        return None

    # -- stop ----------------------------------------------------------------------------------

    def _stop_everything(self) -> int:
        """Stop roles in reverse START_ORDER, then the name server; sweep; the exit status."""
        self._status = "stopping"
        self._namesrv_restart_due_ns = None
        self._stop_roles(close_listener=True)
        self._close_listener()
        self._stop_namesrv()
        for instance in sorted(self._instances_to_sweep):
            names.unlink_instance(instance)
        log.info("stopped%s", " (not cleanly)" if self._stop_unclean else "")
        if not self._stop_unclean:
            return EXIT_OK
        # `mqbox stop` is not this process's parent: the file is how it learns of it.
        document = {
            "reason": "the stop was not clean: a process was killed or exited non-zero while "
            f"stopping (see {self.layout.logs_dir / SUPERVISOR_LOG_FILE_NAME})",
            "stopped_at_ms": wall_clock_ms(),
            "exit_status": EXIT_STOP_UNCLEAN,
        }
        with contextlib.suppress(OSError):
            write_json_atomically(self.layout.last_stop_path, document)
        return EXIT_STOP_UNCLEAN

    def _stop_roles(self, *, close_listener: bool) -> None:
        """SIGTERM to every role in reverse START_ORDER, a kind at a time, each kind waited for
        (rule 6); the listener closes once the reactors are gone, if `close_listener`."""
        self._restart_due_ns.clear()
        if self.control is not None:
            self.control.set_broker_state(control_block.BROKER_STOPPING)
        if self._lock_fd >= 0:
            self._write_state()
        for kind in reversed(START_ORDER):
            processes = [p for p in self._processes.values() if p.spec.kind is kind]
            if processes:
                self._stop_kind(kind, processes)
            if kind is RoleKind.REACTOR and close_listener:
                self._close_listener()
        for process in list(self._processes.values()):
            self._stop_kind(process.spec.kind, [process])  # kinds outside START_ORDER

    def _stop_kind(self, kind: RoleKind, processes: list[_RoleProcess]) -> None:
        """SIGTERM to `processes`, wait for them (SIGKILL after the kind's timeout)."""
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        deadline_ns = time.monotonic_ns() + int(self._stop_timeout_s(kind) * 1e9)
        pending = list(processes)
        killed = False
        while pending:
            for process in list(pending):
                status = self._reap(process)
                if status is None:
                    continue
                pending.remove(process)
                if killed or os.waitstatus_to_exitcode(status) != 0:
                    self._stop_unclean = True
                    log.error(
                        "%s exited (%s) while stopping",
                        process.spec.role_id,
                        describe_wait_status(status),
                    )
                else:
                    log.info("%s stopped", process.spec.role_id)
            if not pending:
                return
            now_ns = time.monotonic_ns()
            if not killed and (self._hurry or now_ns >= deadline_ns):
                for process in pending:
                    log.error(
                        "%s (pid %d) did not stop in time: killing it",
                        process.spec.role_id,
                        process.pid,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGKILL)
                killed = True
                deadline_ns = now_ns + int(KILL_WAIT_S * 1e9)
            elif killed and now_ns >= deadline_ns:
                for process in pending:
                    log.error(
                        "%s (pid %d) outlived SIGKILL for %g s: giving up on it",
                        process.spec.role_id,
                        process.pid,
                        KILL_WAIT_S,
                    )
                    self._forget(process)
                return
            self._poll((), min(100, -(-(deadline_ns - now_ns) // 1_000_000)))

    def _close_listener(self) -> None:
        if self._listen_socket is not None:
            self._listen_socket.close()
            self._listen_socket = None
        if self._ha_socket is not None:
            self._ha_socket.close()
            self._ha_socket = None

    def _mark_abort(self) -> None:
        """A critical role died: make sure the next start runs the full recovery, even if the
        store writer removed `abort` during its orderly stop."""
        if self.store_root is None:
            return
        with contextlib.suppress(OSError):
            abort_path(self.store_root).touch()

    # -- state file ----------------------------------------------------------------------------

    def _write_state(self) -> None:
        """`run/state.json` for `mqbox status` and `mqbox stop` (rule 5)."""
        if self._lock_fd < 0 or self.topology is None:
            return
        namesrv = self._namesrv
        roles = []
        for spec in self.topology.roles:
            process = self._processes.get(spec.role_id)
            control = self.control
            roles.append(
                {
                    "role_id": spec.role_id,
                    "kind": spec.kind.value,
                    "pid": process.pid if process else 0,
                    "create_time": process.create_time if process else None,
                    "started_at_ms": process.started_at_ms if process else None,
                    "state": control_block.ROLE_STATE_NAMES[control.state(spec.role_id)]
                    if control is not None
                    else "down",
                    "generation": control.generation(spec.role_id) if control else 0,
                    "start_count": control.start_count(spec.role_id) if control else 0,
                    "quarantined": self._quarantined_counts.get(spec.role_id, 0),
                }
            )
        document = {
            "version": STATE_VERSION,
            "status": self._status,
            "home": str(self.layout.home),
            "instance": self.instance,
            "started_at_ms": self._started_at_ms,
            "supervisor": {"pid": os.getpid(), "create_time": _create_time(os.getpid())},
            "namesrv": {
                "pid": namesrv.popen.pid,
                "create_time": namesrv.create_time,
                "host": namesrv.host,
                "port": namesrv.port,
                "ready": namesrv.ready,
            }
            if namesrv is not None
            else None,
            "broker": {
                "broker_name": self.broker.broker_name if self.broker else "",
                "cluster_name": self.broker.broker_cluster_name if self.broker else "",
                "broker_id": self.broker.broker_id if self.broker else 0,
                "broker_role": self.broker.broker_role.value if self.broker else "",
                "ha_port": self.broker.ha_listen_port if self.broker else 0,
                "address": self.broker_address,
                "namesrv_addr": self.broker.namesrv_addr if self.broker else "",
                "store_root": str(self.store_root) if self.store_root else "",
            },
            "roles": roles,
            "broker_restarts": self._broker_restart_count,
            "last_failure": self._last_failure,
        }
        write_json_atomically(self.layout.state_path, document)


def warm_up_roles(role_mains: Iterable[str]) -> None:
    """Import the module of every role main ("module:function"), then compile each kernel once
    in this process.

    Runs, once each: every role module's `warm_up()`, and every module-level `warm_up()` or
    `warm_up_kernels()` without parameters defined by a loaded mqbox module (ipc/ring.py,
    store/message_store.py, ...). Kernels none of them reached are logged; a kernel a role
    first calls after the fork costs that role numba's compiler memory (about 60 MB).
    server/warm_up.py runs this alone, to fill numba's cache before a first start."""
    started_ns = time.monotonic_ns()
    role_modules: dict[str, Any] = {}
    for main in role_mains:
        resolve_callable(main)
        module_name = main.partition(":")[0]
        role_modules[module_name] = sys.modules[module_name]
    functions: dict[int, tuple[str, Callable[[], Any]]] = {}
    loaded = [module for name, module in sorted(sys.modules.items()) if name.startswith("mqbox.")]
    for module in (*loaded, *role_modules.values()):
        for function_name in WARM_UP_FUNCTION_NAMES:
            function = getattr(module, function_name, None)
            if _is_warm_up(function, module):
                functions[id(function)] = (f"{module.__name__}.{function_name}", function)
    for qualified_name, function in functions.values():
        log.info("warming up: %s()", qualified_name)
        function()
    cold = []
    if not _jit.JIT_DISABLED:
        cold = [
            getattr(function, "__qualname__", repr(function))
            for function in _jit.kernels()
            if not _jit.is_compiled(function)
        ]
    log.info(
        "warm-up took %.1f s; %d kernels compiled; %d not reached as entry points "
        "(helpers called only from other kernels are among them): %s",
        (time.monotonic_ns() - started_ns) / 1e9,
        len(_jit.kernels()) - len(cold),
        len(cold),
        ", ".join(sorted(cold)) or "-",
    )
    assert threading.active_count() == 1, "a warm-up function left a thread running"


def _is_warm_up(function: Any, module: Any) -> TypeGuard[Callable[[], Any]]:
    """True for a function `module` defines itself that takes no arguments."""
    if not inspect.isfunction(function) or function.__module__ != module.__name__:
        return False
    parameters = inspect.signature(function).parameters.values()
    return all(parameter.default is not inspect.Parameter.empty for parameter in parameters)


def _report_ready_outside_a_role(info: Mapping[str, Any]) -> None:
    raise AssertionError("report_ready() of the supervisor's template context was called")


def _ready_reporter(role_id: str, write_fd: int) -> Callable[[Mapping[str, Any]], None]:
    """ctx.report_ready for one child: one JSON line into its ready pipe, once."""
    reported = False

    def report_ready(info: Mapping[str, Any]) -> None:
        nonlocal reported
        assert not reported, f"{role_id}: report_ready() called twice"
        reported = True
        line = runtime.ready_line(role_id, info)
        assert len(line) <= READY_LINE_SIZE_BYTES_MAX, f"{role_id}: ready info is too large"
        try:
            os.write(write_fd, line)
        except BrokenPipeError:
            pass  # the supervisor is gone; the parent-death signal stops this role
        finally:
            os.close(write_fd)

    return report_ready


def _namesrv_preexec() -> None:
    """In the name server's child before exec: die with the supervisor (no threads here)."""
    runtime.set_parent_death_signal(signal.SIGTERM)


def _port_problem(host: str, port: int) -> str | None:
    """Why nothing could listen on host:port now; None if something could."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def _port_free(host: str, port: int) -> bool:
    return port <= 65535 and _port_problem(host, port) is None


def _check_port_free(what: str, host: str, port: int) -> None:
    """MqboxError if nothing could listen on host:port now (a clear message beats the child's)."""
    reason = _port_problem(host, port)
    if reason is not None:
        raise MqboxError(f"{what} cannot listen on {host}:{port}: {reason}")


def _last_line(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------
# `python -m mqbox.server.supervisor`: what `mqbox start --daemon` runs in the background
# ---------------------------------------------------------------------------------------------


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mqbox.server.supervisor",
        description="Run one mqbox appliance (name server and broker) in the foreground.",
    )
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--config", type=Path, help="broker.conf")
    parser.add_argument("--namesrv-config", type=Path, help="namesrv.conf")
    parser.add_argument("--namesrv-port", type=int)
    parser.add_argument("--broker-port", type=int)
    parser.add_argument("--http-port", type=int, help="instead of mqboxHttpPort unless it is -1")
    parser.add_argument("--topology", help="module:function building the topology (tests)")
    parser.add_argument("--namesrv-module", default="mqbox.namesrv")
    parser.add_argument("--no-namesrv", action="store_true", help="use namesrvAddr as it is")
    parser.add_argument("--namesrv-addr", help="with --no-namesrv: register here, not namesrvAddr")
    parser.add_argument("--ready-timeout-s", type=float)
    parser.add_argument("--stop-timeout-s", type=float)
    parser.add_argument(
        "--restart-count-max", type=int, help="deaths of one role in the window (tests)"
    )
    parser.add_argument(
        "--ready-fd",
        type=int,
        help='write one JSON line here: {"ok": true, ...} when ready, {"ok": false, "error"}',
    )
    return parser.parse_args(list(argv))


def options_from_arguments(arguments: argparse.Namespace) -> ApplianceOptions:
    return ApplianceOptions(
        home=arguments.home,
        broker_config_path=arguments.config,
        namesrv_config_path=arguments.namesrv_config,
        namesrv_port=arguments.namesrv_port,
        broker_port=arguments.broker_port,
        http_port=arguments.http_port,
        topology=arguments.topology,
        run_namesrv=not arguments.no_namesrv,
        namesrv_module=arguments.namesrv_module,
        namesrv_addr=arguments.namesrv_addr,
        ready_timeout_s=arguments.ready_timeout_s,
        stop_timeout_s=arguments.stop_timeout_s,
        restart_count_max=arguments.restart_count_max,
    )


def main(argv: Sequence[str]) -> int:
    """Run the appliance; report readiness (or the start error) on --ready-fd."""
    arguments = parse_arguments(argv)
    ready_fd: int | None = arguments.ready_fd

    def report(document: Mapping[str, Any]) -> None:
        nonlocal ready_fd
        if ready_fd is None:
            return
        fd, ready_fd = ready_fd, None
        try:
            os.write(fd, json.dumps(document, sort_keys=True).encode() + b"\n")
        except OSError:
            pass  # whoever waited is gone; keep running
        finally:
            _close_quietly(fd)

    if ready_fd is not None:
        os.set_inheritable(ready_fd, False)
    supervisor = Supervisor(
        options_from_arguments(arguments),
        on_ready=lambda info: report({"ok": True, **info}),
        close_in_children=() if ready_fd is None else (ready_fd,),
    )
    try:
        status = supervisor.run()
    except MqboxError as error:
        report({"ok": False, "error": str(error)})
        sys.stderr.write(f"mqbox: {error}\n")
        return EXIT_START_FAILED
    report({"ok": False, "error": f"stopped before it was ready (status {status})"})
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

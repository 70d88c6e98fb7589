"""A layout on one host: `mqbox start --layout DIR` runs a name server and several brokers.

Owns: the lifecycle of a layout home (server/home.py draws it): starting the name server as a
process of its own that holds the layout home's lock, starting one supervisor per broker of the
layout (each in its sub-home `brokers/<NAME>/`, exactly as a single `mqbox start --daemon` runs
one broker, with `--no-namesrv --namesrv-addr` pointing at the layout's name server), stopping
all of it or one broker alone, and the status of every broker. Never: prints or exits (the CLI),
or what a broker's supervisor does (supervisor.py); a single-broker home is ops.py's.

Why the name server is not under a supervisor: a supervisor is one broker's zygote, and the
layout's brokers come and go one by one (`--broker NAME`) while the name server stays. It is
therefore its own session, started and stopped by pid (recorded with its start time in
`run/layout.json`); it is not restarted if it dies (the brokers keep serving their clients'
open connections and re-register when it is back after `mqbox start --layout` again).

The brokers of a layout start concurrently (each supervisor warms its kernels from numba's
cache, then forks its roles), and the start returns once every one is ready; if one fails,
everything started is stopped and the error names that broker.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.admin import ops
from mqbox.config import LayoutConfig, LayoutMember, ignored_keys_warning, load_layout
from mqbox.errors import ConfigError, MqboxError
from mqbox.run_files import read_json, write_json_atomically
from mqbox.server import launch
from mqbox.server.home import (
    NAMESRV_OUTPUT_FILE_NAME,
    NAMESRV_READY_FILE_NAME,
    HomeLayout,
    lock_home,
    prepare_home,
    process_alive,
    read_ha_state,
    read_layout_state,
    read_state,
)

LAYOUT_STATE_VERSION: Final = 1
NAMESRV_READY_TIMEOUT_S: Final = 30.0
NAMESRV_STOP_TIMEOUT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class StartedBroker:
    """One broker of a layout, once its supervisor reported ready."""

    name: str  # config.member_name: `--broker NAME`
    broker_name: str
    broker_id: int
    role: str  # brokerRole
    address: str  # ip:port clients use
    pid: int  # its supervisor's
    home: Path


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutStarted:
    home: Path
    layout_path: Path
    namesrv: str  # ip:port
    namesrv_pid: int
    brokers: tuple[StartedBroker, ...]
    warnings: tuple[str, ...]  # one line per broker file with keys mqbox ignores


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerStatus:
    """One broker of a layout as `mqbox status` shows it."""

    name: str
    broker_name: str
    broker_id: int
    role: str
    running: bool
    address: str
    ha_port: int | None
    process_count: int  # the supervisor, the name server (none here) and every role
    processes_up: int
    pss_bytes: int
    store_size_bytes: int
    ha_state: str  # server/home.HaState: "n/a" until replication reports
    slave_lag_bytes: int | None
    slave_lag_messages: int | None
    home: Path
    reason: str  # why it stopped after a failure, or restarted last


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutStatus:
    home: Path
    layout_path: str
    running: bool  # the name server runs
    namesrv: str
    namesrv_pid: int
    brokers: tuple[BrokerStatus, ...]

    def as_dict(self) -> dict[str, Any]:
        document = ops.config_as_dict(self)
        document["home"] = str(self.home)
        for broker, status in zip(document["brokers"], self.brokers, strict=True):
            broker["home"] = str(status.home)
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutStopped:
    home: Path
    brokers: tuple[ops.StopResult, ...]  # the brokers that were running
    killed: tuple[str, ...]  # "NAME: process" for each that needed SIGKILL
    seconds: float


# ---------------------------------------------------------------------------------------------
# Which homes are layout homes


def is_layout_home(home: Path | None) -> bool:
    """True when a layout was started in `home` and has not been stopped."""
    return read_layout_state(ops.home_dir(home)) is not None


def running_brokers(home: Path) -> list[str]:
    """The brokers of the layout recorded in `home` whose supervisors run."""
    state = read_layout_state(home) or {}
    names = [str(broker.get("name")) for broker in state.get("brokers") or []]
    paths = HomeLayout(home)
    return [name for name in names if ops.supervisor_running(paths.broker_home(name))]


def broker_home(home: Path | None, name: str) -> Path:
    """The home of broker `name` of the layout started in `home`; MqboxError if there is no
    layout there or it has no such broker."""
    home_path = ops.home_dir(home)
    state = read_layout_state(home_path)
    if state is None:
        raise MqboxError(f"no layout runs in {home_path}, so it has no broker {name!r}")
    names = [str(broker.get("name")) for broker in state.get("brokers") or []]
    if name not in names:
        raise MqboxError(f"the layout in {home_path} has no broker {name!r} ({', '.join(names)})")
    return HomeLayout(home_path).broker_home(name)


def _recorded_layout(home: Path) -> tuple[dict[str, Any], LayoutConfig]:
    """The layout state of `home` and the layout file it names, loaded again now."""
    state = read_layout_state(home)
    if state is None:
        raise MqboxError(f"no layout runs in {home}; start one with `mqbox start --layout DIR`")
    return state, load_layout(Path(str(state["layout"])))


# ---------------------------------------------------------------------------------------------
# start


def start_layout(
    home: Path | None,
    layout_path: Path,
    *,
    namesrv_port: int | None = None,
    broker_port: int | None = None,
    ready_timeout_s: float = ops.DAEMON_READY_TIMEOUT_S,
) -> LayoutStarted:
    """Start the layout's name server and every broker in `home`; return once all are ready.
    `broker_port` may only be 0 (every broker on a free port; its HA port is that + 1, its
    HTTP endpoint any free port).
    MqboxError (ConfigError for a bad file) if anything fails; nothing is left running then."""
    ops.pin_thread_pools()
    if broker_port not in (None, 0):
        raise MqboxError("--broker-port with --layout can only be 0 (each broker any free port)")
    if namesrv_port is not None and not 0 <= namesrv_port <= 65535:
        raise MqboxError(f"--namesrv-port {namesrv_port} is not a port (0 to 65535)")
    layout = load_layout(layout_path)
    home_path = ops.home_dir(home)
    paths = prepare_home(home_path)
    lock_fd = lock_home(paths)  # MqboxError if anything runs in this home
    try:
        still_running = running_brokers(home_path)  # the name server of their layout died
        if still_running:
            raise MqboxError(
                f"brokers of an earlier layout still run in {home_path} "
                f"({', '.join(still_running)}); `mqbox stop --home {home_path}` stops them"
            )
        namesrv_process, namesrv_address = _start_namesrv(
            paths,
            layout,
            layout.namesrv.listen_port if namesrv_port is None else namesrv_port,
            lock_fd,
        )
    finally:
        os.close(lock_fd)  # the name server holds the lock from here
    write_json_atomically(
        paths.layout_state_path,
        {
            "version": LAYOUT_STATE_VERSION,
            "layout": str(layout.path),
            "broker_port": broker_port,
            "namesrv": {
                "pid": namesrv_process.pid,
                "create_time": namesrv_process.create_time(),
                "address": namesrv_address,
            },
            "brokers": [
                {"name": member.name, "config": str(member.config_path)}
                for member in layout.members
            ],
        },
    )
    try:
        brokers = _start_brokers(
            paths, layout.members, namesrv_address, broker_port, ready_timeout_s
        )
    except BaseException:
        _stop_namesrv(paths)
        with contextlib.suppress(FileNotFoundError):
            paths.layout_state_path.unlink()
        raise
    return LayoutStarted(
        home=home_path,
        layout_path=layout.path,
        namesrv=namesrv_address,
        namesrv_pid=namesrv_process.pid,
        brokers=tuple(brokers),
        warnings=_warnings(layout.members),
    )


def start_broker(
    home: Path | None, name: str, *, ready_timeout_s: float = ops.DAEMON_READY_TIMEOUT_S
) -> StartedBroker:
    """Start one broker of the layout running in `home` (after `stop --broker NAME`)."""
    ops.pin_thread_pools()
    home_path = ops.home_dir(home)
    state, layout = _recorded_layout(home_path)
    namesrv = state.get("namesrv") or {}
    if not process_alive(int(namesrv.get("pid") or 0), namesrv.get("create_time")):
        raise MqboxError(
            f"the layout's name server in {home_path} is not running; "
            f"`mqbox stop --home {home_path}`, then start the layout again"
        )
    member = layout.member(name)
    broker_port = state.get("broker_port")
    (started,) = _start_brokers(
        HomeLayout(home_path),
        [member],
        str(namesrv["address"]),
        broker_port if isinstance(broker_port, int) else None,
        ready_timeout_s,
    )
    return started


def _warnings(members: Sequence[LayoutMember]) -> tuple[str, ...]:
    lines = (ignored_keys_warning(m.config_path, m.broker.unknown_keys) for m in members)
    return tuple(line for line in lines if line is not None)


def _start_namesrv(
    paths: HomeLayout, layout: LayoutConfig, port: int, lock_fd: int
) -> tuple[psutil.Process, str]:
    """`python -m mqbox.namesrv` in a session of its own, holding `lock_fd` (the home's lock)
    for as long as it lives; its process and ip:port once it wrote its ready file."""
    ready_path = paths.run_dir / NAMESRV_READY_FILE_NAME
    with contextlib.suppress(FileNotFoundError):
        ready_path.unlink()
    command = [sys.executable, "-m", "mqbox.namesrv", "--listen-port", str(port)]
    command += ["--ready-file", str(ready_path)]
    if layout.namesrv_config_path is not None:
        command += ["--config", str(layout.namesrv_config_path)]
    output_path = paths.logs_dir / NAMESRV_OUTPUT_FILE_NAME
    with output_path.open("ab") as output:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.SINGLE_THREAD_ENVIRONMENT},
            pass_fds=(lock_fd,),
            start_new_session=True,
        )
    deadline = time.monotonic() + NAMESRV_READY_TIMEOUT_S
    while (document := read_json(ready_path)) is None:
        status = popen.poll()
        if status is not None or time.monotonic() >= deadline:
            if status is None:
                launch.stop(popen, NAMESRV_STOP_TIMEOUT_S)
            raise MqboxError(
                f"the name server did not start ({ops.last_line(output_path)}); see {output_path}"
            )
        time.sleep(POLL_INTERVAL_S)
    host = str(document.get("host") or "127.0.0.1")
    client_host = host if host not in ("", "0.0.0.0") else "127.0.0.1"
    return psutil.Process(popen.pid), f"{client_host}:{int(document['port'])}"


def _start_brokers(
    paths: HomeLayout,
    members: Sequence[LayoutMember],
    namesrv_address: str,
    broker_port: int | None,
    ready_timeout_s: float,
) -> list[StartedBroker]:
    """One supervisor per member, started together and each waited for; if one fails, the
    others are stopped and MqboxError names the one that failed."""
    started: list[tuple[LayoutMember, launch.Started, Path]] = []
    try:
        for member in members:
            broker_home = paths.broker_home(member.name)
            sub = prepare_home(broker_home)
            if ops.supervisor_running(broker_home):
                raise MqboxError(f"broker {member.name} already runs in {broker_home}")
            command = ["--home", str(broker_home), "--config", str(member.config_path)]
            command += ["--no-namesrv", "--namesrv-addr", namesrv_address]
            if broker_port is not None:
                command += ["--broker-port", str(broker_port)]
            http_port = ops.http_port_for(broker_port)
            if http_port is not None:
                command += ["--http-port", str(http_port)]
            output_path = sub.logs_dir / ops.SUPERVISOR_OUTPUT_FILE_NAME
            with output_path.open("ab") as output:
                started.append((member, launch.spawn(command, output=output), output_path))
        return [
            _ready_broker(member, one, output_path, ready_timeout_s)
            for member, one, output_path in started
        ]
    except BaseException:
        for _, one, _ in started:
            launch.stop(one.process, ops.STOP_TIMEOUT_S_DEFAULT)
            if one.ready_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(one.ready_fd)
        raise


def _ready_broker(
    member: LayoutMember, started: launch.Started, output_path: Path, ready_timeout_s: float
) -> StartedBroker:
    """The member's ready report; MqboxError naming it if it did not start."""
    try:
        report = launch.read_ready(started, ready_timeout_s)
    except launch.SupervisorNotReadyError as error:
        raise MqboxError(
            f"broker {member.name} did not start ({error}): {ops.last_line(output_path)}"
        ) from None
    finally:
        started.ready_fd = -1  # read_ready closed it
    if not report.get("ok"):
        raise MqboxError(f"broker {member.name}: {report.get('error', 'did not start')}")
    broker = member.broker
    return StartedBroker(
        name=member.name,
        broker_name=broker.broker_name,
        broker_id=broker.broker_id,
        role=broker.broker_role.value,
        address=str(report.get("broker", "")),
        pid=started.process.pid,
        home=Path(str(report.get("home", ""))),
    )


def wait_for_stop_signal(still_running: Callable[[], bool], poll_s: float = 1.0) -> int:
    """Block SIGINT and SIGTERM and wait for one (`mqbox start --layout` in the foreground), or
    until `still_running()` turns false (stopped from elsewhere); the signal number, or 0."""
    stop_signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    try:
        while still_running():
            received = signal.sigtimedwait(stop_signals, poll_s)
            if received is not None:
                return received.si_signo
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# ---------------------------------------------------------------------------------------------
# stop


def stop_layout(
    home: Path | None, *, timeout_s: float = ops.STOP_TIMEOUT_S_DEFAULT
) -> LayoutStopped:
    """Stop every broker of the layout in `home` (together), then its name server, and forget
    the layout. MqboxError if no layout was started there."""
    home_path = ops.home_dir(home)
    began = time.monotonic()
    state = read_layout_state(home_path)
    if state is None:
        raise MqboxError(f"no layout runs in {home_path}")
    paths = HomeLayout(home_path)
    running = running_brokers(home_path)
    results: list[ops.StopResult] = []
    killed: list[str] = []
    if running:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(running)) as pool:
            futures = [
                pool.submit(ops.stop, paths.broker_home(name), timeout_s=timeout_s)
                for name in running
            ]
            for name, future in zip(running, futures, strict=True):
                with contextlib.suppress(MqboxError):  # it stopped meanwhile
                    result = future.result()
                    results.append(result)
                    killed.extend(f"{name}: {process}" for process in result.killed)
    if not _stop_namesrv(paths):
        killed.append("namesrv")
    with contextlib.suppress(FileNotFoundError):
        paths.layout_state_path.unlink()
    return LayoutStopped(home_path, tuple(results), tuple(killed), time.monotonic() - began)


def stop_broker(
    home: Path | None, name: str, *, timeout_s: float = ops.STOP_TIMEOUT_S_DEFAULT
) -> ops.StopResult:
    """Stop one broker of the layout in `home`; the others and the name server keep running."""
    home_path = ops.home_dir(home)
    _, layout = _recorded_layout(home_path)
    member = layout.member(name)
    return ops.stop(HomeLayout(home_path).broker_home(member.name), timeout_s=timeout_s)


def _stop_namesrv(paths: HomeLayout) -> bool:
    """SIGTERM to the layout's name server and wait; SIGKILL after NAMESRV_STOP_TIMEOUT_S.
    False if it had to be killed."""
    state = read_layout_state(paths.home) or {}
    namesrv = state.get("namesrv") or {}
    pid = int(namesrv.get("pid") or 0)
    clean = True
    if pid and process_alive(pid, namesrv.get("create_time")):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            process.terminate()
            try:
                process.wait(NAMESRV_STOP_TIMEOUT_S)
            except psutil.TimeoutExpired:
                process.kill()
                process.wait(NAMESRV_STOP_TIMEOUT_S)
                clean = False
    with contextlib.suppress(FileNotFoundError):
        (paths.run_dir / NAMESRV_READY_FILE_NAME).unlink()
    return clean


# ---------------------------------------------------------------------------------------------
# status


def layout_status(home: Path | None) -> LayoutStatus:
    """The layout's name server and every broker of it, measured now."""
    home_path = ops.home_dir(home)
    state = read_layout_state(home_path)
    if state is None:
        raise MqboxError(f"no layout runs in {home_path}")
    paths = HomeLayout(home_path)
    namesrv = state.get("namesrv") or {}
    namesrv_pid = int(namesrv.get("pid") or 0)
    namesrv_up = process_alive(namesrv_pid, namesrv.get("create_time")) if namesrv_pid else False
    layout = _load_quietly(Path(str(state.get("layout", ""))))
    brokers = tuple(
        _broker_status(paths.broker_home(str(entry["name"])), str(entry["name"]), layout)
        for entry in state.get("brokers") or []
    )
    return LayoutStatus(
        home=home_path,
        layout_path=str(state.get("layout", "")),
        running=namesrv_up,
        namesrv=str(namesrv.get("address", "")) if namesrv_up else "",
        namesrv_pid=namesrv_pid if namesrv_up else 0,
        brokers=brokers,
    )


def _load_quietly(path: Path) -> LayoutConfig | None:
    """The layout file as it is now; None if it no longer loads (status still shows the run)."""
    try:
        return load_layout(path)
    except ConfigError:
        return None


def _broker_status(broker_home: Path, name: str, layout: LayoutConfig | None) -> BrokerStatus:
    running = ops.supervisor_running(broker_home)
    measured = ops.status(broker_home) if running else None
    state: Mapping[str, Any] = (read_state(broker_home) or {}).get("broker") or {}
    member = None
    if layout is not None:
        with contextlib.suppress(ConfigError):
            member = layout.member(name)
    ha = read_ha_state(broker_home)
    processes = measured.processes if measured is not None else ()
    last_stop = ops.read_last_stop_reason(broker_home)
    return BrokerStatus(
        name=name,
        broker_name=str(state.get("broker_name") or (member.broker.broker_name if member else "")),
        broker_id=int(state.get("broker_id", member.broker.broker_id if member else 0)),
        role=str(state.get("broker_role") or (member.broker.broker_role.value if member else "")),
        running=running,
        address=str(state.get("address", "")) if running else "",
        ha_port=int(state["ha_port"]) if running and state.get("ha_port") else None,
        process_count=len(processes),
        processes_up=sum(1 for process in processes if process.pid),
        pss_bytes=measured.pss_bytes if measured is not None else 0,
        store_size_bytes=measured.store_size_bytes if measured is not None else 0,
        ha_state=ha.state,
        slave_lag_bytes=ha.slave_lag_bytes,
        slave_lag_messages=ha.slave_lag_messages,
        home=broker_home,
        reason=measured.reason if measured is not None else last_stop,
    )

"""Operations behind the CLI: everything `mqbox ...` does, as plain functions that return data.

Owns: locating the home directory and etc/ defaults, loading configuration for display, and the
appliance's lifecycle as seen from outside: starting it in this process or in the background,
stopping it by the pids its supervisor recorded in `<home>/run/`, and measuring every process
for `mqbox status`; and which name server the wire commands ask (`namesrv_addr`). The wire
commands themselves (topic, offset, cluster, message, send, tail) live in admin/broker_ops.py.
Never: prints (the CLI prints) or exits the process; failures are MqboxError subclasses.

mqbox.server.supervisor (and with it numpy and numba) is imported inside the functions that
need it, so `mqbox --help` and `mqbox config` stay quick, and so `start` can pin the BLAS
thread pools to one thread before numpy first loads (the supervisor forks, and a pool thread
would only cost memory in the zygote).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import psutil

from mqbox.acl.plain import RETRY_GROUP_TOPIC_PREFIX, AclConfig, is_group_resource, perm_text
from mqbox.acl.validator import acl_file_path, load_acl_file
from mqbox.clock import wall_clock_ms
from mqbox.config import (
    BrokerConfig,
    NamesrvConfig,
    broker_listen_address,
    broker_white_list_of,
    ignored_keys_warning,
    is_loopback,
    load_broker_config,
    load_namesrv_config,
)
from mqbox.errors import ConfigError, MqboxError
from mqbox.server import launch

if TYPE_CHECKING:
    from mqbox.server.supervisor import ApplianceOptions

ETC_DIR = Path(__file__).resolve().parents[2] / "etc"

# First start compiles every numba kernel (minutes on a small machine); later starts load them.
DAEMON_READY_TIMEOUT_S: Final = 1200.0
STOP_TIMEOUT_S_DEFAULT: Final = 120.0
LEFTOVER_STOP_TIMEOUT_S: Final = 5.0
CPU_SAMPLE_S: Final = 0.2
SUPERVISOR_OUTPUT_FILE_NAME: Final = "supervisor.out"
NAMESRV_ENV: Final = "MQBOX_NAMESRV"  # the wire commands' name server when --namesrv is absent


def home_dir(home: Path | None) -> Path:
    """The appliance's home: --home, else $MQBOX_HOME, else ~/mqbox."""
    if home is not None:
        return home.expanduser().resolve()
    env_home = os.environ.get("MQBOX_HOME")
    if env_home:
        return Path(env_home).expanduser().resolve()
    return (Path.home() / "mqbox").resolve()


def config_paths(broker_conf: Path | None) -> tuple[Path | None, Path]:
    """(namesrv.conf or None, broker.conf) that `mqbox start` reads."""
    namesrv_path = ETC_DIR / "namesrv.conf"
    broker_path = broker_conf if broker_conf is not None else ETC_DIR / "broker.conf"
    return (namesrv_path if namesrv_path.exists() else None), broker_path


def load_configs(broker_conf: Path | None) -> tuple[NamesrvConfig, BrokerConfig]:
    """The name server and broker configuration `mqbox start` would use."""
    namesrv_path, broker_path = config_paths(broker_conf)
    namesrv = load_namesrv_config(namesrv_path)
    broker = load_broker_config(broker_path)
    return namesrv, broker


def ignored_key_warnings(broker_conf: Path | None) -> list[str]:
    """One line per configuration file `mqbox start` reads that has keys mqbox ignores.
    ConfigError if a file does not load (a refused key among them)."""
    namesrv, broker = load_configs(broker_conf)
    namesrv_path, broker_path = config_paths(broker_conf)
    lines = [
        ignored_keys_warning(namesrv_path or "namesrv", namesrv.unknown_keys),
        ignored_keys_warning(broker_path, broker.unknown_keys),
    ]
    return [line for line in lines if line is not None]


def exposure_warning(namesrv: NamesrvConfig, broker: BrokerConfig) -> str | None:
    """What `mqbox start` warns about when a listener binds an address other hosts reach while
    aclEnable is false (docs/security.md): who can then do what. None when both listeners are
    on loopback or the ACL is on."""
    if broker.acl_enable:
        return None
    lines: list[str] = []
    broker_address = broker_listen_address(broker)
    if not is_loopback(broker_address):
        lines.append(
            f"the broker listens on {broker_address}: anyone who reaches it can send to and "
            "read every topic, create and delete topics, commit or reset any group's offsets "
            "and send back any stored message into a group's retry topic"
        )
    if not is_loopback(namesrv.listen_address):
        white_list = ",".join(broker_white_list_of(namesrv))
        lines.append(
            f"the name server listens on {namesrv.listen_address}: anyone who reaches it can "
            "read every route and delete routes and KV entries; peers in "
            f"mqboxNamesrvBrokerWhiteList ({white_list}) can register brokers and wipe "
            "their write permission"
        )
    if not lines:
        return None
    return (
        "WARNING: aclEnable=false and "
        + "; ".join(lines)
        + ". Set mqboxListenAddress=127.0.0.1, or turn the ACL on (aclEnable=true and "
        "plain_acl.yml); see docs/security.md."
    )


@dataclasses.dataclass(frozen=True, slots=True)
class NamesrvAddress:
    """The name server(s) a wire command asks, and where that address came from (for errors)."""

    address: str  # ip:port, ';'-separated for several
    source: str  # "--namesrv", "$MQBOX_NAMESRV", "the appliance running in HOME", a conf file


def running_state(home: Path) -> dict[str, Any] | None:
    """run/state.json of `home` while its supervisor runs; None otherwise."""
    from mqbox.server.home import process_alive, read_state

    state = read_state(home) or {}
    supervisor = state.get("supervisor") or {}
    pid = supervisor.get("pid")
    if not pid or not process_alive(int(pid), supervisor.get("create_time")):
        return None
    return state


def running_namesrv(home: Path) -> str | None:
    """The name server address the broker of the appliance running in `home` registers with
    (or a layout's name server, when `home` holds a running layout); None when nothing of it
    runs there."""
    from mqbox.server.home import process_alive, read_layout_state

    layout = (read_layout_state(home) or {}).get("namesrv") or {}
    pid = int(layout.get("pid") or 0)
    if pid and layout.get("address") and process_alive(pid, layout.get("create_time")):
        return str(layout["address"])
    state = running_state(home)
    if state is None:
        return None
    address = str((state.get("broker") or {}).get("namesrv_addr") or "").strip()
    if address:
        return address
    namesrv = state.get("namesrv") or {}
    if namesrv.get("port"):
        host = namesrv.get("host") or "127.0.0.1"
        return f"{'127.0.0.1' if host == '0.0.0.0' else host}:{namesrv['port']}"
    return None


def resolve_namesrv(
    option: str | NamesrvAddress | None, home: Path | None = None
) -> NamesrvAddress:
    """The name server(s) the wire commands ask: --namesrv, else $MQBOX_NAMESRV, else the one
    of the appliance running in the home (--home, $MQBOX_HOME, ~/mqbox), else namesrvAddr of
    etc/broker.conf. ConfigError if none is set or etc/broker.conf does not load."""
    if isinstance(option, NamesrvAddress):
        return option
    for value, source in ((option, "--namesrv"), (os.environ.get(NAMESRV_ENV), f"${NAMESRV_ENV}")):
        if value is not None and value.strip():
            return NamesrvAddress(value.strip(), source)
    home_path = home_dir(home)
    running = running_namesrv(home_path)
    if running is not None:
        return NamesrvAddress(running, f"the appliance running in {home_path}")
    broker_path = config_paths(None)[1]
    address = load_broker_config(broker_path).namesrv_addr.strip()
    if not address:
        raise ConfigError(
            f"no name server: give --namesrv, set ${NAMESRV_ENV}, start mqbox in {home_path}, "
            f"or set namesrvAddr in {broker_path}"
        )
    return NamesrvAddress(address, f"namesrvAddr of {broker_path}")


def namesrv_addr(option: str | NamesrvAddress | None, home: Path | None = None) -> str:
    """resolve_namesrv's address alone."""
    return resolve_namesrv(option, home).address


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigShown:
    """What `mqbox config` prints: values by RocketMQ key name, and where they came from."""

    source: str  # the files read, or "the appliance running in HOME"
    broker: dict[str, Any]
    namesrv: dict[str, Any] | None  # None: the appliance runs without its own name server
    ignored: dict[str, list[str]]  # keys of the files mqbox does not know, per file


def config_shown(broker_conf: Path | None, home: Path | None = None) -> ConfigShown:
    """The configuration `mqbox start` would use (etc/ or `broker_conf`), or with `home`, the one
    the appliance running there uses (run/config.json: ports as bound, the name server address
    its broker registers with). MqboxError if nothing runs in `home`."""
    from mqbox.config import key_values
    from mqbox.run_files import read_json
    from mqbox.server.home import HomeLayout

    if home is not None:
        home_path = home_dir(home)
        document = read_json(HomeLayout(home_path).run_config_path)
        if running_state(home_path) is None or not document:
            raise MqboxError(
                f"not running in {home_path}; without --home, `mqbox config` shows what "
                "`mqbox start` would use"
            )
        return ConfigShown(
            source=f"the appliance running in {home_path} (started with "
            f"{document.get('broker_config_path') or 'the defaults'})",
            broker=dict(document.get("broker") or {}),
            namesrv=document.get("namesrv"),
            ignored=dict(document.get("ignored") or {}),
        )
    namesrv, broker = load_configs(broker_conf)
    namesrv_path, broker_path = config_paths(broker_conf)
    return ConfigShown(
        source=", ".join(str(path) for path in (broker_path, namesrv_path) if path is not None),
        broker=key_values(broker),
        namesrv=key_values(namesrv),
        ignored={"broker": list(broker.unknown_keys), "namesrv": list(namesrv.unknown_keys)},
    )


def config_as_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready view of a config dataclass (enums by value, nested dataclasses inlined)."""

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)
            }
        if isinstance(value, tuple):
            return [plain(item) for item in value]
        return value

    result = plain(config)
    assert isinstance(result, dict)
    if result.get("namesrv_secret_key"):  # a secret is never printed
        result["namesrv_secret_key"] = "<hidden>"
    return result


def version_text() -> str:
    """`mqbox --version`: the package's version and the RocketMQ protocol it speaks."""
    from importlib import metadata

    from mqbox.protocol.codes import VERSION_MQBOX

    try:
        version = metadata.version("mqbox")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return (
        f"mqbox {version} (RocketMQ 4.x remoting protocol; announces client version "
        f"{VERSION_MQBOX}, RocketMQ V4_5_2)"
    )


def kernels_need_compiling() -> bool:
    """True when numba's cache holds no compiled kernel yet (no index file under
    NUMBA_CACHE_DIR, or under the package's __pycache__ directories without it): the start
    then compiles every kernel, about 20 s on 2 cores. A cache of an older version may still
    be recompiled kernel by kernel; that is not detected."""
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    root = Path(cache_dir) if cache_dir else Path(__file__).resolve().parents[1]
    return next(root.rglob("*.nbi"), None) is None


def warm_up_text(*, compiling: bool) -> str:
    """What the silent part of a start does."""
    if compiling:
        return "compiling the kernels, as a first start does (about 20 s on 2 cores)"
    return "loading the compiled kernels and starting every process (a few seconds)"


def acl_view(home: Path | None, broker_conf: Path | None) -> dict[str, Any]:
    """What `mqbox acl show` prints: whether broker.conf turns the ACL on, the file the broker
    reads, and its rules without the secret keys; AclConfigError for a file that is not valid."""
    _namesrv, broker = load_configs(broker_conf)
    path = acl_file_path(broker.acl_file, home_dir(home))
    view: dict[str, Any] = {"acl_enable": broker.acl_enable, "file": str(path)}
    if not path.exists() and not broker.acl_enable:
        view["accounts"] = []
        view["global_white_remote_addresses"] = []
        return view
    view.update(acl_rules_view(load_acl_file(path)))
    return view


def acl_rules_view(config: AclConfig) -> dict[str, Any]:
    """An ACL's rules as JSON-ready values; secret keys are left out."""
    return {
        "global_white_remote_addresses": [
            pattern.text for pattern in config.global_white_remote_addresses
        ],
        "accounts": [
            {
                "access_key": account.access_key,
                "admin": account.admin,
                "white_remote_address": account.white_remote_address.text,
                "default_topic_perm": perm_text(account.default_topic_perm),
                "default_group_perm": perm_text(account.default_group_perm),
                "topic_perms": {
                    name: perm_text(perm)
                    for name, perm in account.resource_perms.items()
                    if not is_group_resource(name)
                },
                "group_perms": {
                    name.removeprefix(RETRY_GROUP_TOPIC_PREFIX): perm_text(perm)
                    for name, perm in account.resource_perms.items()
                    if is_group_resource(name)
                },
            }
            for account in config.accounts.values()
        ],
    }


# ---------------------------------------------------------------------------------------------
# start
# ---------------------------------------------------------------------------------------------


def pin_thread_pools() -> None:
    """Ask numpy's BLAS (and numba) for one thread, if numpy is not loaded yet."""
    for key, value in launch.SINGLE_THREAD_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def start_options(
    home: Path | None,
    broker_conf: Path | None,
    *,
    namesrv_port: int | None = None,
    broker_port: int | None = None,
    topology: str | None = None,
) -> ApplianceOptions:
    """What `mqbox start` runs, with the configuration checked (ConfigError otherwise).
    `broker_port` 0 puts the HTTP endpoint on any free port too (`http_port_for`)."""
    pin_thread_pools()
    from mqbox.server.supervisor import ApplianceOptions

    load_configs(broker_conf)
    namesrv_path, broker_path = config_paths(broker_conf)
    for port, what in ((namesrv_port, "--namesrv-port"), (broker_port, "--broker-port")):
        if port is not None and not 0 <= port <= 65535:
            raise MqboxError(f"{what} {port} is not a port (0 to 65535)")
    return ApplianceOptions(
        home=home_dir(home),
        broker_config_path=broker_path.expanduser().resolve(),
        namesrv_config_path=namesrv_path.resolve() if namesrv_path is not None else None,
        namesrv_port=namesrv_port,
        broker_port=broker_port,
        http_port=http_port_for(broker_port),
        topology=topology,
    )


def http_port_for(broker_port: int | None) -> int | None:
    """The HTTP endpoint's port when `--broker-port` is `broker_port`: any free one (0) with
    --broker-port 0, which asks for every port of the broker free (tests run many at once);
    otherwise None, mqboxHttpPort's."""
    return 0 if broker_port == 0 else None


def run_foreground(options: ApplianceOptions, on_ready: Callable[[Mapping[str, Any]], None]) -> int:
    """Run the appliance in this process until it stops; its exit status. MqboxError if it
    could not start (nothing is left running then)."""
    pin_thread_pools()
    from mqbox.server.supervisor import Supervisor

    return Supervisor(options, on_ready=on_ready).run()


def start_daemon(
    options: ApplianceOptions, *, ready_timeout_s: float = DAEMON_READY_TIMEOUT_S
) -> dict[str, Any]:
    """Start the appliance in the background (its own session) and return its ready report
    once every role is ready. MqboxError if it could not start; nothing is left running."""
    from mqbox.server.home import prepare_home

    layout = prepare_home(options.home)
    command = ["--home", str(options.home)]
    if options.broker_config_path is not None:
        command += ["--config", str(options.broker_config_path)]
    if options.namesrv_config_path is not None:
        command += ["--namesrv-config", str(options.namesrv_config_path)]
    if options.namesrv_port is not None:
        command += ["--namesrv-port", str(options.namesrv_port)]
    if options.broker_port is not None:
        command += ["--broker-port", str(options.broker_port)]
    if options.http_port is not None:
        command += ["--http-port", str(options.http_port)]
    if options.topology is not None:
        command += ["--topology", options.topology]
    output_path = layout.logs_dir / SUPERVISOR_OUTPUT_FILE_NAME
    with output_path.open("ab") as output:
        started = launch.spawn(command, output=output)
    popen = started.process
    try:
        report = launch.read_ready(started, ready_timeout_s)
    except launch.SupervisorNotReadyError as error:
        launch.stop(popen, STOP_TIMEOUT_S_DEFAULT)
        if error.status is None:
            raise MqboxError(
                f"the appliance did not become ready within {ready_timeout_s:g} s; "
                f"see {output_path}"
            ) from None
        raise MqboxError(
            f"the appliance exited with status {error.status}: {last_line(output_path)}"
        ) from None
    except BaseException:
        launch.stop(popen, STOP_TIMEOUT_S_DEFAULT)
        raise
    if not report.get("ok"):
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=30)
        raise MqboxError(str(report.get("error", "the appliance did not start")))
    return report


def last_line(path: Path) -> str:
    """The last line of a log file, for an error message."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return lines[-1] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------
# stop
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class StopResult:
    home: Path
    supervisor_pid: int | None
    stopped: tuple[str, ...]  # names of processes that exited after SIGTERM
    killed: tuple[str, ...]  # names of processes that needed SIGKILL
    seconds: float
    # Why the stop was not clean ("" if it was): processes killed, no supervisor to run the
    # orderly stop, or the supervisor's own report (run/last-stop.json) of a role that had to be
    # killed or exited non-zero while stopping.
    unclean: str = ""


def _supervisor_pid(home: Path) -> int | None:
    from mqbox.server.home import HomeLayout

    try:
        return int(HomeLayout(home).pid_path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def supervisor_running(home: Path) -> bool:
    """True if the supervisor recorded in `home` runs (an mqbox process, not a reused pid)."""
    from mqbox.server.home import read_state

    recorded = (read_state(home) or {}).get("supervisor") or {}
    pid = int(recorded.get("pid") or _supervisor_pid(home) or 0)
    process = live_process(pid, recorded.get("create_time")) if pid else None
    return process is not None and _looks_like_mqbox(process)


def read_last_stop_reason(home: Path) -> str:
    """Why the last run in `home` stopped after a failure; "" if it did not."""
    from mqbox.server.home import read_last_stop

    return str((read_last_stop(home) or {}).get("reason") or "")


def live_process(pid: int, create_time: float | None) -> psutil.Process | None:
    from mqbox.server.home import process_alive

    if not process_alive(pid, create_time):
        return None
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid)
    return None


def stop(home: Path | None, *, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> StopResult:
    """SIGTERM to the supervisor of `home` and wait for its orderly stop; after `timeout_s`,
    SIGKILL it and every process it recorded, and sweep its shared memory. MqboxError if
    nothing of the appliance runs there; ConfigError for a negative `timeout_s`."""
    if not timeout_s >= 0:  # also refuses NaN
        raise ConfigError(f"--timeout-s {timeout_s:g} is negative")
    from mqbox.ipc import names
    from mqbox.server.home import HomeLayout, read_state, recorded_processes

    home = home_dir(home)
    started = time.monotonic()
    started_ms = wall_clock_ms()
    state = read_state(home) or {}
    recorded = [(name, pid, create) for name, pid, create in recorded_processes(state)]
    supervisor_pid = _supervisor_pid(home)
    if supervisor_pid is not None and all(pid != supervisor_pid for _, pid, _ in recorded):
        recorded.insert(0, ("supervisor", supervisor_pid, None))
    live = {
        name: process
        for name, pid, create_time in recorded
        if (process := live_process(pid, create_time)) is not None
    }
    supervisor = live.get("supervisor")
    if supervisor is not None and not _looks_like_mqbox(supervisor):
        del live["supervisor"]  # the pid was reused by something else
        supervisor = None
    if not live:
        removed = _clean_dead_run(home, state)
        left = f" (removed {removed} shared-memory objects a dead run left)" if removed else ""
        raise MqboxError(f"not running in {home}{left}")
    stopped: list[str] = []
    killed: list[str] = []
    if supervisor is not None:
        with contextlib.suppress(psutil.Error):
            supervisor.send_signal(signal.SIGTERM)
        if not _wait_gone([supervisor], timeout_s):
            stopped.append("supervisor")
    # What is still alive now outlived its supervisor (or never had one): end it by pid.
    leftovers = {name: p for name, p in live.items() if p.is_running() and _not_zombie(p)}
    for process in leftovers.values():
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGTERM)
    alive = _wait_gone(list(leftovers.values()), LEFTOVER_STOP_TIMEOUT_S)
    for name, process in leftovers.items():
        if process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
            killed.append(name)
        elif name != "supervisor":
            stopped.append(name)
    _wait_gone(alive, LEFTOVER_STOP_TIMEOUT_S)
    if killed or supervisor is None:
        # Nobody ran the orderly stop to its end: do its cleanup.
        instance = state.get("instance")
        if isinstance(instance, str) and instance:
            with contextlib.suppress(MqboxError):
                names.unlink_instance(instance)
        layout = HomeLayout(home)
        for path in (layout.pid_path, layout.state_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return StopResult(
        home=home,
        supervisor_pid=supervisor.pid if supervisor is not None else None,
        stopped=tuple(stopped),
        killed=tuple(killed),
        seconds=time.monotonic() - started,
        unclean=_unclean_reason(home, supervisor is not None, killed, started_ms),
    )


def _unclean_reason(home: Path, had_supervisor: bool, killed: list[str], since_ms: int) -> str:
    """Why the stop that began at `since_ms` was not clean, or ""."""
    from mqbox.server.home import read_last_stop

    if killed:
        return "killed after the timeout: " + ", ".join(killed)
    if not had_supervisor:
        return "no supervisor ran the orderly stop; its processes were stopped one by one"
    last_stop = read_last_stop(home) or {}
    if int(last_stop.get("stopped_at_ms") or 0) >= since_ms:
        return str(last_stop.get("reason") or "the supervisor reported an unclean stop")
    return ""


def _clean_dead_run(home: Path, state: Mapping[str, Any]) -> int:
    """Remove the shared memory and run files of a run whose processes are all gone, unless a
    supervisor holds the home's lock (it may be starting); how many objects were removed."""
    from mqbox.ipc import names
    from mqbox.server.home import NAMESRV_READY_FILE_NAME, HomeLayout

    layout = HomeLayout(home)
    try:
        fd = os.open(layout.lock_path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        removed = []
        instance = state.get("instance")
        if isinstance(instance, str) and instance:
            with contextlib.suppress(MqboxError):
                removed = names.unlink_instance(instance)
        for path in (layout.pid_path, layout.state_path, layout.run_dir / NAMESRV_READY_FILE_NAME):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return len(removed)
    finally:
        os.close(fd)


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Poll until every process in `processes` is gone (or a zombie); those still alive after
    `timeout_s`. (psutil.wait_procs sleeps in long steps for processes that are not ours.)"""
    deadline = time.monotonic() + timeout_s
    alive = list(processes)
    while True:
        alive = [process for process in alive if process.is_running() and _not_zombie(process)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def _looks_like_mqbox(process: psutil.Process) -> bool:
    try:
        return any("mqbox" in part for part in process.cmdline())
    except psutil.Error:
        return False


def _not_zombie(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessStatus:
    name: str  # "supervisor", "namesrv" or a role id
    kind: str  # "supervisor", "namesrv" or the role kind
    pid: int  # 0 if the role is down
    state: str  # "running", "ready", "starting", "down"
    cpu_percent: float
    pss_anon_bytes: int
    pss_shmem_bytes: int
    rss_bytes: int
    port: int | None
    uptime_s: float
    generation: int | None  # roles: odd while up (control_block.ControlBlock)


@dataclasses.dataclass(frozen=True, slots=True)
class ApplianceStatus:
    home: Path
    running: bool
    status: str  # the supervisor's: "starting", "running", "restarting", "stopping"; "stopped"
    namesrv: str  # ip:port
    broker: str  # ip:port
    broker_name: str
    broker_id: int
    broker_role: str  # ASYNC_MASTER, SYNC_MASTER or SLAVE
    instance: str
    store_root: str
    store_size_bytes: int
    processes: tuple[ProcessStatus, ...]
    broker_restarts: int  # times every role of the broker was restarted after a critical death
    # Why it restarted last (while running) or stopped (after a failure); "" if neither happened.
    reason: str
    # Replication as run/replication.json reports it (server/home.HaState); "n/a" and None
    # until it does.
    ha_state: str
    slave_lag_bytes: int | None
    slave_lag_messages: int | None
    # The HA role's run/replication.json (docs/replication.md); empty when there is none.
    replication: dict[str, Any] = dataclasses.field(default_factory=dict)
    http: str = ""  # the HTTP endpoint's URL (/metrics, the dashboard), from run/http.json

    @property
    def pss_bytes(self) -> int:
        """Sum of Pss_Anon + Pss_Shmem over every process: the appliance's memory."""
        return sum(p.pss_anon_bytes + p.pss_shmem_bytes for p in self.processes)

    def as_dict(self) -> dict[str, Any]:
        document = config_as_dict(self)
        document["home"] = str(self.home)
        document["pss_bytes"] = self.pss_bytes
        return document


@dataclasses.dataclass(frozen=True, slots=True)
class StateRow:
    """One process as run/state.json records it."""

    name: str
    kind: str
    pid: int
    create_time: float | None
    state: str
    port: int | None
    generation: int | None


def state_rows(state: Mapping[str, Any], supervisor_pid: int | None = None) -> list[StateRow]:
    """Every process a run/state.json lists (supervisor, name server, roles), as recorded."""
    supervisor = state.get("supervisor") or {}
    if supervisor_pid is None:
        supervisor_pid = int(supervisor.get("pid") or 0)
    namesrv = state.get("namesrv") or {}
    broker = state.get("broker") or {}
    broker_address = str(broker.get("address", ""))
    broker_port = int(broker_address.rpartition(":")[2]) if broker_address else None
    rows = [
        StateRow(
            name="supervisor",
            kind="supervisor",
            pid=supervisor_pid,
            create_time=supervisor.get("create_time"),
            state="running",
            port=broker_port,
            generation=None,
        )
    ]
    if namesrv.get("pid"):
        rows.append(
            StateRow(
                name="namesrv",
                kind="namesrv",
                pid=int(namesrv["pid"]),
                create_time=namesrv.get("create_time"),
                state="ready" if namesrv.get("ready") else "starting",
                port=int(namesrv.get("port") or 0) or None,
                generation=None,
            )
        )
    rows.extend(
        StateRow(
            name=str(role["role_id"]),
            kind=str(role["kind"]),
            pid=int(role.get("pid") or 0),
            create_time=role.get("create_time"),
            state=str(role.get("state", "down")),
            port=broker_port if role.get("kind") == "reactor" else None,
            generation=int(role.get("generation") or 0),
        )
        for role in state.get("roles") or []
    )
    return rows


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup as bytes per field (Rss, Pss_Anon, Pss_Shmem, ...); {} if gone."""
    fields: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="ascii")
    except OSError:
        return fields
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":") and parts[2] == "kB":
            fields[parts[0][:-1]] = int(parts[1]) * 1024
    return fields


def disk_usage_bytes(root: Path) -> int:
    """What `du -s` counts: allocated blocks under `root`, each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _, files in os.walk(root):
        for name in (".", *files):
            try:
                status = Path(directory, name).lstat()
            except OSError:
                continue
            key = (status.st_dev, status.st_ino)
            if key not in seen:
                seen.add(key)
                total += status.st_blocks * 512
    return total


def status(home: Path | None) -> ApplianceStatus:
    """Every process of the appliance in `home`, measured now (CPU over CPU_SAMPLE_S)."""
    from mqbox.server.home import (
        read_ha_state,
        read_http,
        read_last_stop,
        read_replication,
        read_state,
    )

    home = home_dir(home)
    state = read_state(home) or {}
    supervisor = state.get("supervisor") or {}
    supervisor_pid = int(supervisor.get("pid") or _supervisor_pid(home) or 0)
    supervisor_process = live_process(supervisor_pid, supervisor.get("create_time"))
    running = supervisor_process is not None and _looks_like_mqbox(supervisor_process)
    namesrv = state.get("namesrv") or {}
    broker = state.get("broker") or {}
    broker_address = str(broker.get("address", ""))
    rows = state_rows(state, supervisor_pid)
    processes: dict[str, psutil.Process] = {}
    for row in rows:
        process = live_process(row.pid, row.create_time) if row.pid else None
        if process is not None:
            with contextlib.suppress(psutil.Error):
                process.cpu_percent(None)  # the first call starts the sample
                processes[row.name] = process
    if processes:
        time.sleep(CPU_SAMPLE_S)
    now = time.time()
    measured: list[ProcessStatus] = []
    for row in rows:
        process = processes.get(row.name)
        if process is None:
            measured.append(
                ProcessStatus(
                    row.name, row.kind, 0, "down", 0.0, 0, 0, 0, row.port, 0.0, row.generation
                )
            )
            continue
        try:
            cpu_percent = process.cpu_percent(None)
            uptime_s = now - process.create_time()
        except psutil.Error:
            cpu_percent, uptime_s = 0.0, 0.0
        memory = smaps_rollup(row.pid)
        measured.append(
            ProcessStatus(
                name=row.name,
                kind=row.kind,
                pid=row.pid,
                state=row.state,
                cpu_percent=cpu_percent,
                pss_anon_bytes=memory.get("Pss_Anon", 0),
                pss_shmem_bytes=memory.get("Pss_Shmem", 0),
                rss_bytes=memory.get("Rss", 0),
                port=row.port,
                uptime_s=uptime_s,
                generation=row.generation,
            )
        )
    store_root = str(broker.get("store_root", ""))
    ha = read_ha_state(home)
    last_failure = state.get("last_failure") if running else read_last_stop(home)
    return ApplianceStatus(
        home=home,
        running=running,
        status=str(state.get("status", "running")) if running else "stopped",
        namesrv=f"{namesrv.get('host')}:{namesrv.get('port')}" if namesrv.get("port") else "",
        broker=broker_address,
        broker_name=str(broker.get("broker_name", "")),
        broker_id=int(broker.get("broker_id") or 0),
        broker_role=str(broker.get("broker_role", "")),
        instance=str(state.get("instance", "")),
        store_root=store_root,
        store_size_bytes=disk_usage_bytes(Path(store_root)) if store_root else 0,
        processes=tuple(measured),
        broker_restarts=int(state.get("broker_restarts") or 0) if running else 0,
        reason=str((last_failure or {}).get("reason") or ""),
        http=str((read_http(home) or {}).get("url") or "") if running else "",
        ha_state=ha.state,
        slave_lag_bytes=ha.slave_lag_bytes,
        slave_lag_messages=ha.slave_lag_messages,
        replication=(read_replication(home) or {}) if running else {},
    )


# ---------------------------------------------------------------------------------------------
# Offline store repair


@dataclasses.dataclass(frozen=True)
class RepairResult:
    """What `mqbox store repair` found and did (offsets are commit-log bytes)."""

    store_root: str
    write_log_offset_bytes: int  # appends resume here
    cut_at_log_offset_bytes: int | None  # where a damaged or unfinished tail was cut
    reason: str | None  # why the first cut record failed
    flushed_damage: bool  # the cut went below the flushed offset (acknowledged data)
    copy_directory: str | None  # the bytes cut, one file per segment; None if nothing was copied
    copied_bytes: int


def _store_users(store_root: Path) -> list[int]:
    """Pids of processes with a file under `store_root` open (a running broker of it)."""
    root = str(store_root.resolve())
    users: list[int] = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if any(item.path.startswith(root) for item in process.open_files()):
                users.append(process.pid)
    return users


def repair_store(
    home: Path | None, broker_conf: Path | None, store_root: Path | None
) -> RepairResult:
    """Open the broker's store offline and recover it, cutting damage found inside flushed data
    (which `mqbox start` refuses to cut) after copying every byte cut into
    `<store>/repair/<UTC time>/`; then close it cleanly. Holds the home's lock meanwhile, so the
    appliance cannot start, and refuses a store any process has open."""
    from mqbox.message import pack_host
    from mqbox.server.home import HomeLayout, lock_home, store_root_of
    from mqbox.store.message_store import MessageStore, StoreConfig

    home_path = home_dir(home)
    _namesrv, broker = load_configs(broker_conf)
    root = (store_root or store_root_of(home_path, broker)).expanduser()
    if not (root / "commitlog").is_dir():
        raise ConfigError(f"no store at {root} (no commitlog/ there)")
    layout = HomeLayout(home_path)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = lock_home(layout)
    try:
        users = _store_users(root)
        if users:
            raise MqboxError(
                f"the store {root} is open in process {users[0]}; stop the broker first"
            )
        copy_directory = root / "repair" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        config = StoreConfig.from_broker_config(
            broker, pack_host(broker.broker_ip1 or "127.0.0.1", broker.listen_port)
        )
        store = MessageStore.open(
            root, config, truncate_flushed_damage=True, cut_copy_directory=copy_directory
        )
        report = store.recovery_report
        assert report is not None
        store.close()
    finally:
        os.close(lock_fd)
    copied_bytes = 0
    if copy_directory.is_dir():
        copied_bytes = sum(path.stat().st_size for path in copy_directory.iterdir())
    return RepairResult(
        store_root=str(root),
        write_log_offset_bytes=report.write_log_offset_bytes,
        cut_at_log_offset_bytes=report.truncated_at_log_offset_bytes,
        reason=report.truncated_reason,
        flushed_damage=report.flushed_damage,
        copy_directory=str(copy_directory) if copy_directory.is_dir() else None,
        copied_bytes=copied_bytes,
    )

"""Goal: the supervisor runs every role as its own process, starts them in START_ORDER one kind
at a time, re-forks a dead non-critical role (which then serves again, and the others hear of it
through the control block), restarts every role of the broker on the death of a critical role
and stops it when that keeps happening (the reason shown by `mqbox status`), stops everything
in reverse order on SIGTERM, leaves no process and no shared memory behind, sweeps what a dead
run left, and fails a bad start with one clear message and nothing left running.

Method: each test runs `python -m mqbox.server.supervisor` in its own session with a fresh home
under tmp_path, port 0 and the trivial roles of tests/support/roles.py (the broker's real
topology with stand-in mains); the supervisor's ready report arrives on a pipe. The roles log
start, ready, control changes and stop to `<home>/events.log` with CLOCK_MONOTONIC stamps, and
answer the test on a pair of extra rings per role. Every process is killed by pid at the end
(reap_pids); processes and /dev/shm are checked to be empty after each stop.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from mqbox.admin import cli, ops
from mqbox.client.namesrv_api import cluster_info
from mqbox.client.remoting import RemotingClient
from mqbox.config import BrokerConfig
from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.run_files import write_json_atomically
from mqbox.server import launch, supervisor
from mqbox.server.home import (
    HomeLayout,
    instance_name,
    prepare_home,
    read_last_stop,
    read_state,
    store_root_of,
)
from mqbox.server.topology import START_ORDER, RoleKind, Topology
from mqbox.store.layout import abort_path
from tests.support import roles

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
# The first start on a machine compiles every kernel; later starts load them from numba's cache.
READY_TIMEOUT_S = 300.0
EXIT_TIMEOUT_S = 60.0
MEMORY_BUDGET_BYTES = 500 << 20


@dataclasses.dataclass
class Running:
    """One supervisor started by a test."""

    popen: subprocess.Popen[bytes]
    home: Path
    report: dict[str, Any]
    output_path: Path

    @property
    def ok(self) -> bool:
        return bool(self.report.get("ok"))

    @property
    def role_pids(self) -> dict[str, int]:
        return {role_id: int(pid) for role_id, pid in self.report["roles"].items()}

    def topology(self, factory: Callable[[str, BrokerConfig], Topology]) -> Topology:
        return factory(self.report["instance"], BrokerConfig())

    def wait(self) -> int:
        return self.popen.wait(timeout=EXIT_TIMEOUT_S)

    def output(self) -> str:
        return self.output_path.read_text(encoding="utf-8", errors="replace")


def start_supervisor(
    home: Path,
    reap_pids: list[int],
    *,
    topology: str = "topology",
    namesrv: bool = False,
    broker_port: int = 0,
    namesrv_port: int = 0,
    extra: tuple[str, ...] = (),
) -> Running:
    """Run a supervisor over tests/support/roles.py and wait for its ready report."""
    command = [
        "--home",
        str(home),
        "--broker-port",
        str(broker_port),
        "--topology",
        f"tests.support.roles:{topology}",
        *extra,
    ]
    command += ["--namesrv-port", str(namesrv_port)] if namesrv else ["--no-namesrv"]
    output_path = home.parent / f"{home.name}.supervisor.out"
    with output_path.open("ab") as output:
        started = launch.spawn(command, output=output, cwd=REPO_ROOT)
    reap_pids.append(started.process.pid)
    try:
        report = launch.read_ready(started, READY_TIMEOUT_S)
    except launch.SupervisorNotReadyError as error:
        raise AssertionError(
            f"no ready report ({error}); output:\n{output_path.read_text()}"
        ) from None
    running = Running(started.process, home, report, output_path)
    if running.ok:
        reap_pids.extend(running.role_pids.values())
    return running


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def assert_nothing_left(running: Running, pids: list[int]) -> None:
    """No process of the run alive, no shared memory of its instance, no run files."""
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "every process to be gone")
    instance = running.report.get("instance") or instance_name(running.home.resolve(), "broker-a")
    assert names.instance_paths(instance) == []
    layout = HomeLayout(running.home)
    assert not layout.pid_path.exists()
    assert not layout.state_path.exists()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def stopper(reap_pids: list[int]) -> Iterator[list[Running]]:
    """Supervisors a test started: SIGTERM at the end, so they clean their shm up."""
    started: list[Running] = []
    yield started
    for running in started:
        if running.popen.poll() is None:
            running.popen.send_signal(signal.SIGTERM)
            try:
                running.popen.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                running.popen.kill()
                running.popen.wait()


def kind_rank(role_id: str) -> int:
    return START_ORDER.index(RoleKind(role_id.split(".")[0]))


def test_every_role_is_its_own_process_started_one_kind_after_the_other(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids)
    stopper.append(running)
    assert running.ok, running.report
    topology = running.topology(roles.topology)
    pids = running.role_pids
    assert sorted(pids) == sorted(role.role_id for role in topology.roles)
    assert len(set(pids.values())) == len(pids)
    for pid in pids.values():
        assert psutil.Process(pid).ppid() == running.popen.pid
    events = roles.read_events(home)
    ready_ns = {e.role_id: e.monotonic_ns for e in events if e.what == "ready"}
    start_ns = {e.role_id: e.monotonic_ns for e in events if e.what == "start"}
    assert set(ready_ns) == set(pids)
    for role_id, started_ns in start_ns.items():
        for other_id, other_ready_ns in ready_ns.items():
            if kind_rank(other_id) < kind_rank(role_id):
                assert other_ready_ns < started_ns, f"{role_id} started before {other_id} was ready"
    state = read_state(home)
    assert state is not None
    assert state["status"] == "running"
    assert {role["role_id"]: role["state"] for role in state["roles"]} == dict.fromkeys(
        pids, "ready"
    )


def test_sigterm_stops_roles_in_reverse_order_and_leaves_nothing(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids)
    stopper.append(running)
    assert running.ok, running.report
    instance = running.report["instance"]
    assert names.instance_paths(instance), "the rings exist while the broker runs"
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK, running.output()
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])
    stops = [e for e in roles.read_events(home) if e.what == "stop"]
    assert {e.role_id for e in stops} == set(running.role_pids)
    ranks = [kind_rank(e.role_id) for e in sorted(stops, key=lambda e: e.monotonic_ns)]
    assert ranks == sorted(ranks, reverse=True)


@pytest.mark.crash
def test_sigkilled_non_critical_role_is_reforked_and_serves_again(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids)
    stopper.append(running)
    assert running.ok, running.report
    topology = running.topology(roles.topology)
    request_name, reply_name = roles.client_ring_names(
        running.report["instance"], "send.0", topology
    )
    client = roles.RoleClient(request_name, reply_name)
    try:
        first = client.ask("before", timeout_s=10)
        assert first["pid"] == running.role_pids["send.0"]
        assert first["generation"] == 1
        os.kill(first["pid"], signal.SIGKILL)
        wait_until(lambda: not alive(first["pid"]), 10, "send.0 to die")
        second = client.ask("after", timeout_s=30)
    finally:
        client.close()
    assert second["payload"] == "after"
    assert second["pid"] != first["pid"]
    assert second["generation"] == 3  # up (1), dead (2), up again (3)
    reap_pids.append(second["pid"])
    assert running.popen.poll() is None

    def state_of_send() -> dict[str, Any]:
        state = read_state(home) or {"roles": []}
        return next(role for role in state["roles"] if role["role_id"] == "send.0")

    # The re-forked role may answer before its supervisor has written the state file.
    wait_until(lambda: state_of_send()["state"] == "ready", 10, "send.0 to be ready again")
    assert state_of_send()["pid"] == second["pid"]
    assert state_of_send()["start_count"] == 2

    def worker_heard_of_the_restart() -> bool:
        return any(
            e.role_id == "worker.0" and "send.0=3" in e.what for e in roles.read_events(home)
        )

    wait_until(worker_heard_of_the_restart, 10, "worker.0 to see send.0's new generation")
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK, running.output()
    assert_nothing_left(running, [running.popen.pid, second["pid"], *running.role_pids.values()])


@pytest.mark.crash
def test_sigkilled_critical_role_restarts_every_role_of_the_broker(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids)
    stopper.append(running)
    assert running.ok, running.report
    os.kill(running.role_pids["store_writer.0"], signal.SIGKILL)

    def restarted() -> bool:
        state = read_state(home) or {}
        roles_ready = all(role["state"] == "ready" for role in state.get("roles", []))
        return state.get("broker_restarts") == 1 and state["status"] == "running" and roles_ready

    wait_until(restarted, 60, "the broker's roles to run again")
    state = read_state(home)
    assert state is not None
    new_pids = {role["role_id"]: role["pid"] for role in state["roles"]}
    reap_pids.extend(new_pids.values())
    assert set(new_pids) == set(running.role_pids)
    assert not set(new_pids.values()) & set(running.role_pids.values())  # every role restarted
    assert "critical role store_writer.0" in state["last_failure"]["reason"]
    store_root = store_root_of(home.resolve(), BrokerConfig())
    assert abort_path(store_root).exists(), "the store writer's open runs the full recovery"
    topology = running.topology(roles.topology)
    client = roles.RoleClient(
        *roles.client_ring_names(running.report["instance"], "send.0", topology)
    )
    try:  # the rings are new: what was in flight belonged to connections that are gone
        answer = client.ask("after the restart", timeout_s=30)
    finally:
        client.close()
    assert answer["pid"] == new_pids["send.0"]
    status = ops.status(home)
    assert (status.status, status.broker_restarts) == ("running", 1)
    assert "critical role store_writer.0" in status.reason
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK, running.output()
    all_pids = [running.popen.pid, *running.role_pids.values(), *new_pids.values()]
    assert_nothing_left(running, all_pids)


@pytest.mark.crash
def test_critical_role_that_keeps_dying_stops_the_broker_with_the_reason_in_status(
    home: Path, tmp_path: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("mqboxBrokerRestartCountMax=2\nmqboxRestartBackoffMs=10\n")
    running = start_supervisor(
        home,
        reap_pids,
        topology="topology_dispatcher_keeps_dying",
        extra=("--config", str(conf)),
    )
    stopper.append(running)
    assert running.ok, running.report
    assert running.wait() == supervisor.EXIT_ROLE_FAILED, running.output()
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])
    reason = "the broker restarted 2 times within 60 s"
    log_text = (home / "logs" / "supervisor.log").read_text()
    assert reason in log_text
    assert log_text.count("restarting every role of the broker") == 2
    last_stop = read_last_stop(home)
    assert last_stop is not None
    assert "critical role dispatcher.0" in last_stop["reason"]
    assert reason in last_stop["reason"]
    status = ops.status(home)
    assert (status.running, status.status) == (False, "stopped")
    assert reason in status.reason
    shown = CliRunner().invoke(cli.app, ["status", "--home", str(home)])
    assert shown.exit_code == 1
    assert reason in shown.output


def test_stale_shared_memory_and_state_of_a_dead_run_are_swept_at_start(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    instance = instance_name(home.resolve(), "broker-a")
    topology = roles.topology(instance, BrokerConfig())
    layout = prepare_home(home)
    # A dead run's ring (same name as one the new run creates) and a stray object.
    Ring.create(topology.rings[0].name, 4096).close()
    stray = names.SHM_DIRECTORY / f"mqbox.{instance}.stale-role.0"
    stray.write_bytes(b"left by a dead run")
    finished = subprocess.Popen(["true"])
    finished.wait()
    write_json_atomically(
        layout.state_path,
        {"instance": instance, "supervisor": {"pid": finished.pid}, "roles": []},
    )
    layout.pid_path.write_text(f"{finished.pid}\n")
    running = start_supervisor(home, reap_pids)
    stopper.append(running)
    assert running.ok, running.report
    assert not stray.exists()
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])


def test_second_start_on_the_same_home_fails_clearly(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    first = start_supervisor(home, reap_pids)
    stopper.append(first)
    assert first.ok, first.report
    second = start_supervisor(home, reap_pids)
    stopper.append(second)
    assert not second.ok
    assert "already running" in second.report["error"]
    assert str(first.popen.pid) in second.report["error"]
    assert second.wait() == supervisor.EXIT_START_FAILED
    assert first.popen.poll() is None
    assert all(alive(pid) for pid in first.role_pids.values())
    assert HomeLayout(home).pid_path.read_text().strip() == str(first.popen.pid)


def test_busy_broker_port_fails_clearly_and_starts_nothing(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        running = start_supervisor(home, reap_pids, namesrv=True, broker_port=port)
        stopper.append(running)
        assert not running.ok
        assert f"broker cannot listen on 127.0.0.1:{port}" in running.report["error"]
        assert "in use" in running.report["error"]
        assert running.wait() == supervisor.EXIT_START_FAILED
    assert roles.read_events(home) == []
    assert_nothing_left(running, [running.popen.pid])


def test_busy_namesrv_port_fails_clearly_and_leaves_nothing(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        running = start_supervisor(home, reap_pids, namesrv=True, namesrv_port=port)
        stopper.append(running)
        assert not running.ok
        assert f"name server cannot listen on 127.0.0.1:{port}" in running.report["error"]
        assert running.wait() == supervisor.EXIT_START_FAILED
    assert_nothing_left(running, [running.popen.pid])


def test_role_that_never_reports_ready_fails_the_start_and_leaves_nothing(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(
        home, reap_pids, topology="topology_send_never_ready", extra=("--ready-timeout-s", "2")
    )
    stopper.append(running)
    assert not running.ok
    assert "role send.0 did not report ready within 2 s" in running.report["error"]
    assert running.wait() == supervisor.EXIT_START_FAILED
    started = [e.pid for e in roles.read_events(home) if e.what == "start"]
    started_before_send = {
        "store_writer.0",
        "dispatcher.0",
        "services.0",
        "schedule.0",
        "ha_service.0",
    }
    assert len(started) == len(started_before_send | {"send.0"})
    assert_nothing_left(running, [running.popen.pid, *started])


def test_role_that_fails_before_ready_fails_the_start_with_its_log(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids, topology="topology_send_fails")
    stopper.append(running)
    assert not running.ok
    error = running.report["error"]
    assert "role send.0 exited (exit status 70) while starting" in error
    assert str(home / "logs" / "send.0.log") in error
    assert "fails on purpose" in (home / "logs" / "send.0.log").read_text()
    assert running.wait() == supervisor.EXIT_START_FAILED
    started = [e.pid for e in roles.read_events(home) if e.what == "start"]
    assert_nothing_left(running, [running.popen.pid, *started])


@pytest.mark.crash
def test_role_that_ignores_sigterm_is_killed_after_the_stop_timeout(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(
        home,
        reap_pids,
        topology="topology_services_ignores_sigterm",
        extra=("--stop-timeout-s", "1"),
    )
    stopper.append(running)
    assert running.ok, running.report
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_STOP_UNCLEAN
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])
    assert "services.0" in (home / "logs" / "supervisor.log").read_text()


@pytest.mark.crash
def test_role_that_keeps_dying_stops_the_broker(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(
        home, reap_pids, topology="topology_send_keeps_dying", extra=("--restart-count-max", "2")
    )
    stopper.append(running)
    assert running.ok, running.report
    assert running.wait() == supervisor.EXIT_ROLE_FAILED, running.output()
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])
    log_text = (home / "logs" / "supervisor.log").read_text()
    assert "role send.0 died 3 times within 60 s" in log_text


@pytest.mark.crash
def test_dead_name_server_is_restarted_on_the_same_port(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids, namesrv=True)
    stopper.append(running)
    assert running.ok, running.report
    state = read_state(home)
    assert state is not None
    first_pid = state["namesrv"]["pid"]
    port = state["namesrv"]["port"]
    assert running.report["namesrv"] == f"127.0.0.1:{port}"
    assert running.report["namesrv_addr"] == f"127.0.0.1:{port}"
    os.kill(first_pid, signal.SIGKILL)

    def restarted() -> bool:
        now = read_state(home) or {}
        namesrv = now.get("namesrv") or {}
        return namesrv.get("pid") not in (None, first_pid) and bool(namesrv.get("ready"))

    wait_until(restarted, 30, "the name server to come back")
    state = read_state(home)
    assert state is not None
    second_pid = state["namesrv"]["pid"]
    reap_pids.append(second_pid)
    assert state["namesrv"]["port"] == port
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK
    assert_nothing_left(running, [running.popen.pid, second_pid, *running.role_pids.values()])


def test_services_role_registers_the_broker_with_the_started_name_server(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    running = start_supervisor(home, reap_pids, topology="topology_real_services", namesrv=True)
    stopper.append(running)
    assert running.ok, running.report
    client = RemotingClient(running.report["namesrv"], timeout_ms=5000)
    try:
        info = cluster_info(client)
    finally:
        client.close()
    assert info.cluster_addr_table == {"DefaultCluster": ("broker-a",)}
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: running.report["broker"]}
    running.popen.send_signal(signal.SIGTERM)
    assert running.wait() == supervisor.EXIT_OK, running.output()
    assert_nothing_left(running, [running.popen.pid, *running.role_pids.values()])
    assert "unregistering" not in (home / "logs" / "services.0.log").read_text()


def test_idle_appliance_fits_the_memory_budget(
    home: Path, reap_pids: list[int], stopper: list[Running]
) -> None:
    """Sum of Pss_Anon + Pss_Shmem over the supervisor, the name server and every role, with the
    default pools, with numba and the store kernels loaded and warmed in the zygote."""
    running = start_supervisor(home, reap_pids, namesrv=True)
    stopper.append(running)
    assert running.ok, running.report
    state = read_state(home)
    assert state is not None
    pids = [running.popen.pid, state["namesrv"]["pid"], *running.role_pids.values()]
    time.sleep(1)  # let the roles settle into their idle loops
    total_bytes = 0
    for pid in pids:
        memory = ops.smaps_rollup(pid)
        assert memory, f"pid {pid} is gone"
        total_bytes += memory["Pss_Anon"] + memory["Pss_Shmem"]
    assert total_bytes <= MEMORY_BUDGET_BYTES, f"{total_bytes >> 20} MiB over {len(pids)} processes"

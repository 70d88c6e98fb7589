"""Goal: a name server forgets a real broker in both of RocketMQ's ways. (a) The whole broker
(supervisor and every role) SIGKILLed: its registering connection closes and the name server
drops its routes at once, long before the expiry: GET_ROUTEINFO_BY_TOPIC for TBW102 answers
TOPIC_NOT_EXIST (17) and the cluster no longer lists broker-a. (b) Every broker process SIGSTOPped:
the connection stays open but registrations stop, and the name server evicts the broker once it
was silent for brokerChannelExpiredTime (not before: while it runs, it stays routed past the
expiry); after SIGCONT the broker registers again and the orderly stop still exits 0.

Method: a name server of its own (tests/support/namesrv_process.py: `python -m mqbox.namesrv` on
port 0) with scanNotActiveBrokerInterval 200 ms and the expiry shrunk, and the real appliance
(`python -m mqbox.server.supervisor`, what `mqbox start --daemon` runs; tests/support/
appliance.py) started with --no-namesrv and namesrvAddr naming that name server, so the name
server outlives the broker; registerNameServerPeriod is 1 s. Routes are asked with
mqbox.client. Signals go to the PIDs this test started (the supervisor, the roles of its ready
line and its other children), nothing else; every one is SIGCONTed and SIGKILLed in `finally`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import psutil
import pytest

from mqbox.client import namesrv_api
from mqbox.client.remoting import RemotingClient
from tests.support.appliance import running_supervisor, stop_process
from tests.support.namesrv_process import NamesrvProcess, running_namesrv

pytestmark = pytest.mark.integration

BROKER_NAME: Final = "broker-a"
SCAN_INTERVAL_MS: Final = 200
REGISTER_PERIOD_MS: Final = 1000
WAIT_S: Final = 30.0


def broker_conf(namesrv: NamesrvProcess) -> str:
    return (
        "brokerIP1=127.0.0.1\n"
        f"namesrvAddr={namesrv.address}\n"
        f"registerNameServerPeriod={REGISTER_PERIOD_MS}\n"
        "mapedFileSizeCommitLog=16777216\n"
        "mapedFileSizeConsumeQueue=60000\n"
        "mqboxSendProcessorCount=1\n"
        "mqboxPullProcessorCount=1\n"
    )


@contextlib.contextmanager
def running_broker(
    home: Path, namesrv: NamesrvProcess, reap_pids: list[int]
) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """The appliance without its own name server; yields (supervisor, every PID it started)."""
    home.mkdir(parents=True, exist_ok=True)
    conf = home / "broker.conf"
    conf.write_text(broker_conf(namesrv), encoding="utf-8")
    arguments = ["--config", str(conf), "--broker-port", "0", "--no-namesrv"]
    with running_supervisor(home, arguments, reap_pids) as (process, ready, _output):
        yield process, family_of(process.pid, ready)


def family_of(supervisor_pid: int, ready: dict[str, Any]) -> list[int]:
    """The supervisor and everything it started: the roles of its ready line and its children."""
    pids = {supervisor_pid, *(int(pid) for pid in ready["roles"].values())}
    with contextlib.suppress(psutil.NoSuchProcess):
        pids |= {child.pid for child in psutil.Process(supervisor_pid).children(recursive=True)}
    return sorted(pids)


def survivors(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` still alive (not gone, not a zombie)."""
    alive = []
    for member in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if member.is_running() and member.status() not in (
                psutil.STATUS_ZOMBIE,
                psutil.STATUS_DEAD,
            ):
                alive.append(member)
    return alive


def signal_all(pids: list[int], signal_number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal_number)


def broker_routed(namesrv: NamesrvProcess) -> bool:
    """True when TBW102's route names broker-a; False when the name server answers 17."""
    with RemotingClient(namesrv.address, 2000) as client:
        route = namesrv_api.get_route(client, "TBW102")
    if route is None:
        return False
    return any(data.broker_name == BROKER_NAME for data in route.broker_datas)


def broker_in_cluster(namesrv: NamesrvProcess) -> bool:
    with RemotingClient(namesrv.address, 2000) as client:
        info = namesrv_api.cluster_info(client)
    return BROKER_NAME in info.broker_addr_table


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
    """Poll until `condition()`; the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_sigkilled_broker_loses_its_routes_when_its_connection_closes(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    expire_ms = 60_000  # far off: only the closed connection can remove the routes in time
    with running_namesrv(
        tmp_path / "namesrv", reap_pids, scan_interval_ms=SCAN_INTERVAL_MS, expire_ms=expire_ms
    ) as namesrv:
        with running_broker(tmp_path / "home", namesrv, reap_pids) as (process, family):
            wait_until("broker-a routed", lambda: broker_routed(namesrv))
            assert broker_in_cluster(namesrv)
            # psutil.Process remembers each start time: a pid reused by another test's process
            # after the kill is not mistaken for a survivor.
            processes = [psutil.Process(pid) for pid in family]
            signal_all(family, signal.SIGKILL)
            process.wait(WAIT_S)
            gone_s = wait_until("routes dropped", lambda: not broker_routed(namesrv))
            assert gone_s < expire_ms / 1000
            assert not broker_in_cluster(namesrv)
            # A killed process can still be tearing down its maps for a moment (state R).
            wait_until("the broker's processes gone", lambda: not survivors(processes))
        with RemotingClient(namesrv.address, 2000) as client:
            assert namesrv_api.get_route(client, "TBW102") is None  # TOPIC_NOT_EXIST
        assert namesrv.process.poll() is None  # the name server lives on
        assert namesrv.stop() == 0
        assert namesrv.statistics()["broker_evicted_count"] == 0


def test_a_stopped_broker_is_evicted_after_the_expiry_then_registers_again(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    expire_ms = 3000
    with running_namesrv(
        tmp_path / "namesrv", reap_pids, scan_interval_ms=SCAN_INTERVAL_MS, expire_ms=expire_ms
    ) as namesrv:
        with running_broker(tmp_path / "home", namesrv, reap_pids) as (process, family):
            wait_until("broker-a routed", lambda: broker_routed(namesrv))
            # Registering every second keeps a running broker routed past the expiry.
            time.sleep(expire_ms / 1000 + 1)
            assert broker_routed(namesrv)
            stopped_at = time.monotonic()
            signal_all(family, signal.SIGSTOP)
            try:
                wait_until("broker-a evicted", lambda: not broker_routed(namesrv))
                silent_s = time.monotonic() - stopped_at
                # The last registration came at most one period before the stop.
                assert silent_s >= (expire_ms - REGISTER_PERIOD_MS) / 1000
                assert not broker_in_cluster(namesrv)
                assert all(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in family)
            finally:
                signal_all(family, signal.SIGCONT)
            # Its next registration fails on the closed connection; the retry reconnects.
            wait_until("broker-a routed again", lambda: broker_routed(namesrv))
            assert stop_process(process) == 0
        assert namesrv.stop() == 0
        assert namesrv.statistics()["broker_evicted_count"] == 1
        assert "evicted after silence" in namesrv.log_text()

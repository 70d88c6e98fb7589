"""Goal: `mqbox start` binds the broker where mqboxListenAddress says and warns on stderr when
that address is reachable from other hosts while aclEnable is false, naming what anyone can then
do; the default start (loopback) prints no warning.

Method: the real `mqbox start --daemon` console script (tests/integration/test_cli_lifecycle.py's
helpers) on a fresh home, port 0 for both servers; a broker.conf with mqboxListenAddress=0.0.0.0
(every interface, port 0: nothing fixed is taken); the listening socket's address read from the
supervisor's sockets with psutil; `mqbox stop`, then every recorded pid killed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mqbox.server.home import HomeLayout
from tests.integration.test_cli_lifecycle import (
    address_of,
    appliance_pids,
    mqbox,
    processes_mentioning,
    start_daemon,
)
from tests.support.cli import REPO_ROOT

pytestmark = pytest.mark.integration


@pytest.fixture
def home(tmp_path: Path, reap_pids: list[int]) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    reap_pids.extend(appliance_pids(home))
    reap_pids.extend(process.pid for process in processes_mentioning(home))
    if HomeLayout(home).pid_path.exists():
        mqbox("stop", "--home", str(home), "--timeout-s", "20")


def listening_addresses(pids: list[int], port: int) -> set[str]:
    """The local addresses of the listening TCP sockets on `port` among `pids`' sockets."""
    found = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        for connection in connections:
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port:
                found.add(connection.laddr.ip)
    return found


def test_a_broker_on_every_interface_without_acl_starts_with_a_warning(
    home: Path, tmp_path: Path
) -> None:
    conf = tmp_path / "broker.conf"
    defaults = (REPO_ROOT / "etc" / "broker.conf").read_text(encoding="utf-8")
    conf.write_text(defaults + "\nmqboxListenAddress=0.0.0.0\n", encoding="utf-8")
    started = start_daemon(home, "--config", str(conf))
    assert started.returncode == 0, started.stderr
    warning = started.stderr
    assert "WARNING: aclEnable=false" in warning
    assert "the broker listens on 0.0.0.0" in warning
    assert "read every topic" in warning
    assert "docs/security.md" in warning
    host, port = address_of("broker", started.stdout)
    assert host == "127.0.0.1"  # brokerIP1: what clients are told
    assert listening_addresses(appliance_pids(home), port) == {"0.0.0.0"}
    with socket.create_connection((host, port), timeout=5):
        pass
    stopped = mqbox("stop", "--home", str(home), timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr


def test_the_default_start_on_loopback_prints_no_warning(home: Path) -> None:
    started = start_daemon(home)
    assert started.returncode == 0, started.stderr
    assert "WARNING" not in started.stderr
    assert "aclEnable" not in started.stderr
    _host, port = address_of("broker", started.stdout)
    assert listening_addresses(appliance_pids(home), port) == {"127.0.0.1"}
    stopped = mqbox("stop", "--home", str(home), timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr

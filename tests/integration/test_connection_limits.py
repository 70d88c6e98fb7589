"""Goal (issue 9, part 3): the broker's connections are bounded by configuration. Past
`mqboxConnectionCountMax` a connection is accepted and closed at once while the others keep being
served, and the reactor says so in its log; a connection that sends no request for
`serverChannelMaxIdleTimeSeconds` is closed while an active one stays; the supervisor raises the
soft descriptor limit to the hard one for every role; out of descriptors (EMFILE) the reactor
backs off instead of spinning on its listening socket.

Method: the real appliance (tests/support/appliance.py) with a broker.conf that shrinks the
limits and one reactor, driven with raw sockets and FrontClient. The descriptor tests set the
supervisor's RLIMIT_NOFILE before exec; the reactor's CPU is read with psutil over one second
while more connections wait in the listen backlog than the reactor has descriptors for (before
the back-off this measured about 100 % of a core).
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Final

import psutil
import pytest

from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.raw_sockets import closed_by_peer, cpu_percent_over, soft_file_limit

pytestmark = pytest.mark.integration

WAIT_S: Final = 10.0
CPU_PERCENT_MAX: Final = 20.0
ONE_REACTOR: Final = BROKER_CONF + "mqboxReactorCount=1\n"


def connect(appliance: Appliance) -> socket.socket:
    return socket.create_connection(("127.0.0.1", appliance.broker_port), timeout=WAIT_S)


def role_log(appliance: Appliance, role_id: str) -> str:
    return (appliance.home / "logs" / f"{role_id}.log").read_text(errors="replace")


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    pids: list[int] = []
    conf = ONE_REACTOR + "mqboxConnectionCountMax=8\n"
    with running_appliance(tmp_path / "home", pids, conf) as appliance:
        kept = [connect(appliance) for _ in range(7)]
        with contextlib.closing(appliance.client()) as client:  # the eighth, and in use
            assert client.call(MQBOX_NOOP).code == 0
            refused = [connect(appliance) for _ in range(3)]
            try:
                assert all(closed_by_peer(sock, WAIT_S) for sock in refused)
                assert not any(closed_by_peer(sock, 0.2) for sock in kept)
                assert client.call(MQBOX_NOOP).code == 0
            finally:
                for sock in (*kept, *refused):
                    sock.close()
            # Closed connections make room again.
            deadline = time.monotonic() + WAIT_S
            while True:
                with connect(appliance) as late:
                    if not closed_by_peer(late, 0.2):
                        break
                assert time.monotonic() < deadline, "no room after the others closed"
        assert "mqboxConnectionCountMax" in role_log(appliance, "reactor.0")


def test_an_idle_connection_is_closed_and_an_active_one_kept(tmp_path: Path) -> None:
    pids: list[int] = []
    conf = ONE_REACTOR + "serverChannelMaxIdleTimeSeconds=1\n"
    with (
        running_appliance(tmp_path / "home", pids, conf) as appliance,
        contextlib.closing(appliance.client()) as active,
        connect(appliance) as idle,
    ):
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            assert active.call(MQBOX_NOOP).code == 0
            time.sleep(0.3)
        assert closed_by_peer(idle, 0.1)


def test_the_soft_descriptor_limit_is_raised_for_every_role(tmp_path: Path) -> None:
    pids: list[int] = []
    with running_appliance(
        tmp_path / "home", pids, ONE_REACTOR, file_limit=(256, 4096)
    ) as appliance:
        assert {soft_file_limit(pid) for pid in appliance.roles.values()} == {4096}


def test_out_of_descriptors_the_reactor_backs_off_instead_of_spinning(tmp_path: Path) -> None:
    pids: list[int] = []
    with running_appliance(
        tmp_path / "home", pids, ONE_REACTOR, file_limit=(160, 160)
    ) as appliance:
        reactor = psutil.Process(appliance.roles["reactor.0"])
        room = 160 - reactor.num_fds()
        sockets = [connect(appliance) for _ in range(room + 40)]
        try:
            cpu_percent = cpu_percent_over(reactor.pid, 1.0)
            assert cpu_percent < CPU_PERCENT_MAX, f"{cpu_percent:.0f} % of a core"
            # Freeing descriptors lets the waiting connections in.
            for sock in sockets[:60]:
                sock.close()
            with contextlib.closing(appliance.client()) as client:
                assert client.call(MQBOX_NOOP).code == 0
        finally:
            for sock in sockets:
                sock.close()
        assert "accept failed" in role_log(appliance, "reactor.0")

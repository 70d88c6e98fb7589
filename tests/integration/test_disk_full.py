"""Goal: a full disk is an operating error, not a crash and not damage. Sends get RocketMQ's
SERVICE_NOT_AVAILABLE (14) with a remark that says the disk is full; no role dies; every message
acknowledged before stays readable, exactly once and in order; and sends are served again as
soon as space returns, with no restart. Two ways to run out: the refuse ratio (RocketMQ's 90 %
of the disk used) and a segment that cannot be reserved at a roll (posix_fallocate's ENOSPC)
while the ratio still allows writes.

Method: a tmpfs the test mounts (16 MiB) holds the store (storePathRootDir); a filler file in the
same tmpfs takes the space away and gives it back. The real appliance runs on it (tests/support/
appliance.py). A few messages of 2 KiB are sent, the filler leaves 1 or 3 MiB, and more are sent
to one queue until one is refused; the refusal code and
remark are checked, the role PIDs compared, every acknowledged message pulled and compared; the
filler is deleted and sends must succeed again within a few seconds; finally the broker is
stopped and started again on the same store, and everything acknowledged is read back once more.
Mounting needs root with CAP_SYS_ADMIN (the machines this project runs on give both); without
it the test is skipped and says so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psutil
import pytest

from mqbox.message import decode_record
from mqbox.protocol.codes import RequestCode, ResponseCode
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header
from tests.support.send_requests import send_to_queue_header

pytestmark = pytest.mark.integration

TMPFS_SIZE_BYTES: Final = 16 * 1024 * 1024
TOPIC: Final = "DiskFullTopic"
BODY_SIZE_BYTES: Final = 2048
WAIT_S: Final = 30.0


@contextlib.contextmanager
def small_filesystem(path: Path) -> Iterator[Path]:
    """A tmpfs of TMPFS_SIZE_BYTES mounted at `path` for the test; skipped if mounting is not
    allowed here."""
    path.mkdir(parents=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE_BYTES},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def broker_conf(store_root: Path, segment_size_bytes: int) -> str:
    return (
        "brokerIP1=127.0.0.1\n"
        f"storePathRootDir={store_root}\n"
        f"mapedFileSizeCommitLog={segment_size_bytes}\n"
        "mapedFileSizeConsumeQueue=6000\n"
        "maxMessageSize=65536\n"
        "flushIntervalCommitLog=100\n"
        "mqboxSendProcessorCount=1\n"
        "mqboxPullProcessorCount=1\n"
    )


def send(client: FrontClient, number: int) -> tuple[int, str]:
    """(response code, remark) of one send of message `number` to queue 0."""
    header = send_to_queue_header(TOPIC)
    body = f"{number:08}".encode() * (BODY_SIZE_BYTES // 8)
    response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), body)
    return response.code, response.remark or ""


def pull_bodies(client: FrontClient, end: int) -> list[bytes]:
    """The bodies of queue 0, indexes [0, end)."""
    bodies: list[bytes] = []
    queue_index = 0
    deadline = time.monotonic() + WAIT_S
    while queue_index < end:
        assert time.monotonic() < deadline, f"only {queue_index} of {end} messages"
        header = pull_everything_header(TOPIC, queue_index)
        response = client.call(RequestCode.PULL_MESSAGE, header.to_ext())
        if response.code == ResponseCode.PULL_NOT_FOUND:
            time.sleep(0.05)
            continue
        assert response.code == ResponseCode.SUCCESS, (response.code, response.ext_fields)
        position = 0
        while position < len(response.body):
            message = decode_record(response.body, position)
            assert message.queue_index == len(bodies)  # in order, each once
            bodies.append(message.body)
            position += message.size_bytes
        queue_index = int(response.ext_fields["nextBeginOffset"])
    return bodies


def fill(path: Path, leave_free_bytes: int) -> None:
    """Grow the filler file at `path` until the file system has about `leave_free_bytes` free."""
    usage = os.statvfs(path.parent)
    free_bytes = usage.f_bavail * usage.f_frsize
    grow_bytes = max(free_bytes - leave_free_bytes, 0)
    with path.open("ab") as file:
        file.write(b"\xee" * grow_bytes)


def send_until_refused(client: FrontClient, first: int) -> tuple[int, int, str]:
    """Send from `first` on until one is refused: (how many were acknowledged, code, remark)."""
    number = first
    while True:
        code, remark = send(client, number)
        if code != ResponseCode.SUCCESS:
            return number, code, remark
        number += 1
        assert number - first < 10_000, "the disk never filled"


def expected_body(number: int) -> bytes:
    return f"{number:08}".encode() * (BODY_SIZE_BYTES // 8)


def same_pids(appliance: Appliance) -> bool:
    return all(psutil.pid_exists(pid) for pid in appliance.role_pids)


@pytest.mark.parametrize(
    ("segment_size_bytes", "leave_free_bytes", "remark_says"),
    [
        # 1 MiB left of 16: over 90 % used, the ratio refuses the next send.
        (4 * 1024 * 1024, 1024 * 1024, "at which writes are refused"),
        # 3 MiB left: under 90 %, but the next 4 MiB segment cannot be reserved at the roll.
        (4 * 1024 * 1024, 3 * 1024 * 1024, "No space left on device"),
    ],
)
def test_a_full_disk_refuses_sends_clearly_keeps_everything_and_recovers(
    tmp_path: Path,
    reap_pids: list[int],
    segment_size_bytes: int,
    leave_free_bytes: int,
    remark_says: str,
) -> None:
    with small_filesystem(tmp_path / "small") as mount:
        store_root = mount / "store"
        filler = mount / "filler"
        home = tmp_path / "home"
        conf = broker_conf(store_root, segment_size_bytes)
        with running_appliance(home, reap_pids, conf) as appliance:
            client = appliance.client()
            try:
                for number in range(5):
                    assert send(client, number) == (ResponseCode.SUCCESS, ""), number
                fill(filler, leave_free_bytes)
                acked, code, remark = send_until_refused(client, 5)
                assert code == ResponseCode.SERVICE_NOT_AVAILABLE, (code, remark)
                assert remark_says in remark, remark
                assert send(client, acked)[0] == ResponseCode.SERVICE_NOT_AVAILABLE
                assert same_pids(appliance), "a role died on a full disk"
                assert pull_bodies(client, acked) == [expected_body(n) for n in range(acked)]

                filler.unlink()
                deadline = time.monotonic() + WAIT_S
                while send(client, acked)[0] != ResponseCode.SUCCESS:
                    assert time.monotonic() < deadline, "sends were not served again"
                    time.sleep(0.2)
                acked += 1
                for number in range(acked, acked + 20):
                    assert send(client, number) == (ResponseCode.SUCCESS, ""), number
                acked += 20
                assert pull_bodies(client, acked) == [expected_body(n) for n in range(acked)]
                assert same_pids(appliance)
            finally:
                client.close()
            assert appliance.stop() == 0

        with running_appliance(home, reap_pids, conf) as appliance:
            client = appliance.client()
            try:
                assert pull_bodies(client, acked) == [expected_body(n) for n in range(acked)]
                header = pull_everything_header(TOPIC, acked)
                response = client.call(RequestCode.PULL_MESSAGE, header.to_ext())
                assert response.code == ResponseCode.PULL_NOT_FOUND
            finally:
                client.close()
            assert appliance.stop() == 0

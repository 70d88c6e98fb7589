"""Goal (issue 9, part 3): what the appliance creates is readable by its own user only: every
file it writes under its home (store segments, consume queues, the index, config files, the
checkpoint, the abort file, locks, run files, logs) is created 0600 and every directory 0700,
whatever the umask of whoever started it; so are its shared-memory objects and spill files.

Method: the real appliance (tests/support/appliance.py) started from this test's process with
the common umask 022, in a fresh home. A message is sent (commit log, consume queue, index), a
consumer group heartbeats (subscriptionGroup.json, its retry topic in topics.json, the pulls'
subscription file), an offset is committed (consumerOffset.json at the stop); a message over the
rings' inline maximum makes spill files, whose modes are read while they exist. /dev/shm is
listed while the broker runs, the home after the orderly stop, which writes the checkpoint.
The test's own files (broker.conf, the output file) are not the appliance's and are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from mqbox.ipc import names
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader
from tests.support.appliance import running_appliance

pytestmark = pytest.mark.integration

TEST_OWN_FILES: Final = frozenset({"broker.conf", "supervisor.out"})
SPILL_ATTEMPT_COUNT: Final = 5
BIG_BODY_SIZE_BYTES: Final = 3 * 1024 * 1024  # over the 2 MiB inline maximum of a 4 MiB ring


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def loose_modes(paths: list[Path]) -> list[str]:
    """`path mode` for each path that group or others may read, write or enter."""
    found = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            mode = path.lstat().st_mode
            if stat.S_IMODE(mode) & 0o077:
                found.append(f"{path} {stat.S_IMODE(mode):o}")
    return found


def send_header(topic: str) -> dict[str, str]:
    header = SendMessageRequestHeader("PG", topic, "TBW102", 1, 0, 0, int(time.time() * 1000), 0)
    return header.to_ext()


def test_files_directories_and_shared_memory_are_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pids: list[int] = []
    shm_seen: list[Path] = []
    with (
        umask(0o022),
        running_appliance(home, pids) as appliance,
        contextlib.closing(appliance.client()) as client,
        contextlib.closing(appliance.client()) as big,
    ):
        assert client.call(RequestCode.SEND_MESSAGE, send_header("ModeTopic"), b"m").code == 0
        heartbeat = {
            "clientID": "1-127.0.0.1@MODES",
            "consumerDataSet": [
                {
                    "groupName": "ModeGroup",
                    "consumeType": 1,
                    "messageModel": 1,
                    "consumeFromWhere": 0,
                    "subscriptionDataSet": [{"topic": "ModeTopic", "subString": "*"}],
                }
            ],
        }
        response = client.call(RequestCode.HEART_BEAT, {}, json.dumps(heartbeat).encode())
        assert response.code == ResponseCode.SUCCESS, response.remark
        # A spill file lives only while its frame is in flight: under load the poll below can
        # miss it, so the big send is repeated (each is stored and answered) until one is seen.
        for _ in range(SPILL_ATTEMPT_COUNT):
            opaque = big.request(
                RequestCode.SEND_MESSAGE, send_header("ModeTopic"), b"b" * BIG_BODY_SIZE_BYTES
            )
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and not any(
                "spill" in path.name for path in shm_seen
            ):
                shm_seen.extend(names.instance_paths(appliance.instance))
                shm_seen.extend(
                    path
                    for path in names.SHM_DIRECTORY.iterdir()
                    if path.name.startswith(f"mqbox.{appliance.instance}.spill")
                )
            (stored,) = big.responses(1)
            assert (stored.opaque, stored.code) == (opaque, ResponseCode.SUCCESS), stored.remark
            if any("spill" in path.name for path in shm_seen):
                break
        assert any("spill" in path.name for path in shm_seen), "no spill file was seen"
        assert loose_modes(shm_seen) == []
        commit = {"consumerGroup": "ModeGroup", "topic": "ModeTopic", "queueId": "0"}
        update = big.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**commit, "commitOffset": "1"})
        assert update.code == ResponseCode.SUCCESS, update.remark
        assert appliance.stop() == 0
    written = [
        Path(root) / name
        for root, directories, files in os.walk(home)
        for name in (*directories, *files)
        if not (Path(root) == home and name in TEST_OWN_FILES)
    ]
    kinds = {path.name for path in written}
    for expected in ("commitlog", "consumequeue", "index", "checkpoint", "topics.json"):
        assert expected in kinds, f"{expected} was not written: {sorted(kinds)}"
    assert {"subscriptionGroup.json", "consumerOffset.json", "supervisor.log"} <= kinds
    assert loose_modes(written) == []

"""Start a real `python -m mqbox.namesrv` for a test and learn its port from the ready file.

Owns: the child process of one test, its ready, statistics and log files under the test's tmp
directory. Never: fixed ports or shared paths (xdist-safe: port 0, tmp_path). The caller passes
the `reap_pids` list of tests/conftest.py, so the process is SIGKILLed by PID whatever happens;
`stop()` is the orderly SIGTERM path for tests that check it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 30.0


@dataclass
class NamesrvProcess:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    ready_file: Path
    stats_file: Path
    log_file: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then wait; the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def statistics(self) -> dict[str, Any]:
        """The statistics file (written after each scan and at exit)."""
        document: dict[str, Any] = json.loads(self.stats_file.read_text(encoding="utf-8"))
        return document

    def log_text(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def running_namesrv(
    directory: Path,
    reap_pids: list[int],
    *,
    scan_interval_ms: int | None = None,
    expire_ms: int | None = None,
    config_file: Path | None = None,
    file_limit: tuple[int, int] | None = None,
) -> Iterator[NamesrvProcess]:
    """A name server on 127.0.0.1 port 0, ready; SIGKILLed by PID and reaped on the way out."""
    namesrv = start_namesrv(
        directory,
        reap_pids,
        scan_interval_ms=scan_interval_ms,
        expire_ms=expire_ms,
        config_file=config_file,
        file_limit=file_limit,
    )
    try:
        yield namesrv
    finally:
        if namesrv.process.poll() is None:
            os.kill(namesrv.process.pid, signal.SIGKILL)
        namesrv.process.wait(READY_TIMEOUT_S)


def start_namesrv(
    directory: Path,
    reap_pids: list[int],
    *,
    scan_interval_ms: int | None = None,
    expire_ms: int | None = None,
    config_file: Path | None = None,
    file_limit: tuple[int, int] | None = None,
) -> NamesrvProcess:
    """Start a name server on 127.0.0.1 port 0 and wait until its ready file appears.
    `file_limit` (soft, hard) is its RLIMIT_NOFILE, set in the child before exec.

    The caller must reap the process (`running_namesrv` does): `reap_pids` kills it, but a Popen
    dropped while its child runs raises a ResourceWarning, which the suite turns into an error.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ready_file = directory / "namesrv.ready"
    stats_file = directory / "namesrv.stats.json"
    log_file = directory / "namesrv.log"
    command = [
        sys.executable,
        "-m",
        "mqbox.namesrv",
        "--listen-port",
        "0",
        "--host",
        "127.0.0.1",
        "--ready-file",
        str(ready_file),
        "--stats-file",
        str(stats_file),
    ]
    if scan_interval_ms is not None:
        command += ["--scan-interval-ms", str(scan_interval_ms)]
    if expire_ms is not None:
        command += ["--expire-ms", str(expire_ms)]
    if config_file is not None:
        command += ["--config", str(config_file)]
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, "PYTHONPATH": str(root)}
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=root,
            env=environment,
            preexec_fn=None
            if file_limit is None
            else functools.partial(set_file_limit, file_limit),
        )
    reap_pids.append(process.pid)
    try:
        return _wait_ready(process, ready_file, stats_file, log_file)
    except BaseException:
        process.kill()
        process.wait(READY_TIMEOUT_S)
        raise


def set_file_limit(limit: tuple[int, int]) -> None:
    """RLIMIT_NOFILE of the calling process (a child between fork and exec)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, limit)


def _wait_ready(
    process: subprocess.Popen[bytes], ready_file: Path, stats_file: Path, log_file: Path
) -> NamesrvProcess:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready_file.exists():
        status = process.poll()
        if status is not None:
            log_text = log_file.read_text(encoding="utf-8", errors="replace")
            raise AssertionError(f"namesrv exited {status} before it was ready:\n{log_text}")
        if time.monotonic() > deadline:
            raise AssertionError(f"namesrv not ready after {READY_TIMEOUT_S} s")
        time.sleep(0.02)
    ready = json.loads(ready_file.read_text(encoding="utf-8"))
    assert ready["pid"] == process.pid
    return NamesrvProcess(process, ready["host"], ready["port"], ready_file, stats_file, log_file)

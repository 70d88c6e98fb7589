"""Raw-socket checks shared by the connection-limit tests of the broker and the name server.

Owns: nothing but helpers over a socket or a process the caller started and stops.
"""

from __future__ import annotations

import resource
import socket
import time

import psutil


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """True if the server closes `sock` (EOF or reset) within timeout_s; it sends nothing."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def soft_file_limit(pid: int) -> int:
    """The soft RLIMIT_NOFILE of process `pid`."""
    soft, _hard = psutil.Process(pid).rlimit(resource.RLIMIT_NOFILE)
    return int(soft)


def cpu_percent_over(pid: int, seconds: float) -> float:
    """Percent of one core that process `pid` used over the next `seconds`."""
    process = psutil.Process(pid)
    process.cpu_percent(None)
    time.sleep(seconds)
    return float(process.cpu_percent(None))

"""Process resources that the broker's reactors and the name server bound the same way.

Owns: raising the soft RLIMIT_NOFILE to the hard limit at start (`raise_file_limit`), the rule
for an accept that failed for lack of resources (`accept_out_of_resources`: EMFILE, ENFILE,
ENOBUFS, ENOMEM) and what follows it (`AcceptBackoff`: the caller takes its listening socket out
of its poll for ACCEPT_BACKOFF_NS instead of polling it again at once, because a level-triggered
poll of a listener with a full backlog returns at once, forever, which is a loop at 100 % of a
core), `RateLimitedLog`, one warning line per interval for a condition that may recur
thousands of times a second (refused connections), and `FailureLog`, the traceback log of a
request boundary (an unexpected exception a process caught and survived), and the allocator's
thresholds for the payloads the roles copy (`keep_large_allocations`), and the one reader of a
process's /proc/<pid>/stat fields (`process_stat_fields`). Never: sockets,
selectors or policy about which connection to close; it imports only the standard library, so
both the broker and the name server use it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

ACCEPT_BACKOFF_NS: Final = 100_000_000  # the listener rests this long after EMFILE and friends
LOG_INTERVAL_NS_DEFAULT: Final = 10_000_000_000
NR_OPEN_PATH: Final = Path("/proc/sys/fs/nr_open")
NR_OPEN_DEFAULT: Final = 1 << 20  # Linux's default fs.nr_open
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


# glibc's mallopt(3) parameters.
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
# Blocks below this come from the heap, not from a map of their own: a ring's largest inline
# payload (2 MiB for a 4 MiB ring) with room to spare.
MMAP_THRESHOLD_BYTES: Final = 4 << 20
# The heap gives back its free top only past this much, so a process keeps at most this much
# freed memory for its next large block.
TRIM_THRESHOLD_BYTES: Final = 8 << 20


def keep_large_allocations() -> bool:
    """Have this process's allocator (glibc) serve blocks of up to MMAP_THRESHOLD_BYTES from its
    heap and keep up to TRIM_THRESHOLD_BYTES of freed heap: a role that copies a request's body
    of a few hundred KB (a batched send) then reuses the pages of the last one, instead of
    mapping fresh ones and faulting each 4 KiB in again (glibc's default maps blocks of 128 KiB
    and more on their own and unmaps them on free). Forked children inherit it. False where
    mallopt is not glibc's (the defaults stay)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    )


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (to fs.nr_open when the hard
    limit is unlimited); returns (soft limit before, soft limit now). Children inherit it. A
    refusal by the kernel leaves the limit as it was: the caller logs both numbers."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            target = int(NR_OPEN_PATH.read_text(encoding="ascii"))
        except (OSError, ValueError):
            target = NR_OPEN_DEFAULT
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        return soft, soft
    return soft, target


def accept_out_of_resources(error: OSError) -> bool:
    """True if accept(2) failed because the process or the system ran out of descriptors or
    memory: the listener must rest (ACCEPT_BACKOFF_NS), not be polled again at once."""
    return error.errno in _OUT_OF_RESOURCES


class RateLimitedLog:
    """Warnings about one recurring condition, at most one line per `interval_ns`; the next line
    that is written says how many were held back since the last one."""

    def __init__(self, logger: logging.Logger, interval_ns: int = LOG_INTERVAL_NS_DEFAULT):
        assert interval_ns > 0
        self.logger = logger
        self.interval_ns = interval_ns
        self._next_ns = 0
        self._held_back_count = 0

    def warning(self, message: str, *args: object) -> None:
        now_ns = time.monotonic_ns()
        if now_ns < self._next_ns:
            self._held_back_count += 1
            return
        self._next_ns = now_ns + self.interval_ns
        if self._held_back_count:
            message += " (%d more like it since the last report)"
            args = (*args, self._held_back_count)
            self._held_back_count = 0
        self.logger.warning(message, *args)


class AcceptBackoff:
    """When a listening socket rests after an accept failed for lack of resources. The owner
    unregisters the socket from its poll after `rest`, registers it again once `resume_due`
    says so, and bounds its poll's timeout by `resume_in_ms`."""

    def __init__(self, logger: logging.Logger) -> None:
        self.resume_ns: int | None = None
        self.rest_count = 0
        self._log = RateLimitedLog(logger)

    @property
    def resting(self) -> bool:
        return self.resume_ns is not None

    def rest(self, error: OSError, connection_count: int) -> None:
        assert accept_out_of_resources(error)
        self._log.warning(
            "accept failed (%s) with %d connections open: not accepting for %d ms",
            error.strerror,
            connection_count,
            ACCEPT_BACKOFF_NS // 1_000_000,
        )
        self.rest_count += 1
        self.resume_ns = time.monotonic_ns() + ACCEPT_BACKOFF_NS

    def resume_due(self, now_ns: int) -> bool:
        """True once, when the rest is over: the owner polls its listener again."""
        if self.resume_ns is None or now_ns < self.resume_ns:
            return False
        self.resume_ns = None
        return True

    def resume_in_ms(self, now_ns: int) -> int | None:
        """Milliseconds until the rest is over (rounded up), or None when not resting."""
        if self.resume_ns is None:
            return None
        return max(0, -(-(self.resume_ns - now_ns) // 1_000_000))


FAILURE_TRACEBACK_COUNT_MAX: Final = 5
FAILURE_LOG_INTERVAL_NS: Final = 60_000_000_000


class FailureLog:
    """Unexpected exceptions a role caught at a request boundary and survived: each is counted,
    and logged with its traceback at most FAILURE_TRACEBACK_COUNT_MAX times a minute; the rest of
    the minute's failures get one summary line when the next minute starts. The bound matters: a
    client repeating a request that fails would otherwise fill the disk with tracebacks."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        traceback_count_max: int = FAILURE_TRACEBACK_COUNT_MAX,
        interval_ns: int = FAILURE_LOG_INTERVAL_NS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        assert traceback_count_max > 0
        assert interval_ns > 0
        self._logger = logger
        self._traceback_count_max = traceback_count_max
        self._interval_ns = interval_ns
        self._clock_ns = clock_ns
        self._interval_start_ns = clock_ns()
        self._logged_in_interval = 0
        self._unlogged_in_interval = 0
        self.failure_count = 0

    def record(self, what: str, error: BaseException) -> None:
        """Count `error`, caught while doing `what`; log it if this minute's budget allows."""
        self.failure_count += 1
        now_ns = self._clock_ns()
        if now_ns - self._interval_start_ns >= self._interval_ns:
            if self._unlogged_in_interval:
                self._logger.error(
                    "%d more unexpected failures were not logged in the last minute",
                    self._unlogged_in_interval,
                )
            self._interval_start_ns = now_ns
            self._logged_in_interval = 0
            self._unlogged_in_interval = 0
        if self._logged_in_interval >= self._traceback_count_max:
            self._unlogged_in_interval += 1
            return
        self._logged_in_interval += 1
        self._logger.error(
            "unexpected %s while %s (survived; %d so far)",
            type(error).__name__,
            what,
            self.failure_count,
            exc_info=error,
        )


def process_stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from the third (state) on, so proc(5)'s field n is at index
    n - 3; None if the process is gone. The command name before them may hold spaces and
    parentheses, so they start after its last ")". One open and one read, no file object: the
    statistics sampler calls this for every role each second."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[data.rfind(b")") + 2 :].split()

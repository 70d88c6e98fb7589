"""Process resources that the broker's reactors and the name server bound the same way.

Owns: raising the soft RLIMIT_NOFILE to the hard limit at start (`raise_file_limit`), the rule
for an accept that failed for lack of resources (`accept_out_of_resources`: EMFILE, ENFILE,
ENOBUFS, ENOMEM) and what follows it (`AcceptBackoff`: the caller takes its listening socket out
of its poll for ACCEPT_BACKOFF_NS instead of polling it again at once, because a level-triggered
poll of a listener with a full backlog returns at once, forever, which is a loop at 100 % of a
core), and `RateLimitedLog`, one warning line per interval for a condition that may recur
thousands of times a second (refused connections). Never: sockets, selectors or policy about
which connection to close; it imports only the standard library, so both the broker and the
name server use it.
"""

from __future__ import annotations

import errno
import logging
import resource
import time
from pathlib import Path
from typing import Final

ACCEPT_BACKOFF_NS: Final = 100_000_000  # the listener rests this long after EMFILE and friends
LOG_INTERVAL_NS_DEFAULT: Final = 10_000_000_000
NR_OPEN_PATH: Final = Path("/proc/sys/fs/nr_open")
NR_OPEN_DEFAULT: Final = 1 << 20  # Linux's default fs.nr_open
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


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

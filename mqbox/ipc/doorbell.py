"""The doorbell of one ring: a named FIFO a sleeping consumer waits on, and the full memory fence.

Owns: creating, opening, ringing, clearing and removing the FIFO, and `memory_fence()`. Never: the
decision when to ring or sleep; ring.py makes it from the waiting flag in the segment's doorbell
line (layout.py), so a producer rings only while its consumer sleeps and the hot path makes no
system call.

Why a named FIFO. The reactor waits on sockets and rings in one epoll, so the doorbell must be a
file descriptor: a posix_ipc semaphore cannot be polled. That leaves an eventfd or a FIFO. An
eventfd has no name: it must be inherited at spawn, so the supervisor would have to hand the right
numbers to every role it starts or restarts, and a test or an admin tool could not attach to a
running ring. A FIFO has a name, so attaching to a ring by its shared-memory name finds its
doorbell too, and a restarted role reopens both. It lives beside the segment in /dev/shm (tmpfs,
no disk I/O) as `<segment>.doorbell`, so the supervisor's one sweep of an instance's names
removes both (names.py). Each side opens it O_RDWR | O_NONBLOCK: on Linux that open never blocks
and never fails for want of a peer, and the reader never sees end-of-file or POLLHUP when a writer
dies, so a dead producer does not make the consumer spin (fifo(7) documents the O_RDWR open).
Ringing writes one byte; a full pipe (EAGAIN) means the bell is already ringing, so nothing is
lost. The cost is the same write(2) an eventfd would take, paid once per sleep, not per parcel.

Memory ordering. mqbox assumes x86-64 (TSO): stores become visible in program order and loads are
not reordered with other loads, but a store may be delayed past a later load to another address.
The check-after-set handshake needs exactly that pair to stay in order on both sides:

    consumer: store waiting=odd; FENCE; load the header at tail (is a parcel published?)
    producer: store the header (publish); FENCE; load waiting (is the consumer asleep?)

Without the fences each side may read the other's old value, the producer skips the bell and the
consumer sleeps on a published parcel: a lost wake-up. `memory_fence()` takes and releases a
thread-private `threading.Lock`. On Linux, CPython's lock is a POSIX semaphore (3.11 and 3.12:
acquire(blocking=False) is sem_trywait, release is sem_post; 3.13 made it a PyMutex whose lock and
unlock are sequentially consistent compare-and-swaps). POSIX lists sem_trywait and sem_post among
the functions that synchronise memory (XBD 4.12), and glibc implements both on x86-64 with a
`lock cmpxchg` on the semaphore word (for sem_trywait: when the semaphore is free, which a
thread-private lock always is); a locked instruction is a full barrier: no load passes it and no
store is held back behind it (Intel SDM vol. 3A, "Memory Ordering in P6 and More Recent Processor
Families"; AMD's APM vol. 2 orders locked instructions the same way). It costs about 0.3 us here
(two C calls without argument conversion), paid once per batch by the producer and once per sleep
by the consumer; the earlier pthread_spin_trylock through ctypes gave the same barrier for 1.4 us.
numba offers no fence on the CPU short of an LLVM intrinsic, which only mqbox/_jit.py could
define; Linux membarrier(2) could move the whole cost to the sleeping side, but it needs
registration in every producer and costs more to explain than it saves.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading
from pathlib import Path
from typing import Final

from mqbox.errors import ConfigError

_RING_BYTE: Final = b"\x01"
_CLEAR_CHUNK_SIZE_BYTES: Final = 4096
_FIFO_MODE: Final = 0o600


class _FenceLock(threading.local):
    """One lock per thread, so the lock is always free when its thread takes it: sem_trywait on a
    taken semaphore returns without the locked instruction, and then it fences nothing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


_fence_lock = _FenceLock()


def memory_fence() -> None:
    """A full memory barrier: no load after it is done before a store ahead of it is visible."""
    lock = _fence_lock.lock
    taken = lock.acquire(False)  # sem_trywait: the lock cmpxchg inside is the barrier
    assert taken, "the fence lock is thread-private and never held between two calls"
    lock.release()  # sem_post: a second barrier


class Doorbell:
    """One side's descriptor of a ring's FIFO. The producer rings; the consumer waits and clears.

    Owned by one process; the descriptor number means nothing in another process (each side opens
    the FIFO by path). Not thread-safe.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, path: Path) -> Doorbell:
        """Make the FIFO at `path` (FileExistsError if anything is there) and open it."""
        os.mkfifo(path, _FIFO_MODE)
        try:
            return cls.open(path)
        except BaseException:
            path.unlink()
            raise

    @classmethod
    def open(cls, path: Path) -> Doorbell:
        """Open the FIFO at `path`; FileNotFoundError if it was never created or was removed,
        ConfigError if something else has its name."""
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISFIFO(mode):
            os.close(fd)
            raise ConfigError(f"doorbell {path} is not a FIFO")
        return cls(path, fd)

    def fileno(self) -> int:
        """The descriptor to register with epoll or poll, readable while the bell has rung."""
        assert self._fd >= 0, "doorbell is closed"
        return self._fd

    def ring_nowait(self) -> None:
        """Wake the waiter: one byte into the FIFO. A full FIFO already wakes it, so EAGAIN is
        fine."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.fileno(), _RING_BYTE)

    def clear_nowait(self) -> int:
        """Take every pending ring out of the FIFO; returns how many bytes were pending.

        A read from a pipe returns everything pending up to its size, so a short read means the
        FIFO is empty: no second read(2) that fails with EAGAIN (and no BlockingIOError, which
        costs more than the system call in Python) in the usual case of one pending byte."""
        cleared_size_bytes = 0
        while True:
            try:
                chunk = os.read(self.fileno(), _CLEAR_CHUNK_SIZE_BYTES)
            except BlockingIOError:
                return cleared_size_bytes
            assert chunk, "a FIFO opened O_RDWR never reports end-of-file"
            cleared_size_bytes += len(chunk)
            if len(chunk) < _CLEAR_CHUNK_SIZE_BYTES:
                return cleared_size_bytes

    def wait_rung(self, timeout_ms: int) -> bool:
        """Sleep until the bell rings or `timeout_ms` passes (negative: no limit); True if rung.
        Leaves the ring pending: the caller clears it once it has looked at the ring."""
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        # poll(2) restarts after a signal handler returns (PEP 475), with the remaining timeout.
        return bool(poller.poll(timeout_ms if timeout_ms >= 0 else None))

    def close(self) -> None:
        """Close this side's descriptor; the FIFO stays for the other side. Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        """Remove the FIFO from /dev/shm; open descriptors keep working. Missing is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

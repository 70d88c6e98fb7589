"""The ring transport: how a role moves parcels (parcels.py) over its rings.

Owns: the two ends every role uses (an Outbox per ring it writes, which batches, spills and
applies back-pressure; an Inbox per ring it drains, which quarantines a parcel that stopped its
consumer twice; one Sleeper, which spins and then sleeps on the rings' doorbells), the spill files
of payloads too big for a ring (SpillWriter, read_spill) and their budget (SpillBudget). Never:
a parcel's layout (parcels.py), the ring protocol itself (mqbox/ipc/ring.py), or what a parcel
means (the roles).

Spill budget (issue 9). Spill files are memory (/dev/shm), and a SPILLED parcel is a few dozen
bytes in its ring, so the rings' back-pressure alone let 96 clients that never read push them
past 1 GB. Two rules bound them:
- An Outbox counts the file bytes of the SPILLED parcels it has staged in `pending_size_bytes`,
  so a role stops reading its inputs while big payloads wait for a ring, as for inline ones.
- `SpillBudget` holds the instance's spill files to mqboxSpillBytesMax. It is asked where new
  bytes would enter the pipeline as a spill file: the reactor, for a client's frame over the
  inline maximum, keeps that frame (and stops reading its connection) until there is room; a
  processor, for a reply over it, answers SYSTEM_BUSY (2) with a remark instead. A role that
  only carries a payload on (the codec's COMMAND and RESPONSE, the send processor's APPEND)
  never waits: blocking there could stall the pipeline that frees the room. Such a hop holds
  the payload's old and new file until it releases its batch, so the files may reach twice the
  budget for a moment. A payload larger than the whole budget spills when no other file exists.
  The budget reads /dev/shm itself (a directory scan, only for payloads over the inline
  maximum, whose copy costs far more): no shared counter to drift after a crash, and a file a
  crash orphaned counts, since it holds memory too.

Spinning (issue 15). A role that waits may poll its rings for a while before it sleeps (Sleeper),
because a wake-up through a doorbell costs the producer a write(2) and the sleeper its return
from epoll, 30-50 us on this VM when the CPU it lands on has halted. A spin pays only when a core
is free for it: on 2 cores every role a request visits used to spin up to 1 ms after its part,
so the spinners took the core the next hop needed and both cores stayed busy for about 2 ms
after each request. Two rules keep what spinning buys and drop the rest:
- The gate (SpinGate). Each role's activity word in the control block is 1 while it works or
  spins and 0 while it sleeps. A role spins only while the roles on a core, itself included, are
  no more than the cores it may run on (config.usable_core_count, the number the pools are
  sized by), and stops as soon as they are more. On 2 cores that leaves the role at work and one
  spinner; on a host with more cores than busy roles every role spins as before. A role that
  awaits answers (below) spins its budget whatever the gate says: its answer is the next step
  of a request in flight, and side by side on 2 cores (docs/BENCHMARKS.md, issue 15, "awaiting
  roles pass the gate") that cut hop.py's p50 to 0.83x and the C++ client's to 0.87x.
- Two budgets. A role that has sent parcels whose answers will come back to it (the reactor and
  the codec with requests in flight, the send processor with appends at the store writer) waits
  with `awaiting=True`; each kind of wait adapts a budget of its own. The short waits for an
  answer inside a request keep that budget high, and the wait for the next request, which a
  client that sends one request every 50 ms never rewards, halves its own to nothing, so an idle
  broker stops spinning after the last answer went out instead of after about 2 ms.
The doorbell stays a FIFO (mqbox/ipc/doorbell.py says why; docs/BENCHMARKS.md, issue 15, has
the futex and eventfd figures beside it).

Large payloads (issue 15). An Outbox stages small parcels in one buffer and writes them as one
batch per flush, but a parcel of DIRECT_WRITE_SIZE_BYTES_MIN or more (a batched SEND: 200 KB for
1,000 messages of 128 B) is written straight into the ring when nothing staged is left before it:
staging it cost a copy, and the staging buffer, grown to hold it and freed at each flush, cost
a fresh allocation with a page fault per 4 KiB touched (and an mremap as it grew). Profiled on
bench/produce.py, that allocation was about 40 % of the codec's and the worker's CPU. Order is
kept: what is staged is flushed first, and a parcel the ring cannot take now is staged.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import logging
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final, Protocol, TypeAlias

import numpy as np

from mqbox.config import usable_core_count
from mqbox.ipc import names
from mqbox.ipc.layout import PARCEL_HEADER_SIZE_BYTES
from mqbox.ipc.ring import SMALL_BATCH_COUNT_MAX, ParcelBatch, Ring
from mqbox.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from mqbox.server import runtime
from mqbox.server.parcels import (
    COMMAND,
    SPILL_HEAD_STRUCT,
    SPILLED_FLAG,
    Buffer,
    RequestFailed,
    command_head_offset,
    pack_spill,
    spill_head_view,
    unpack_command_route,
)

log = logging.getLogger(__name__)

QuarantineHook: TypeAlias = Callable[[int, Buffer, int, int], None]

# Each role drains at most this many parcels per ring per turn (docs/style.md section 3).
BATCH_COUNT_MAX: Final = 256

# An Outbox writes a parcel whose last part is at least this long straight into its ring (module
# docstring, "Large payloads"); smaller ones are staged and batched.
DIRECT_WRITE_SIZE_BYTES_MIN: Final = 32 * 1024

# A spill file name's index runs 0..SPILL_INDEX_LIMIT - 1, then wraps (names.py allows 9 digits).
SPILL_INDEX_LIMIT: Final = 1_000_000_000

SPILL_ROLE_PREFIX: Final = "spill-"

# The longest adaptive spin of a role before it sleeps (Sleeper). The roles on a request's round
# trip (reactor, codec, worker, processors) spin up to about four round trips through the front,
# so that with one request in flight each finds its next parcel while it spins. At 50 us (the
# earlier default for all) bench/hop.py --inflight 1 on 2 shared cores was bistable: while the
# codec's and reactor's gaps stayed under 50 us they kept spinning, which also kept the CPUs from
# halting, and a request took ~230 us; after one slow hop their spins missed, every hop paid a
# wake-up through the FIFO on a halted CPU (30-50 us on this VM) and the p50 settled near 690 us
# (docs/BENCHMARKS.md, issue 4). At 1 ms it stays at 220-300 us. An idle role gives up after
# about 2 ms (the budget halves on each empty spin), and no role spins while the cores are taken
# or for new work that does not come (module docstring, "Spinning"). The other roles (store
# writer, dispatcher, schedule) keep 50 us: their parcels come in batches, where spinning costs
# CPU that bench/produce.py counts.
SPIN_NS_MAX_DEFAULT: Final = 50_000

REQUEST_SPIN_NS_MAX: Final = 1_000_000

# A wait after more than this many parcels handled since the last one sleeps without spinning:
# the role is in batch mode, where the wake-up is shared by the batch and a spinner would only
# keep a core from the roles that have work (it also stops the kernel from balancing them onto
# a core that would otherwise be idle). bench/hop.py --inflight 64 lost 10-15 % to spinning
# reactors without it.
SPIN_DRAINED_COUNT_MAX: Final = 8


class RingSpecLike(Protocol):
    """What attach_inboxes needs of a ring's description (topology.RingSpec has it)."""

    @property
    def name(self) -> str: ...

    @property
    def producer(self) -> str: ...


class SpillBudget:
    """The instance's spill files against one budget in bytes (module docstring, "Spill
    budget"). Any role may hold one; all of them see the same files."""

    def __init__(
        self, instance: str, size_bytes_max: int, directory: Path = names.SHM_DIRECTORY
    ) -> None:
        assert size_bytes_max > 0
        names.check_part("instance", instance)
        self.size_bytes_max = size_bytes_max
        self.directory = directory
        self.name_prefix = f"{names.NAME_PREFIX}.{instance}.{SPILL_ROLE_PREFIX}"
        self.refusal_count = 0

    def used_bytes(self) -> int:
        """Bytes of the instance's spill files now (files being written count what they hold)."""
        total = 0
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.startswith(self.name_prefix):
                    with contextlib.suppress(FileNotFoundError):
                        total += entry.stat(follow_symlinks=False).st_size
        return total

    def has_room_nowait(self, size_bytes: int) -> bool:
        """True if a payload of `size_bytes` may spill now: it fits beside the files there are,
        or there are none (so a payload larger than the budget still goes, alone)."""
        used_bytes = self.used_bytes()
        if used_bytes == 0 or used_bytes + size_bytes <= self.size_bytes_max:
            return True
        self.refusal_count += 1
        return False


class SpillWriter:
    """Names and writes the spill files of one producer role (`spill-<role>.<n>` in /dev/shm)."""

    def __init__(self, instance: str, role_id: str, directory: Path = names.SHM_DIRECTORY) -> None:
        self.role_part = SPILL_ROLE_PREFIX + role_id.replace(".", "-")
        names.check_part("role", self.role_part)
        self.instance = instance
        self.directory = directory
        self._index_next = 0
        self.spill_count = 0
        self.spill_size_bytes = 0

    def write(self, parts: Sequence[Buffer]) -> str:
        """Write `parts` back to back into a fresh file; returns its name (not its path)."""
        for _attempt in range(SPILL_INDEX_LIMIT):
            index = self._index_next
            self._index_next = (index + 1) % SPILL_INDEX_LIMIT
            name = names.shm_name(self.instance, self.role_part, index).removeprefix("/")
            path = self.directory / name
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue  # left by an earlier process of this role, still unread: skip it
            try:
                for part in parts:
                    view = memoryview(part)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
            except BaseException:
                os.close(fd)
                path.unlink()
                raise
            os.close(fd)
            self.spill_count += 1
            self.spill_size_bytes += sum(len(part) for part in parts)
            return name
        raise AssertionError("unreachable: every spill index is taken")


def quarantined_request_failed(
    parcel_type: int, buffer: Buffer, offset: int, role_id: str
) -> RequestFailed | None:
    """The SYSTEM_ERROR answer to a quarantined parcel (Inbox) if it is a COMMAND that wants a
    reply (not ONEWAY, not a client's response), else None."""
    if parcel_type & ~SPILLED_FLAG != COMMAND:
        return None
    head_offset = command_head_offset(parcel_type, buffer, offset)
    conn_id, opaque, _code, flag, serialize_type = unpack_command_route(buffer, head_offset)
    if flag & (FLAG_RESPONSE | FLAG_ONEWAY):
        return None
    remark = quarantine_remark(role_id)
    return RequestFailed(conn_id, opaque, ResponseCode.SYSTEM_ERROR, serialize_type, remark)


def quarantine_remark(role_id: str) -> str:
    """The remark of the answer to a quarantined request."""
    return f"mqbox: quarantined: this request stopped {role_id} twice"


def read_spill(
    buffer: Buffer, offset: int, directory: Path = names.SHM_DIRECTORY
) -> tuple[bytes, Path]:
    """The whole original payload of the SPILLED parcel at `offset` (head + file) and the file's
    path, which the caller unlinks after releasing the parcel. FileNotFoundError if the file is
    gone (a consumer died between unlinking and releasing: the parcel is lost)."""
    head_size, name_size, file_size = SPILL_HEAD_STRUCT.unpack_from(buffer, offset)
    head_offset = offset + SPILL_HEAD_STRUCT.size
    head = bytes(buffer[head_offset : head_offset + head_size])
    name = bytes(buffer[head_offset + head_size : head_offset + head_size + name_size]).decode()
    assert "/" not in name
    path = directory / name
    with path.open("rb") as file:
        tail = file.read()
    assert len(tail) == file_size, f"spill file {path} holds {len(tail)} of {file_size} bytes"
    return head + tail, path


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxStatistics:
    parcel_count_written: int
    batch_count_written: int
    direct_count_written: int  # large parcels written straight into the ring, never staged
    full_count: int  # flushes that left parcels behind
    spill_count: int
    spill_size_bytes: int


class Outbox:
    """Parcels for one out-ring, staged in one buffer and written as one batch per flush.

    Not thread-safe; one per (role, out-ring). A parcel whose payload is longer than the ring's
    inline maximum goes to a spill file (SpillWriter) and travels as a SPILLED parcel. What the
    ring cannot take now stays staged, in order, for the next flush: the caller stops reading its
    inputs while `pending_size_bytes` is above its high-water mark (back-pressure). That size
    counts the files of staged SPILLED parcels too (module docstring, "Spill budget").
    """

    def __init__(
        self,
        ring: Ring,
        spill_writer: SpillWriter,
        direct_write_size_bytes_min: int = DIRECT_WRITE_SIZE_BYTES_MIN,
    ) -> None:
        assert direct_write_size_bytes_min > 0
        self.ring = ring
        self.spill_writer = spill_writer
        self.payload_size_bytes_max = ring.payload_size_bytes_max
        self.direct_write_size_bytes_min = direct_write_size_bytes_min
        # Staged parcels: payloads back to back, and type, offset and size per parcel in arrays
        # that numpy reads in place (np.frombuffer), so a flush converts nothing.
        self._buffer = bytearray()
        self._types = array.array("i")
        self._offsets = array.array("q")
        self._sizes = array.array("q")
        # Staged SPILLED parcels as (index among the staged parcels, file bytes), in order.
        self._spilled: list[tuple[int, int]] = []
        self._spilled_size_bytes = 0
        self._parcel_count_written = 0
        self._batch_count_written = 0
        self._direct_count_written = 0
        self._full_count = 0
        assert self._types.itemsize == 4
        assert self._offsets.itemsize == 8

    @property
    def pending_count(self) -> int:
        return len(self._types)

    @property
    def pending_size_bytes(self) -> int:
        """Bytes staged: inline payloads and the files of staged SPILLED parcels."""
        return len(self._buffer) + self._spilled_size_bytes

    def append(self, parcel_type: int, head: Buffer, *tail: Buffer) -> None:
        """Stage one parcel: `head` then each part of `tail`, back to back. One whose last part
        holds at least direct_write_size_bytes_min bytes goes straight into the ring when
        nothing staged is left before it (module docstring, "Large payloads")."""
        assert 0 <= parcel_type < SPILLED_FLAG
        if (
            tail
            and len(tail[-1]) >= self.direct_write_size_bytes_min
            and self._write_direct_nowait(parcel_type, head, tail)
        ):
            return
        buffer = self._buffer
        start = len(buffer)
        buffer += head
        for part in tail:
            buffer += part
        size_bytes = len(buffer) - start
        if size_bytes > self.payload_size_bytes_max:
            del buffer[start:]
            self._append_spilled(parcel_type, head, tail)
            return
        self._types.append(parcel_type)
        self._offsets.append(start)
        self._sizes.append(size_bytes)

    def _write_direct_nowait(
        self, parcel_type: int, head: Buffer, tail: tuple[Buffer, ...]
    ) -> bool:
        """Write the parcel into the ring now, parts copied straight in, if nothing staged must
        go before it (what is staged is flushed first) and the ring has room; else False, and
        the caller stages it."""
        if self._types and not self.flush_nowait():
            return False
        size_bytes = len(head) + sum(len(part) for part in tail)
        if size_bytes > self.payload_size_bytes_max:
            return False  # it spills
        if not self.ring.try_write_parts_nowait(parcel_type, (head, *tail)):
            return False
        self._parcel_count_written += 1
        self._batch_count_written += 1
        self._direct_count_written += 1
        return True

    def append_spilled(self, parcel_type: int, payload: Buffer) -> None:
        """Stage a SPILLED parcel received from another ring, unchanged: its file goes along."""
        assert parcel_type & SPILLED_FLAG
        assert len(payload) <= self.payload_size_bytes_max
        self._note_spilled(SPILL_HEAD_STRUCT.unpack_from(payload)[2])
        self._append_raw(parcel_type, payload)

    def _append_spilled(self, parcel_type: int, head: Buffer, tail: Sequence[Buffer]) -> None:
        name = self.spill_writer.write(tail)
        file_size_bytes = sum(len(part) for part in tail)
        payload = pack_spill(head, name, file_size_bytes)
        assert len(payload) <= self.payload_size_bytes_max, "a fixed head never fills a ring"
        self._note_spilled(file_size_bytes)
        self._append_raw(parcel_type | SPILLED_FLAG, payload)

    def _note_spilled(self, file_size_bytes: int) -> None:
        """Count the file of the SPILLED parcel about to be staged in pending_size_bytes."""
        self._spilled.append((len(self._types), file_size_bytes))
        self._spilled_size_bytes += file_size_bytes

    def _append_raw(self, parcel_type: int, payload: Buffer) -> None:
        self._types.append(parcel_type)
        self._offsets.append(len(self._buffer))
        self._sizes.append(len(payload))
        self._buffer += payload

    def flush_nowait(self) -> bool:
        """Write what the ring takes now; True when nothing is left staged."""
        parcel_count = len(self._types)
        if parcel_count == 0:
            return True
        if parcel_count <= SMALL_BATCH_COUNT_MAX:
            written = self._write_few_nowait(parcel_count)
        else:
            types = np.frombuffer(self._types, dtype=np.int32)
            offsets = np.frombuffer(self._offsets, dtype=np.int64)
            sizes = np.frombuffer(self._sizes, dtype=np.int64)
            payloads = np.frombuffer(self._buffer, dtype=np.uint8)
            try:
                written = self.ring.try_write_batch_nowait(types, payloads, offsets, sizes)
            finally:
                # The buffers cannot change size while numpy holds views of them.
                del types, offsets, sizes, payloads
        assert 0 <= written <= parcel_count
        if written > 0:
            self._parcel_count_written += written
            self._batch_count_written += 1
        if written == parcel_count:
            self._buffer.clear()
            del self._types[:]
            del self._offsets[:]
            del self._sizes[:]
            if self._spilled:
                self._spilled.clear()
                self._spilled_size_bytes = 0
            return True
        self._full_count += 1
        if written > 0:
            cut = self._offsets[written]
            del self._buffer[:cut]
            del self._types[:written]
            self._offsets = array.array("q", [offset - cut for offset in self._offsets[written:]])
            del self._sizes[:written]
            if self._spilled:
                self._spilled = [
                    (index - written, size) for index, size in self._spilled if index >= written
                ]
                self._spilled_size_bytes = sum(size for _index, size in self._spilled)
        return False

    def _write_few_nowait(self, parcel_count: int) -> int:
        """Write a few staged parcels one by one through the ring's single-parcel path (plain
        Python: no kernel call, no numpy views; ring.py says why that is cheaper up to
        SMALL_BATCH_COUNT_MAX parcels). Stops at the first that does not fit; returns how many
        were written."""
        ring = self.ring
        buffer = self._buffer
        if parcel_count == 1:
            assert self._sizes[0] == len(buffer)
            return 1 if ring.try_write_nowait(self._types[0], buffer) else 0
        written = 0
        with memoryview(buffer) as view:
            for parcel_type, offset, size_bytes in zip(
                self._types, self._offsets, self._sizes, strict=True
            ):
                if not ring.try_write_nowait(parcel_type, view[offset : offset + size_bytes]):
                    break
                written += 1
        return written

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(
            parcel_count_written=self._parcel_count_written,
            batch_count_written=self._batch_count_written,
            direct_count_written=self._direct_count_written,
            full_count=self._full_count,
            spill_count=self.spill_writer.spill_count,
            spill_size_bytes=self.spill_writer.spill_size_bytes,
        )


class Inbox:
    """One in-ring of a role: drains batches and opens spilled parcels.

    Iterate a drained batch with `parcels(batch)`: it yields (type, buffer, offset, size) with the
    SPILLED flag resolved, so `buffer[offset : offset + size]` is always the whole payload. Spill
    files read during a batch are unlinked by `release(batch)`, after the ring's release.

    In a role process it also keeps quarantine (runtime.py): before yielding a parcel it writes
    the parcel's position into the role's handling words (the ring's number once per batch),
    and clears them when the batch is done; the parcel the supervisor quarantined is not yielded
    but given to `on_quarantined(type, buffer, offset, size)` (a role sets it to answer a
    request with SYSTEM_ERROR; it gets the parcel as stored in the ring, SPILLED flag and all),
    then logged and counted. That costs about 70 ns per parcel.
    """

    def __init__(self, ring: Ring, producer: str, marks: runtime.ParcelMarks | None = None) -> None:
        """`marks`: the role process's (runtime.parcel_marks()) unless given (tests)."""
        self.ring = ring
        self.producer = producer  # role id of the producer, e.g. "codec.1"
        self._view: memoryview | None = None
        self._spill_paths: list[Path] = []
        self.spill_missing_count = 0
        self.on_quarantined: QuarantineHook | None = None
        self.quarantined_count = 0
        if marks is None:
            marks = runtime.parcel_marks()
        ring_number = marks.ring_number(ring.name) if marks is not None else 0
        self._mark_words = marks.words if marks is not None and ring_number else None
        self._ring_number = ring_number
        self._skip_position = marks.skip_position(ring_number) if marks is not None else -1
        self._die_on_marker = marks.die_on_marker if marks is not None else None
        self._position_mask = ring.capacity_bytes - 1

    def drain_nowait(self, batch_count_max: int = BATCH_COUNT_MAX) -> ParcelBatch:
        return self.ring.drain_nowait(batch_count_max)

    def parcels(
        self, batch: ParcelBatch, keep_spilled: frozenset[int] = frozenset()
    ) -> Iterator[tuple[int, Buffer, int, int]]:
        """(type, buffer, offset, size) of each parcel. A SPILLED parcel whose base type is in
        `keep_spilled` comes as it is (type with SPILLED_FLAG, the inline spill payload): for a
        role that forwards it unread; every other one comes with its whole payload."""
        if batch.count == 0:
            return
        view = self._view
        if view is None:
            # The ring's data area: the same array for every batch this ring drains.
            view = self._view = memoryview(batch.data.data)
        words = self._mark_words
        ring_number = self._ring_number
        mask = self._position_mask
        start_bytes = batch.start_bytes
        # A parcel's position: the batch's start plus how far its header lies past the start's
        # place in the data area, modulo the capacity (a padding parcel may lie between).
        base = (start_bytes & mask) + PARCEL_HEADER_SIZE_BYTES
        if words is not None:
            words[1] = -1  # no parcel yet (ControlBlock.handling)
            words[0] = ring_number
        for parcel_type, offset, size in zip(
            batch.types.tolist(), batch.offsets.tolist(), batch.sizes.tolist(), strict=True
        ):
            if words is not None:
                position = start_bytes + ((offset - base) & mask)
                words[1] = position
                if position == self._skip_position:
                    self._quarantine(parcel_type, view, offset, size, position)
                    continue
            if parcel_type & SPILLED_FLAG and parcel_type & ~SPILLED_FLAG not in keep_spilled:
                try:
                    payload, path = read_spill(view, offset)
                except FileNotFoundError:
                    self.spill_missing_count += 1
                    continue
                self._spill_paths.append(path)
                parcel: tuple[int, Buffer, int, int] = (
                    parcel_type & ~SPILLED_FLAG,
                    payload,
                    0,
                    len(payload),
                )
            else:
                parcel = (parcel_type, view, offset, size)
            if self._die_on_marker is not None:
                self._die_if_marked(parcel)
            yield parcel
        if words is not None:
            words[0] = 0

    def _quarantine(
        self, parcel_type: int, buffer: Buffer, offset: int, size: int, position: int
    ) -> None:
        self.quarantined_count += 1
        if parcel_type & SPILLED_FLAG:  # its file goes with the batch, as a read one would
            _head_offset, _head_size, name_offset, name_size = spill_head_view(buffer, offset)
            name = bytes(buffer[name_offset : name_offset + name_size]).decode()
            self._spill_paths.append(names.SHM_DIRECTORY / name)
        log.error(
            "quarantined parcel type %d (%d bytes) at position %d of %s: it stopped this role's "
            "process twice; it is skipped",
            parcel_type,
            size,
            position,
            self.ring.name,
        )
        if self.on_quarantined is None:
            return
        try:
            self.on_quarantined(parcel_type, buffer, offset, size)
        except Exception:
            log.exception("answering the quarantined parcel failed")

    def _die_if_marked(self, parcel: tuple[int, Buffer, int, int]) -> None:
        """The test hook (runtime.py): SIGKILL this process on a parcel holding the marker."""
        _parcel_type, buffer, offset, size = parcel
        assert self._die_on_marker is not None
        if self._die_on_marker in bytes(memoryview(buffer)[offset : offset + size]):
            log.warning("test hook: dying on a parcel that holds %r", self._die_on_marker)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def release(self, batch: ParcelBatch) -> None:
        self.ring.release(batch)
        if self._mark_words is not None:
            self._mark_words[0] = 0
        if self._spill_paths:
            for path in self._spill_paths:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._spill_paths.clear()


def attach_inboxes(specs: Iterable[RingSpecLike]) -> list[Inbox]:
    """An Inbox on each ring of `specs` (topology.RingSpec: name and producer)."""
    return [Inbox(Ring.attach(spec.name), spec.producer) for spec in specs]


class SpinGate:
    """Whether this role may spin now: only while the roles holding a core, it included, are no
    more than the cores there are (module docstring, "Spinning").

    Reads every role's activity word in the control block (control_block.py) and writes only its
    own: 1 from creation and after each sleep, 0 for the time it sleeps in epoll. The count is a
    heuristic, not a lock: two roles may decide at the same moment and both spin for one turn
    of their loop, and processes that are not roles (clients, other services) are not counted.
    Without a control block (unit tests) there is nothing to count and the gate always opens.
    """

    def __init__(self, words: memoryview | None, index: int, core_count: int) -> None:
        assert core_count > 0
        self._words = words
        self._index = index
        self.core_count = core_count
        self.active(True)

    @classmethod
    def of_process(cls, core_count: int | None = None) -> SpinGate:
        """The gate of this role process, over the cores it may run on (config.py)."""
        activity = runtime.activity_words()
        if core_count is None:
            core_count = usable_core_count()
        if activity is None:
            return cls(None, 0, core_count)
        words, index = activity
        return cls(words, index, core_count)

    def active(self, on_core: bool) -> None:
        """Say whether this role holds a core (working or spinning) or sleeps."""
        if self._words is not None:
            self._words[self._index] = 1 if on_core else 0

    def open(self) -> bool:
        """True if the roles on a core, this one included, do not outnumber the cores."""
        words = self._words
        return words is None or sum(words) <= self.core_count


@dataclasses.dataclass(frozen=True, slots=True)
class SleeperStatistics:
    sleep_count: int  # waits that blocked in epoll with the doorbells armed
    spin_hit_count: int  # waits that found work while spinning: no sleep, no doorbell
    spin_miss_count: int  # spins that ended without work, then slept
    spin_yield_count: int  # spins cut short, or not begun, because the cores were taken
    spin_budget_ns: int  # the current adaptive budget while the role awaits nothing
    awaiting_spin_budget_ns: int  # the same while it awaits answers to parcels it sent


class Sleeper:
    """The one place a role sleeps: every in-ring's doorbell and the role's sockets in one epoll.

    `wait(timeout_ms)` may first spin: it polls the rings (and, for the reactor, the epoll with a
    zero timeout) and yields the core between polls, then arms each ring's doorbell and blocks in
    epoll. A producer rings only while its consumer is armed, so a spin that finds the next
    parcel saves the producer's write(2), this role's wake-up (tens of microseconds on a VM) and
    the arm/disarm round. The budget adapts, as an adaptive mutex's does (glibc's
    PTHREAD_MUTEX_ADAPTIVE_NP, HotSpot's spin-then-park): a spin that finds work doubles it, up
    to `spin_ns_max`; one that ends empty halves it, down to nothing; a sleep that ended sooner
    than `spin_ns_max` raises it to twice that sleep, so a role that stopped spinning starts
    again when its parcels come close together. The yield matters with fewer cores than roles:
    a spinner gives its core to any role with work on it. A role that drained more than
    SPIN_DRAINED_COUNT_MAX parcels since its last wait does not spin at all: spinning pays where
    single parcels travel (a wake-up per parcel), not in batch mode.

    Two budgets (module docstring, "Spinning"): the caller says whether it awaits answers to
    parcels it sent on (`awaiting`: a reactor or codec with requests in flight, a send processor
    with appends at the store writer); each kind of wait adapts its own budget, so the short
    waits inside a request do not keep a role spinning after the last answer went out. And the
    SpinGate: no spin for new work while the roles on a core already fill the cores.
    """

    SPIN_NS_FLOOR: Final = 2_000  # below this, a spin is not worth its first system call

    def __init__(
        self,
        epoll: select.epoll,
        inboxes: Sequence[Inbox],
        spin_ns_max: int = 0,
        *,
        poll_sockets_while_spinning: bool = False,
        gate: SpinGate | None = None,
    ) -> None:
        assert spin_ns_max >= 0
        self.epoll = epoll
        self.rings = [inbox.ring for inbox in inboxes]
        self.spin_ns_max = spin_ns_max
        # [awaiting nothing, awaiting answers]
        self._budgets_ns = [spin_ns_max, spin_ns_max]
        self.poll_sockets_while_spinning = poll_sockets_while_spinning
        self.gate = gate if gate is not None else SpinGate.of_process()
        for ring in self.rings:
            epoll.register(ring.doorbell_fileno(), select.EPOLLIN)
        self._read_count_seen = sum(ring.parcel_count_read() for ring in self.rings)
        self._other_work_count = 0
        self.sleep_count = 0
        self.spin_hit_count = 0
        self.spin_miss_count = 0
        self.spin_yield_count = 0
        self._gave_way = False

    @property
    def spin_budget_ns(self) -> int:
        return self._budgets_ns[0]

    def wait(
        self, timeout_ms: int, other_work_count: int = 0, *, awaiting: bool = False
    ) -> list[tuple[int, int]]:
        """Events from the epoll (doorbell events included, which the caller ignores), after at
        most `timeout_ms` (negative: no limit). Returns at once if a ring is readable: [] without
        a system call when one is readable already (a role that waits right after a turn of
        work finds its next batch this way). Timeout 0 always polls the epoll once: the reactor
        waits so after a turn of work, to look at its sockets. `other_work_count` is work the
        role did since its last wait that no ring of this Sleeper counts (frames the reactor
        read from sockets): it counts toward SPIN_DRAINED_COUNT_MAX as drained parcels do.
        `awaiting`: the role has sent parcels whose answers will come back to it (class
        docstring); it picks which of the two budgets this wait spins and adapts."""
        self._other_work_count += other_work_count
        if timeout_ms == 0:
            return self.epoll.poll(0)
        read_count = 0
        for ring in self.rings:
            if ring.readable():
                return []
            read_count += ring.parcel_count_read()
        drained_count = read_count - self._read_count_seen + self._other_work_count
        self._read_count_seen = read_count
        self._other_work_count = 0
        budgets_ns = self._budgets_ns
        kind = 1 if awaiting else 0
        budget_ns = budgets_ns[kind]
        if drained_count <= SPIN_DRAINED_COUNT_MAX and budget_ns >= self.SPIN_NS_FLOOR:
            spun = self._spin(budget_ns, gated=not awaiting)
            if spun is not None:
                self.spin_hit_count += 1
                budgets_ns[kind] = min(self.spin_ns_max, budget_ns * 2)
                return spun
            if self._gave_way:
                self.spin_yield_count += 1  # the cores were taken: no verdict on the budget
            else:
                self.spin_miss_count += 1
                budgets_ns[kind] = budget_ns // 2
        rings = self.rings
        if not Ring.arm_doorbells_nowait(rings):
            return self.epoll.poll(0)  # a parcel arrived meanwhile: do not sleep
        events: list[tuple[int, int]] | None = None
        gate = self.gate
        try:
            self.sleep_count += 1
            slept_from_ns = time.monotonic_ns()
            gate.active(False)
            events = self.epoll.poll(timeout_ms / 1000 if timeout_ms > 0 else -1)
            slept_ns = time.monotonic_ns() - slept_from_ns
            if slept_ns < self.spin_ns_max:
                # A spin this long would have found the work: spin for it next time.
                budgets_ns[kind] = min(self.spin_ns_max, max(budgets_ns[kind] * 2, slept_ns * 2))
            return events
        finally:
            gate.active(True)
            # Read a doorbell's FIFO only if epoll said it fired (ring.disarm_doorbell).
            fired = None if events is None else {fd for fd, _ in events}
            for ring in rings:
                ring.disarm_doorbell(rung=fired is None or ring.doorbell_fileno() in fired)

    def _spin(self, spin_ns: int, *, gated: bool = True) -> list[tuple[int, int]] | None:
        """Poll until spin_ns passes; [] or the epoll's events if work came, None if not. Sets
        `_gave_way` when it stopped (or never began) because the gate closed. `gated=False` (a
        role awaiting answers) spins its budget whatever the gate says."""
        gate = self.gate
        self._gave_way = gated and not gate.open()
        if self._gave_way:
            return None
        deadline_ns = time.monotonic_ns() + spin_ns
        rings = self.rings
        poll_sockets = self.poll_sockets_while_spinning
        while True:
            for ring in rings:
                if ring.readable():
                    return []
            if poll_sockets:
                events = self.epoll.poll(0)
                if events:
                    return events
            if time.monotonic_ns() >= deadline_ns:
                return None
            os.sched_yield()
            if gated and not gate.open():
                self._gave_way = True
                return None

    def statistics(self) -> SleeperStatistics:
        return SleeperStatistics(
            sleep_count=self.sleep_count,
            spin_hit_count=self.spin_hit_count,
            spin_miss_count=self.spin_miss_count,
            spin_yield_count=self.spin_yield_count,
            spin_budget_ns=self._budgets_ns[0],
            awaiting_spin_budget_ns=self._budgets_ns[1],
        )

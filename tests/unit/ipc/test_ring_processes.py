"""Goal: a ring carries parcels between two real processes without loss, reorder or corruption;
a producer SIGKILLed between a payload and its header leaves everything published before it
readable; a consumer asleep on the doorbell is woken by a producer in another process, and never
misses a wake-up, also when it sleeps on several rings at once (one fence for all, FIFOs read
only when epoll says they fired, as the broker's roles sleep).

Method: this file is also the child program (`python test_ring_processes.py <command> ...`); the
test process creates the ring, starts the child with subprocess, and is the consumer. Parcels
carry their sequence number, a per-parcel check word and filler derived from both, so the
consumer rebuilds the expected bytes of every parcel and compares them all. The crash test stops
the child inside a real write, after the payload is staged and before its header is stored (the
ring's test hook), and SIGKILLs it there. Every child is killed by PID in `finally` (and by the
`reap_pids` fixture); every shared-memory object is unlinked by the test that made it.
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from numpy.typing import NDArray

from mqbox.ipc import names
from mqbox.ipc.ring import Ring

MIX = np.uint64(0x9E37_79B9_7F4A_7C15)
PARCEL_COUNT = 2_000_000
BATCH_COUNT = 512
LINE_TIMEOUT_SECS = 60.0


def parcel_sizes(sequences: NDArray[np.uint64]) -> NDArray[np.int64]:
    """16 to 48 payload bytes, varying with the sequence number."""
    return (16 + 8 * (sequences % np.uint64(5))).astype(np.int64)


def parcel_types(sequences: NDArray[np.uint64]) -> NDArray[np.int32]:
    return (sequences % np.uint64(7)).astype(np.int32)


def parcel_words(sequences: NDArray[np.uint64], sizes: NDArray[np.int64]) -> NDArray[np.uint64]:
    """The payloads of these parcels back to back as uint64 words: word 0 is the sequence
    number, word 1 its check word, word j > 1 the check word plus j."""
    word_counts = sizes // 8
    owners = np.repeat(sequences, word_counts)
    starts = np.repeat(np.cumsum(word_counts) - word_counts, word_counts)
    positions = (np.arange(owners.size, dtype=np.int64) - starts).astype(np.uint64)
    check_words = owners * MIX
    words = check_words + positions
    words[positions == 0] = owners[positions == 0]
    words[positions == 1] = check_words[positions == 1]
    return words


# The child program.


def say(line: str) -> None:
    """One line to the test process, which waits for it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def child_produce(name: str, count: int) -> None:
    ring = Ring.attach(name)
    say("attached")
    sent = 0
    while sent < count:
        sequences = np.arange(sent, min(sent + BATCH_COUNT, count), dtype=np.uint64)
        sizes = parcel_sizes(sequences)
        offsets = np.cumsum(sizes) - sizes
        payloads = parcel_words(sequences, sizes).view(np.uint8)
        types = parcel_types(sequences)
        done = 0
        while done < sequences.size:
            written = ring.try_write_batch_nowait(
                types[done:], payloads, offsets[done:], sizes[done:]
            )
            if written == 0:
                time.sleep(0.0001)  # no producer doorbell: let a consumer on this core run
            done += written
        sent += sequences.size
    say("done")
    ring.close()


def child_hang_after_staging(name: str, count: int) -> None:
    ring = Ring.attach(name)
    for number in range(count):
        assert ring.try_write_nowait(1, staged_payload(number))

    def hang() -> None:
        say("staged")
        time.sleep(600)

    ring._test_hook_before_publish = hang
    ring.try_write_nowait(2, b"S" * 40)
    raise AssertionError("unreachable: the parent kills this process while it hangs")


def child_write_later(name: str, delay_ms: int) -> None:
    ring = Ring.attach(name)
    say("attached")
    time.sleep(delay_ms / 1000)
    assert ring.try_write_nowait(5, b"wake up")
    ring.close()


def child_trickle(name: str, count: int) -> None:
    ring = Ring.attach(name)
    say("attached")
    chooser = random.Random(count)
    for number in range(count):
        while not ring.try_write_nowait(0, number.to_bytes(8, "little")):
            time.sleep(0.0001)
        if chooser.random() < 0.5:
            time.sleep(chooser.random() * 0.0003)
    ring.close()


def child_ping_two(names_joined: str, count: int) -> None:
    """Numbers 0..count-1 over the first two rings, each to one chosen at random, then waits for
    the consumer's acknowledgement on the third before the next: a lost wake-up stops both
    sides. Half the writes go at once, so they land while the consumer is between its last
    read and its sleep, where a missing check-after-set loses them."""
    first, second, acks = (Ring.attach(name) for name in names_joined.split(","))
    say("attached")
    chooser = random.Random(count)
    for number in range(count):
        if chooser.random() < 0.5:
            time.sleep(chooser.random() * 0.0002)
        ring = first if chooser.random() < 0.5 else second
        assert ring.try_write_nowait(0, number.to_bytes(8, "little"))
        assert acks.wait_readable(int(LINE_TIMEOUT_SECS * 1000)), f"no acknowledgement of {number}"
        assert acks.read_nowait() == (0, number.to_bytes(8, "little"))
    for ring in (first, second, acks):
        ring.close()


def staged_payload(number: int) -> bytes:
    return number.to_bytes(8, "little") * 5


# Helpers of the test process.


@pytest.fixture
def ring(shm_instance: str) -> Iterator[Ring]:
    ring = Ring.create(names.shm_name(shm_instance, "test", 0), 1 << 20)
    try:
        yield ring
    finally:
        ring.close()
        ring.unlink()
        names.unlink_instance(shm_instance)


def spawn(reap_pids: list[int], *arguments: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, __file__, *arguments], stdout=subprocess.PIPE, text=True
    )
    reap_pids.append(child.pid)
    return child


def kill(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    if child.stdout is not None:
        child.stdout.close()


def read_line(child: subprocess.Popen[str]) -> str:
    """The child's next line of output; fails instead of hanging if it never comes."""
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], LINE_TIMEOUT_SECS)
    assert ready, f"child {child.pid} said nothing for {LINE_TIMEOUT_SECS} s"
    return child.stdout.readline().strip()


# The tests.


# About 1.2 s here (3.5 s with the box busy): below the ~2 s that earns the integration mark.
def test_two_processes_pass_millions_of_parcels_without_loss_or_reorder(
    ring: Ring, reap_pids: list[int]
) -> None:
    child = spawn(reap_pids, "produce", ring.name, str(PARCEL_COUNT))
    try:
        assert read_line(child) == "attached"
        target = np.zeros(ring.payload_size_bytes_max, dtype=np.uint8)
        received = 0
        deadline_ns = time.monotonic_ns() + 60 * 10**9
        while received < PARCEL_COUNT:
            batch = ring.drain_into_nowait(target, 4096)
            if batch.count == 0:
                assert time.monotonic_ns() < deadline_ns, f"stuck after {received} parcels"
                assert child.poll() is None, f"producer exited with {child.returncode}"
                ring.wait_readable(100)
                continue
            sequences = np.arange(received, received + batch.count, dtype=np.uint64)
            sizes = parcel_sizes(sequences)
            assert np.array_equal(batch.sizes, sizes)
            assert np.array_equal(batch.types, parcel_types(sequences))
            assert np.array_equal(batch.offsets, np.cumsum(sizes) - sizes)
            words = target[: batch.payload_size_bytes].view(np.uint64)
            assert np.array_equal(words, parcel_words(sequences, sizes))
            received += batch.count
        assert read_line(child) == "done"
        assert child.wait(timeout=30) == 0
        assert ring.drain_nowait(1).count == 0
        statistics = ring.statistics()
        assert statistics.parcel_count_written == statistics.parcel_count_read == PARCEL_COUNT
        assert statistics.head_bytes == statistics.tail_bytes
    finally:
        kill(child)


@pytest.mark.crash
def test_producer_killed_before_publishing_leaves_earlier_parcels_readable(
    ring: Ring, reap_pids: list[int]
) -> None:
    published_count = 100
    child = spawn(reap_pids, "hang-after-staging", ring.name, str(published_count))
    try:
        assert read_line(child) == "staged"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill(child)
    statistics = ring.statistics()
    assert statistics.parcel_count_written == published_count
    start = statistics.head_bytes % ring.capacity_bytes
    assert bytes(ring._data[start + 8 : start + 48]) == b"S" * 40  # the payload got there
    assert ring._words[start // 8] == 0  # its header did not
    for number in range(published_count):
        assert ring.read_nowait() == (1, staged_payload(number))
    assert ring.read_nowait() is None
    # This process takes over as producer and continues where the dead one published last.
    assert ring.try_write_nowait(3, b"after the crash")
    assert ring.read_nowait() == (3, b"after the crash")
    assert ring.read_nowait() is None


def test_consumer_asleep_is_woken_by_a_producer_in_another_process(
    ring: Ring, reap_pids: list[int]
) -> None:
    child = spawn(reap_pids, "write-later", ring.name, "300")
    try:
        assert read_line(child) == "attached"
        start_ns = time.monotonic_ns()
        assert ring.wait_readable(20_000)
        waited_secs = (time.monotonic_ns() - start_ns) / 1e9
        assert child.wait(timeout=30) == 0
    finally:
        kill(child)
    assert 0.1 < waited_secs < 15
    statistics = ring.statistics()
    assert statistics.doorbell_count_waited >= 1
    assert statistics.doorbell_count_rung == 1
    assert ring.read_nowait() == (5, b"wake up")


def test_doorbell_wakes_an_epoll_shared_with_sockets(ring: Ring, reap_pids: list[int]) -> None:
    reader, writer = socket.socketpair()
    poller = select.epoll()
    child = spawn(reap_pids, "write-later", ring.name, "200")
    try:
        poller.register(reader.fileno(), select.EPOLLIN)
        poller.register(ring.doorbell_fileno(), select.EPOLLIN)
        assert read_line(child) == "attached"
        assert ring.arm_doorbell_nowait()
        events = poller.poll(20)
        ring.disarm_doorbell()
        assert [fd for fd, _ in events] == [ring.doorbell_fileno()]
        assert ring.read_nowait() == (5, b"wake up")
        assert child.wait(timeout=30) == 0
        # Disarmed and cleared: the doorbell no longer reads as ready.
        assert poller.poll(0) == []
    finally:
        kill(child)
        poller.close()
        reader.close()
        writer.close()


def test_no_wake_up_is_lost_while_a_producer_trickles(ring: Ring, reap_pids: list[int]) -> None:
    count = 3000
    child = spawn(reap_pids, "trickle", ring.name, str(count))
    try:
        assert read_line(child) == "attached"
        received: list[int] = []
        while len(received) < count:
            # A lost wake-up would leave this asleep on a readable ring until the timeout.
            assert ring.wait_readable(5_000), f"no wake-up after {len(received)} parcels"
            while (parcel := ring.read_nowait()) is not None:
                received.append(int.from_bytes(parcel[1], "little"))
        assert child.wait(timeout=30) == 0
    finally:
        kill(child)
    assert received == list(range(count))
    assert ring.statistics().doorbell_count_waited > 0


def test_no_wake_up_is_lost_while_sleeping_on_two_rings(
    ring: Ring, shm_instance: str, reap_pids: list[int]
) -> None:
    second = Ring.create(names.shm_name(shm_instance, "test", 1), 1 << 16)
    acks = Ring.create(names.shm_name(shm_instance, "test", 2), 1 << 16)
    rings = [ring, second]
    poller = select.epoll()
    count = 2000
    child = spawn(reap_pids, "ping-two", f"{ring.name},{second.name},{acks.name}", str(count))
    try:
        for each in rings:
            poller.register(each.doorbell_fileno(), select.EPOLLIN)
        assert read_line(child) == "attached"
        received: list[int] = []
        sleep_count = 0
        while len(received) < count:
            for each in rings:
                while (parcel := each.read_nowait()) is not None:
                    received.append(int.from_bytes(parcel[1], "little"))
                    assert acks.try_write_nowait(0, parcel[1])
            if len(received) == count or not Ring.arm_doorbells_nowait(rings):
                continue
            sleep_count += 1
            # The producer waits for an acknowledgement of every parcel, so a lost wake-up
            # leaves both asleep: this poll then times out with the parcel unread.
            events = poller.poll(10.0)
            fired = {fd for fd, _ in events}
            for each in rings:
                each.disarm_doorbell(rung=each.doorbell_fileno() in fired)
            assert events, f"no wake-up after {len(received)} parcels"
        assert child.wait(timeout=30) == 0
    finally:
        kill(child)
        poller.close()
        for each in (second, acks):
            each.close()
            each.unlink()
    assert received == list(range(count))
    assert sleep_count > count // 2  # the consumer really slept between most parcels


def main(arguments: list[str]) -> None:
    command, name, number = arguments
    children = {
        "produce": child_produce,
        "hang-after-staging": child_hang_after_staging,
        "write-later": child_write_later,
        "trickle": child_trickle,
        "ping-two": child_ping_two,
    }
    children[command](name, int(number))


if __name__ == "__main__":
    main(sys.argv[1:])

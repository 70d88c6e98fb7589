"""How many parcels per second and bytes per second does one shared-memory ring carry between two
processes?

One producer process writes `--count` parcels of `--size-bytes` through mqbox.ipc.ring in batches
(the numba staging kernel copies each batch from one flat buffer); this process is the consumer,
draining batches of views and digesting every payload byte with a numba kernel. Each payload starts
with its sequence number (checked: no loss, no reorder) and, on the first parcel of each producer
batch, the producer's clock just before the write; the consumer's clock after the drain gives the
latency samples. Under a saturating load those are mostly time spent queued in a full ring. The
checksum covers every payload byte the consumer received except the clock word (folded in as 0),
so runs with the same parameters print the same checksum. The ring has no doorbell for free
space, so a producer facing a full ring yields, then sleeps briefly; the consumer spins a little
on an empty ring, then sleeps on the ring's doorbell.

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/ring.py --size-bytes 128
    .venv/bin/python bench/ring.py --size-bytes 65536
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from _common import emit, log, percentiles_us  # bench/ is sys.path[0] when a script runs
from numpy.typing import NDArray

from mqbox._jit import kernel
from mqbox.ipc import layout, names, ring

BENCH = "ring"
HEADER_WORD_COUNT = 2  # sequence number, producer clock (ns) or 0
SIZE_BYTES_MIN = HEADER_WORD_COUNT * 8
SPIN_COUNT_BEFORE_SLEEP = 100
FULL_SPIN_COUNT_BEFORE_SLEEP = 100
FULL_SLEEP_SECS = 50e-6
FLETCHER_PRIME = np.uint64(0x100000001B3)


@kernel
def digest_parcels(
    words: NDArray[np.uint64],
    data: NDArray[np.uint8],
    offsets: NDArray[np.int64],
    sizes: NDArray[np.int64],
    count: int,
    first_sequence: int,
    state: NDArray[np.uint64],
    stamps: NDArray[np.int64],
) -> int:
    """Fold every payload byte of a batch into state[0] (a Fletcher sum per parcel, chained);
    collect non-zero producer clocks into stamps (count in state[1]). Returns how many parcels
    carry the wrong sequence number. Payloads start 8-byte aligned (ring.py's layout)."""
    digest = state[0]
    stamp_count = 0
    mismatches = 0
    for parcel_index in range(count):
        offset = offsets[parcel_index]
        size_bytes = sizes[parcel_index]
        first_word = offset >> 3
        word_count = size_bytes >> 3
        if words[first_word] != np.uint64(first_sequence + parcel_index):
            mismatches += 1
        stamp = words[first_word + 1]
        if stamp != 0:
            stamps[stamp_count] = np.int64(stamp)
            stamp_count += 1
        # The clock word counts as 0, so the checksum is the same on every run.
        low = words[first_word]
        high = low + low
        for word_index in range(first_word + HEADER_WORD_COUNT, first_word + word_count):
            low += words[word_index]
            high += low
        for byte_index in range(offset + word_count * 8, offset + size_bytes):
            low += np.uint64(data[byte_index])
            high += low
        digest = (digest ^ low) * FLETCHER_PRIME + high
    state[0] = digest
    state[1] = stamp_count
    return mismatches


def parcel_template(
    size_bytes: int, batch_count: int
) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int64], NDArray[np.uint64]]:
    """One batch of parcels in a flat buffer (each on an 8-byte stride) with a fixed filler, and
    the buffer as uint64 words for patching sequence numbers and clocks in place."""
    stride_bytes = (size_bytes + 7) & -8
    payloads = np.zeros(stride_bytes * batch_count, dtype=np.uint8)
    filler = (np.arange(payloads.size, dtype=np.int64) * 131 % 251).astype(np.uint8)
    payloads[:] = filler
    offsets = np.arange(batch_count, dtype=np.int64) * stride_bytes
    sizes = np.full(batch_count, size_bytes, dtype=np.int64)
    words = payloads.view(np.uint64)
    words[1 :: stride_bytes // 8] = 0  # no clock unless the producer sets one
    return payloads, offsets, sizes, words


def produce(name: str, size_bytes: int, count: int, batch_count: int) -> None:
    """The producer process: attach, report ready, wait for go, write `count` parcels."""
    ring.warm_up()
    channel = ring.Ring.attach(name)
    payloads, offsets, sizes, words = parcel_template(size_bytes, batch_count)
    types = np.zeros(batch_count, dtype=np.int32)
    stride_words = offsets[1] // 8 if batch_count > 1 else (size_bytes + 7) // 8
    sequence_words = words[:: int(stride_words)]
    first_sequences = np.arange(batch_count, dtype=np.uint64)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    sent = 0
    full_spins = 0
    stalled = 0
    while sent < count:
        batch = min(batch_count, count - sent)
        np.add(first_sequences[:batch], np.uint64(sent), out=sequence_words[:batch])
        words[1] = np.uint64(time.monotonic_ns())
        done = 0
        while done < batch:
            written = channel.try_write_batch_nowait(
                types[done:batch], payloads, offsets[done:batch], sizes[done:batch]
            )
            if written == 0:
                # No producer doorbell: back off so a consumer sharing this core can run.
                full_spins += 1
                stalled += 1
                if stalled > FULL_SPIN_COUNT_BEFORE_SLEEP:
                    time.sleep(FULL_SLEEP_SECS)
                else:
                    os.sched_yield()
            else:
                stalled = 0
            done += written
        sent += batch
    log(f"producer: done, {full_spins} spins on a full ring")
    channel.close()


def consume(
    channel: ring.Ring, count: int, drain_count_max: int, producer: subprocess.Popen[str]
) -> tuple[float, str, list[NDArray[np.int64]]]:
    """Drain `count` parcels; returns (seconds, checksum, latency samples in ns)."""
    state = np.zeros(2, dtype=np.uint64)
    stamps = np.zeros(drain_count_max, dtype=np.int64)
    latencies_ns: list[NDArray[np.int64]] = []
    received = 0
    mismatches = 0
    empty_drains = 0
    start_ns = time.monotonic_ns()
    while received < count:
        batch = channel.drain_nowait(drain_count_max)
        if batch.count == 0:
            empty_drains += 1
            if empty_drains % SPIN_COUNT_BEFORE_SLEEP == 0 and not channel.wait_readable(100):
                assert producer.poll() is None, f"producer exited with {producer.returncode}"
            continue
        mismatches += digest_parcels(
            batch.data.view(np.uint64),
            batch.data,
            batch.offsets,
            batch.sizes,
            batch.count,
            received,
            state,
            stamps,
        )
        now_ns = time.monotonic_ns()
        channel.release(batch)
        stamp_count = int(state[1])
        if stamp_count:
            latencies_ns.append(now_ns - stamps[:stamp_count])
        received += batch.count
    secs = (time.monotonic_ns() - start_ns) / 1e9
    assert received == count
    assert mismatches == 0, f"{mismatches} parcels out of sequence"
    checksum = f"{int(state[0]):016x}"
    log(f"consumer: {received} parcels, {empty_drains} empty drains")
    return secs, checksum, latencies_ns


def warm_up_digest() -> None:
    data = np.zeros(64, dtype=np.uint8)
    offsets = np.zeros(1, dtype=np.int64)
    sizes = np.full(1, 17, dtype=np.int64)
    state = np.zeros(2, dtype=np.uint64)
    digest_parcels(data.view(np.uint64), data, offsets, sizes, 1, 0, state, np.zeros(1, np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="payload bytes per parcel")
    parser.add_argument("--count", type=int, default=None, help="parcels (default: ~2 s worth)")
    parser.add_argument("--capacity-bytes", type=int, default=None, help="ring data area")
    parser.add_argument("--batch-count", type=int, default=None, help="parcels per write")
    parser.add_argument("--drain-count-max", type=int, default=None, help="parcels per drain")
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    parser.add_argument("--producer", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size_bytes: int = args.size_bytes
    if size_bytes < SIZE_BYTES_MIN:
        parser.error(f"--size-bytes must be at least {SIZE_BYTES_MIN}")
    count: int = args.count or (
        20_000 if args.smoke else int(min(6_000_000, max(20_000, 6e9 // size_bytes)))
    )
    # Defaults found by sweeping this box: a ring that stays in cache (1 MiB, or 64 parcels),
    # writes of 1/8 of it and drains of at most 1/4 of it, so neither side waits long for room.
    capacity_bytes: int = args.capacity_bytes or max(
        1 << 20, 1 << (size_bytes * 64 - 1).bit_length()
    )
    parcel_bytes = layout.parcel_size_bytes(size_bytes)
    batch_count: int = args.batch_count or max(1, min(1024, capacity_bytes // 8 // parcel_bytes))
    drain_count_max: int = args.drain_count_max or max(
        1, min(4096, capacity_bytes // 4 // parcel_bytes)
    )
    if args.producer:
        produce(args.producer, size_bytes, count, batch_count)
        return

    start_ns = time.monotonic_ns()
    ring.warm_up()
    warm_up_digest()
    jit_warmup_secs = (time.monotonic_ns() - start_ns) / 1e9
    name = names.shm_name(f"bench{os.getpid()}", "ring", 0)
    channel = ring.Ring.create(name, capacity_bytes)
    producer: subprocess.Popen[str] | None = None
    try:
        command = [sys.executable, __file__, "--producer", name, "--size-bytes", str(size_bytes)]
        command += ["--count", str(count), "--capacity-bytes", str(capacity_bytes)]
        command += ["--batch-count", str(batch_count)]
        producer = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert producer.stdin is not None
        assert producer.stdout is not None
        assert producer.stdout.readline().strip() == "ready"
        producer.stdin.write("go\n")
        producer.stdin.flush()
        secs, checksum, latencies_ns = consume(channel, count, drain_count_max, producer)
        assert producer.wait(timeout=60) == 0
        statistics = channel.statistics()
        log(f"ring: {statistics}")
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        channel.close()
        channel.unlink()
    samples_ns = np.concatenate(latencies_ns) if latencies_ns else np.zeros(0, dtype=np.int64)
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": count,
            "capacity_bytes": capacity_bytes,
            "batch_count": batch_count,
            "drain_count_max": drain_count_max,
            "smoke": args.smoke,
        },
        msgs=count,
        secs=secs,
        size_bytes=size_bytes,
        parcels_per_s=round(count / secs, 1),
        **percentiles_us(samples_ns),
        jit_warmup_secs=round(jit_warmup_secs, 3),
        checksum=checksum,
        latency_samples=int(samples_ns.size),
    )


if __name__ == "__main__":
    main()

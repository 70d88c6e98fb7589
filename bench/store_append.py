"""How many records per second does the store writer append, in batches, with ASYNC_FLUSH?

One process opens a fresh store (1 GiB commit-log segments, posix_fallocate'd) and appends
`--count` records of `--size-bytes` in batches of `--batch-count`, each batch bound for one of
`--queue-count` queues in turn, through MessageStore.append_batch: queue indexes assigned, log
offsets computed, the batch copied into the mapped segment and its store fields patched by the
append kernel. As with ASYNC_FLUSH, a thread msyncs the commit log every
`--flush-interval-ms` (RocketMQ's flushIntervalCommitLog), and by default the SegmentWarmer
thread pre-faults pages ahead of the writer (`--no-warm` turns it off); `--prefault` faults in
the whole segment before the clock starts, as RocketMQ's warmMapedFileEnable does for a new
segment, which measures the writer without first-touch page faults. Latency samples are per
batch. The checksum covers every commit-log byte written, so a change in what is stored shows
(store times are the batch numbers, not the wall clock, so it is the same on every run).

Extra key `cpu_secs`: the process's CPU time (all threads) over the timed part; on shared cores
secs / cpu_secs tells waiting for a core from the code's own cost.

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/store_append.py --size-bytes 128
    .venv/bin/python bench/store_append.py --size-bytes 1024
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
from _common import emit, log, percentiles_us  # bench/ is sys.path[0] when a script runs
from _store import TOPIC, BatchTemplate, commit_log_digest, temporary_store

from mqbox.config import FlushDiskType
from mqbox.store.commit_log import populate_write
from mqbox.store.layout import GiB, StoreGeometry
from mqbox.store.message_store import MessageStore, StoreConfig, warm_up_kernels

BENCH = "store_append"


def flush_periodically(store: MessageStore, interval_s: float, stop: threading.Event) -> None:
    """ASYNC_FLUSH's flush service: msync [flushed, written) every interval."""
    while not stop.wait(interval_s):
        store.flush_commit_log()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="bytes per stored record")
    parser.add_argument("--count", type=int, default=None, help="records (default: 512 MB worth)")
    parser.add_argument("--batch-count", type=int, default=64, help="records per append")
    parser.add_argument("--queue-count", type=int, default=8, help="queues written in turn")
    parser.add_argument("--flush-interval-ms", type=int, default=500, help="0: never flush")
    parser.add_argument("--no-warm", action="store_true", help="no page pre-faulting thread")
    parser.add_argument(
        "--prefault",
        action="store_true",
        help="fault in the whole segment before timing (RocketMQ's warmMapedFileEnable)",
    )
    parser.add_argument("--segment-size-bytes", type=int, default=GiB, help="commit log segment")
    parser.add_argument("--dir", default=None, help="parent of the temporary store")
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.count = args.count or 20_000
        args.segment_size_bytes = min(args.segment_size_bytes, 64 * 1024 * 1024)
    count = args.count or max(512_000_000 // args.size_bytes, args.batch_count)
    batch_total = max(count // args.batch_count, 1)
    count = batch_total * args.batch_count
    warm = not args.no_warm

    jit_start = time.perf_counter()
    warm_up_kernels()
    jit_warmup_secs = time.perf_counter() - jit_start
    log(f"{BENCH}: JIT warm-up {jit_warmup_secs:.2f} s")

    templates = [
        BatchTemplate(queue_id, args.size_bytes, args.batch_count)
        for queue_id in range(args.queue_count)
    ]
    config = StoreConfig(
        geometry=StoreGeometry(commit_log_segment_size_bytes=args.segment_size_bytes),
        max_message_size_bytes=min(4 * 1024 * 1024, args.segment_size_bytes // 2),
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        warm_segments=warm,
    )
    latencies_ns = np.empty(batch_total, dtype=np.int64)
    with temporary_store(args.dir, config) as store:
        store.start_background_threads()
        stop = threading.Event()
        flusher = None
        if args.flush_interval_ms > 0:
            flusher = threading.Thread(
                target=flush_periodically,
                args=(store, args.flush_interval_ms / 1000, stop),
                daemon=True,
            )
            flusher.start()
        append_batch = store.append_batch
        queue_count = args.queue_count
        if args.prefault:
            # RocketMQ with warmMapedFileEnable touches every page of a new segment before the
            # writer uses it; one untimed batch creates the segment, then it is faulted in.
            append_batch(
                templates[0].data, templates[0].sizes_bytes, TOPIC, 0, store_timestamp_ms=0
            )
            buffer = store.commit_log.segment_view(0)
            assert buffer is not None
            prefault_start = time.perf_counter()
            populate_write(buffer, 0, buffer.size)
            log(f"{BENCH}: segment faulted in in {time.perf_counter() - prefault_start:.2f} s")
        clock_ns = time.perf_counter_ns
        start_ns = clock_ns()
        cpu_start_s = time.process_time()
        for batch in range(batch_total):
            queue_id = batch % queue_count
            template = templates[queue_id]
            before_ns = clock_ns()
            # A fixed store time per batch (instead of the wall clock the store would read)
            # keeps the checksum the same from run to run.
            append_batch(
                template.data, template.sizes_bytes, TOPIC, queue_id, store_timestamp_ms=batch
            )
            latencies_ns[batch] = clock_ns() - before_ns
        secs = (clock_ns() - start_ns) / 1e9
        cpu_secs = time.process_time() - cpu_start_s
        stop.set()
        if flusher is not None:
            flusher.join()
        statistics = store.statistics()
        assert statistics.record_total == count + (args.batch_count if args.prefault else 0)
        log(
            f"{BENCH}: {count} records in {secs:.3f} s, "
            f"{statistics.write_log_offset_bytes / 1e6:.0f} MB written, "
            f"{statistics.flushed_log_offset_bytes / 1e6:.0f} MB flushed by the timer"
        )
        checksum = commit_log_digest(store)
    emit(
        BENCH,
        {
            "size_bytes": args.size_bytes,
            "count": count,
            "batch_count": args.batch_count,
            "queue_count": args.queue_count,
            "flush": "ASYNC_FLUSH",
            "flush_interval_ms": args.flush_interval_ms,
            "warm_segments": warm,
            "prefault": args.prefault,
            "segment_size_bytes": args.segment_size_bytes,
        },
        count,
        secs,
        args.size_bytes,
        **percentiles_us(latencies_ns),
        jit_warmup_secs=round(jit_warmup_secs, 3),
        cpu_secs=round(cpu_secs, 6),
        checksum=checksum,
    )


if __name__ == "__main__":
    main()

"""How fast does recovery CRC-scan the commit log after an unclean stop?

One process builds a store of `--count` records of `--size-bytes` (default: a 2 GiB log of
1 KiB records in 1 GiB segments) through MessageStore.append_batch, dispatches and flushes it,
then drops it as a crash would (the abort file stays) and rewrites the checkpoint with a physic
time and offset of 0: "nothing known flushed", so recovery must check every record of the log
(magic, sizes, PHYSICALOFFSET, body CRC, the unfinished-record check) while the consume queues
and the index,
known flushed, are kept. The timed part is `recovery.recover()` as the store's open will run
it; `GB_per_s` is the bytes it scanned over its wall time (target >= 1.0). The scan alone is
also timed with one thread and with the default thread count. Everything runs over the page
cache (the log was just written), so this measures the CPU side of recovery, not the disk.

With --index-unflushed N the checkpoint's index position is the start of the N-th record from
the end (its time that record's batch's less 1 ms): the index known flushed only below it, as
after a crash up to a minute after the dispatcher's last index flush (it flushes the index every
mqboxFlushIntervalIndexMs, 60 s, far less often than the consume queues). Recovery then cuts the
index there (the file holding the cut gets its slots rebuilt from the kept entries) and puts the
keys of those N records again; their consume-queue entries are kept. The difference from a run
without it is what re-indexing costs. The log must fit one segment (the position is computed).

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/store_recover.py
    .venv/bin/python bench/store_recover.py --size-bytes 256 --count 8000000
    .venv/bin/python bench/store_recover.py --size-bytes 256 --count 2000000 \
        --index-unflushed 1000000
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import checksum, emit, log  # bench/ is sys.path[0] when a script runs
from _store import TOPIC, BatchTemplate

from mqbox.store.checkpoint import read_checkpoint, write_checkpoint
from mqbox.store.layout import GiB, StoreGeometry, checkpoint_path
from mqbox.store.message_store import MessageStore, StoreConfig, warm_up_kernels
from mqbox.store.recovery import (
    create_abort_file,
    recover,
    recover_scan,
    warm_up_recovery_kernels,
)

BENCH = "store_recover"
BUILD_START_MS = 1_700_000_000_000  # store time of the first batch; each next one 1 ms later


def build(root: Path, config: StoreConfig, count: int, size_bytes: int, batch_count: int) -> int:
    """Append `count` records to a fresh store at `root`, dispatch, flush, and drop it without
    closing (an unclean stop); return the write position."""
    store = MessageStore(root, config)
    create_abort_file(root)
    store.commit_log.load()
    store.index.load()
    recover(
        store.commit_log,
        store.consume_queues,
        store.index,
        None,
        was_clean=True,
        dispatcher=store.dispatcher,
    )
    queue_count = 8
    templates = [
        BatchTemplate(queue_id, size_bytes, batch_count) for queue_id in range(queue_count)
    ]
    batch_total = count // batch_count
    start_s = time.perf_counter()
    for batch in range(batch_total):
        template = templates[batch % queue_count]
        template.set_keys(batch * batch_count)
        # Store times 1 ms apart per batch: the checkpoint then marks a precise point.
        store.append_batch(
            template.data,
            template.sizes_bytes,
            TOPIC,
            batch % queue_count,
            store_timestamp_ms=BUILD_START_MS + batch,
        )
        if batch % 256 == 255:
            store.dispatch()
    store.dispatch()
    store.flush()
    end_bytes = store.commit_log.write_log_offset_bytes
    log(f"{BENCH}: built {end_bytes / 1e9:.2f} GB in {time.perf_counter() - start_s:.1f} s")
    store.stop_background_threads()
    store.reader.close()
    store.commit_log.close()
    store.consume_queues.close()
    store.index.close()
    return end_bytes


def main() -> None:
    # A SIGTERM still removes the temporary store (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda _signal, _frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=1024, help="bytes per stored record")
    parser.add_argument("--count", type=int, default=None, help="records (default: 2 GiB worth)")
    parser.add_argument("--batch-count", type=int, default=64, help="records per append")
    parser.add_argument("--segment-size-bytes", type=int, default=GiB, help="commit log segment")
    parser.add_argument("--threads", type=int, default=None, help="scan threads (default: CPUs)")
    parser.add_argument("--dir", default=None, help="parent of the temporary store")
    parser.add_argument(
        "--index-unflushed",
        type=int,
        default=0,
        help="records at the end whose keys the checkpoint does not claim flushed",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.count = args.count or 20_000
        args.segment_size_bytes = min(args.segment_size_bytes, 16 * 1024 * 1024)
    count = args.count or (2 * GiB) // args.size_bytes
    count = max(count // args.batch_count, 1) * args.batch_count

    jit_start = time.perf_counter()
    warm_up_kernels()
    warm_up_recovery_kernels()
    jit_warmup_secs = time.perf_counter() - jit_start
    config = StoreConfig(
        geometry=StoreGeometry(commit_log_segment_size_bytes=args.segment_size_bytes),
        max_message_size_bytes=min(4 * 1024 * 1024, args.segment_size_bytes // 2),
    )
    root = Path(tempfile.mkdtemp(prefix="mqbox-bench-", dir=args.dir))
    try:
        end_bytes = build(root, config, count, args.size_bytes, args.batch_count)
        flushed = read_checkpoint(checkpoint_path(root))
        assert flushed is not None
        crashed = dataclasses.replace(flushed, physic_msg_timestamp_ms=0, physic_log_offset_bytes=0)
        if args.index_unflushed:
            assert 0 < args.index_unflushed <= count
            assert end_bytes == count * args.size_bytes, "--index-unflushed needs one segment"
            kept_count = count - args.index_unflushed
            index_ms = 0 if kept_count == 0 else BUILD_START_MS + kept_count // args.batch_count - 1
            crashed = dataclasses.replace(
                crashed,
                index_msg_timestamp_ms=max(index_ms, 0),
                index_log_offset_bytes=kept_count * args.size_bytes,
            )
        write_checkpoint(checkpoint_path(root), crashed)
        # The scan alone, one thread and the default count (a warm-up pass first: the pages
        # of the maps are faulted in once, as recovery would have to as well).
        store = MessageStore(root, config)
        store.commit_log.load()
        scan_secs = {}
        for thread_count in (1, args.threads):
            start_s = time.perf_counter()
            outcome = recover_scan(store.commit_log, 0, thread_count=thread_count)
            scan_secs[thread_count] = time.perf_counter() - start_s
            assert outcome.end_log_offset_bytes == end_bytes
            assert outcome.record_count == count
        store.commit_log.close()

        store = MessageStore(root, config)
        was_clean = not create_abort_file(root)
        assert not was_clean
        store.commit_log.load()
        store.index.load()
        start_s = time.perf_counter()
        report = recover(
            store.commit_log,
            store.consume_queues,
            store.index,
            store.checkpoint,
            was_clean=was_clean,
            dispatcher=store.dispatcher,
            timestamp_margin_ms=0,
            scan_thread_count=args.threads,
        )
        secs = time.perf_counter() - start_s
        assert report.write_log_offset_bytes == end_bytes
        assert report.scanned_bytes == end_bytes
        assert report.record_count == count
        assert report.truncated_at_log_offset_bytes is None
        if args.index_unflushed:
            assert report.redispatched_record_count == args.index_unflushed
            assert report.redispatch_from_log_offset_bytes == end_bytes - (
                args.index_unflushed * args.size_bytes
            )
        store.close()
        log(
            f"{BENCH}: recover() scanned {report.scanned_bytes / 1e9:.2f} GB, "
            f"{report.record_count} records in {secs:.3f} s; re-dispatched "
            f"{report.redispatched_record_count}, index keys dropped "
            f"{report.index_entry_dropped_count}; scan alone {scan_secs[1]:.3f} s on one "
            f"thread, {scan_secs[args.threads]:.3f} s on the default count"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = np.array(
        [report.write_log_offset_bytes, report.record_count, report.scanned_bytes],
        dtype=np.int64,
    )
    emit(
        BENCH,
        {
            "size_bytes": args.size_bytes,
            "count": count,
            "segment_size_bytes": args.segment_size_bytes,
            "threads": args.threads,
            "check_crc": True,
            "index_unflushed": args.index_unflushed,
        },
        count,
        secs,
        args.size_bytes,
        jit_warmup_secs=round(jit_warmup_secs, 3),
        GB_per_s=round(report.scanned_bytes / secs / 1e9, 3),
        target_GB_per_s=1.0,
        scan_GB_per_s_one_thread=round(end_bytes / scan_secs[1] / 1e9, 3),
        scan_GB_per_s=round(end_bytes / scan_secs[args.threads] / 1e9, 3),
        redispatched_record_count=report.redispatched_record_count,
        index_entry_dropped_count=report.index_entry_dropped_count,
        checksum=checksum(summary),
    )


if __name__ == "__main__":
    main()

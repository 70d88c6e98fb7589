"""Do the append rate and the memory of the store stay flat as the backlog grows?

One process opens a fresh store and stores `--count` records of `--size-bytes` spread over
`--queue-count` queues (10,000 by default, RocketMQ's large-deployment shape), the way the store
writer and the dispatcher of one broker do: batches of `--batch-count` records, each batch for
the next queue in turn, appended through MessageStore.append_batch (queue offsets, log offsets,
the copy into the map), dispatched every `--dispatch-every` batches (consume-queue entries for
every queue, index keys), and flushed every `--flush-every` records (commit log, index, consume
queues, checkpoint). Nothing is ever deleted, so the backlog is the whole store.

Measured: the rate (records/s, append + dispatch + flush) in ten windows of equal record
counts (the start rate is the first window after the checkpoint, since the windows before it
also create every queue's files); the process's anonymous memory (Anonymous and Pss_Anon of
/proc/self/smaps_rollup: the heap, numpy arrays, Python objects; the page cache of the maps is
file-backed and not counted) at `--checkpoint-count` stored records (1M by default) and at the
end; commit-log and index rolls; consume-queue map evictions. Targets (the issue's): the rate
of the last window within 10 % of the start rate, and the anonymous memory at the end under
twice its value at the checkpoint. RocketMQ's question is 1M vs 100M stored messages;
`--count 100000000` asks it (13 GB of disk, hours at today's rate); the default (3M) runs in a
few minutes.

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/store_backlog.py
    .venv/bin/python bench/store_backlog.py --count 100000000
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import numpy as np
from _common import checksum, emit, log  # bench/ is sys.path[0] when a script runs
from _store import TOPIC, BatchTemplate, temporary_store

from mqbox.message import QUEUEID_POSITION_BYTES
from mqbox.store.layout import MiB, StoreGeometry
from mqbox.store.message_store import StoreConfig, warm_up_kernels

BENCH = "store_backlog"
SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def anonymous_kib() -> dict[str, int]:
    """Anonymous and Pss_Anon of this process, in KiB (0 where the kernel lacks the file)."""
    values = {"Anonymous": 0, "Pss_Anon": 0}
    try:
        text = SMAPS_ROLLUP.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in values:
            values[name] = int(rest.split()[0])
    return values


class QueueIdPatcher:
    """Rewrites the QUEUEID field of every record of a batch template in place, so one template
    serves every queue (10,000 templates would be 10,000 copies of the same bytes)."""

    def __init__(self, template: BatchTemplate):
        starts = np.concatenate(([0], np.cumsum(template.sizes_bytes[:-1], dtype=np.int64)))
        self.data = template.data
        self.positions = [starts + QUEUEID_POSITION_BYTES + byte for byte in range(4)]

    def set_queue_id(self, queue_id: int) -> None:
        for byte, positions in enumerate(self.positions):
            self.data[positions] = (queue_id >> (8 * (3 - byte))) & 0xFF


def main() -> None:
    # A SIGTERM still removes the temporary store (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda _signal, _frame: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="bytes per stored record")
    parser.add_argument("--count", type=int, default=3_000_000, help="records stored in all")
    parser.add_argument("--queue-count", type=int, default=10_000, help="queues written in turn")
    parser.add_argument("--batch-count", type=int, default=32, help="records per append")
    parser.add_argument("--dispatch-every", type=int, default=256, help="batches per dispatch")
    parser.add_argument("--flush-every", type=int, default=1_000_000, help="records per flush")
    parser.add_argument(
        "--checkpoint-count",
        type=int,
        default=1_000_000,
        help="records at the first memory reading",
    )
    parser.add_argument(
        "--segment-size-bytes", type=int, default=256 * MiB, help="commit log segment"
    )
    parser.add_argument("--dir", default=None, help="parent of the temporary store")
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.count = 40_000
        args.queue_count = 200
        args.flush_every = 20_000
        args.checkpoint_count = 10_000
        args.segment_size_bytes = 1 * MiB
    batch_total = max(args.count // args.batch_count, 10)
    count = batch_total * args.batch_count
    window_batch_count = max(batch_total // 10, 1)
    checkpoint_batch = max(args.checkpoint_count // args.batch_count, 1)
    flush_batch_count = max(args.flush_every // args.batch_count, 1)

    jit_start = time.perf_counter()
    warm_up_kernels()
    jit_warmup_secs = time.perf_counter() - jit_start
    template = BatchTemplate(0, args.size_bytes, args.batch_count)
    patcher = QueueIdPatcher(template)
    config = StoreConfig(
        geometry=StoreGeometry(commit_log_segment_size_bytes=args.segment_size_bytes),
        max_message_size_bytes=min(4 * MiB, args.segment_size_bytes // 2),
    )
    windows: list[dict[str, float]] = []
    memory: dict[str, dict[str, int]] = {"start": anonymous_kib()}
    with temporary_store(args.dir, config) as store:
        start_s = time.perf_counter()
        window_start_s = start_s
        window_start_batch = 0
        for batch in range(batch_total):
            queue_id = batch % args.queue_count
            patcher.set_queue_id(queue_id)
            template.set_keys(batch * args.batch_count)
            store.append_batch(
                template.data, template.sizes_bytes, TOPIC, queue_id, store_timestamp_ms=batch
            )
            done_batch = batch + 1
            if done_batch % args.dispatch_every == 0:
                store.dispatch()
            if done_batch % flush_batch_count == 0:
                store.dispatch()
                store.flush()
            if done_batch == checkpoint_batch:
                memory["checkpoint"] = anonymous_kib()
            if done_batch % window_batch_count == 0 or done_batch == batch_total:
                now_s = time.perf_counter()
                records = (done_batch - window_start_batch) * args.batch_count
                windows.append(
                    {
                        "stored": done_batch * args.batch_count,
                        "msgs_per_s": round(records / (now_s - window_start_s), 1),
                    }
                )
                log(f"{BENCH}: {windows[-1]} anon {anonymous_kib()}")
                window_start_s = now_s
                window_start_batch = done_batch
        store.dispatch()
        store.flush()
        secs = time.perf_counter() - start_s
        memory["end"] = anonymous_kib()
        statistics = store.statistics()
        commit_log_statistics = store.commit_log.statistics()
        cq_statistics = store.consume_queues.statistics()
        index_statistics = store.index.statistics()
        assert statistics.record_total == count
        assert statistics.dispatched_record_total == count
        assert sum(store.max_offset(TOPIC, q) for q in range(args.queue_count)) == count
        digest_input = np.array(
            [statistics.write_log_offset_bytes, statistics.dispatched_log_offset_bytes, count],
            dtype=np.int64,
        )
    memory.setdefault("checkpoint", memory["end"])
    # The start rate is the first window after the checkpoint: the windows before it also pay
    # for creating every queue's files, which a backlog does not grow.
    checkpoint_count = checkpoint_batch * args.batch_count
    after_checkpoint = [
        window for window in windows if window["stored"] > checkpoint_count
    ] or windows
    rate_first = after_checkpoint[0]["msgs_per_s"]
    rate_last = windows[-1]["msgs_per_s"]
    anonymous_growth = memory["end"]["Anonymous"] / max(memory["checkpoint"]["Anonymous"], 1)
    log(
        f"{BENCH}: {count} records in {secs:.1f} s; last window {rate_last / rate_first:.2f}x "
        f"the first after {checkpoint_count} records; anonymous memory "
        f"{anonymous_growth:.2f}x its value there"
    )
    emit(
        BENCH,
        {
            "size_bytes": args.size_bytes,
            "count": count,
            "queue_count": args.queue_count,
            "batch_count": args.batch_count,
            "dispatch_every_batches": args.dispatch_every,
            "flush_every_records": args.flush_every,
            "checkpoint_count": args.checkpoint_count,
            "segment_size_bytes": args.segment_size_bytes,
        },
        count,
        secs,
        args.size_bytes,
        jit_warmup_secs=round(jit_warmup_secs, 3),
        rate_windows=windows,
        rate_start_msgs_per_s=rate_first,
        rate_end_msgs_per_s=rate_last,
        rate_last_vs_first=round(rate_last / rate_first, 3),
        rate_target_met=rate_last >= 0.9 * rate_first,
        memory_kib=memory,
        anonymous_end_vs_checkpoint=round(anonymous_growth, 3),
        memory_target_met=anonymous_growth < 2.0,
        commit_log_rolls=commit_log_statistics.roll_total,
        index_rolls=index_statistics.roll_total,
        cq_map_evicted_total=cq_statistics.map_evicted_total,
        cq_map_open_count_max=cq_statistics.map_open_count_max,
        checksum=checksum(digest_input),
    )


if __name__ == "__main__":
    main()

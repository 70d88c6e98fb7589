"""How many records per second does the dispatcher turn into consume-queue and index entries?

Setup (not timed): a fresh store gets `--count` records of `--size-bytes` appended in batches of
64 over `--queue-count` queues; each record carries TAGS and, when it has room, KEYS with a
distinct 8-digit key and a UNIQ_KEY (a 128-byte record has room for TAGS and KEYS), like a C++
producer's. Timed: the dispatcher catching up, `--step-count` records per Dispatcher.dispatch()
call as a dispatcher polling the write position would: the numba scan, one ConsumeQueue.append
per queue per scan and one IndexService.put_batch per scan. Latency samples are per call. The
checksum covers every consume-queue entry written and the number of index keys.

Extra key `cpu_secs`: the process's CPU time (all threads) over the timed part; on shared cores
secs / cpu_secs tells waiting for a core from the code's own cost.

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/store_dispatch.py --size-bytes 128
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
from _common import emit, log, percentiles_us  # bench/ is sys.path[0] when a script runs
from _store import TOPIC, BatchTemplate, temporary_store

from mqbox.store.dispatch import DISPATCH_RECORD_COUNT_MAX_DEFAULT
from mqbox.store.layout import GiB, StoreGeometry
from mqbox.store.message_store import StoreConfig, warm_up_kernels

BENCH = "store_dispatch"
BATCH_COUNT = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="bytes per stored record")
    parser.add_argument("--count", type=int, default=None, help="records (default: 4,000,000)")
    parser.add_argument("--queue-count", type=int, default=8, help="queues the records go to")
    parser.add_argument("--step-count", type=int, default=65536, help="records per dispatch()")
    parser.add_argument(
        "--scan-record-count-max", type=int, default=None, help="records per kernel scan"
    )
    parser.add_argument("--dir", default=None, help="parent of the temporary store")
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    args = parser.parse_args()
    count = args.count or (20_000 if args.smoke else 4_000_000)
    batch_total = max(count // BATCH_COUNT, 1)
    count = batch_total * BATCH_COUNT
    segment_size_bytes = 64 * 1024 * 1024 if args.smoke else GiB

    jit_start = time.perf_counter()
    warm_up_kernels()
    jit_warmup_secs = time.perf_counter() - jit_start
    log(f"{BENCH}: JIT warm-up {jit_warmup_secs:.2f} s")

    templates = [
        BatchTemplate(queue_id, args.size_bytes, BATCH_COUNT)
        for queue_id in range(args.queue_count)
    ]
    config = StoreConfig(
        geometry=StoreGeometry(commit_log_segment_size_bytes=segment_size_bytes),
        max_message_size_bytes=min(4 * 1024 * 1024, segment_size_bytes // 2),
        dispatch_record_count_max=args.scan_record_count_max or DISPATCH_RECORD_COUNT_MAX_DEFAULT,
    )
    with temporary_store(args.dir, config) as store:
        setup_start = time.perf_counter()
        step_ends: list[int] = []
        for batch in range(batch_total):
            queue_id = batch % args.queue_count
            template = templates[queue_id]
            template.set_keys(batch * BATCH_COUNT)
            result = store.append_batch(template.data, template.sizes_bytes, TOPIC, queue_id)
            if (batch + 1) * BATCH_COUNT % args.step_count == 0 or batch == batch_total - 1:
                step_ends.append(result.end_log_offset_bytes)
        log(f"{BENCH}: appended {count} records in {time.perf_counter() - setup_start:.2f} s")
        dispatcher = store.dispatcher
        latencies_ns = np.empty(len(step_ends), dtype=np.int64)
        clock_ns = time.perf_counter_ns
        dispatched = 0
        start_ns = clock_ns()
        cpu_start_s = time.process_time()
        for step, end_bytes in enumerate(step_ends):
            before_ns = clock_ns()
            dispatched += dispatcher.dispatch(end_bytes)
            latencies_ns[step] = clock_ns() - before_ns
        secs = (clock_ns() - start_ns) / 1e9
        cpu_secs = time.process_time() - cpu_start_s
        assert dispatched == count
        statistics = dispatcher.statistics()
        log(
            f"{BENCH}: {count} records in {secs:.3f} s, {statistics.cq_entry_total} entries, "
            f"{statistics.key_total} keys, {statistics.scan_total} scans"
        )
        digest = hashlib.blake2b(digest_size=8)
        for queue_id in range(args.queue_count):
            queue = store.consume_queues.find_queue(TOPIC, queue_id)
            assert queue is not None
            digest.update(queue.read(0, queue.entry_count).tobytes())
        digest.update(statistics.key_total.to_bytes(8, "big"))
        checksum = digest.hexdigest()
    emit(
        BENCH,
        {
            "size_bytes": args.size_bytes,
            "count": count,
            "queue_count": args.queue_count,
            "step_count": args.step_count,
            "scan_record_count_max": config.dispatch_record_count_max,
            "keys_per_record": statistics.key_total / count,
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

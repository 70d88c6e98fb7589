"""How many PULL read plans per second does the store build?

Setup (not timed): a fresh store with `--queue-count` queues gets `--per-queue` records of
`--size-bytes` each (batches of 64, queue after queue, so a queue's records sit in runs of 64),
then dispatches them. Timed: `--count` calls of MessageStoreReader.get_messages (the object a
pull processor holds) for a random queue from a random queue index, `--message-count-max`
messages at most (RocketMQ's 32), no tag filter: the bounds rules, the plan_read kernel over
the consume queue's map, and the ReadPlan.
A second pass over `--latency-count` plans times each call for the percentiles. msgs counts the
messages the plans hold; MB_per_s is the bytes they would send. The checksum covers every
plan's status, next index and runs.

Extra key `cpu_secs`: the process's CPU time (all threads) over the timed part; on shared cores
secs / cpu_secs tells waiting for a core from the code's own cost.

Prints one JSON line on stdout (docs/style.md section 7); chatter goes to stderr. Run:
    .venv/bin/python bench/store_read.py
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time

import numpy as np
from _common import emit, log, percentiles_us  # bench/ is sys.path[0] when a script runs
from _store import TOPIC, BatchTemplate, temporary_store

from mqbox.store.layout import GiB, StoreGeometry
from mqbox.store.message_store import StoreConfig, warm_up_kernels
from mqbox.store.read_plan import GetMessageStatus

BENCH = "store_read"
BATCH_COUNT = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="bytes per stored record")
    parser.add_argument("--count", type=int, default=None, help="plans (default: 1,000,000)")
    parser.add_argument("--queue-count", type=int, default=1000, help="queues in the store")
    parser.add_argument("--per-queue", type=int, default=320, help="records per queue")
    parser.add_argument("--message-count-max", type=int, default=32, help="maxMsgNums")
    parser.add_argument("--latency-count", type=int, default=100_000, help="timed one by one")
    parser.add_argument("--dir", default=None, help="parent of the temporary store")
    parser.add_argument("--smoke", action="store_true", help="tiny run, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.queue_count = min(args.queue_count, 50)
        args.per_queue = min(args.per_queue, 128)
        args.latency_count = min(args.latency_count, 2000)
    count = args.count or (20_000 if args.smoke else 1_000_000)
    per_queue = max(args.per_queue // BATCH_COUNT, 1) * BATCH_COUNT
    assert per_queue > args.message_count_max

    jit_start = time.perf_counter()
    warm_up_kernels()
    jit_warmup_secs = time.perf_counter() - jit_start
    log(f"{BENCH}: JIT warm-up {jit_warmup_secs:.2f} s")

    config = StoreConfig(geometry=StoreGeometry(commit_log_segment_size_bytes=GiB))
    with temporary_store(args.dir, config) as store:
        setup_start = time.perf_counter()
        templates = [
            BatchTemplate(queue_id, args.size_bytes, BATCH_COUNT)
            for queue_id in range(args.queue_count)
        ]
        for _round in range(per_queue // BATCH_COUNT):
            for queue_id, template in enumerate(templates):
                store.append_batch(template.data, template.sizes_bytes, TOPIC, queue_id)
        log(f"{BENCH}: appended in {time.perf_counter() - setup_start:.2f} s")
        store.dispatch()
        log(
            f"{BENCH}: {args.queue_count} queues x {per_queue} records ready in "
            f"{time.perf_counter() - setup_start:.2f} s"
        )
        rng = random.Random(20240521)
        queue_ids = [rng.randrange(args.queue_count) for _ in range(count)]
        queue_indexes = [rng.randrange(per_queue - args.message_count_max) for _ in range(count)]
        get_messages = store.reader.get_messages  # what a pull processor holds
        message_count_max = args.message_count_max
        for queue_id in range(args.queue_count):  # map every queue once, as a warm broker has
            get_messages(TOPIC, queue_id, 0, message_count_max)
        start_ns = time.perf_counter_ns()
        cpu_start_s = time.process_time()
        for queue_id, queue_index in zip(queue_ids, queue_indexes, strict=True):
            get_messages(TOPIC, queue_id, queue_index, message_count_max)
        secs = (time.perf_counter_ns() - start_ns) / 1e9
        cpu_secs = time.process_time() - cpu_start_s
        # Second pass, not part of the rate: one clock pair per plan, and the checksum.
        latencies_ns = np.empty(min(args.latency_count, count), dtype=np.int64)
        digest = hashlib.blake2b(digest_size=8)
        message_total = 0
        size_bytes_total = 0
        clock_ns = time.perf_counter_ns
        for sample in range(count):
            before_ns = clock_ns()
            plan = get_messages(TOPIC, queue_ids[sample], queue_indexes[sample], message_count_max)
            if sample < latencies_ns.size:
                latencies_ns[sample] = clock_ns() - before_ns
            assert plan.status is GetMessageStatus.FOUND
            message_total += plan.message_count
            size_bytes_total += plan.size_bytes
            digest.update(repr((plan.next_queue_index, plan.runs)).encode())
        log(f"{BENCH}: {count} plans in {secs:.3f} s, {message_total} messages")
    emit(
        BENCH,
        {
            "size_bytes": args.size_bytes,
            "count": count,
            "queue_count": args.queue_count,
            "per_queue": per_queue,
            "message_count_max": args.message_count_max,
        },
        message_total,
        secs,
        size_bytes_total // max(message_total, 1),
        **percentiles_us(latencies_ns),
        jit_warmup_secs=round(jit_warmup_secs, 3),
        cpu_secs=round(cpu_secs, 6),
        checksum=digest.hexdigest(),
        plans_per_s=round(count / secs, 1),
    )


if __name__ == "__main__":
    main()

"""bench/client_decode.py: how fast the client turns PULL bodies into messages.

One question: can decoding keep up with a 1,000,000 msgs/s consumer? `decode_pull_body` (one
numba kernel call over the whole body, then a lazy batch) is timed on:
- small: a 32-message body of 128-byte bodies, as one pull brings them (msgs_per_s, the headline;
  target well above 3,000,000 per second);
- wide: one body of 4,096 such records, the kernel's own rate with the per-call cost spread out;
- large: a 32-message body of 64 KiB bodies;
- objects: the small body decoded, then every message looked at the way a consumer does (queue
  index, stored body size, and the body bytes), to show what the lazy Python layer costs.
Each figure is the median of --repeat runs. The checksum covers the decoded queue indexes, log
offsets and body positions, and the bodies the objects run read.

Usage: python bench/client_decode.py [--calls N] [--repeat N] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _common import checksum, emit, log

from mqbox.client.pull_decode import decode_pull_body
from mqbox.client.pull_kernels import (
    COLUMN_BODY_POSITION_BYTES,
    COLUMN_LOG_OFFSET_BYTES,
    COLUMN_QUEUE_INDEX,
)
from mqbox.message import (
    MessageToStore,
    encode_properties_str,
    encode_record,
    pack_host,
)

SMALL_BODY_SIZE_BYTES = 128
LARGE_BODY_SIZE_BYTES = 64 * 1024
PULL_MESSAGE_COUNT = 32  # maxMsgNums of the Java and C++ push consumers
WIDE_MESSAGE_COUNT = 4096


def build_body(message_count: int, body_size_bytes: int) -> bytes:
    """`message_count` stored records back to back, as a broker's PULL answer carries them."""
    born_host = pack_host("10.0.0.7", 50123)
    store_host = pack_host("10.0.0.1", 10911)
    records = bytearray()
    for queue_index in range(message_count):
        properties = encode_properties_str(
            {
                "TAGS": "TagA",
                "KEYS": f"order-{queue_index}",
                "UNIQ_KEY": f"0A000007C3CB0000000000{queue_index:010X}",
                "WAIT": "true",
            }
        )
        records += encode_record(
            MessageToStore(
                "BenchTopic",
                queue_index % 8,
                bytes([queue_index & 0xFF]) * body_size_bytes,
                properties,
                born_timestamp_ms=1_700_000_000_000 + queue_index,
                born_host=born_host,
            ),
            queue_index=queue_index,
            log_offset_bytes=len(records),
            store_timestamp_ms=1_700_000_000_001 + queue_index,
            store_host=store_host,
        )
    return bytes(records)


def time_decode(body: bytes, calls: int) -> tuple[float, str]:
    """Seconds for `calls` decodes of `body`, and a checksum of the last decode's table."""
    batch = decode_pull_body(body)
    started_ns = time.perf_counter_ns()
    for _ in range(calls):
        batch = decode_pull_body(body)
    secs = (time.perf_counter_ns() - started_ns) / 1e9
    assert batch.complete
    return secs, checksum(
        batch.table[COLUMN_QUEUE_INDEX],
        batch.table[COLUMN_LOG_OFFSET_BYTES],
        batch.table[COLUMN_BODY_POSITION_BYTES],
    )


def time_objects(body: bytes, calls: int) -> tuple[float, str]:
    """Seconds for `calls` decodes of `body` with every message's index, size and body read."""
    total_index = 0
    total_bytes = 0
    last_body = b""
    started_ns = time.perf_counter_ns()
    for _ in range(calls):
        for message in decode_pull_body(body):
            total_index += message.queue_index
            total_bytes += message.body_size_bytes
            last_body = message.body
    secs = (time.perf_counter_ns() - started_ns) / 1e9
    return secs, checksum(np.array([total_index, total_bytes], dtype=np.int64), last_body)


def median_run(runs: list[tuple[float, str]]) -> tuple[float, str]:
    secs = statistics.median(secs for secs, _ in runs)
    checksums = {digest for _, digest in runs}
    assert len(checksums) == 1, "a repeat decoded something else"
    return secs, checksums.pop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=20_000, help="decodes of the small body per run"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.repeat = 200, 1

    warmup_started_ns = time.perf_counter_ns()
    decode_pull_body(build_body(2, 16))
    jit_warmup_secs = (time.perf_counter_ns() - warmup_started_ns) / 1e9

    small = build_body(PULL_MESSAGE_COUNT, SMALL_BODY_SIZE_BYTES)
    wide = build_body(WIDE_MESSAGE_COUNT, SMALL_BODY_SIZE_BYTES)
    large = build_body(PULL_MESSAGE_COUNT, LARGE_BODY_SIZE_BYTES)
    small_calls = args.calls
    wide_calls = max(1, args.calls // 400)
    large_calls = max(1, args.calls // 20)
    objects_calls = max(1, args.calls // 10)

    small_secs, small_sum = median_run(
        [time_decode(small, small_calls) for _ in range(args.repeat)]
    )
    wide_secs, wide_sum = median_run([time_decode(wide, wide_calls) for _ in range(args.repeat)])
    large_secs, large_sum = median_run(
        [time_decode(large, large_calls) for _ in range(args.repeat)]
    )
    objects_secs, objects_sum = median_run(
        [time_objects(small, objects_calls) for _ in range(args.repeat)]
    )

    small_msgs = small_calls * PULL_MESSAGE_COUNT
    rates = {
        "small_msgs_per_s": small_msgs / small_secs,
        "wide_msgs_per_s": wide_calls * WIDE_MESSAGE_COUNT / wide_secs,
        "large_msgs_per_s": large_calls * PULL_MESSAGE_COUNT / large_secs,
        "objects_msgs_per_s": objects_calls * PULL_MESSAGE_COUNT / objects_secs,
    }
    log(", ".join(f"{name}: {rate:,.0f}" for name, rate in rates.items()))
    emit(
        "client_decode",
        {
            "calls": small_calls,
            "repeat": args.repeat,
            "pull_message_count": PULL_MESSAGE_COUNT,
            "small_body_size_bytes": SMALL_BODY_SIZE_BYTES,
            "small_pull_body_size_bytes": len(small),
            "wide_message_count": WIDE_MESSAGE_COUNT,
            "large_body_size_bytes": LARGE_BODY_SIZE_BYTES,
        },
        msgs=small_msgs,
        secs=small_secs,
        size_bytes=len(small) // PULL_MESSAGE_COUNT,
        **{name: round(rate, 1) for name, rate in rates.items()},
        small_call_us=round(small_secs / small_calls * 1e6, 3),
        jit_warmup_secs=round(jit_warmup_secs, 3),
        checksum=checksum(
            small_sum.encode(), wide_sum.encode(), large_sum.encode(), objects_sum.encode()
        ),
    )


if __name__ == "__main__":
    main()

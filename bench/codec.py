"""bench/codec.py: how fast one process turns frames and stored records into work.

Two questions, one JSON line:
- frames_per_s: the broker side of one SEND_MESSAGE round trip in the codec: decode a C++-style
  code-10 request frame (128-byte body) into a typed SendMessageRequestHeader, build the
  SendMessageResponseHeader response and encode its frame. Target >= 100,000 per second.
- records_per_s: the numba `scan_records` kernel over 1,000,000 stored 128-byte records (no CRC;
  the CRC-checked rate is reported beside it). Target >= 10,000,000 per second.
Also `json_parse_speedup`: orjson against the standard json module on the same header, the
evidence behind the choice of JSON library (ARCHITECTURE.md, "Libraries").

Usage: python bench/codec.py [--count N] [--records N] [--repeat N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import orjson
from _common import checksum, emit, log

from mqbox.message import (
    PHYSICALOFFSET_POSITION_BYTES,
    QUEUEOFFSET_POSITION_BYTES,
    MessageToStore,
    encode_properties_str,
    encode_record,
    pack_host,
)
from mqbox.protocol import Connection, RemotingCommand, Role
from mqbox.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader
from mqbox.store.kernels import scan_records

BODY_SIZE_BYTES = 128
RECORD_SIZE_BYTES = 128

# The SEND header exactly as the official C++ client writes it (docs/protocol.md section 10).
SEND_HEADER = (
    b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN",'
    b'"Signature":"XoIGQbHGTkIrkkxmsEJ8vLPfJxg=","batch":"0","bornTimestamp":"1795243948045",'
    b'"defaultTopic":"TBW102","defaultTopicQueueNums":4,"flag":0,"producerGroup":"PG_test",'
    b'"properties":"KEYS\\u0001k1 k2\\u0002TAGS\\u0001TagA\\u0002UNIQ_KEY\\u0001'
    b'0100007F0000901900008D1AD66D0100\\u0002WAIT\\u0001true\\u0002","queueId":0,'
    b'"reconsumeTimes":"0","sysFlag":0,"topic":"test","unitMode":"0"},"flag":0,'
    b'"language":"CPP","opaque":1,"remark":"","version":63}\n'
)


def send_frame() -> bytes:
    body = bytes(range(BODY_SIZE_BYTES))
    frame_length = 4 + len(SEND_HEADER) + len(body)
    return (
        frame_length.to_bytes(4, "big") + len(SEND_HEADER).to_bytes(4, "big") + SEND_HEADER + body
    )


def bench_frames(count: int) -> tuple[float, str]:
    """Seconds for `count` decode + respond + encode turns, and a checksum of the responses."""
    frame = send_frame()
    connection = Connection(Role.BROKER)
    store_host = "7F00000100002A9F"
    last = b""
    total_bytes = 0
    started_ns = time.perf_counter_ns()
    for queue_index in range(count):
        connection.receive_data(frame)
        command = connection.next_command()
        assert isinstance(command, RemotingCommand)
        header = SendMessageRequestHeader.from_command(command)
        last = connection.send_response(
            command,
            0,
            SendMessageResponseHeader(
                f"{store_host}{queue_index:016X}", header.queue_id, queue_index
            ).to_ext(),
        )
        total_bytes += len(last)
    secs = (time.perf_counter_ns() - started_ns) / 1e9
    return secs, checksum(last, total_bytes.to_bytes(8, "big"))


def bench_json(count: int) -> float:
    """How many times faster orjson parses the SEND header than the standard json module."""
    started_ns = time.perf_counter_ns()
    for _ in range(count):
        json.loads(SEND_HEADER)
    standard_ns = time.perf_counter_ns() - started_ns
    started_ns = time.perf_counter_ns()
    for _ in range(count):
        orjson.loads(SEND_HEADER)
    fast_ns = time.perf_counter_ns() - started_ns
    return standard_ns / max(fast_ns, 1)


def build_records(record_count: int) -> np.ndarray:
    """record_count stored records of exactly RECORD_SIZE_BYTES each, offsets patched."""
    properties = encode_properties_str({"TAGS": "TagA", "UNIQ_KEY": "0A0B0C0D"})
    probe = encode_record(
        MessageToStore("bench", 0, b"", properties, born_host=pack_host("127.0.0.1", 1))
    )
    body = bytes(RECORD_SIZE_BYTES - len(probe))
    template = encode_record(
        MessageToStore("bench", 0, body, properties, born_host=pack_host("127.0.0.1", 1)),
        store_host=pack_host("127.0.0.1", 10911),
    )
    assert len(template) == RECORD_SIZE_BYTES
    records = np.tile(np.frombuffer(bytes(template), dtype=np.uint8), record_count)
    rows = records.reshape(record_count, RECORD_SIZE_BYTES)
    indexes = np.arange(record_count, dtype=np.int64)
    offsets = indexes * RECORD_SIZE_BYTES
    rows[:, QUEUEOFFSET_POSITION_BYTES : QUEUEOFFSET_POSITION_BYTES + 8] = (
        indexes.astype(">i8").view(np.uint8).reshape(record_count, 8)
    )
    rows[:, PHYSICALOFFSET_POSITION_BYTES : PHYSICALOFFSET_POSITION_BYTES + 8] = (
        offsets.astype(">i8").view(np.uint8).reshape(record_count, 8)
    )
    return records


def bench_scan(records: np.ndarray, record_count: int, check_crc: bool) -> tuple[float, str]:
    outputs = (
        np.empty(record_count, np.int64),
        np.empty(record_count, np.int32),
        np.empty(record_count, np.int32),
        np.empty(record_count, np.int64),
        np.empty(record_count, np.int64),
        np.empty(record_count, np.int64),
    )
    started_ns = time.perf_counter_ns()
    count, stop_bytes, _reason = scan_records(records, 0, records.size, 0, check_crc, *outputs)
    secs = (time.perf_counter_ns() - started_ns) / 1e9
    assert count == record_count, (count, stop_bytes)
    return secs, checksum(outputs[0][:count], outputs[3][:count], outputs[4][:count])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="SEND frames")
    parser.add_argument("--records", type=int, default=1_000_000, help="stored records to scan")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters, about a second")
    args = parser.parse_args()
    if args.smoke:
        args.count, args.records, args.repeat = 2_000, 10_000, 1

    warmup_started_ns = time.perf_counter_ns()
    tiny = build_records(4)
    bench_scan(tiny, 4, False)
    bench_scan(tiny, 4, True)
    bench_frames(100)
    jit_warmup_secs = (time.perf_counter_ns() - warmup_started_ns) / 1e9

    frame_runs = [bench_frames(args.count) for _ in range(args.repeat)]
    frame_secs = sorted(secs for secs, _ in frame_runs)[len(frame_runs) // 2]
    records = build_records(args.records)
    scan_runs = [bench_scan(records, args.records, False) for _ in range(args.repeat)]
    scan_secs = sorted(secs for secs, _ in scan_runs)[len(scan_runs) // 2]
    crc_runs = [bench_scan(records, args.records, True) for _ in range(args.repeat)]
    crc_secs = sorted(secs for secs, _ in crc_runs)[len(crc_runs) // 2]
    speedup = bench_json(max(args.count // 10, 100))
    log(f"frames: {args.count / frame_secs:,.0f}/s; scan: {args.records / scan_secs:,.0f}/s")
    emit(
        "codec",
        {
            "count": args.count,
            "records": args.records,
            "body_size_bytes": BODY_SIZE_BYTES,
            "record_size_bytes": RECORD_SIZE_BYTES,
            "repeat": args.repeat,
        },
        msgs=args.count,
        secs=frame_secs,
        size_bytes=BODY_SIZE_BYTES,
        frames_per_s=round(args.count / frame_secs, 1),
        records_per_s=round(args.records / scan_secs, 1),
        records_crc_per_s=round(args.records / crc_secs, 1),
        json_parse_speedup=round(speedup, 2),
        jit_warmup_secs=round(jit_warmup_secs, 3),
        checksum=checksum(
            frame_runs[0][1].encode(), scan_runs[0][1].encode(), crc_runs[0][1].encode()
        ),
    )


if __name__ == "__main__":
    main()

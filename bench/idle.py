"""bench/idle.py: what does the broker burn while no request is in flight?

The appliance (_load.py's `appliance`: every role, ASYNC_FLUSH, a topic of 8 queues) gets
synchronous 128 B sends over the raw protocol (latency.py's `raw_send`, one in flight), in three
parts:

- burst: `--burst` sends back to back; then `after_burst_cpu_ms` is the CPU every broker process
  used in the `--after-ms` (50) after the last answer, summed over the processes, and
  `after_burst_cpu_percent` the same in percent of one core.
- trickle: one send every `--interval-ms` (50) for `--secs` (5) seconds. The broker's CPU is read
  right after each answer and right before the next send, so the time between is a window with
  no request in flight: `gap_cpu_percent` is the broker's CPU in those windows in percent of
  one core (target < 1), `gap_cpu_percent_by_role` who spends it, `cpu_us_per_request` all of
  the broker's CPU over the trickle per send, and `p50_us` / `p99_us` the trickle's latencies
  (each send comes to a broker that was idle for 50 ms).
- quiet: `--quiet-secs` (3) with no request at all, from 1 s after the trickle:
  `quiet_cpu_percent` is the floor the gaps cannot go under (timers, the statistics sampler,
  registration), `quiet_cpu_percent_by_role` who spends it, and `quiet_wakeups_per_s_by_role`
  how often each role's threads were put on a CPU (schedstat's third field: at idle, each is a
  wake-up); `gap_wakeups_per_s_by_role` is the same over the trickle's gaps.

CPU is the sum over every thread of the supervisor and the roles of /proc/<pid>/task/<tid>/
schedstat's time on a CPU, in nanoseconds: psutil's cpu_times counts clock ticks (10 ms here),
too coarse for 50 ms windows. The name server is left out, as in the other benches.

Usage: python bench/idle.py [--interval-ms N] [--secs N] [--burst N] [--quiet-secs N] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Final

from _common import emit, log, percentiles_us  # bench/ is sys.path[0]
from _load import appliance, create_topic, message_body
from latency import raw_send

from mqbox.client.remoting import RemotingClient

BENCH: Final = "idle"
SEND_TIMEOUT_MS: Final = 3000
QUIET_START_DELAY_S: Final = 1.0


class BrokerClock:
    """On-CPU nanoseconds of every thread of the broker's processes, by role; and how many times
    they were put on a CPU (`read_runs`)."""

    def __init__(self, roles: dict[str, int]) -> None:
        self.stat_paths: dict[str, list[Path]] = {}
        for role, pid in roles.items():
            task_dir = Path(f"/proc/{pid}/task")
            self.stat_paths[role] = [path / "schedstat" for path in task_dir.iterdir()]

    def read_ns(self) -> dict[str, int]:
        return self._read_field(0)

    def read_runs(self) -> dict[str, int]:
        return self._read_field(2)

    def _read_field(self, index: int) -> dict[str, int]:
        found: dict[str, int] = {}
        for role, paths in self.stat_paths.items():
            total = 0
            for path in paths:
                try:
                    total += int(path.read_bytes().split()[index])
                except (OSError, ValueError, IndexError):
                    continue  # a thread that ended keeps its figures out of the sum
            found[role] = total
        return found


def add_delta(into: dict[str, int], before: dict[str, int], after: dict[str, int]) -> None:
    for role, value in after.items():
        into[role] = into.get(role, 0) + value - before.get(role, 0)


def by_role(values: dict[str, int], wall_ns: int, scale: float) -> dict[str, float]:
    """Each role's non-zero figure per wall-clock nanosecond, times `scale` (100: percent of a
    core from nanoseconds; 1e9: per second from counts)."""
    return {
        role: round(value / wall_ns * scale, 3)
        for role, value in sorted(values.items())
        if wall_ns and value
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-ms", type=float, default=50.0, help="trickle: ms per send")
    parser.add_argument("--secs", type=float, default=5.0, help="trickle: how long")
    parser.add_argument("--burst", type=int, default=2000, help="sends back to back first")
    parser.add_argument("--after-ms", type=float, default=50.0, help="window after the burst")
    parser.add_argument("--quiet-secs", type=float, default=3.0, help="no requests at all")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    interval_ns = int(arguments.interval_ms * 1e6)
    secs, burst, quiet_secs = arguments.secs, arguments.burst, arguments.quiet_secs
    if arguments.smoke:
        secs, burst, quiet_secs = 0.5, 50, 0.3
    assert interval_ns > 0
    assert secs > 0
    assert burst > 0
    body = message_body(b"mqbox idle ", 128)
    topic = f"BenchIdle{os.getpid()}"
    with appliance(BENCH, None) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        create_topic(app, topic)
        roles = {**app.roles, "supervisor": app.pids[0]}
        clock = BrokerClock(roles)
        failures = 0
        with RemotingClient(app.broker_address, SEND_TIMEOUT_MS) as client:
            for number in range(burst):
                failures += raw_send(client, topic, body, number) is None
            burst_end = clock.read_ns()
            burst_end_ns = time.monotonic_ns()
            time.sleep(arguments.after_ms / 1000)
            after_burst = clock.read_ns()
            after_burst_secs = (time.monotonic_ns() - burst_end_ns) / 1e9
            after_burst_ns = sum(after_burst.values()) - sum(burst_end.values())
            gap_ns_by_role: dict[str, int] = {}
            gap_runs_by_role: dict[str, int] = {}
            gap_wall_ns = 0
            latencies_ns: list[int] = []
            trickle_start = clock.read_ns()
            trickle_start_ns = time.monotonic_ns()
            due_ns = trickle_start_ns
            end_ns = trickle_start_ns + int(secs * 1e9)
            answered = trickle_start
            answered_runs = clock.read_runs()
            answered_ns = trickle_start_ns
            number = burst
            while due_ns < end_ns:
                delay_ns = due_ns - time.monotonic_ns()
                if delay_ns > 0:
                    time.sleep(delay_ns / 1e9)
                before_send = clock.read_ns()
                add_delta(gap_runs_by_role, answered_runs, clock.read_runs())
                add_delta(gap_ns_by_role, answered, before_send)
                gap_wall_ns += time.monotonic_ns() - answered_ns
                elapsed_ns = raw_send(client, topic, body, number)
                answered = clock.read_ns()
                answered_runs = clock.read_runs()
                answered_ns = time.monotonic_ns()
                number += 1
                if elapsed_ns is None:
                    failures += 1
                else:
                    latencies_ns.append(elapsed_ns)
                due_ns += interval_ns
            trickle_secs = (answered_ns - trickle_start_ns) / 1e9
            trickle_cpu_ns = sum(answered.values()) - sum(trickle_start.values())
            trickle_count = number - burst
        time.sleep(QUIET_START_DELAY_S)
        quiet_start = clock.read_ns()
        quiet_start_runs = clock.read_runs()
        quiet_start_ns = time.monotonic_ns()
        time.sleep(quiet_secs)
        quiet_end = clock.read_ns()
        quiet_end_runs = clock.read_runs()
        quiet_wall_ns = time.monotonic_ns() - quiet_start_ns
        quiet_ns_by_role: dict[str, int] = {}
        add_delta(quiet_ns_by_role, quiet_start, quiet_end)
        quiet_runs_by_role: dict[str, int] = {}
        add_delta(quiet_runs_by_role, quiet_start_runs, quiet_end_runs)
        quiet_cpu_ns = sum(quiet_ns_by_role.values())
    gap_cpu_ns = sum(gap_ns_by_role.values())
    gap_percent = round(gap_cpu_ns / gap_wall_ns * 100, 3) if gap_wall_ns else None
    log(f"{BENCH}: {gap_percent} % of a core between requests, {failures} failed")
    emit(
        BENCH,
        {
            "interval_ms": arguments.interval_ms,
            "secs": secs,
            "burst": burst,
            "after_ms": arguments.after_ms,
            "quiet_secs": quiet_secs,
            "size_bytes": 128,
        },
        trickle_count,
        trickle_secs,
        128,
        **percentiles_us(latencies_ns),
        gap_cpu_percent=gap_percent,
        gap_cpu_percent_by_role=by_role(gap_ns_by_role, gap_wall_ns, 100),
        cpu_us_per_request=round(trickle_cpu_ns / trickle_count / 1000, 1),
        after_burst_cpu_ms=round(after_burst_ns / 1e6, 3),
        after_burst_cpu_percent=round(after_burst_ns / 1e9 / after_burst_secs * 100, 2),
        quiet_cpu_percent=round(quiet_cpu_ns / quiet_wall_ns * 100, 3),
        quiet_cpu_percent_by_role=by_role(quiet_ns_by_role, quiet_wall_ns, 100),
        quiet_wakeups_per_s_by_role=by_role(quiet_runs_by_role, quiet_wall_ns, 1e9),
        gap_wakeups_per_s_by_role=by_role(gap_runs_by_role, gap_wall_ns, 1e9),
        failures=failures,
        checksum=f"{trickle_count - failures} answered",
    )


if __name__ == "__main__":
    main()

"""Goal: every bench script still runs and prints exactly one well-formed JSON line.

Method: run each `bench/*.py --smoke` as a subprocess (tiny parameters, about a second each) and
check stdout is one JSON object with the shared keys of docs/style.md section 7. Figures are not
judged here: speed is measured by the scripts themselves, never by timed tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# bench/ is not a package: its helpers import each other as top-level modules
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

from _peers import nats_server_path, redis_server_path

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(path for path in BENCH_DIR.glob("*.py") if not path.name.startswith("_"))
SHARED_KEYS = {"bench", "params", "msgs", "secs", "msgs_per_s", "MB_per_s", "checksum", "host"}
# The figures a script exists for: present and not null in its smoke line.
FIGURE_KEYS = {
    "acl": {"batch_check_us", "batch_check_ns_per_msg", "single_check_us"},
    "role_profile": {"roles", "samples", "run"},
    "cold_turn": {"cpu_us_p50_by_pause", "slowdown_by_pause"},
    "idle": {"gap_cpu_percent", "cpu_us_per_request", "after_burst_cpu_ms", "quiet_cpu_percent"},
    "latency": {"cpp_p50_us", "cpp_p99_us", "cpp_count", "raw_p50_us", "raw_p99_us", "raw_count"},
    "sync_flush": {"single_msgs_per_s", "batch_msgs_per_s", "single_client_cpu_pct"},
    "memory": {"idle_pss_mb", "after_pss_mb", "ratio", "requests"},
    "client_latency": {"client_p50_us", "client_count", "raw_p50_us", "raw_count"},
    "client_consume": {"client_msgs_per_s_median", "raw_msgs_per_s_median", "handler_calls"},
    "spark_read": {"reads_secs", "session_start_secs"},
    "spark_write": {"exactly_once_msgs_per_s_median", "plain_msgs_per_s_median"},
    "spark_stream": {"p50_us", "p99_us"},
    "compare": {
        "mqbox_produce_msgs_per_s",
        "mqbox_consume_msgs_per_s",
        "mqbox_latency_p50_us",
        "mqbox_latency_p99_us",
        "mqbox_sync_msgs_per_s",
    },
    "client_produce": {
        "batch_msgs_per_s_median",
        "raw_batch_msgs_per_s_median",
        "async_msgs_per_s_median",
        "raw_single_msgs_per_s_median",
    },
}
# Counts of refused or failed requests that a smoke run must leave at zero.
FAILURE_KEYS = {
    "latency": {"cpp_failures", "raw_failures"},
    "sync_flush": {"single_failures", "batch_failures"},
    "memory": {"failures"},
    "idle": {"failures"},
    "client_latency": {"client_failures", "raw_failures"},
    "compare": {"failures"},
}
SMOKE_TIMEOUT_SECS = 240
# The Spark scripts start a JVM each: they join the Spark tests' xdist group (docs/spark.md
# section 6), so a run never has two JVMs with their local[2] Python workers fighting for the
# cores at once; the rest of the suite goes on beside that group on the other workers. They are
# in the `slow` tier (`bin/test -m slow`): each starts a JVM and its Python workers, 43-83 s apiece
# on the 2-core box, and the connector they drive is tested in every run by tests/spark.
SPARK_SMOKE_MARKS = [pytest.mark.xdist_group("spark"), pytest.mark.slow]


def smoke_param(path: Path) -> Any:
    marks = SPARK_SMOKE_MARKS if path.stem.startswith("spark") else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_there_are_bench_scripts() -> None:
    assert any(path.name == "codec.py" for path in SCRIPTS)


@pytest.mark.parametrize("script", [smoke_param(path) for path in SCRIPTS])
def test_bench_smoke_prints_one_json_line(script: Path, tmp_path: Path) -> None:
    # PYTHONPATH: the scripts import this tree's mqbox, not whichever the venv installed
    environment = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(BENCH_DIR.parent))
    result = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_SECS,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    document = json.loads(lines[0])
    assert document.keys() >= SHARED_KEYS
    assert document["bench"] == script.stem
    assert document["msgs"] > 0
    assert document["checksum"]
    for key in FIGURE_KEYS.get(script.stem, set()):
        assert document.get(key) is not None, (key, document)
    for key in FAILURE_KEYS.get(script.stem, set()):
        assert document[key] == 0, (key, document)
    if script.stem == "compare":
        check_installed_peers_ran(document)


def check_installed_peers_ran(document: dict[str, Any]) -> None:
    """compare.py: a peer installed here (bin/test installs both) ran and gave every figure; one
    that is not is reported absent, with nothing made up in its place."""
    for system, server_path in (("nats", nats_server_path), ("redis", redis_server_path)):
        entry = document["systems"][system]
        if server_path() is None:
            assert entry == {"present": False, "reason": entry["reason"]}
            continue
        assert entry["present"] is True, entry
        for workload in ("produce", "consume", "sync"):
            assert entry[workload]["msgs_per_s"] > 0, (workload, entry)
            assert entry[workload]["failures"] == 0, (workload, entry)
        assert entry["latency"]["p50_us"] > 0, entry
        assert entry["latency"]["failures"] == 0, entry


def test_figure_keys_name_existing_scripts() -> None:
    stems = {path.stem for path in SCRIPTS}
    assert FIGURE_KEYS.keys() <= stems
    assert FAILURE_KEYS.keys() <= stems


@pytest.mark.parametrize("stem", ["produce", "latency"])
def test_bench_smoke_with_the_acl_on(stem: str, tmp_path: Path) -> None:
    """--acl: the appliance checks every request and the bench signs them; none is refused."""
    # PYTHONPATH: the scripts import this tree's mqbox, not whichever the venv installed
    environment = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(BENCH_DIR.parent))
    result = subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{stem}.py"), "--smoke", "--acl"],
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_SECS,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document["params"]["acl"] is True
    assert document["msgs"] > 0
    for key in FAILURE_KEYS.get(stem, set()):
        assert document[key] == 0, (key, document)

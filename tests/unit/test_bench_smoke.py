"""Goal: every bench script still runs and prints exactly one well-formed JSON line.

Method: run each `bench/*.py --smoke` as a subprocess (tiny parameters, about a second each) and
check stdout is one JSON object with the shared keys of STYLE.md section 7. Figures are not
judged here: speed is measured by the scripts themselves, never by timed tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(path for path in BENCH_DIR.glob("*.py") if not path.name.startswith("_"))
SHARED_KEYS = {"bench", "params", "msgs", "secs", "msgs_per_s", "MB_per_s", "checksum", "host"}
SMOKE_TIMEOUT_SECS = 240


def test_there_are_bench_scripts() -> None:
    assert any(path.name == "codec.py" for path in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_bench_smoke_prints_one_json_line(script: Path, tmp_path: Path) -> None:
    environment = dict(os.environ, TMPDIR=str(tmp_path))
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
    assert document["msgs"] > 0
    assert document["checksum"]

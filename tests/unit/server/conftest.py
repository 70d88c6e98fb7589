"""Fixtures of the server unit tests: the broker's front as objects in the test's process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.front_in_process import FrontInProcess


@pytest.fixture
def front(shm_instance: str, tmp_path: Path) -> Iterator[FrontInProcess]:
    """Reactor, codecs, worker and admin processor over real rings (front_in_process.py)."""
    graph = FrontInProcess(shm_instance, tmp_path / "store")
    try:
        yield graph
    finally:
        graph.close()

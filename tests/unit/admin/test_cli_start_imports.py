"""Goal: the `mqbox` CLI starts without numba and without the client's producer and consumers
(they cost a second of a core per command; `send` and `tail` load them when they run), while
`from mqbox.client import NAME` still gives every public name.

Method: a fresh interpreter imports the CLI and reports the modules it loaded.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import mqbox.client

HEAVY = ("numba", "mqbox.client.consumer_core", "mqbox.client.producer", "mqbox.client.pull")


def test_the_cli_imports_no_numba_and_no_producer_or_consumer() -> None:
    probe = "import sys, mqbox.admin.cli; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert [name for name in HEAVY if name in loaded] == []


def test_every_public_name_of_the_client_package_resolves() -> None:
    importlib.import_module("mqbox.client.pull")  # a submodule named like the function `pull`
    for name in mqbox.client.__all__:
        assert getattr(mqbox.client, name).__name__ == name
    assert "Producer" in dir(mqbox.client)

"""Goal: the typer command tree is there and fails with one clear line where it must.

Method: typer.testing.CliRunner against mqbox.admin.cli.app; no processes are started.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mqbox.admin.cli import app

runner = CliRunner()


def test_help_lists_the_command_tree() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("start", "stop", "status", "config"):
        assert command in result.output


def test_config_json_shows_the_defaults() -> None:
    result = runner.invoke(app, ["config", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["broker"]["brokerName"] == "broker-a"
    assert document["namesrv"]["listenPort"] == 9876


def test_config_shows_the_resource_limits() -> None:
    """Issue 9: every limit is a config key whose value `mqbox config` prints."""
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    for shown in (
        "[namesrv]",
        "  mqboxConnectionCountMax = 4096",
        "  serverChannelMaxIdleTimeSeconds = 120",
        "  mqboxKvEntryCountMax = 10000",
        "  mqboxKvNamespaceEntryCountMax = 1000",
        "  mqboxKvKeyBytesMax = 1024",
        "  mqboxKvValueBytesMax = 16384",
        "[broker]",
        "  mqboxHeartbeatGroupCountMax = 256",
        "  mqboxHeartbeatSubscriptionCountMax = 256",
        "  mqboxAutoCreateTopicCountMax = 10000",
        "  mqboxAutoCreateGroupCountMax = 10000",
        "  mqboxSpillBytesMax = 268435456",
        "  mqboxPartialFrameBytesMax = 67108864",
        "  mqboxConnectionInFlightCountMax = 1024",
        "  mqboxConnectionOutputBytesMax = 16777216",
        "  mqboxResponseBufferBytesMax = 268435456",
    ):
        assert shown in result.output.splitlines()


def test_bad_config_file_is_one_line_and_nonzero(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("listenPort = many\n")
    result = runner.invoke(app, ["config", "--config", str(path)])
    assert result.exit_code == 1
    assert "listenPort" in result.output
    assert len(result.output.strip().splitlines()) == 1

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
    assert document["broker"]["broker_name"] == "broker-a"
    assert document["namesrv"]["listen_port"] == 9876


def test_config_shows_the_resource_limits() -> None:
    """Issue 9: every limit is a config key whose value `mqbox config` prints."""
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    for shown in (
        "connection_count_max = 4096",
        "connection_idle_time_s = 120",
        "kv_entry_count_max = 10000",
        "kv_namespace_entry_count_max = 1000",
        "kv_key_size_bytes_max = 1024",
        "kv_value_size_bytes_max = 16384",
        "limits.connection_count_max = 4096",
        "limits.connection_idle_time_s = 120",
        "limits.heartbeat_group_count_max = 256",
        "limits.heartbeat_subscription_count_max = 256",
        "limits.auto_create_topic_count_max = 10000",
        "limits.auto_create_group_count_max = 10000",
        "limits.spill_size_bytes_max = 268435456",
        "limits.partial_frame_size_bytes_max = 67108864",
        "limits.connection_in_flight_count_max = 1024",
        "limits.connection_output_size_bytes_max = 16777216",
        "limits.response_buffer_size_bytes_max = 268435456",
    ):
        assert shown in result.output


def test_bad_config_file_is_one_line_and_nonzero(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("listenPort = many\n")
    result = runner.invoke(app, ["config", "--config", str(path)])
    assert result.exit_code == 1
    assert "listenPort" in result.output
    assert len(result.output.strip().splitlines()) == 1

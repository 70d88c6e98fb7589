"""Goal: `mqbox store repair` is the way out that recovery's refusal names: it cuts a commit log
damaged inside flushed data, keeps a copy of every byte it cut, leaves a store `mqbox start`
opens, and never runs beside a running appliance.

Method: a store built with MessageStore in a temporary home from a small broker.conf, a flushed
body byte flipped as a failing disk would, then typer's CliRunner against mqbox.admin.cli.app.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mqbox.admin.cli import app
from mqbox.config import load_broker_config
from mqbox.errors import StoreError
from mqbox.message import MessageToStore, encode_record, pack_host
from mqbox.server.home import HomeLayout, lock_home
from mqbox.store.message_store import MessageStore, StoreConfig
from tests.support.faulty_file import abandon_store, commit_log_segment_path, write_range

runner = CliRunner()
SEGMENT_SIZE_BYTES = 64 * 1024


def build_damaged_store(tmp_path: Path) -> tuple[Path, Path, Path, list[tuple[int, bytes]]]:
    """(home, broker.conf, store root, every record stored); record 10's body is damaged."""
    home = tmp_path / "home"
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"brokerName=b1\nmapedFileSizeCommitLog={SEGMENT_SIZE_BYTES}\nmaxMessageSize=16384\n"
    )
    broker = load_broker_config(conf)
    root = home / "store" / "b1"
    config = StoreConfig.from_broker_config(broker, pack_host("127.0.0.1", 10911))
    store = MessageStore.open(root, config)
    stored: list[tuple[int, bytes]] = []
    for serial in range(20):
        record = encode_record(MessageToStore("T", 0, f"body-{serial:04}".encode()))
        result = store.append_record(record, "T", 0)
        data = store.commit_log.read_record(
            result.log_offset_bytes, store.commit_log.write_log_offset_bytes
        )
        assert data is not None
        stored.append((result.log_offset_bytes, data))
    store.dispatch()
    store.flush()
    abandon_store(store)
    victim_at, _ = stored[10]
    write_range(commit_log_segment_path(root, 0), victim_at + 90, b"\xff")
    return home, conf, root, stored


def test_repair_cuts_the_damage_keeps_a_copy_and_the_store_opens(tmp_path: Path) -> None:
    home, conf, root, stored = build_damaged_store(tmp_path)
    broker = load_broker_config(conf)
    config = StoreConfig.from_broker_config(broker, pack_host("127.0.0.1", 10911))
    with pytest.raises(StoreError, match="mqbox store repair --store-root"):
        MessageStore.open(root, config)

    result = runner.invoke(
        app, ["store", "repair", "--home", str(home), "--config", str(conf), "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    victim_at, victim = stored[10]
    assert document["cut_at_log_offset_bytes"] == victim_at
    assert document["flushed_damage"] is True
    assert document["reason"] == "body CRC mismatch"
    copies = sorted(Path(document["copy_directory"]).iterdir())
    cut_bytes = b"".join(data for _, data in stored[10:])
    copied = copies[0].read_bytes()
    assert copied[len(victim) : len(cut_bytes)] == cut_bytes[len(victim) :]
    assert not any(copied[len(cut_bytes) :])  # the rest of the last page written
    assert copied[:90] == victim[:90]
    assert document["copied_bytes"] == len(copied)

    store = MessageStore.open(root, config)  # what `mqbox start` does: no refusal now
    try:
        assert store.commit_log.write_log_offset_bytes == victim_at
        for log_offset_bytes, data in stored[:10]:
            assert store.commit_log.read_record(log_offset_bytes, victim_at) == data
        assert store.max_offset("T", 0) == 10
    finally:
        store.close()

    again = runner.invoke(app, ["store", "repair", "--home", str(home), "--config", str(conf)])
    assert again.exit_code == 0, again.output
    assert "nothing to cut" in again.output


def test_repair_refuses_while_the_appliance_holds_the_home(tmp_path: Path) -> None:
    home, conf, _root, _stored = build_damaged_store(tmp_path)
    layout = HomeLayout(home)
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    fd = lock_home(layout)  # what a running supervisor holds
    try:
        result = runner.invoke(app, ["store", "repair", "--home", str(home), "--config", str(conf)])
    finally:
        os.close(fd)
    assert result.exit_code == 1
    assert "already running" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_repair_of_a_missing_store_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["store", "repair", "--store-root", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert "no store at" in result.output

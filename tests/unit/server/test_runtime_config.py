"""UPDATE_BROKER_CONFIG's keys and file (server/runtime_config.py) and GET_BROKER_RUNTIME_INFO's
text forms (admin/runtime_info.py).

Goal: only the runtime keys may change, with values their parsers take; an update rewrites the
home's broker.conf keeping every other line; the overlay applies those keys at start; the
watcher reports a change once; GET_BROKER_CONFIG's properties load back as the same
configuration; sizes and durations read as Java writes them. Method: files in a temporary
home, configurations loaded with config.py.
"""

from __future__ import annotations

from pathlib import Path

from mqbox.config import BrokerConfig, load_broker_config, parse_properties
from mqbox.server import runtime_config
from mqbox.server.roles.processors.admin.runtime_info import (
    disk_used_ratio,
    format_runtime,
    human_readable_bytes,
)


def test_only_runtime_keys_with_good_values_may_change() -> None:
    broker = BrokerConfig()
    assert runtime_config.update_problems({"autoCreateTopicEnable": "false"}, broker) == []
    (start_time,) = runtime_config.update_problems({"listenPort": "1"}, broker)
    assert "listenPort is a start-time key" in start_time
    (unknown,) = runtime_config.update_problems({"madeUp": "1"}, broker)
    assert "not a key mqbox knows" in unknown
    (bad,) = runtime_config.update_problems({"autoCreateTopicEnable": "sometimes"}, broker)
    assert "autoCreateTopicEnable" in bad


def test_an_update_keeps_every_other_line_and_applies_at_start(tmp_path: Path) -> None:
    conf = runtime_config.home_broker_conf(tmp_path)
    conf.write_text("# mine\nbrokerName=broker-x\nautoCreateTopicEnable=true\nlistenPort=0\n")
    runtime_config.persist_overrides(tmp_path, {"autoCreateTopicEnable": "false"})
    runtime_config.persist_overrides(tmp_path, {"autoCreateSubscriptionGroup": "false"})
    lines = conf.read_text().splitlines()
    assert lines == [
        "# mine",
        "brokerName=broker-x",
        "autoCreateTopicEnable=false",
        "listenPort=0",
        "autoCreateSubscriptionGroup=false",
    ]
    started = load_broker_config(None)
    applied = runtime_config.apply_home_overrides(started, tmp_path)
    assert not applied.auto_create_topic_enable
    assert not applied.auto_create_subscription_group
    assert applied.broker_name == started.broker_name  # only runtime keys come from the home


def test_a_home_without_the_file_gets_one_with_the_keys(tmp_path: Path) -> None:
    assert runtime_config.read_overrides(tmp_path) == {}
    runtime_config.persist_overrides(tmp_path, {"autoCreateTopicEnable": "false"})
    assert runtime_config.read_overrides(tmp_path) == {"autoCreateTopicEnable": "false"}


def test_the_watcher_reports_a_change_once(tmp_path: Path) -> None:
    started = BrokerConfig()
    watcher = runtime_config.RuntimeConfigWatcher(tmp_path, started)
    assert watcher.refresh() is None
    runtime_config.persist_overrides(tmp_path, {"autoCreateTopicEnable": "false"})
    changed = watcher.refresh()
    assert changed is not None
    assert not changed.auto_create_topic_enable
    assert watcher.refresh() is None


def test_the_shown_properties_load_back_as_the_same_config(tmp_path: Path) -> None:
    broker = load_broker_config(None, {"mapedFileSizeConsumeQueue": "60000", "brokerId": "0"})
    properties = runtime_config.broker_properties(broker)
    assert properties["mappedFileSizeConsumeQueue"] == "60000"
    assert "mapedFileSizeCommitLog" not in properties
    conf = tmp_path / "shown.conf"
    conf.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    assert parse_properties(conf.read_text()) == properties
    assert load_broker_config(conf) == broker


def test_sizes_durations_and_ratios_read_as_java_writes_them(tmp_path: Path) -> None:
    assert human_readable_bytes(0) == "0 B"
    assert human_readable_bytes(1023) == "1023 B"
    assert human_readable_bytes(1536) == "1.5 KiB"
    assert human_readable_bytes(3 << 30) == "3.0 GiB"
    assert format_runtime(90_061_000) == "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"
    assert disk_used_ratio(tmp_path / "missing") == -1.0
    ratio = disk_used_ratio(tmp_path)
    assert 0.0 < ratio <= 1.0
    assert ratio == round(ratio, 2)

"""Goal: etc/ defaults load, a RocketMQ broker.conf loads as it is, bad values fail clearly.

Method: load the shipped files and hand-written properties texts through mqbox.config.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mqbox.config import (
    REFUSED_BROKER_KEYS,
    BrokerConfig,
    BrokerRole,
    FlushDiskType,
    LimitConfig,
    NamesrvConfig,
    delay_level_durations_ms,
    ignored_keys_warning,
    load_broker_config,
    load_layout,
    load_namesrv_config,
    member_name,
    parse_properties,
)
from mqbox.errors import ConfigError

ETC = Path(__file__).resolve().parents[2] / "etc"

ROCKETMQ_BROKER_CONF = """\
# a broker.conf as RocketMQ 4.x ships it
brokerClusterName = DefaultCluster
brokerName = broker-b
brokerId = 0
deleteWhen = 04
fileReservedTime = 48
brokerRole = SYNC_MASTER
flushDiskType = SYNC_FLUSH
storePathRootDir=/data/rocketmq/store
namesrvAddr=10.0.0.1:9876;10.0.0.2:9876
autoCreateTopicEnable=false
sendMessageThreadPoolNums=16
useReentrantLockWhenPutMessage=true
"""


def test_shipped_defaults_load() -> None:
    broker = load_broker_config(ETC / "broker.conf")
    namesrv = load_namesrv_config(ETC / "namesrv.conf")
    assert broker.broker_name == "broker-a"
    assert broker.listen_port == 10911
    assert broker.broker_cluster_name == "DefaultCluster"
    assert broker.unknown_keys == ()
    assert namesrv.listen_port == 9876
    assert namesrv.broker_channel_expired_time_ms == 120_000
    # etc/namesrv.conf documents every key with its default value.
    assert namesrv == NamesrvConfig()
    assert broker.limits == LimitConfig()


def test_namesrv_limit_keys_load_and_are_bounded() -> None:
    config = load_namesrv_config(
        None,
        {
            "mqboxConnectionCountMax": "8",
            "serverChannelMaxIdleTimeSeconds": "3",
            "mqboxKvEntryCountMax": "5",
            "mqboxKvNamespaceEntryCountMax": "2",
            "mqboxKvKeyBytesMax": "16",
            "mqboxKvValueBytesMax": "32",
        },
    )
    assert (config.connection_count_max, config.connection_idle_time_s) == (8, 3)
    assert (config.kv_entry_count_max, config.kv_namespace_entry_count_max) == (5, 2)
    assert (config.kv_key_size_bytes_max, config.kv_value_size_bytes_max) == (16, 32)
    with pytest.raises(ConfigError, match="mqboxConnectionCountMax"):
        load_namesrv_config(None, {"mqboxConnectionCountMax": "0"})


def test_retention_keys_load_with_rocketmqs_names_and_defaults() -> None:
    defaults = load_broker_config(None)
    assert (defaults.clean_resource_interval_ms, defaults.clean_file_forcibly_enable) == (
        10_000,
        True,
    )
    assert load_broker_config(ETC / "broker.conf").clean_resource_interval_ms == 10_000
    config = load_broker_config(
        None,
        {
            "cleanResourceInterval": "300",
            "cleanFileForciblyEnable": "false",
            "fileReservedTime": "0",
        },
    )
    assert (config.clean_resource_interval_ms, config.clean_file_forcibly_enable) == (300, False)
    assert config.file_reserved_time_hours == 0
    with pytest.raises(ConfigError, match="cleanResourceInterval"):
        load_broker_config(None, {"cleanResourceInterval": "0"})


def test_the_index_flush_interval_loads_and_is_bounded() -> None:
    assert load_broker_config(ETC / "broker.conf").flush_interval_index_ms == 60_000
    assert load_broker_config(None).flush_interval_index_ms == 60_000
    config = load_broker_config(None, {"mqboxFlushIntervalIndexMs": "200"})
    assert (config.flush_interval_index_ms, config.flush_interval_consume_queue_ms) == (200, 1000)
    for value in ("0", "86400001"):
        with pytest.raises(ConfigError, match="mqboxFlushIntervalIndexMs"):
            load_broker_config(None, {"mqboxFlushIntervalIndexMs": value})


def test_the_broker_lock_lifetime_loads_and_stays_above_the_clients_staleness() -> None:
    assert load_broker_config(ETC / "broker.conf").rebalance_lock_max_live_time_ms == 60_000
    assert load_broker_config(None).rebalance_lock_max_live_time_ms == 60_000
    config = load_broker_config(None, {"mqboxRebalanceLockMaxLiveTimeMs": "30000"})
    assert config.rebalance_lock_max_live_time_ms == 30_000
    for value in ("29999", "0", "86400001"):
        with pytest.raises(ConfigError, match="mqboxRebalanceLockMaxLiveTimeMs"):
            load_broker_config(None, {"mqboxRebalanceLockMaxLiveTimeMs": value})


def test_example_layout_loads() -> None:
    for path in sorted((ETC / "examples" / "2m-2s").glob("broker-*.conf")):
        config = load_broker_config(path)
        assert (config.broker_id == 0) == (config.broker_role is not BrokerRole.SLAVE)


def test_rocketmq_broker_conf_loads_and_unknown_keys_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(ROCKETMQ_BROKER_CONF)
    config = load_broker_config(path)
    assert config.broker_role is BrokerRole.SYNC_MASTER
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert config.file_reserved_time_hours == 48
    assert config.auto_create_topic_enable is False
    assert config.namesrv_addr == "10.0.0.1:9876;10.0.0.2:9876"
    assert config.unknown_keys == ("sendMessageThreadPoolNums", "useReentrantLockWhenPutMessage")


def test_pool_keys_and_overrides_apply() -> None:
    config = load_broker_config(None, {"mqboxCodecCount": "3", "listenPort": "0"})
    assert config.pools.codec_count == 3
    assert config.listen_port == 0


def test_restart_keys_apply_and_the_backoff_doubles_up_to_its_maximum() -> None:
    defaults = load_broker_config(ETC / "broker.conf").restarts
    assert defaults == BrokerConfig().restarts  # etc/broker.conf states the defaults
    config = load_broker_config(
        None,
        {
            "mqboxRestartWindowMs": "5000",
            "mqboxRoleRestartCountMax": "2",
            "mqboxBrokerRestartCountMax": "3",
            "mqboxRestartBackoffMs": "50",
            "mqboxRestartBackoffMaxMs": "300",
        },
    ).restarts
    assert (config.window_ms, config.role_restart_count_max) == (5000, 2)
    assert config.broker_restart_count_max == 3
    assert [config.delay_ms(count) for count in range(1, 7)] == [0, 50, 100, 200, 300, 300]
    assert defaults.delay_ms(1000) == defaults.backoff_ms_max


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("listenPort", "70000", "listenPort"),
        ("mqboxRestartWindowMs", "10", "mqboxRestartWindowMs"),
        ("brokerRole", "LEADER", "brokerRole"),
        ("autoCreateTopicEnable", "perhaps", "autoCreateTopicEnable"),
        ("mapedFileSizeConsumeQueue", "6000001", "multiple of 20"),
        ("mqboxReactorCount", "0", "mqboxReactorCount"),
    ],
)
def test_bad_value_names_the_key(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_broker_config(None, {key: value})


def test_slave_needs_nonzero_broker_id() -> None:
    with pytest.raises(ConfigError, match="SLAVE"):
        load_broker_config(None, {"brokerRole": "SLAVE"})


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_broker_config(tmp_path / "absent.conf")


def test_properties_parser_handles_colons_comments_and_repeats() -> None:
    parsed = parse_properties("# c\n! c\na: 1\nb = x=y\na=2\n\n")
    assert parsed == {"a": "2", "b": "x=y"}
    with pytest.raises(ValueError, match="no '='"):
        parse_properties("just words")


def test_delay_levels_are_rocketmq_defaults() -> None:
    durations = delay_level_durations_ms(load_broker_config(None).message_delay_level)
    assert len(durations) == 18
    assert durations[0] == 1000
    assert durations[2] == 10_000
    assert durations[-1] == 2 * 3_600_000


def test_http_endpoint_keys_load_and_are_bounded() -> None:
    default = load_broker_config()
    assert (default.http_port, default.http_host) == (5557, "127.0.0.1")
    config = load_broker_config(overrides={"mqboxHttpPort": "0", "mqboxHttpHost": "0.0.0.0"})
    assert (config.http_port, config.http_host) == (0, "0.0.0.0")
    assert load_broker_config(overrides={"mqboxHttpPort": "-1"}).http_port == -1
    for bad in ("-2", "65536", "web"):
        with pytest.raises(ConfigError, match="mqboxHttpPort"):
            load_broker_config(overrides={"mqboxHttpPort": bad})


# --- keys mqbox does not implement (issue 16 section 5, issue 14 item 1) ------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enableLmq", "true"),
        ("enablePropertyFilter", "TRUE"),
        ("transientStorePoolEnable", "1"),
        ("enableDLegerCommitLog", "true"),
        ("brokerPermission", "4"),
        ("storePathCommitLog", "/data/commitlog"),
    ],
)
def test_a_key_that_changes_behaviour_is_refused_naming_key_and_file(
    tmp_path: Path, key: str, value: str
) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(f"brokerName = b\n{key} = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_broker_config(path)
    message = str(caught.value)
    assert str(path) in message
    assert f"{key}={value}" in message
    assert "does not implement" in message


def test_a_refused_key_at_rocketmq_s_default_is_only_ignored() -> None:
    harmless = {
        key: refused.harmless
        for key, refused in REFUSED_BROKER_KEYS.items()
        if refused.harmless is not None
    }
    config = load_broker_config(None, {**harmless, "enableLmq": "False"})
    assert set(config.unknown_keys) == set(harmless)


def test_an_unknown_mqbox_key_is_a_typo_and_refused_with_the_nearest_names() -> None:
    with pytest.raises(ConfigError, match="did you mean mqboxReactorCount"):
        load_broker_config(None, {"mqboxReactorCont": "2"})
    with pytest.raises(ConfigError, match="mqboxKvEntryCountMix is not an mqbox key"):
        load_namesrv_config(None, {"mqboxKvEntryCountMix": "2"})


def test_harmless_unknown_keys_make_one_warning_line(tmp_path: Path) -> None:
    config = load_broker_config(
        None, {"sendMessageThreadPoolNums": "4", "warmMapedFileEnable": "1"}
    )
    line = ignored_keys_warning(tmp_path / "b.conf", config.unknown_keys)
    assert line is not None
    assert "\n" not in line
    assert "sendMessageThreadPoolNums" in line
    assert "warmMapedFileEnable" in line
    assert ignored_keys_warning("x", ()) is None


def test_replication_keys_load() -> None:
    config = load_broker_config(
        None,
        {
            "brokerRole": "SLAVE",
            "brokerId": "2",
            "haMasterAddress": "10.0.0.1:10912",
            "slaveReadEnable": "true",
            "brokerIP2": "10.0.0.9",
        },
    )
    assert config.broker_role is BrokerRole.SLAVE
    assert (config.ha_master_address, config.slave_read_enable) == ("10.0.0.1:10912", True)
    assert config.broker_ip2 == "10.0.0.9"
    assert member_name(config) == "broker-a-s2"


# --- layouts ----------------------------------------------------------------------------------


def test_the_2m_2s_example_loads_as_four_brokers() -> None:
    layout = load_layout(ETC / "examples" / "2m-2s")
    members = {member.name: member.broker for member in layout.members}
    assert list(members) == ["broker-a", "broker-a-s", "broker-b", "broker-b-s"]
    assert {(b.broker_name, b.broker_id) for b in members.values()} == {
        ("broker-a", 0),
        ("broker-a", 1),
        ("broker-b", 0),
        ("broker-b", 1),
    }
    assert members["broker-a"].broker_role is BrokerRole.SYNC_MASTER
    assert members["broker-b-s"].broker_role is BrokerRole.SLAVE
    # Each broker its own HTTP endpoint: with one port for all, all but one could not bind it.
    http_ports = [broker.http_port for broker in members.values()]
    assert len(set(http_ports)) == len(http_ports), http_ports
    assert layout.namesrv_config_path == ETC / "namesrv.conf"
    with pytest.raises(ConfigError, match="no broker 'broker-c'"):
        layout.member("broker-c")


def _write_layout(directory: Path, brokers: dict[str, str], extra: str = "") -> Path:
    directory.mkdir()
    for name, text in brokers.items():
        (directory / name).write_text(text)
    (directory / "mqbox.conf").write_text(f"brokers = {';'.join(brokers)}\n{extra}")
    return directory


def test_a_layout_refuses_a_broker_twice_colliding_ports_and_unknown_keys(tmp_path: Path) -> None:
    twice = _write_layout(
        tmp_path / "twice",
        {
            "a.conf": "brokerName = x\nlistenPort = 0\n",
            "b.conf": "brokerName = x\nlistenPort = 0\n",
        },
    )
    with pytest.raises(ConfigError, match="both brokerName=x brokerId=0"):
        load_layout(twice)
    clash = _write_layout(
        tmp_path / "clash",
        {
            "a.conf": "brokerName = x\nlistenPort = 20000\n",
            "b.conf": "brokerName = y\nlistenPort = 20001\n",
        },
    )
    with pytest.raises(ConfigError, match="want port 20001"):
        load_layout(clash)
    odd = _write_layout(tmp_path / "odd", {"a.conf": "brokerName = x\n"}, "colour = blue\n")
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        load_layout(odd)
    refused = _write_layout(tmp_path / "refused", {"a.conf": "enableDLegerCommitLog = true\n"})
    with pytest.raises(ConfigError, match=r"a\.conf: enableDLegerCommitLog=true"):
        load_layout(refused)

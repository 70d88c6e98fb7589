"""Goal: the config/ JSON files round-trip, read what RocketMQ writes, never lose the previous
version to a crash, and name the file when they are corrupt.

Method: save and load through the public functions in tmp_path; compare the JSON on disk with
RocketMQ's key names; feed RocketMQ-style files (fastjson's unquoted integer keys, extra
fields); simulate a crash between the temp write and the rename by making the rename raise;
hypothesis round-trips offset tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import ConfigError, StoreError
from mqbox.store import config_files
from mqbox.store.config_files import (
    DataVersion,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
    TopicConfigTable,
)


def test_missing_files_load_as_empty_tables(tmp_path: Path) -> None:
    assert config_files.load_topics(tmp_path) == TopicConfigTable()
    assert config_files.load_consumer_offsets(tmp_path) == {}
    assert config_files.load_delay_offsets(tmp_path) == {}
    assert config_files.load_subscription_groups(tmp_path) == SubscriptionGroupTable()


def test_topics_round_trip_with_rocketmq_keys(tmp_path: Path) -> None:
    table = TopicConfigTable(
        topics={
            "TopicA": TopicConfig("TopicA"),
            "TopicB": TopicConfig("TopicB", 8, 4, 2, "MULTI_TAG", 1, True),
        },
        data_version=DataVersion(timestamp_ms=1_700_000_000_000, counter=3),
    )
    config_dir = tmp_path / "config"
    config_files.save_topics(config_dir, table)
    assert config_files.load_topics(config_dir) == table
    document = json.loads((config_dir / "topics.json").read_text())
    assert document["topicConfigTable"]["TopicB"] == {
        "topicName": "TopicB",
        "readQueueNums": 8,
        "writeQueueNums": 4,
        "perm": 2,
        "topicFilterType": "MULTI_TAG",
        "topicSysFlag": 1,
        "order": True,
    }
    assert document["dataVersion"] == {"timestamp": 1_700_000_000_000, "counter": 3}


def test_consumer_offsets_round_trip(tmp_path: Path) -> None:
    offsets = {("TopicA", "group-1"): {0: 5, 3: 17}, ("%RETRY%group-1", "group-1"): {0: 0}}
    config_files.save_consumer_offsets(tmp_path, offsets)
    assert config_files.load_consumer_offsets(tmp_path) == offsets
    document = json.loads((tmp_path / "consumerOffset.json").read_text())
    assert document == {
        "offsetTable": {"TopicA@group-1": {"0": 5, "3": 17}, "%RETRY%group-1@group-1": {"0": 0}}
    }


def test_delay_offsets_round_trip(tmp_path: Path) -> None:
    config_files.save_delay_offsets(tmp_path, {1: 0, 3: 42})
    assert config_files.load_delay_offsets(tmp_path) == {1: 0, 3: 42}


def test_subscription_groups_round_trip(tmp_path: Path) -> None:
    table = SubscriptionGroupTable(
        groups={
            "group-1": SubscriptionGroupConfig("group-1"),
            "group-2": SubscriptionGroupConfig("group-2", consume_enable=False, retry_max_times=3),
        }
    )
    config_files.save_subscription_groups(tmp_path, table)
    assert config_files.load_subscription_groups(tmp_path) == table
    document = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert document["subscriptionGroupTable"]["group-2"]["retryMaxTimes"] == 3
    assert document["subscriptionGroupTable"]["group-2"]["consumeEnable"] is False


def test_reads_fastjson_files_with_bare_integer_keys_and_extra_fields(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text(
        '{\n\t"offsetTable":{\n\t\t"TopicA@g1":{0:12,1:3\n\t\t}\n\t}\n}'
    )
    (tmp_path / "delayOffset.json").write_text('{"offsetTable":{1:0,2 : 5}}')
    (tmp_path / "topics.json").write_text(
        json.dumps(
            {
                "dataVersion": {"counter": 1, "timestamp": 5, "stateVersion": 0},
                "topicConfigTable": {
                    "TopicA": {"topicName": "TopicA", "perm": 6, "attributes": {}}
                },
            }
        )
    )
    assert config_files.load_consumer_offsets(tmp_path) == {("TopicA", "g1"): {0: 12, 1: 3}}
    assert config_files.load_delay_offsets(tmp_path) == {1: 0, 2: 5}
    topics = config_files.load_topics(tmp_path)
    assert topics.topics == {"TopicA": TopicConfig("TopicA")}
    assert topics.data_version == DataVersion(timestamp_ms=5, counter=1)


def test_save_keeps_previous_version_as_backup(tmp_path: Path) -> None:
    config_files.save_delay_offsets(tmp_path, {1: 1})
    config_files.save_delay_offsets(tmp_path, {1: 2})
    config_files.save_delay_offsets(tmp_path, {1: 3})
    backup = json.loads((tmp_path / "delayOffset.json.bak").read_text())
    assert backup == {"offsetTable": {"1": 2}}
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "delayOffset.json",
        "delayOffset.json.bak",
    ]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"offsetTable": {"TopicA": {"0": 1}}}',
        '{"offsetTable": {"TopicA@g": {"zero": 1}}}',
        '{"offsetTable": {"TopicA@g": {"0": "1"}}}',
        '{"offsetTable": {"TopicA@g": {"0": true}}}',
        '{"offsetTable": {"a@b@c": {"0": 1}}}',
    ],
)
def test_corrupt_consumer_offsets_raise_config_error_naming_the_file(
    tmp_path: Path, content: str
) -> None:
    (tmp_path / "consumerOffset.json").write_text(content)
    with pytest.raises(ConfigError, match=r"consumerOffset\.json"):
        config_files.load_consumer_offsets(tmp_path)


@pytest.mark.parametrize(
    "record",
    [
        {"readQueueNums": 8},
        {"topicName": "TopicA", "readQueueNums": "8"},
        {"topicName": "TopicA", "order": 1},
        {"topicName": "Other"},
    ],
)
def test_malformed_topic_records_raise_config_error(
    tmp_path: Path, record: dict[str, object]
) -> None:
    (tmp_path / "topics.json").write_text(json.dumps({"topicConfigTable": {"TopicA": record}}))
    with pytest.raises(ConfigError, match=r"topics\.json"):
        config_files.load_topics(tmp_path)


def test_corrupt_file_falls_back_to_backup_only_when_asked(tmp_path: Path) -> None:
    config_files.save_consumer_offsets(tmp_path, {("T", "g"): {0: 1}})
    config_files.save_consumer_offsets(tmp_path, {("T", "g"): {0: 2}})
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable": {')
    with pytest.raises(ConfigError, match="previous version in"):
        config_files.load_consumer_offsets(tmp_path)
    offsets = config_files.load_consumer_offsets(tmp_path, use_backup_if_corrupt=True)
    assert offsets == {("T", "g"): {0: 1}}
    (tmp_path / "consumerOffset.json.bak").write_text("garbage")
    with pytest.raises(ConfigError, match="unusable too"):
        config_files.load_consumer_offsets(tmp_path, use_backup_if_corrupt=True)


def test_missing_or_empty_file_with_backup_loads_backup(tmp_path: Path) -> None:
    config_files.save_delay_offsets(tmp_path, {1: 7})
    config_files.save_delay_offsets(tmp_path, {1: 8})
    (tmp_path / "delayOffset.json").write_text("")
    assert config_files.load_delay_offsets(tmp_path) == {1: 7}
    (tmp_path / "delayOffset.json").unlink()
    assert config_files.load_delay_offsets(tmp_path) == {1: 7}


def test_crash_between_temp_write_and_rename_keeps_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {("TopicA", "g"): {0: 10}}
    config_files.save_consumer_offsets(tmp_path, old)
    original_replace = Path.replace

    def crash_on_final_rename(self: Path, target: Path) -> Path:
        if self.name.endswith(".json.tmp"):  # the backup rename goes through; this one dies
            raise OSError(5, "simulated crash")
        return original_replace(self, target)

    monkeypatch.setattr(Path, "replace", crash_on_final_rename)
    with pytest.raises(StoreError, match="simulated crash"):
        config_files.save_consumer_offsets(tmp_path, {("TopicA", "g"): {0: 99}})
    monkeypatch.undo()
    assert (tmp_path / "consumerOffset.json.tmp").exists()  # the new version, never renamed
    assert config_files.load_consumer_offsets(tmp_path) == old
    config_files.save_consumer_offsets(tmp_path, {("TopicA", "g"): {0: 11}})
    assert config_files.load_consumer_offsets(tmp_path) == {("TopicA", "g"): {0: 11}}


names = st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=12)


@given(
    st.dictionaries(
        st.tuples(names, names),
        st.dictionaries(
            st.integers(min_value=0, max_value=1023),
            st.integers(min_value=0, max_value=2**62),
            max_size=4,
        ),
        max_size=5,
    )
)
def test_consumer_offsets_round_trip_any_table(
    tmp_path_factory: pytest.TempPathFactory, offsets: dict[tuple[str, str], dict[int, int]]
) -> None:
    config_dir = tmp_path_factory.mktemp("config")
    config_files.save_consumer_offsets(config_dir, offsets)
    assert config_files.load_consumer_offsets(config_dir) == offsets

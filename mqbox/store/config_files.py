"""The JSON files under config/: topics, consumer offsets, delay offsets, subscription groups.

Owns: their encoding (RocketMQ's key names, so a RocketMQ operator's tools read them), typed
records for their contents, atomic saves that keep the previous version as `<name>.bak`, and
loads that tolerate a missing file and name a corrupt one. Written only by the broker's admin
and offset services (one writer per file); read at start.

Never: hold the tables in memory between calls or decide when to save (the services do), and
never write a file in place.

Invariants:
- A save leaves `<name>` whole at every instant: the old version until the rename, the new one
  after (mapped_file.write_file_atomically). `<name>.bak` holds the version before the last save.
- A load returns an empty table for a missing file (a new store), falls back to `<name>.bak`
  when `<name>` is missing or empty (RocketMQ's ConfigManager does the same), and raises
  ConfigError naming the file when it cannot be parsed; with `use_backup_if_corrupt=True` it
  takes the backup instead, and raises only if that is unusable too.
- RocketMQ writes these files with fastjson, which leaves integer map keys unquoted
  (`{0:12}`). A load accepts that form; a save writes standard JSON with quoted keys.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mqbox.errors import ConfigError
from mqbox.message import java_utf8_encode
from mqbox.store.layout import (
    BACKUP_SUFFIX,
    CONSUMER_OFFSET_FILE_NAME,
    DELAY_OFFSET_FILE_NAME,
    SUBSCRIPTION_GROUP_FILE_NAME,
    TOPICS_FILE_NAME,
)
from mqbox.store.mapped_file import ensure_directory, fsync_directory, write_file_atomically

TOPIC_GROUP_SEPARATOR = "@"

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DataVersion:
    """RocketMQ's DataVersion: bumped on every change so brokers and namesrv see staleness."""

    timestamp_ms: int = 0
    counter: int = 0


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """One topic's configuration, RocketMQ's TopicConfig (defaults are RocketMQ's)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False


@dataclasses.dataclass(frozen=True)
class TopicConfigTable:
    """Contents of topics.json."""

    topics: Mapping[str, TopicConfig] = dataclasses.field(default_factory=dict)
    data_version: DataVersion = DataVersion()


@dataclasses.dataclass(frozen=True)
class SubscriptionGroupConfig:
    """One consumer group's configuration, RocketMQ's SubscriptionGroupConfig."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True


@dataclasses.dataclass(frozen=True)
class SubscriptionGroupTable:
    """Contents of subscriptionGroup.json."""

    groups: Mapping[str, SubscriptionGroupConfig] = dataclasses.field(default_factory=dict)
    data_version: DataVersion = DataVersion()


ConsumerOffsetTable = dict[tuple[str, str], dict[int, int]]
"""(topic, group) -> queue_id -> queue_index of the next message to consume."""

DelayOffsetTable = dict[int, int]
"""delay level -> queue_index in SCHEDULE_TOPIC_XXXX's queue for that level."""

# JSON key of each record field, in RocketMQ's camelCase.
_TOPIC_KEYS = {
    "topic_name": "topicName",
    "read_queue_nums": "readQueueNums",
    "write_queue_nums": "writeQueueNums",
    "perm": "perm",
    "topic_filter_type": "topicFilterType",
    "topic_sys_flag": "topicSysFlag",
    "order": "order",
}
_GROUP_KEYS = {
    "group_name": "groupName",
    "consume_enable": "consumeEnable",
    "consume_from_min_enable": "consumeFromMinEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "broker_id": "brokerId",
    "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
    "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
}
assert set(_TOPIC_KEYS) == {field.name for field in dataclasses.fields(TopicConfig)}
assert set(_GROUP_KEYS) == {field.name for field in dataclasses.fields(SubscriptionGroupConfig)}

# ---------------------------------------------------------------------------------------------
# Reading and writing JSON files
# ---------------------------------------------------------------------------------------------


class _MalformedError(Exception):
    """The JSON parsed but does not have the shape of the file (message says where)."""


# A bare integer used as an object key, as fastjson writes map keys: `{0:12,` or `, 3 :`.
# Topic and group names cannot hold braces, commas or colons, so strings never match.
_BARE_INTEGER_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        quoted = _BARE_INTEGER_KEY.sub(r'\1"\2"\3', text)
        if quoted == text:
            raise
        return json.loads(quoted)


def _load(
    path: Path, decode: Callable[[Any], T], empty: Callable[[], T], *, use_backup_if_corrupt: bool
) -> T:
    """Read, parse and decode `path`, with the missing, empty and corrupt cases above."""
    backup_path = path.with_name(path.name + BACKUP_SUFFIX)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as error:
        if use_backup_if_corrupt and backup_path.exists():
            return _load_backup(backup_path, decode, f"{path}: {error}")
        raise ConfigError(f"{path}: cannot read: {error}") from error
    if text.strip() == "":
        if backup_path.exists():
            return _load_backup(backup_path, decode, f"{path} is missing or empty")
        return empty()
    try:
        return decode(_parse_json(text))
    except (json.JSONDecodeError, _MalformedError) as error:
        problem = f"{path}: corrupt: {error}"
        if use_backup_if_corrupt and backup_path.exists():
            return _load_backup(backup_path, decode, problem)
        hint = f" (previous version in {backup_path})" if backup_path.exists() else ""
        raise ConfigError(problem + hint) from error


def _load_backup(backup_path: Path, decode: Callable[[Any], T], problem: str) -> T:
    try:
        return decode(_parse_json(backup_path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, _MalformedError) as error:
        raise ConfigError(f"{problem}; backup {backup_path} unusable too: {error}") from error


def _save(path: Path, document: Mapping[str, Any]) -> None:
    """Write `document` as JSON to `path` atomically, keeping the old version as .bak."""
    for directory in ensure_directory(path.parent):
        fsync_directory(directory)
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    # Names and values here came from the wire: encoded as Java encodes text (message.py).
    write_file_atomically(path, java_utf8_encode(text), keep_backup=True)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _MalformedError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _MalformedError(f"{where}: expected an integer, got {value!r}")
    return value


def _int_key(key: str, where: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise _MalformedError(f"{where}: key {key!r} is not an integer") from None


def _record(
    record_type: type[T], keys: Mapping[str, str], value: Any, where: str, name_field: str
) -> T:
    """Decode one JSON object into a record: known keys typed like the defaults, others ignored
    (newer RocketMQ versions add fields)."""
    document = _object(value, where)
    fields = {field.name: field for field in dataclasses.fields(record_type)}  # type: ignore[arg-type]
    arguments: dict[str, Any] = {}
    for field_name, json_key in keys.items():
        if json_key not in document:
            if field_name == name_field:
                raise _MalformedError(f"{where}: missing {json_key!r}")
            continue
        field_value = document[json_key]
        default = fields[field_name].default
        expected_type = str if field_name == name_field else type(default)
        if expected_type is int:
            field_value = _int(field_value, f"{where}.{json_key}")
        elif not isinstance(field_value, expected_type):
            raise _MalformedError(
                f"{where}.{json_key}: expected {expected_type.__name__}, got {field_value!r}"
            )
        arguments[field_name] = field_value
    return record_type(**arguments)


def _data_version(document: dict[str, Any], where: str) -> DataVersion:
    if "dataVersion" not in document:
        return DataVersion()
    version = _object(document["dataVersion"], f"{where}.dataVersion")
    return DataVersion(
        timestamp_ms=_int(version.get("timestamp", 0), f"{where}.dataVersion.timestamp"),
        counter=_int(version.get("counter", 0), f"{where}.dataVersion.counter"),
    )


def _encode_data_version(data_version: DataVersion) -> dict[str, int]:
    return {"timestamp": data_version.timestamp_ms, "counter": data_version.counter}


# ---------------------------------------------------------------------------------------------
# topics.json
# ---------------------------------------------------------------------------------------------


def _decode_topics(value: Any) -> TopicConfigTable:
    document = _object(value, "topics")
    table = _object(document.get("topicConfigTable", {}), "topicConfigTable")
    topics: dict[str, TopicConfig] = {}
    for topic, record in table.items():
        config = _record(
            TopicConfig, _TOPIC_KEYS, record, f"topicConfigTable.{topic}", "topic_name"
        )
        if config.topic_name != topic:
            raise _MalformedError(f"topicConfigTable.{topic}: topicName is {config.topic_name!r}")
        topics[topic] = config
    return TopicConfigTable(topics=topics, data_version=_data_version(document, "topics"))


def load_topics(config_dir: Path, *, use_backup_if_corrupt: bool = False) -> TopicConfigTable:
    """Load config/topics.json; an empty table if there is none."""
    return _load(
        config_dir / TOPICS_FILE_NAME,
        _decode_topics,
        TopicConfigTable,
        use_backup_if_corrupt=use_backup_if_corrupt,
    )


def save_topics(config_dir: Path, table: TopicConfigTable) -> None:
    """Save config/topics.json atomically."""
    topics: dict[str, dict[str, Any]] = {}
    for topic, config in table.topics.items():
        assert config.topic_name == topic
        topics[topic] = {
            json_key: getattr(config, field_name) for field_name, json_key in _TOPIC_KEYS.items()
        }
    _save(
        config_dir / TOPICS_FILE_NAME,
        {"topicConfigTable": topics, "dataVersion": _encode_data_version(table.data_version)},
    )


# ---------------------------------------------------------------------------------------------
# consumerOffset.json
# ---------------------------------------------------------------------------------------------


def _decode_consumer_offsets(value: Any) -> ConsumerOffsetTable:
    document = _object(value, "consumerOffset")
    table = _object(document.get("offsetTable", {}), "offsetTable")
    offsets: ConsumerOffsetTable = {}
    for topic_at_group, queue_offsets in table.items():
        parts = topic_at_group.split(TOPIC_GROUP_SEPARATOR)
        if len(parts) != 2 or not all(parts):
            raise _MalformedError(f"offsetTable: key {topic_at_group!r} is not <topic>@<group>")
        where = f"offsetTable.{topic_at_group}"
        offsets[(parts[0], parts[1])] = {
            _int_key(queue_id, where): _int(queue_index, f"{where}.{queue_id}")
            for queue_id, queue_index in _object(queue_offsets, where).items()
        }
    return offsets


def load_consumer_offsets(
    config_dir: Path, *, use_backup_if_corrupt: bool = False
) -> ConsumerOffsetTable:
    """Load config/consumerOffset.json; an empty table if there is none."""
    return _load(
        config_dir / CONSUMER_OFFSET_FILE_NAME,
        _decode_consumer_offsets,
        dict,
        use_backup_if_corrupt=use_backup_if_corrupt,
    )


def save_consumer_offsets(
    config_dir: Path, offsets: Mapping[tuple[str, str], Mapping[int, int]]
) -> None:
    """Save config/consumerOffset.json atomically."""
    table: dict[str, dict[str, int]] = {}
    for (topic, group), queue_offsets in offsets.items():
        assert topic
        assert group
        assert TOPIC_GROUP_SEPARATOR not in topic
        assert TOPIC_GROUP_SEPARATOR not in group
        table[f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"] = {
            str(queue_id): queue_index for queue_id, queue_index in sorted(queue_offsets.items())
        }
    _save(config_dir / CONSUMER_OFFSET_FILE_NAME, {"offsetTable": table})


# ---------------------------------------------------------------------------------------------
# delayOffset.json
# ---------------------------------------------------------------------------------------------


def _decode_delay_offsets(value: Any) -> DelayOffsetTable:
    document = _object(value, "delayOffset")
    table = _object(document.get("offsetTable", {}), "offsetTable")
    return {
        _int_key(level, "offsetTable"): _int(queue_index, f"offsetTable.{level}")
        for level, queue_index in table.items()
    }


def load_delay_offsets(
    config_dir: Path, *, use_backup_if_corrupt: bool = False
) -> DelayOffsetTable:
    """Load config/delayOffset.json; an empty table if there is none."""
    return _load(
        config_dir / DELAY_OFFSET_FILE_NAME,
        _decode_delay_offsets,
        dict,
        use_backup_if_corrupt=use_backup_if_corrupt,
    )


def save_delay_offsets(config_dir: Path, offsets: Mapping[int, int]) -> None:
    """Save config/delayOffset.json atomically."""
    table = {str(level): queue_index for level, queue_index in sorted(offsets.items())}
    _save(config_dir / DELAY_OFFSET_FILE_NAME, {"offsetTable": table})


# ---------------------------------------------------------------------------------------------
# subscriptionGroup.json
# ---------------------------------------------------------------------------------------------


def _decode_subscription_groups(value: Any) -> SubscriptionGroupTable:
    document = _object(value, "subscriptionGroup")
    table = _object(document.get("subscriptionGroupTable", {}), "subscriptionGroupTable")
    groups: dict[str, SubscriptionGroupConfig] = {}
    for group, record in table.items():
        config = _record(
            SubscriptionGroupConfig,
            _GROUP_KEYS,
            record,
            f"subscriptionGroupTable.{group}",
            "group_name",
        )
        if config.group_name != group:
            raise _MalformedError(f"subscriptionGroupTable.{group}: groupName differs")
        groups[group] = config
    return SubscriptionGroupTable(
        groups=groups, data_version=_data_version(document, "subscriptionGroup")
    )


def load_subscription_groups(
    config_dir: Path, *, use_backup_if_corrupt: bool = False
) -> SubscriptionGroupTable:
    """Load config/subscriptionGroup.json; an empty table if there is none."""
    return _load(
        config_dir / SUBSCRIPTION_GROUP_FILE_NAME,
        _decode_subscription_groups,
        SubscriptionGroupTable,
        use_backup_if_corrupt=use_backup_if_corrupt,
    )


def save_subscription_groups(config_dir: Path, table: SubscriptionGroupTable) -> None:
    """Save config/subscriptionGroup.json atomically."""
    groups: dict[str, dict[str, Any]] = {}
    for group, config in table.groups.items():
        assert config.group_name == group
        groups[group] = {
            json_key: getattr(config, field_name) for field_name, json_key in _GROUP_KEYS.items()
        }
    _save(
        config_dir / SUBSCRIPTION_GROUP_FILE_NAME,
        {
            "subscriptionGroupTable": groups,
            "dataVersion": _encode_data_version(table.data_version),
        },
    )

"""The broker keys that may change while the broker runs, and the home's broker.conf that keeps
them (UPDATE_BROKER_CONFIG, 25; docs/protocol.md section 4.7).

Owns: `RUNTIME_KEYS`; the runtime keys' lines of `<home>/broker.conf` (an update rewrites the
file with those lines changed and every other line kept, and replaces it by rename, so a reader
never sees half of it); the overlay of that file's runtime keys on the configuration the broker
started with (`apply_home_overrides`, at start and whenever the file changes);
`RuntimeConfigWatcher`, which a processor asks once a tick. Never: keys read once at start
(ports, paths, pool sizes, store layout): changing those means a
restart, and UPDATE_BROKER_CONFIG refuses them with a remark.

Why only these keys: each is read by the processors on every request, from the configuration
the watcher refreshes, so a change takes effect within a tick (1 s) in every process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from mqbox.config import (
    _BROKER_KEYS,
    CQ_ENTRY_SIZE_BYTES,
    BrokerConfig,
    _apply,
    parse_properties,
)
from mqbox.errors import ConfigError

HOME_BROKER_CONF_NAME: Final = "broker.conf"
RUNTIME_KEYS: Final = frozenset({"autoCreateTopicEnable", "autoCreateSubscriptionGroup"})
CHECK_INTERVAL_NS: Final = 1_000_000_000


def home_broker_conf(home: Path) -> Path:
    return home / HOME_BROKER_CONF_NAME


def read_overrides(home: Path) -> dict[str, str]:
    """The runtime keys the home's broker.conf sets ({} without the file); other keys in it are
    ignored (only updates write it)."""
    path = home_broker_conf(home)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    try:
        values = parse_properties(text)
    except ValueError as error:
        raise ConfigError(f"{path}: {error}") from None
    return {key: value for key, value in values.items() if key in RUNTIME_KEYS}


def apply_overrides(broker: BrokerConfig, values: Mapping[str, str], source: str) -> BrokerConfig:
    """`broker` with the runtime keys of `values` applied; ConfigError for a bad value."""
    assert RUNTIME_KEYS.issuperset(values), sorted(values)
    applied: BrokerConfig = _apply(broker, _BROKER_KEYS, values, source)
    return dataclasses.replace(applied, unknown_keys=broker.unknown_keys)


def apply_home_overrides(broker: BrokerConfig, home: Path) -> BrokerConfig:
    """The configuration a broker of this home runs with: its broker.conf's, then the keys
    updates persisted in the home."""
    return apply_overrides(broker, read_overrides(home), str(home_broker_conf(home)))


def update_problems(values: Mapping[str, str], broker: BrokerConfig) -> list[str]:
    """Why an update cannot be applied: a key not in RUNTIME_KEYS, or a value its parser
    refuses; [] when it can."""
    problems: list[str] = []
    for key in sorted(values):
        if key not in RUNTIME_KEYS:
            known = "a start-time key" if key in _BROKER_KEYS else "not a key mqbox knows"
            problems.append(
                f"{key} is {known}; only {', '.join(sorted(RUNTIME_KEYS))} change at run time"
            )
    if problems:
        return problems
    try:
        apply_overrides(broker, values, "the update")
    except ConfigError as error:
        problems.append(str(error))
    return problems


def persist_overrides(home: Path, values: Mapping[str, str]) -> None:
    """Set `values` (runtime keys, already checked) in the home's broker.conf: a key's line is
    replaced where it is, a missing key appended, every other line kept (the file may be the
    whole configuration the broker was started with, as the tests' appliance does); then a
    temporary file, fsync, rename."""
    assert RUNTIME_KEYS.issuperset(values)
    path = home_broker_conf(home)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = ["# Runtime keys set by UPDATE_BROKER_CONFIG; read over the broker's config."]
    remaining = dict(values)
    kept: list[str] = []
    for line in lines:
        key = _key_of(line)
        if key in values:
            if key in remaining:
                kept.append(f"{key}={remaining.pop(key)}")
            continue  # a key given twice: the first line keeps the new value
        kept.append(line)
    kept.extend(f"{key}={value}" for key, value in sorted(remaining.items()))
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as file:
        file.write("\n".join(kept) + "\n")
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)


def _key_of(line: str) -> str | None:
    """The key of a properties line, None for a comment or a blank line."""
    text = line.strip()
    if not text or text[0] in "#!":
        return None
    cut = min((i for i in (text.find("="), text.find(":")) if i >= 0), default=len(text))
    return text[:cut].strip()


class RuntimeConfigWatcher:
    """A process's view of the home's broker.conf: `refresh` answers the configuration with the
    file's keys applied when the file changed since the last look, else None."""

    def __init__(self, home: Path, started_with: BrokerConfig) -> None:
        self._home = home
        self._started_with = started_with
        self._stamp: tuple[int, int] | None = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        with contextlib.suppress(FileNotFoundError):
            status = home_broker_conf(self._home).stat()
            return status.st_mtime_ns, status.st_ino
        return None

    def refresh(self) -> BrokerConfig | None:
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            return apply_home_overrides(self._started_with, self._home)
        except ConfigError:
            return None  # a file edited by hand into nonsense: keep what runs


def _property_text(value: object, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if key.endswith("FileSizeConsumeQueue"):
        assert isinstance(value, int)
        return str(value * CQ_ENTRY_SIZE_BYTES)  # the key is in bytes, the field in entries
    return str(value)


def broker_properties(broker: BrokerConfig) -> dict[str, str]:
    """Every key mqbox reads from broker.conf with the value `broker` holds, in RocketMQ's text
    form (GET_BROKER_CONFIG's body). Of the two spellings of the segment-size keys, the one of
    4.9 (`mappedFile...`)."""
    properties: dict[str, str] = {}
    for key, (field_name, _parse) in _BROKER_KEYS.items():
        if key.startswith("mapedFile"):
            continue
        value: object = broker
        for part in field_name.split("."):
            value = getattr(value, part)
        properties[key] = _property_text(value, key)
    return properties

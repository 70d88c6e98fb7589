"""Operations behind the CLI: everything `mqbox ...` does, as plain functions that return data.

Owns: locating the home directory and etc/ defaults, loading configuration for display.
Never: prints (the CLI prints) or exits the process; failures are MqboxError subclasses.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path
from typing import Any

from mqbox.config import (
    BrokerConfig,
    NamesrvConfig,
    load_broker_config,
    load_namesrv_config,
)

ETC_DIR = Path(__file__).resolve().parents[2] / "etc"


def home_dir(home: Path | None) -> Path:
    """The appliance's home: --home, else $MQBOX_HOME, else ~/mqbox."""
    if home is not None:
        return home.expanduser().resolve()
    env_home = os.environ.get("MQBOX_HOME")
    if env_home:
        return Path(env_home).expanduser().resolve()
    return (Path.home() / "mqbox").resolve()


def load_configs(broker_conf: Path | None) -> tuple[NamesrvConfig, BrokerConfig]:
    """The name server and broker configuration `mqbox start` would use."""
    namesrv_path = ETC_DIR / "namesrv.conf"
    broker_path = broker_conf if broker_conf is not None else ETC_DIR / "broker.conf"
    namesrv = load_namesrv_config(namesrv_path if namesrv_path.exists() else None)
    broker = load_broker_config(broker_path)
    return namesrv, broker


def config_as_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready view of a config dataclass (enums by value, nested dataclasses inlined)."""

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)
            }
        if isinstance(value, tuple):
            return [plain(item) for item in value]
        return value

    result = plain(config)
    assert isinstance(result, dict)
    return result

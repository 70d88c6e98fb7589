"""Names of the shared-memory objects of one mqbox instance, and the sweep that removes them.

Owns: the naming scheme `/mqbox.<instance>.<role>.<n>` of ring segments (plus `.doorbell` for a
ring's FIFO, doorbell.py), and listing and unlinking every object of an instance found in
/dev/shm. Never: opening or mapping anything (ring.py does), or deciding whether an instance is
dead (the supervisor asks psutil before it sweeps).

Invariants: instance and role names use only letters, digits, '_' and '-', so the dots split a
name unambiguously and one instance's prefix `mqbox.<instance>.` never matches another instance;
`n` is a decimal integer without a sign or leading zeros, so each object has exactly one name.

Linux keeps POSIX shared-memory objects as files in /dev/shm, and glibc's shm_unlink is an
unlink(2) there, so the sweep lists and unlinks that directory directly; that also takes the
doorbell FIFOs, which are not shared-memory objects but live beside their segments on purpose.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from mqbox.errors import ConfigError

SHM_DIRECTORY: Final = Path("/dev/shm")
NAME_PREFIX: Final = "mqbox"
DOORBELL_SUFFIX: Final = ".doorbell"
PART_SIZE_CHARS_MAX: Final = 64

_PART = re.compile(rf"[A-Za-z0-9_-]{{1,{PART_SIZE_CHARS_MAX}}}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,8}")
_FILE_NAME = re.compile(
    rf"{NAME_PREFIX}\.(?P<instance>{_PART.pattern})\.(?P<role>{_PART.pattern})"
    rf"\.(?P<index>{_INDEX.pattern})(?P<suffix>{re.escape(DOORBELL_SUFFIX)})?"
)


@dataclass(frozen=True, slots=True)
class ShmName:
    """The parts of one ring's name; `str()` gives the posix_ipc name with its leading '/'."""

    instance: str
    role: str
    index: int

    def __post_init__(self) -> None:
        check_part("instance", self.instance)
        check_part("role", self.role)
        if _INDEX.fullmatch(str(self.index)) is None:
            raise ConfigError(f"shared-memory index {self.index!r} must be 0 to 999999999")

    def __str__(self) -> str:
        return f"/{NAME_PREFIX}.{self.instance}.{self.role}.{self.index}"


def check_part(label: str, part: str) -> None:
    """ConfigError unless `part` may be an instance or role name."""
    if _PART.fullmatch(part) is None:
        raise ConfigError(
            f"shared-memory {label} name {part!r} must be 1 to {PART_SIZE_CHARS_MAX}"
            " letters, digits, '_' or '-'"
        )


def shm_name(instance: str, role: str, index: int) -> str:
    """`/mqbox.<instance>.<role>.<index>`: the name to give Ring.create and Ring.attach."""
    return str(ShmName(instance, role, index))


def parse_shm_name(name: str) -> ShmName:
    """The parts of a ring name made by shm_name; ConfigError for anything else."""
    match = _FILE_NAME.fullmatch(name.removeprefix("/"))
    if not name.startswith("/") or match is None or match["suffix"] is not None:
        raise ConfigError(f"{name!r} is not an mqbox shared-memory name")
    return ShmName(match["instance"], match["role"], int(match["index"]))


def shm_path(name: str) -> Path:
    """Where Linux keeps the shared-memory object `name`."""
    return SHM_DIRECTORY / str(parse_shm_name(name)).removeprefix("/")


def doorbell_path(name: str) -> Path:
    """Where the doorbell FIFO of the ring `name` lives: beside the segment, in /dev/shm."""
    segment_path = shm_path(name)
    return segment_path.with_name(segment_path.name + DOORBELL_SUFFIX)


def instance_paths(instance: str, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """Every segment and doorbell of `instance` in `directory`, sorted by name."""
    check_part("instance", instance)
    found: list[Path] = []
    for path in directory.iterdir():
        match = _FILE_NAME.fullmatch(path.name)
        if match is not None and match["instance"] == instance:
            found.append(path)
    return sorted(found)


def instances(directory: Path = SHM_DIRECTORY) -> list[str]:
    """Names of the instances that have at least one object in `directory`, sorted."""
    found: set[str] = set()
    for path in directory.iterdir():
        match = _FILE_NAME.fullmatch(path.name)
        if match is not None:
            found.add(match["instance"])
    return sorted(found)


def unlink_instance(instance: str, directory: Path = SHM_DIRECTORY) -> list[Path]:
    """Remove every segment and doorbell of `instance`; returns what was removed.

    For the supervisor once every process of the instance is gone: processes that still have a
    segment mapped keep using it, but nothing can attach to it by name afterwards. Objects that
    vanish meanwhile (another sweep) are skipped.
    """
    removed: list[Path] = []
    for path in instance_paths(instance, directory):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed

"""What crosses process boundaries to and from the admin processor, besides parcels.py's parcels.

Owns: the COMMIT_OFFSET ring parcel (pull.p -> admin.0: a commitOffset piggybacked on a PULL,
topology.py's ring) and its layout; and the group-subscriptions file, `config/` +
SUBSCRIPTIONS_FILE_NAME: admin.0 writes each consumer group's subscription table there whenever
it changes, and the pull processors read it (`GroupSubscriptionsReader`) for pulls that carry no
subscription (sysFlag bit 2 clear: the Java push consumer's default). Never: request codes
(protocol/mqbox_codes.py) or their routing (routing.py), business rules (the admin processor and
pull.py decide), sockets, or a parcel type inside parcels.py's range.

Parcel type numbers: parcels.py numbers the broker's core parcels from 1 upwards; the admin's
start at ADMIN_PARCEL_TYPE_FIRST (64), far above them, so the two modules can grow apart without
a clash. Same conventions as parcels.py: little-endian, a numpy dtype with a struct twin checked
at import, a fixed head that is a multiple of 8 bytes.

COMMIT_OFFSET: the consumer group's next queue index for one queue, as a pull carried it.

    +0            +8         +12          +14          +16
    | queue_index | queue_id | group_size | topic_size | group (UTF-8), then topic (UTF-8) |
    | i64         | i32      | u16        | u16        |                                   |

The group-subscriptions file (mqbox's own; RocketMQ keeps subscriptions in memory only):

    {"groups": {"<group>": {"<topic>": {"subString": "TagA || TagB", "tagsSet": ["TagA", "TagB"],
                                        "tagHashes": [2598919, 2598920], "subVersion": 1795..,
                                        "expressionType": "TAG"}}},
     "dataVersion": {"counter": 3, "timestamp": 1795..}}

It is replaced whole by rename (readers see the old table or the new one), without fsync: it is
rebuilt from heartbeats, which every client sends every 30 s, so losing it in a crash costs
nothing. A group without live members is absent; so is everything after the admin restarts,
until the first heartbeat.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeAlias

import numpy as np

from mqbox.message import java_utf8_decode, java_utf8_encode
from mqbox.server.roles.processors.client_manager import Subscription
from mqbox.store.layout import TEMP_SUFFIX, config_dir

Buffer: TypeAlias = bytes | bytearray | memoryview

ADMIN_PARCEL_TYPE_FIRST: Final = 64
COMMIT_OFFSET: Final = ADMIN_PARCEL_TYPE_FIRST + 0
ADMIN_PARCEL_TYPE_NAMES: Final = {COMMIT_OFFSET: "COMMIT_OFFSET"}
NAME_SIZE_BYTES_MAX: Final = 0xFFFF

COMMIT_OFFSET_HEAD = np.dtype(
    {
        "names": ["queue_index", "queue_id", "group_size", "topic_size"],
        "formats": ["<i8", "<i4", "<u2", "<u2"],
        "offsets": [0, 8, 12, 14],
        "itemsize": 16,
    }
)
COMMIT_OFFSET_HEAD_STRUCT: Final = struct.Struct("<qiHH")
assert COMMIT_OFFSET_HEAD.itemsize == COMMIT_OFFSET_HEAD_STRUCT.size
assert COMMIT_OFFSET_HEAD_STRUCT.size % 8 == 0
assert COMMIT_OFFSET_HEAD.fields is not None
assert [
    COMMIT_OFFSET_HEAD.fields[name][1]
    for name in ("queue_index", "queue_id", "group_size", "topic_size")
] == [0, 8, 12, 14]


class CommitOffset(NamedTuple):
    """One COMMIT_OFFSET parcel."""

    group: str
    topic: str
    queue_id: int
    queue_index: int


def pack_commit_offset(group: str, topic: str, queue_id: int, queue_index: int) -> bytes:
    """The whole COMMIT_OFFSET payload (pull.py appends it to its ring to admin.0)."""
    group_bytes = java_utf8_encode(group)
    topic_bytes = java_utf8_encode(topic)
    assert len(group_bytes) <= NAME_SIZE_BYTES_MAX
    assert len(topic_bytes) <= NAME_SIZE_BYTES_MAX
    head = COMMIT_OFFSET_HEAD_STRUCT.pack(queue_index, queue_id, len(group_bytes), len(topic_bytes))
    return head + group_bytes + topic_bytes


def unpack_commit_offset(buffer: Buffer, offset: int, size: int) -> CommitOffset:
    queue_index, queue_id, group_size, topic_size = COMMIT_OFFSET_HEAD_STRUCT.unpack_from(
        buffer, offset
    )
    start = offset + COMMIT_OFFSET_HEAD_STRUCT.size
    assert COMMIT_OFFSET_HEAD_STRUCT.size + group_size + topic_size == size
    group = java_utf8_decode(buffer[start : start + group_size])
    start += group_size
    topic = java_utf8_decode(buffer[start : start + topic_size])
    return CommitOffset(group, topic, queue_id, queue_index)


# ---------------------------------------------------------------------------------------------
# The group-subscriptions file

SUBSCRIPTIONS_FILE_NAME: Final = "mqboxSubscriptions.json"
RELOAD_CHECK_INTERVAL_NS: Final = 100_000_000  # a reader stats the file at most this often

GroupSubscriptions: TypeAlias = Mapping[str, Mapping[str, Subscription]]


def subscriptions_path(store_root: Path) -> Path:
    return config_dir(store_root) / SUBSCRIPTIONS_FILE_NAME


def encode_group_subscriptions(
    groups: GroupSubscriptions, counter: int, timestamp_ms: int
) -> bytes:
    document: dict[str, Any] = {
        "groups": {
            group: {
                topic: {
                    "subString": entry.sub_string,
                    "tagsSet": list(entry.tags),
                    "tagHashes": list(entry.tag_hashes),
                    "subVersion": entry.sub_version,
                    "expressionType": entry.expression_type,
                }
                for topic, entry in sorted(topics.items())
            }
            for group, topics in sorted(groups.items())
        },
        "dataVersion": {"counter": counter, "timestamp": timestamp_ms},
    }
    # Wire text (a subscription's tags) may hold a lone surrogate: '?' on disk, as Java writes it.
    return java_utf8_encode(json.dumps(document, ensure_ascii=False, indent=1) + "\n")


def decode_group_subscriptions(data: bytes) -> tuple[dict[str, dict[str, Subscription]], int]:
    """(group -> topic -> subscription, dataVersion counter). Raises ValueError on a file that
    is not what encode_group_subscriptions wrote."""
    document = json.loads(java_utf8_decode(data))
    if not isinstance(document, dict) or not isinstance(document.get("groups"), dict):
        raise ValueError("not a group-subscriptions document")
    groups: dict[str, dict[str, Subscription]] = {}
    for group, topics in document["groups"].items():
        if not isinstance(topics, dict):
            raise ValueError(f"group {group!r}: not an object")
        entries: dict[str, Subscription] = {}
        for topic, entry in topics.items():
            try:
                entries[topic] = Subscription(
                    topic,
                    str(entry["subString"]),
                    tuple(str(tag) for tag in entry["tagsSet"]),
                    tuple(int(code) for code in entry["tagHashes"]),
                    int(entry["subVersion"]),
                    str(entry["expressionType"]),
                )
            except (KeyError, TypeError) as error:
                raise ValueError(f"group {group!r} topic {topic!r}: {error}") from None
        groups[group] = entries
    version = document.get("dataVersion", {})
    counter = version.get("counter", 0) if isinstance(version, dict) else 0
    return groups, int(counter)


def write_group_subscriptions(
    store_root: Path, groups: GroupSubscriptions, counter: int, timestamp_ms: int
) -> None:
    """Replace the file whole (write beside it, rename); no fsync (module docstring)."""
    path = subscriptions_path(store_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp_path = path.with_name(path.name + TEMP_SUFFIX)
    temp_path.write_bytes(encode_group_subscriptions(groups, counter, timestamp_ms))
    temp_path.replace(path)


class GroupSubscriptionsReader:
    """A pull processor's view of the group-subscriptions file.

    `get` costs a clock read and two dict lookups; it stats the file at most every
    `reload_check_interval_ns`. On a miss, call `get_fresh`, which looks at once: the heartbeat
    that made the entry may have been answered a moment ago. A file that cannot be read or
    parsed leaves the last good table in place (the writer replaces it whole, so that only
    happens if someone else wrote it).
    """

    def __init__(
        self,
        store_root: Path,
        *,
        reload_check_interval_ns: int = RELOAD_CHECK_INTERVAL_NS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        assert reload_check_interval_ns >= 0
        self.path = subscriptions_path(store_root)
        self._reload_check_interval_ns = reload_check_interval_ns
        self._clock_ns = clock_ns
        self._groups: dict[str, dict[str, Subscription]] = {}
        self._signature: tuple[int, int, int] | None = None
        self._check_due_ns = 0
        self.reload_count = 0
        self.bad_file_count = 0

    def get(self, group: str, topic: str) -> Subscription | None:
        """The group's subscription of `topic` as last seen (checked at most every 100 ms)."""
        now_ns = self._clock_ns()
        if now_ns >= self._check_due_ns:
            self._check_due_ns = now_ns + self._reload_check_interval_ns
            self.reload_if_changed()
        return self._groups.get(group, {}).get(topic)

    def get_fresh(self, group: str, topic: str) -> Subscription | None:
        """The same after a look at the file now."""
        self.reload_if_changed()
        return self._groups.get(group, {}).get(topic)

    def reload_if_changed(self) -> bool:
        try:
            status = self.path.stat()
        except FileNotFoundError:
            if self._signature is not None:
                self._groups = {}
                self._signature = None
                return True
            return False
        signature = (status.st_ino, status.st_size, status.st_mtime_ns)
        if signature == self._signature:
            return False
        try:
            groups, _counter = decode_group_subscriptions(self.path.read_bytes())
        except (OSError, ValueError):
            self.bad_file_count += 1
            return False
        self._groups = groups
        self._signature = signature
        self.reload_count += 1
        return True

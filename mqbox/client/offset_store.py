"""Consumer offsets: the in-memory table both of Java's offset stores keep, and the local file.

Owns (docs/client.md B.8):
- OffsetTable: RemoteBrokerOffsetStore's and LocalFileOffsetStore's offsetTable, with Java's
  update (increase-only or set), read (memory, store, memory-then-store, answering -1 and -2 as
  Java does) and the choice of what persistAll sends (assigned queues) and forgets (the others).
- The local offset file of a BROADCASTING consumer: its path, its JSON format (below), reading it
  with the `.bak` fallback, and writing it atomically.

Never: sockets or clocks. Asking a broker is the caller's: read() takes a `fetch` function, and
persisting to a broker is a loop over offsets_to_persist(). The only I/O here is the local file:
write_file_atomically() and read_offsets_file(), small functions the rest calls.

Local file: `<base_dir>/<clientId>/<group>/offsets.json`, base_dir being Java's
`rocketmq.client.localOffsetStoreDir` (default `~/.rocketmq_offsets`). Java writes fastjson's
`{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:offset}}`, whose object keys are not
JSON, and C++ writes a boost text archive to `offsets.Json`; neither can be read by the other,
nor by a JSON parser. mqbox writes standard JSON, one object per queue, in the shape of the
offset table C++ reads in RESET_CONSUMER_CLIENT_OFFSET (docs/protocol.md section 4.4):

    {"offsetTable": [{"brokerName": "broker-a", "offset": 42, "queueId": 0, "topic": "T"}, ...],
     "version": 1}

entries sorted by (topic, brokerName, queueId), keys sorted, one entry per line, newline at the
end. A later entry for the same queue wins.

Writing (write_file_atomically): the new content goes to `offsets.json.tmp`, fsynced; the old
file is renamed to `offsets.json.bak`; the temporary file is renamed to `offsets.json`; the
directory is fsynced. A crash at any point leaves either the old file, or no file and the old one
as `.bak`, or the new file: reading (read_offsets_file) takes `offsets.json`, and falls back to
`.bak` when it is missing, empty or not valid. Java does the same dance with a copy instead of a
rename. Unlike Java, a damaged file with no usable `.bak` raises OffsetFileError rather than
silently starting over from consumeFromWhere.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from mqbox.client.allocate import queue_sort_key
from mqbox.errors import ConfigError, MqboxError
from mqbox.protocol.headers import MessageQueue

OFFSET_NOT_FOUND: Final = -1  # Java: not in memory, or the broker answered a code other than 0
OFFSET_FETCH_FAILED: Final = (
    -2
)  # Java: asking the broker failed otherwise (RemoteBrokerOffsetStore)

LOCAL_OFFSET_DIR_DEFAULT: Final = "~/.rocketmq_offsets"  # expanded by the caller
LOCAL_OFFSET_FILE_NAME: Final = "offsets.json"
FORMAT_VERSION: Final = 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

# fetch(queue) -> the offset the store holds, or None when it holds none (see OffsetTable.read)
Fetch = Callable[[MessageQueue], int | None]


class OffsetFileError(MqboxError):
    """The local offset file cannot be read (damaged, with no usable .bak) or written."""


class ReadOffsetType(enum.Enum):
    """Where OffsetTable.read looks (Java's ReadOffsetType)."""

    READ_FROM_MEMORY = "memory"
    READ_FROM_STORE = "store"
    MEMORY_FIRST_THEN_STORE = "memory first"


class OffsetTable:
    """Offsets by queue: the next queue index to consume, as committed by this client.

    Single owner: the caller serialises access (Java uses a ConcurrentHashMap of AtomicLongs).
    """

    __slots__ = ("_offsets",)

    def __init__(self) -> None:
        self._offsets: dict[MessageQueue, int] = {}

    def update(self, queue: MessageQueue, offset: int, increase_only: bool) -> None:
        """Record `offset` for `queue`; with increase_only (concurrent consumption) never lower
        an offset already held, without it (orderly, a reset) set it as given."""
        held = self._offsets.get(queue)
        if held is None or not increase_only or offset > held:
            self._offsets[queue] = offset

    def read_memory(self, queue: MessageQueue) -> int:
        """The offset held for `queue`, or OFFSET_NOT_FOUND (-1)."""
        return self._offsets.get(queue, OFFSET_NOT_FOUND)

    def read(self, queue: MessageQueue, read_type: ReadOffsetType, fetch: Fetch) -> int:
        """Java's readOffset: memory, the store, or memory and then the store.

        From the store: `fetch(queue)` returns the offset the store holds, which is then held in
        memory (set, not increased) and returned; None (the broker answered a code other than
        SUCCESS, e.g. 22 QUERY_NOT_FOUND) gives OFFSET_NOT_FOUND; an MqboxError raised by fetch
        (no broker address, a timeout, a closed connection) gives OFFSET_FETCH_FAILED. A local
        file fetch answers None for every failure, as Java's LocalFileOffsetStore returns -1.
        """
        if read_type is not ReadOffsetType.READ_FROM_STORE:
            held = self._offsets.get(queue)
            if held is not None:
                return held
            if read_type is ReadOffsetType.READ_FROM_MEMORY:
                return OFFSET_NOT_FOUND
        try:
            offset = fetch(queue)
        except MqboxError:
            return OFFSET_FETCH_FAILED
        if offset is None:
            return OFFSET_NOT_FOUND
        self.update(queue, offset, increase_only=False)
        return offset

    def remove(self, queue: MessageQueue) -> None:
        """Forget `queue` (removeOffset, after a rebalance took it away and it was persisted)."""
        self._offsets.pop(queue, None)

    def load(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Hold every offset of `offsets` (LocalFileOffsetStore.load's putAll)."""
        self._offsets.update(offsets)

    def offsets_to_persist(
        self, assigned: Collection[MessageQueue]
    ) -> list[tuple[MessageQueue, int]]:
        """RemoteBrokerOffsetStore.persistAll: the (queue, offset) pairs to send with
        UPDATE_CONSUMER_OFFSET, every held offset of an assigned queue, changed or not; the
        offsets of queues no longer assigned are forgotten. Nothing happens when `assigned` is
        empty (Java returns at once, forgetting nothing)."""
        if not assigned:
            return []
        assigned_set = assigned if isinstance(assigned, (set, frozenset)) else set(assigned)
        persist = [
            (queue, offset) for queue, offset in self._offsets.items() if queue in assigned_set
        ]
        for queue in [queue for queue in self._offsets if queue not in assigned_set]:
            del self._offsets[queue]
        return persist

    def snapshot(self, queues: Iterable[MessageQueue] | None = None) -> dict[MessageQueue, int]:
        """A copy of the held offsets, of `queues` only when given (nothing is forgotten)."""
        if queues is None:
            return dict(self._offsets)
        return {queue: self._offsets[queue] for queue in queues if queue in self._offsets}

    def clone_offset_table(self, topic: str | None = None) -> dict[MessageQueue, int]:
        """Java's cloneOffsetTable: the held offsets, of one topic when `topic` is given."""
        return {
            queue: offset
            for queue, offset in self._offsets.items()
            if not topic or queue.topic == topic
        }


# --- The local offset file ----------------------------------------------------------------------


def local_offset_path(base_dir: Path, client_id: str, group: str) -> Path:
    """`<base_dir>/<client_id>/<group>/offsets.json`; ConfigError when the id or the group is not
    one plain path component (empty, `.`, `..`, or holding `/` or NUL)."""
    for what, component in (("client id", client_id), ("consumer group", group)):
        if component in ("", ".", "..") or "/" in component or "\0" in component:
            raise ConfigError(f"{what} {component!r} cannot name an offset directory")
    return base_dir / client_id / group / LOCAL_OFFSET_FILE_NAME


def encode_offsets(offsets: Mapping[MessageQueue, int]) -> bytes:
    """The local file's content for `offsets` (module docstring)."""
    entries = [
        {
            "brokerName": queue.broker_name,
            "offset": offset,
            "queueId": queue.queue_id,
            "topic": queue.topic,
        }
        for queue, offset in sorted(offsets.items(), key=lambda item: queue_sort_key(item[0]))
    ]
    lines = ",\n".join(
        "  " + json.dumps(entry, sort_keys=True, ensure_ascii=False) for entry in entries
    )
    body = f"[\n{lines}\n]" if entries else "[]"
    return f'{{"offsetTable": {body},\n "version": {FORMAT_VERSION}}}\n'.encode()


def decode_offsets(content: bytes) -> dict[MessageQueue, int]:
    """The offsets in a local file's content; OffsetFileError when it is not that format."""
    try:
        document = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OffsetFileError(f"offset file is not JSON: {error}") from error
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise OffsetFileError("offset file is not an mqbox offset table, version 1")
    entries = document.get("offsetTable")
    if not isinstance(entries, list):
        raise OffsetFileError("offset file has no offsetTable list")
    offsets: dict[MessageQueue, int] = {}
    for entry in entries:
        queue, offset = _decode_entry(entry)
        offsets[queue] = offset
    return offsets


def _decode_entry(entry: Any) -> tuple[MessageQueue, int]:
    if not isinstance(entry, dict):
        raise OffsetFileError(f"offset entry {entry!r} is not an object")
    topic = entry.get("topic")
    broker_name = entry.get("brokerName")
    queue_id = entry.get("queueId")
    offset = entry.get("offset")
    if not isinstance(topic, str) or not topic or not isinstance(broker_name, str):
        raise OffsetFileError(f"offset entry {entry!r} lacks a topic or brokerName")
    if type(queue_id) is not int or not 0 <= queue_id < 2**31:
        raise OffsetFileError(f"offset entry {entry!r} has no valid queueId")
    if type(offset) is not int or not _INT64_MIN <= offset <= _INT64_MAX:
        raise OffsetFileError(f"offset entry {entry!r} has no valid offset")
    return MessageQueue(topic, broker_name, queue_id), offset


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def temporary_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def write_file_atomically(path: Path, content: bytes) -> None:
    """Replace `path` by `content` so that a crash leaves the old or the new content (module
    docstring): temporary file, fsync, old file to `.bak`, rename, directory fsync. Creates the
    directory. Raises OffsetFileError on any OSError."""
    temporary = temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with temporary.open("wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            path.replace(backup_path(path))
        temporary.replace(path)
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as error:
        raise OffsetFileError(f"cannot write {path}: {error}") from error


def _read_content(path: Path) -> bytes | None:
    """The bytes of `path`, None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise OffsetFileError(f"cannot read {path}: {error}") from error


def read_offsets_file(path: Path) -> dict[MessageQueue, int]:
    """The offsets stored at `path`, falling back to `.bak` when `path` is missing, empty or
    damaged; {} when neither exists (or both are empty). Raises OffsetFileError when the file it
    would rely on is damaged: `.bak` itself, or `path` with no `.bak`."""
    content = _read_content(path)
    damage: OffsetFileError | None = None
    if content:
        try:
            return decode_offsets(content)
        except OffsetFileError as error:
            damage = error
    backup = _read_content(backup_path(path))
    if backup:
        return decode_offsets(backup)
    if damage is not None:
        raise OffsetFileError(f"{path} is damaged and has no usable .bak: {damage}") from damage
    return {}


def persist_local_offsets(
    path: Path, table: OffsetTable, assigned: Collection[MessageQueue]
) -> None:
    """LocalFileOffsetStore.persistAll: write the held offsets of the assigned queues (the file
    then holds those only); nothing when `assigned` is empty. Raises OffsetFileError."""
    if not assigned:
        return
    write_file_atomically(path, encode_offsets(table.snapshot(assigned)))


def fetch_local_offset(path: Path, queue: MessageQueue) -> int | None:
    """LocalFileOffsetStore's READ_FROM_STORE: the offset in the file, None when it is absent or
    the file cannot be read (Java answers -1 either way). Pass it to OffsetTable.read."""
    try:
        return read_offsets_file(path).get(queue)
    except OffsetFileError:
        return None

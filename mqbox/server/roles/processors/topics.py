"""Topic configuration shared by the broker's processes: config/topics.json behind a file lock.

Owns: `TopicConfigStore`, every process's view of the topic table (the send processors create
topics on the fly, the pull processors read them, the services role registers them with the name
server), the system topics of a new store (docs/protocol.md section 9), and the rules of
auto-creation (from a template topic with the INHERIT permission, such as TBW102, and `%RETRY%`
topics with one queue), which topics topic admin may not touch (`system_topic_refusal`,
`group_topic_perm_refusal`), and topic admin's replace and delete (`put`, `delete`: the admin
processors' UPDATE_AND_CREATE_TOPIC and DELETE_TOPIC_IN_BROKER). The file format and its atomic
save belong to store/config_files.py.

Never: a cache that outlives a change by more than RELOAD_CHECK_INTERVAL_NS (unless a miss forces
a look), a write outside the lock, or a write in place (config_files replaces the file whole).

Invariants:
- Every read-modify-write of topics.json runs under an exclusive flock on `topics.json.lock`
  beside it, and re-reads the file inside the lock, so processes that create topics at the same
  time lose nobody's topic. Readers take no lock: the file is replaced by rename, so they see
  the old table or the new one.
- Each saved change bumps the table's dataVersion (counter + 1, timestamp now), which the name
  server and the services role use to notice it.
- A topic, once created, keeps its queue counts unless topic admin replaces it (`put`, from
  UPDATE_AND_CREATE_TOPIC) or removes it (`delete`); create_if_absent never changes one.
- Automatic creation (`create_if_absent`, `create_many_if_absent`, `auto_create`: SEND to a new
  topic, retry and dead-letter topics, a heartbeat's retry topics) stops once the table holds
  mqboxAutoCreateTopicCountMax topics (AutoCreateLimitError, answered 17 with its message);
  topic admin (`put`) and the system topics are not limited. Java has no such bound: any client
  that may send could fill its table, and every creation rewrites the whole file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

from mqbox.clock import wall_clock_ms
from mqbox.config import BrokerConfig
from mqbox.errors import AutoCreateLimitError
from mqbox.protocol.codes import PERM_INHERIT, PERM_READ, PERM_WRITE
from mqbox.protocol.headers import validate_topic
from mqbox.store import config_files
from mqbox.store.config_files import DataVersion, TopicConfig, TopicConfigTable
from mqbox.store.layout import DIRECTORY_MODE, FILE_MODE, TOPICS_FILE_NAME, config_dir

RELOAD_CHECK_INTERVAL_NS: Final = 100_000_000  # a reader stats topics.json at most this often
LOCK_FILE_SUFFIX: Final = ".lock"

AUTO_CREATE_TOPIC_KEY_TOPIC: Final = "TBW102"  # the template of auto-created topics
SELF_TEST_TOPIC: Final = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC: Final = "BenchmarkTest"
OFFSET_MOVED_EVENT: Final = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
TRACE_TOPIC: Final = "RMQ_SYS_TRACE_TOPIC"
TRANS_HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"
RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX: Final = "%DLQ%"
SCHEDULE_QUEUE_COUNT: Final = 18  # one queue per delay level
BENCHMARK_QUEUE_COUNT: Final = 1024  # as the Java broker makes it
PERM_READ_WRITE: Final = PERM_READ | PERM_WRITE
PERM_ALL: Final = PERM_READ | PERM_WRITE | PERM_INHERIT


def system_topics(broker: BrokerConfig) -> list[TopicConfig]:
    """The topics a new store starts with (section 9), in the Java broker's order. TBW102 only
    when autoCreateTopicEnable; the cluster- and broker-named topics only when their names are
    legal topic names."""
    topics: list[TopicConfig] = [TopicConfig(SELF_TEST_TOPIC, 1, 1, PERM_READ_WRITE)]
    if broker.auto_create_topic_enable:
        queue_count = broker.default_topic_queue_nums
        topics.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, queue_count, queue_count, PERM_ALL))
    topics.append(
        TopicConfig(BENCHMARK_TOPIC, BENCHMARK_QUEUE_COUNT, BENCHMARK_QUEUE_COUNT, PERM_READ_WRITE)
    )
    topics.extend(
        TopicConfig(named, 1, 1, PERM_ALL)
        for named in (broker.broker_cluster_name, broker.broker_name)
        if validate_topic(named) is None
    )
    topics += [
        TopicConfig(OFFSET_MOVED_EVENT, 1, 1, PERM_READ_WRITE),
        TopicConfig(SCHEDULE_TOPIC, SCHEDULE_QUEUE_COUNT, SCHEDULE_QUEUE_COUNT, PERM_READ_WRITE),
        TopicConfig(TRACE_TOPIC, 1, 1, PERM_READ_WRITE),
        TopicConfig(TRANS_HALF_TOPIC, 1, 1, PERM_READ_WRITE),
        TopicConfig(TRANS_OP_HALF_TOPIC, 1, 1, PERM_READ_WRITE),
        TopicConfig(TRANS_CHECK_MAX_TIME_TOPIC, 1, 1, PERM_READ_WRITE),
    ]
    return topics


# Java 4.9.x's TopicValidator.SYSTEM_TOPIC_SET: topic admin may neither create, replace nor
# delete these (nor a topic starting with a SYSTEM_TOPIC_PREFIXES entry).
JAVA_SYSTEM_TOPICS: Final = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SCHEDULE_TOPIC,
        BENCHMARK_TOPIC,
        TRANS_HALF_TOPIC,
        TRACE_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)
# Java's is "rmq_sys_" alone; its own RMQ_SYS_* topics are in the set, mqbox keeps the prefix.
SYSTEM_TOPIC_PREFIXES: Final = ("rmq_sys_", "RMQ_SYS_")


def system_topic_refusal(topic: str, broker: BrokerConfig) -> str | None:
    """The remark refusing topic admin (UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER) on
    `topic`, or None when it may go ahead. As Java 4.9.x's TopicValidator.isSystemTopic, with
    Java's remark: the system topics, any `rmq_sys_` / `RMQ_SYS_` topic, and the topics named
    after the cluster and the broker (Java adds those to its set at start). A replaced TBW102
    could stop auto-creation (perm without INHERIT: every new topic 17), a replaced
    SCHEDULE_TOPIC_XXXX delays and retries; docs/security.md."""
    if (
        topic in JAVA_SYSTEM_TOPICS
        or topic.startswith(SYSTEM_TOPIC_PREFIXES)
        or topic in (broker.broker_cluster_name, broker.broker_name)
    ):
        return f"The topic[{topic}] is conflict with system topic."
    return None


def group_topic_perm_refusal(topic: str, perm: int) -> str | None:
    """The remark refusing UPDATE_AND_CREATE_TOPIC to give a group's `%RETRY%` topic less than
    read and write (the broker writes retries there, the group's consumers read them) or its
    `%DLQ%` topic no write (the broker writes dead letters; read is the operator's choice, 4.5.2
    made it write-only); None otherwise. Java has no such rule."""
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and perm & PERM_READ_WRITE != PERM_READ_WRITE:
        return f"perm = {perm}: a {RETRY_GROUP_TOPIC_PREFIX} topic keeps read and write (6)"
    if topic.startswith(DLQ_GROUP_TOPIC_PREFIX) and not perm & PERM_WRITE:
        return f"perm = {perm}: a {DLQ_GROUP_TOPIC_PREFIX} topic keeps write (2)"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class TopicConfigStoreStatistics:
    reload_count: int
    check_count: int
    created_count: int  # topics this process created
    version_counter: int


class TopicConfigStore:
    """One process's view of config/topics.json (module docstring).

    Not thread-safe: one per process (each role owns its own). `get` costs a clock read and a
    dict lookup; it stats the file at most every RELOAD_CHECK_INTERVAL_NS, and `get_fresh` looks
    at once (for a miss that may be a topic another process just made).
    """

    def __init__(
        self,
        store_root: Path,
        broker: BrokerConfig,
        *,
        reload_check_interval_ns: int = RELOAD_CHECK_INTERVAL_NS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        assert reload_check_interval_ns >= 0
        self.broker = broker
        self.directory = config_dir(store_root)
        self.path = self.directory / TOPICS_FILE_NAME
        self.lock_path = self.directory / (TOPICS_FILE_NAME + LOCK_FILE_SUFFIX)
        self._reload_check_interval_ns = reload_check_interval_ns
        self._clock_ns = clock_ns
        self._wall_clock_ms = wall_clock_ms
        self._table = TopicConfigTable()
        self._signature: tuple[int, int, int] | None = None
        self._check_due_ns = 0
        self._reload_count = 0
        self._check_count = 0
        self._created_count = 0
        self.reload_if_changed()

    # -- reading ----------------------------------------------------------------------------------

    def get(self, topic: str) -> TopicConfig | None:
        """The topic's configuration as last seen (checked for changes at most every 100 ms)."""
        now_ns = self._clock_ns()
        if now_ns >= self._check_due_ns:
            self._check_due_ns = now_ns + self._reload_check_interval_ns
            self.reload_if_changed()
        return self._table.topics.get(topic)

    def get_fresh(self, topic: str) -> TopicConfig | None:
        """The topic's configuration after a look at the file now."""
        self.reload_if_changed()
        return self._table.topics.get(topic)

    def topics(self) -> Mapping[str, TopicConfig]:
        """Every topic as last seen."""
        return self._table.topics

    @property
    def data_version(self) -> DataVersion:
        return self._table.data_version

    def reload_if_changed(self) -> bool:
        """Read topics.json again if its inode, size or mtime changed; True if it did."""
        self._check_count += 1
        signature = self._file_signature()
        if signature == self._signature:
            return False
        self._table = config_files.load_topics(self.directory, use_backup_if_corrupt=True)
        self._signature = signature
        self._reload_count += 1
        return True

    def _file_signature(self) -> tuple[int, int, int] | None:
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return None
        return (status.st_ino, status.st_size, status.st_mtime_ns)

    # -- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The exclusive lock of topics.json, with the table re-read inside it."""
        self.directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.reload_if_changed()
            yield
        finally:
            os.close(fd)  # releases the flock

    def _save(self, topics: dict[str, TopicConfig]) -> None:
        """Under the lock: write `topics` with a bumped dataVersion, and adopt it here."""
        version = DataVersion(
            timestamp_ms=self._wall_clock_ms(), counter=self._table.data_version.counter + 1
        )
        table = TopicConfigTable(topics=topics, data_version=version)
        config_files.save_topics(self.directory, table)
        self._table = table
        self._signature = self._file_signature()

    def ensure_system_topics(self) -> list[str]:
        """Add the system topics the table lacks (section 9); the names added. Run once at start
        by the store writer, before any other role reads the table."""
        added: list[str] = []
        with self._locked():
            topics = dict(self._table.topics)
            for config in system_topics(self.broker):
                if config.topic_name not in topics:
                    topics[config.topic_name] = config
                    added.append(config.topic_name)
            if added:
                self._save(topics)
        return added

    def create_if_absent(self, config: TopicConfig) -> tuple[TopicConfig, bool]:
        """(the topic's configuration, True if this call created it). An existing topic wins.
        AutoCreateLimitError if it is absent and the table is full (module docstring)."""
        existing = self._table.topics.get(config.topic_name)
        if existing is not None:
            return existing, False
        created, refused = self.create_many_if_absent((config,))
        if refused:
            raise AutoCreateLimitError(self._refusal(config.topic_name))
        return self._table.topics[config.topic_name], bool(created)

    def create_many_if_absent(self, configs: Sequence[TopicConfig]) -> tuple[list[str], list[str]]:
        """Create every absent topic of `configs` in one write of the file (a heartbeat's retry
        topics: one lock and one save, however many groups it names); returns (the names
        created, the names refused because the table is full). Existing topics win."""
        for config in configs:
            assert validate_topic(config.topic_name) is None
            assert config.read_queue_nums > 0
            assert config.write_queue_nums > 0
        if all(config.topic_name in self._table.topics for config in configs):
            return [], []
        count_max = self.broker.limits.auto_create_topic_count_max
        created: list[str] = []
        refused: list[str] = []
        with self._locked():
            topics = dict(self._table.topics)
            for config in configs:
                name = config.topic_name
                if name in topics:
                    continue
                if len(topics) >= count_max:
                    refused.append(name)
                    continue
                topics[name] = config
                created.append(name)
            if created:
                self._save(topics)
        self._created_count += len(created)
        return created, refused

    def _refusal(self, topic: str) -> str:
        """The remark of a topic refused for a full table."""
        return (
            f"topic[{topic}] not created: the broker holds {len(self._table.topics)} topics, "
            f"mqboxAutoCreateTopicCountMax={self.broker.limits.auto_create_topic_count_max}"
        )

    def put(self, config: TopicConfig) -> bool:
        """Create or replace the topic (UPDATE_AND_CREATE_TOPIC); False if the table held exactly
        this already, so nothing was written. The caller has validated name, counts and perm."""
        assert validate_topic(config.topic_name) is None
        assert config.read_queue_nums > 0
        assert config.write_queue_nums > 0
        with self._locked():
            if self._table.topics.get(config.topic_name) == config:
                return False
            topics = dict(self._table.topics)
            topics[config.topic_name] = config
            self._save(topics)
        return True

    def delete(self, topic: str) -> bool:
        """Remove the topic (DELETE_TOPIC_IN_BROKER); False if the table did not hold it. Its
        consume queues and committed offsets are not touched (other owners, as in Java)."""
        with self._locked():
            if topic not in self._table.topics:
                return False
            topics = dict(self._table.topics)
            del topics[topic]
            self._save(topics)
        return True

    def replace_all(self, topics: Mapping[str, TopicConfig], data_version: DataVersion) -> None:
        """A slave's sync from its master (Java's SlaveSynchronize.syncTopicConfig): the whole
        table and the master's dataVersion replace this broker's, under the lock."""
        for name, config in topics.items():
            assert config.topic_name == name
        with self._locked():
            table = TopicConfigTable(topics=dict(topics), data_version=data_version)
            config_files.save_topics(self.directory, table)
            self._table = table
            self._signature = self._file_signature()

    def auto_create(
        self, topic: str, default_topic: str, default_topic_queue_nums: int
    ) -> TopicConfig | None:
        """Create `topic` for a SEND that names it before anyone configured it, as the Java
        broker does: a `%RETRY%` topic with 1 queue and perm 6; otherwise, when
        autoCreateTopicEnable is on and the client's template (`default_topic`, normally TBW102)
        exists with PERM_INHERIT, min(default_topic_queue_nums, the template's write queues)
        queues and the template's perm without INHERIT. None when the topic may not be made;
        AutoCreateLimitError when the table is full. The caller has validated the name."""
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            config, _created = self.create_if_absent(TopicConfig(topic, 1, 1, PERM_READ_WRITE))
            return config
        if not self.broker.auto_create_topic_enable:
            return None
        template = self.get_fresh(default_topic) if default_topic else None
        if template is None or not template.perm & PERM_INHERIT:
            return None
        queue_count = max(1, min(default_topic_queue_nums, template.write_queue_nums))
        config, _created = self.create_if_absent(
            TopicConfig(
                topic,
                queue_count,
                queue_count,
                template.perm & ~PERM_INHERIT,
                topic_filter_type=template.topic_filter_type,
            )
        )
        return config

    def statistics(self) -> TopicConfigStoreStatistics:
        return TopicConfigStoreStatistics(
            reload_count=self._reload_count,
            check_count=self._check_count,
            created_count=self._created_count,
            version_counter=self._table.data_version.counter,
        )

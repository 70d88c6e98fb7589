"""A slave's copy of its master's metadata: RocketMQ's SlaveSynchronize, in admin.0.

Owns: on a broker with brokerRole=SLAVE, the thread that fetches the master's topics (21),
consumer offsets (43), delay offsets (45) and subscription groups (201) every
mqboxSlaveSyncIntervalMs (RocketMQ 4.9: 10 s, the first after 3 s; mqbox's first comes after
min(3 s, the interval)), and `SlaveSync`, the admin section that applies what it fetched on the
admin loop's tick, so every table keeps its one writer:

    topics              a dataVersion other than this broker's: the master's table and version
                        replace topics.json (under its lock; topics.py)
    consumer offsets    each (topic, group) the master names replaces this broker's entry, others
                        stay (Java's putAll); consumerOffset.json is saved at once
    delay offsets       the master's table is written to delayOffset.json when it differs (the
                        schedule role of a slave delivers nothing and leaves the file alone)
    subscription groups a dataVersion other than this broker's: the master's table replaces
                        subscriptionGroup.json

Where the master is: the name server's route of this broker's name (GET_BROKER_CLUSTER_INFO,
106: `brokerAddrs[0]` of brokerName), asked before each round. That is the address Java's slave
takes from each registration's answer (`masterAddr`, which the name server reads from the same
table); mqbox asks for it here because the registration runs in the services role, another
process. A round is skipped while no master is registered, or when the address is the broker's
own. Each of the four steps fails alone (logged once per kind of failure) and is tried again at
the next round.

Never: runs on a master, writes from the fetching thread (the loop applies, one writer per
table), or takes an entry it cannot hold (a bad topic or group name, a negative index: dropped
with a warning).

Offsets a consumer committed to the slave while its master was down are overwritten by the
master's at the first round after the master is back, as in Java; they are not lost, because the
client keeps its offsets and commits them to the master once it routes to it again (docs/
replication.md, "Slave service").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Final, TypeVar

from mqbox.client.admin_api import (
    AllTopicConfig,
    all_consumer_offsets,
    all_delay_offsets,
    all_subscription_groups,
    all_topic_config,
)
from mqbox.client.errors import ClientError
from mqbox.client.namesrv_api import NamesrvList, cluster_info
from mqbox.client.remoting import RemotingClient
from mqbox.config import BrokerConfig
from mqbox.errors import MqboxError
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import (
    ConsumerOffsetSerializeWrapper,
    DelayOffsetSerializeWrapper,
    SubscriptionGroupWrapper,
    validate_topic,
)
from mqbox.server.roles.processors.admin.base import PERM_MAX, TOPIC_QUEUE_COUNT_MAX
from mqbox.server.roles.processors.admin.groups import (
    RETRY_QUEUE_COUNT_MAX,
    SubscriptionGroupAdmin,
    same_fields,
    stored_group,
)
from mqbox.server.roles.processors.client_manager import group_name_problem
from mqbox.store import config_files
from mqbox.store.config_files import (
    TOPIC_GROUP_SEPARATOR,
    DataVersion,
    SubscriptionGroupTable,
    TopicConfig,
)

log = logging.getLogger("mqbox.admin.slave_sync")

T = TypeVar("T")

FIRST_ROUND_DELAY_MS: Final = 3_000  # Java's initial delay
CALL_TIMEOUT_MS: Final = 5_000
MASTER_ID: Final = 0


@dataclasses.dataclass(frozen=True, slots=True)
class MasterMetadata:
    """One round's fetch from the master; None for a step that failed."""

    master_address: str
    topics: AllTopicConfig | None
    consumer_offsets: ConsumerOffsetSerializeWrapper | None
    delay_offsets: DelayOffsetSerializeWrapper | None
    subscription_groups: SubscriptionGroupWrapper | None


@dataclasses.dataclass(frozen=True, slots=True)
class SlaveSyncStatistics:
    rounds: int  # rounds that reached a master
    rounds_without_master: int
    step_failures: int
    applied: int  # rounds applied by the admin loop
    master_address: str | None


class MasterFetcher:
    """The fetching thread (module docstring). `take_nowait()` hands the loop the newest round."""

    def __init__(self, broker: BrokerConfig, own_address: str) -> None:
        self.broker_name = broker.broker_name
        self.own_address = own_address
        self.interval_ms = broker.slave_sync_interval_ms
        self.first_delay_ms = min(FIRST_ROUND_DELAY_MS, self.interval_ms)
        self._namesrvs = NamesrvList(
            broker.namesrv_addr, lambda address: RemotingClient(address, CALL_TIMEOUT_MS)
        )
        self._master: RemotingClient | None = None
        self._lock = threading.Lock()
        self._pending: MasterMetadata | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures_logged: set[str] = set()
        self.rounds = 0
        self.rounds_without_master = 0
        self.step_failures = 0
        self.master_address: str | None = None

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(target=self._run, name="mqbox-slave-sync", daemon=True)
        self._thread.start()

    def stop(self, timeout_ms: int = CALL_TIMEOUT_MS) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_ms / 1000)
        self._namesrvs.close()
        if self._master is not None:
            self._master.close()

    def take_nowait(self) -> MasterMetadata | None:
        """The round fetched since the last call, or None."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def _run(self) -> None:
        wait_ms = self.first_delay_ms
        while not self._stopping.wait(wait_ms / 1000):
            wait_ms = self.interval_ms
            metadata = self.fetch_round()
            if metadata is not None:
                with self._lock:
                    self._pending = metadata

    def fetch_round(self) -> MasterMetadata | None:
        """One round: the master's address, then the four steps; None without a master."""
        address = self._master_address()
        if address is None or address == self.own_address:
            self.rounds_without_master += 1
            return None
        if self._master is None or self._master.address != address:
            if self._master is not None:
                self._master.close()
            self._master = RemotingClient(address, CALL_TIMEOUT_MS)
            log.info("slave sync: the master of %s is %s", self.broker_name, address)
        self.master_address = address
        master = self._master
        self.rounds += 1
        return MasterMetadata(
            address,
            self._step("topics", lambda: all_topic_config(master)),
            self._step("consumer offsets", lambda: all_consumer_offsets(master)),
            self._step("delay offsets", lambda: all_delay_offsets(master)),
            self._step("subscription groups", lambda: all_subscription_groups(master)),
        )

    def _master_address(self) -> str | None:
        try:
            info = self._namesrvs.call(cluster_info)
        except (ClientError, RemoteProtocolError) as error:
            self._failed("name server", error)
            return None
        broker = info.broker_addr_table.get(self.broker_name)
        return None if broker is None else broker.broker_addrs.get(MASTER_ID)

    def _step(self, name: str, call: Callable[[], T]) -> T | None:
        try:
            result = call()
        except (ClientError, RemoteProtocolError, MqboxError) as error:
            self.step_failures += 1
            if self._master is not None:
                self._master.close()  # the next call reconnects
            self._failed(name, error)
            return None
        self._failures_logged.discard(name)
        return result

    def _failed(self, what: str, error: Exception) -> None:
        if what not in self._failures_logged:
            self._failures_logged.add(what)
            log.warning("slave sync: %s failed: %s", what, error)


class SlaveSync(SubscriptionGroupAdmin):
    """The admin section that applies the master's metadata (admin.0 of a slave only)."""

    slave_fetcher: MasterFetcher | None = None
    slave_sync_applied = 0

    def start_slave_sync(self) -> None:
        """Start the fetching thread on admin.0 of a slave; nothing elsewhere."""
        if self.is_slave and self.owns_state and self.slave_fetcher is None:
            self.slave_fetcher = MasterFetcher(self.ctx.broker, self.ctx.broker_address)
            self.slave_fetcher.start()

    def stop_slave_sync(self) -> None:
        if self.slave_fetcher is not None:
            self.slave_fetcher.stop()

    def apply_slave_sync_nowait(self) -> bool:
        """Apply the round fetched since the last tick, if any; True if there was one."""
        if self.slave_fetcher is None:
            return False
        metadata = self.slave_fetcher.take_nowait()
        if metadata is None:
            return False
        self.apply_master_metadata(metadata)
        return True

    def apply_master_metadata(self, metadata: MasterMetadata) -> None:
        """The module docstring's table, step by step."""
        if metadata.topics is not None:
            self._sync_topics(metadata.topics)
        if metadata.consumer_offsets is not None:
            self._sync_consumer_offsets(metadata.consumer_offsets)
        if metadata.delay_offsets is not None:
            self._sync_delay_offsets(metadata.delay_offsets)
        if metadata.subscription_groups is not None:
            self._sync_subscription_groups(metadata.subscription_groups)
        self.slave_sync_applied += 1

    def _sync_topics(self, master: AllTopicConfig) -> None:
        version = DataVersion(master.data_version.timestamp_ms, master.data_version.counter)
        self.topics.reload_if_changed()
        if self.topics.data_version == version:
            return
        topics: dict[str, TopicConfig] = {}
        for name, config in master.topic_config_table.items():
            if (
                validate_topic(name) is not None
                or config.topic_name != name
                or not 0 < config.read_queue_nums <= TOPIC_QUEUE_COUNT_MAX
                or not 0 < config.write_queue_nums <= TOPIC_QUEUE_COUNT_MAX
                or not 0 <= config.perm <= PERM_MAX
            ):
                log.warning("slave sync: the master's topic %r is not taken", name[:100])
                continue
            topics[name] = same_fields(config, TopicConfig)
        self.topics.replace_all(topics, version)
        log.info("slave sync: %d topics from the master", len(topics))

    def _sync_consumer_offsets(self, master: ConsumerOffsetSerializeWrapper) -> None:
        table: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in master.offset_table.items():
            parts = key.split(TOPIC_GROUP_SEPARATOR)
            if (
                len(parts) != 2
                or validate_topic(parts[0]) is not None
                or group_name_problem(parts[1]) is not None
                or any(queue_id < 0 or index < 0 for queue_id, index in queues.items())
            ):
                log.warning("slave sync: the master's offsets of %r are not taken", key[:100])
                continue
            table[(parts[0], parts[1])] = queues
        self.offsets.put_all(table, self.clock_ns())
        self.offsets.persist_now()

    def _sync_delay_offsets(self, master: DelayOffsetSerializeWrapper) -> None:
        table = {
            level: index for level, index in master.offset_table.items() if level > 0 and index >= 0
        }
        current = config_files.load_delay_offsets(self.config_dir, use_backup_if_corrupt=True)
        if current != table:
            config_files.save_delay_offsets(self.config_dir, table)

    def _sync_subscription_groups(self, master: SubscriptionGroupWrapper) -> None:
        version = DataVersion(master.data_version.timestamp_ms, master.data_version.counter)
        if self.subscription_groups.data_version == version:
            return
        groups = {
            name: stored_group(config)
            for name, config in master.subscription_group_table.items()
            if group_name_problem(name) is None
            and config.group_name == name
            and 0 <= config.retry_queue_nums <= RETRY_QUEUE_COUNT_MAX
        }
        self.replace_subscription_groups(SubscriptionGroupTable(groups, version))
        log.info("slave sync: %d subscription groups from the master", len(groups))

    def statistics_slave_sync(self) -> SlaveSyncStatistics | None:
        fetcher = self.slave_fetcher
        if fetcher is None:
            return None
        return SlaveSyncStatistics(
            fetcher.rounds,
            fetcher.rounds_without_master,
            fetcher.step_failures,
            self.slave_sync_applied,
            fetcher.master_address,
        )

"""Configuration: frozen dataclasses loaded from RocketMQ-style `.conf` files in etc/.

Owns: the key names, their defaults, units and bounds, and the parser of Java-properties files.
Never: reads the environment beyond the explicit overrides its callers pass, or starts anything.

RocketMQ's own key names are used where RocketMQ has one, so a RocketMQ `broker.conf` loads as it
is. A key mqbox does not know is one of three things: a RocketMQ key that changes what the broker
does and that mqbox does not implement (`REFUSED_BROKER_KEYS`, the one table of them: set to
anything but RocketMQ's default it is a ConfigError naming the key and the file, so a broker never
silently behaves unlike its configuration); a key starting with `mqbox` that mqbox does not have
(a typo of one of its own keys: a ConfigError with the nearest names); or anything else, a tuning
knob that is harmless to ignore, kept in `unknown_keys` (`ignored_keys_warning` is the one line
`mqbox start` prints about them). Keys that only mqbox has (pool sizes) start with `mqbox`. Both
RocketMQ spellings of the segment-size keys are accepted (`mapedFileSize...` in 4.x up to 4.5,
`mappedFileSize...` later).

A layout (`load_layout`, `mqbox start --layout`) names a name server file and several broker files
in one `mqbox.conf`; `member_name` is how one broker of it is named on the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import psutil

from mqbox.errors import ConfigError

NAMESRV_PORT_DEFAULT = 9876
BROKER_PORT_DEFAULT = 10911
LOOPBACK_ADDRESS = "127.0.0.1"
# mqboxNamesrvBrokerWhiteList entries besides addresses and networks (namesrv/admission.py)
WHITE_LIST_LOCAL = "local"
WHITE_LIST_ANYONE = "*"
HTTP_PORT_DEFAULT = 5557  # rocketmq-exporter's default port


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


def usable_core_count() -> int:
    """The cores this process may run on (its affinity mask, so taskset and cpusets count):
    what the pool sizes below and the roles' spin policy (transport.SpinGate) are sized by."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity call on this platform
        return psutil.cpu_count(logical=True) or 1


def _pool_default(eighths: int) -> int:
    """A request-path pool's default size: its share of the usable cores C, in eighths, at least
    1. One rule for the pools and the spin policy: the pools fill about 7/8 of C (reactor 1,
    codec 2, worker 1, send 2, pull 1 eighths: the codec and the send processor spend the most
    CPU per request), and a role spins only while the roles on a core are no more than C
    (transport.SpinGate), so on 2 cores every pool has one process and one role spins, and a
    64-core host runs 56 request-path processes that all may spin. ARCHITECTURE.md has the
    model of how the figures grow with C."""
    return max(1, usable_core_count() * eighths // 8)


@dataclasses.dataclass(frozen=True, slots=True)
class PoolConfig:
    """Process counts of one broker: RocketMQ's 1 + N + M1 + M2 threads as OS processes."""

    reactor_count: int = dataclasses.field(default_factory=lambda: _pool_default(1))
    codec_count: int = dataclasses.field(default_factory=lambda: _pool_default(2))
    worker_count: int = dataclasses.field(default_factory=lambda: _pool_default(1))
    send_processor_count: int = dataclasses.field(default_factory=lambda: _pool_default(2))
    pull_processor_count: int = dataclasses.field(default_factory=lambda: _pool_default(1))
    admin_processor_count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class LimitConfig:
    """Bounds on what clients can make one broker hold (issue 9): `mqbox*` keys, and RocketMQ's
    Netty key for the idle time. docs/limits.md says which role enforces each and what a
    client sees past it."""

    connection_count_max: int = 4096  # mqboxConnectionCountMax: all reactors together
    connection_idle_time_s: int = 120  # serverChannelMaxIdleTimeSeconds
    heartbeat_group_count_max: int = 256  # mqboxHeartbeatGroupCountMax: producer + consumer
    heartbeat_subscription_count_max: int = 256  # mqboxHeartbeatSubscriptionCountMax: per group
    auto_create_topic_count_max: int = 10_000  # mqboxAutoCreateTopicCountMax: topics.json size
    auto_create_group_count_max: int = 10_000  # mqboxAutoCreateGroupCountMax: groups file size
    spill_size_bytes_max: int = 256 * 1024 * 1024  # mqboxSpillBytesMax: /dev/shm spill files
    partial_frame_size_bytes_max: int = 64 * 1024 * 1024  # mqboxPartialFrameBytesMax: reactors
    connection_in_flight_count_max: int = 1024  # mqboxConnectionInFlightCountMax
    connection_output_size_bytes_max: int = 16 * 1024 * 1024  # mqboxConnectionOutputBytesMax
    response_buffer_size_bytes_max: int = 256 * 1024 * 1024  # mqboxResponseBufferBytesMax
    # keys of one generation of the idempotent window (store/idempotence.py): at most twice this
    # many held, in two tables of 32 bytes a key (32 MiB at the default), made at the first
    # idempotent send
    idempotent_key_count_max: int = 500_000  # mqboxIdempotentKeyCountMax


@dataclasses.dataclass(frozen=True, slots=True)
class RestartConfig:
    """How the supervisor restarts what died (mqbox only; supervisor.py rule 4). A dead role is
    re-forked, a dead store writer or dispatcher restarts every role of the broker (recovery runs
    first), the n-th restart in a row after backoff_ms * 2 ** (n - 2) (the first at once), at most
    backoff_ms_max; more deaths than the count maxima within window_ms stop the broker."""

    window_ms: int = 60_000  # mqboxRestartWindowMs
    role_restart_count_max: int = 10  # mqboxRoleRestartCountMax: of one role, within the window
    broker_restart_count_max: int = 5  # mqboxBrokerRestartCountMax: whole-broker, in the window
    backoff_ms: int = 100  # mqboxRestartBackoffMs
    backoff_ms_max: int = 10_000  # mqboxRestartBackoffMaxMs

    def delay_ms(self, restart_count: int) -> int:
        """The delay before the `restart_count`-th restart within the window (1 = the first)."""
        assert restart_count >= 1
        if restart_count == 1:
            return 0
        return min(self.backoff_ms_max, self.backoff_ms << min(restart_count - 2, 32))


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerConfig:
    """One broker's settings; RocketMQ key in the comment where the field name differs."""

    broker_cluster_name: str = "DefaultCluster"  # brokerClusterName
    broker_name: str = "broker-a"  # brokerName
    broker_id: int = 0  # brokerId: 0 = master
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER  # brokerRole
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH  # flushDiskType
    namesrv_addr: str = f"127.0.0.1:{NAMESRV_PORT_DEFAULT}"  # namesrvAddr, ';'-separated
    listen_port: int = BROKER_PORT_DEFAULT  # listenPort; 0 = any free port
    broker_ip1: str = "127.0.0.1"  # brokerIP1: the address clients are told to use
    # the IPv4 address the listener binds; "" = brokerIP1 (docs/security.md)
    listen_address: str = ""  # mqboxListenAddress
    broker_ip2: str = ""  # brokerIP2: the HA address slaves are told to use; "" = brokerIP1
    # haListenPort: RocketMQ's BrokerStartup forces listenPort + 1 whatever the file says, and so
    # does the supervisor once the listening port is bound (effective_ha_listen_port)
    ha_listen_port: int = BROKER_PORT_DEFAULT + 1
    # Replication (docs/replication.md): a SLAVE's master, "host:port" of its HA port
    ha_master_address: str = ""  # haMasterAddress
    slave_read_enable: bool = False  # slaveReadEnable: the master may send pulls to a slave
    # SYNC_MASTER answers SLAVE_NOT_AVAILABLE when the slave lags more than this
    ha_slave_fallbehind_max_bytes: int = 256 * 1024 * 1024  # haSlaveFallbehindMax
    ha_transfer_batch_size_bytes: int = 32 * 1024  # haTransferBatchSize: body bound both ways
    ha_send_heartbeat_interval_ms: int = 5000  # haSendHeartbeatInterval
    ha_housekeeping_interval_ms: int = 20_000  # haHousekeepingInterval: silent peer closed
    ha_reconnect_interval_ms: int = 1000  # mqboxHaReconnectIntervalMs: slave's connect retry
    store_path_root_dir: str = ""  # storePathRootDir; "" = <home>/store/<brokerName>
    commit_log_segment_size_bytes: int = 1 << 30  # mapedFileSizeCommitLog
    consume_queue_entry_count: int = 300_000  # mapedFileSizeConsumeQueue / 20
    file_reserved_time_hours: int = 72  # fileReservedTime
    delete_when: str = "04"  # deleteWhen: hours of the day, ';'-separated
    disk_max_used_space_ratio_percent: int = 75  # diskMaxUsedSpaceRatio
    clean_resource_interval_ms: int = 10_000  # cleanResourceInterval: retention runs this often
    clean_file_forcibly_enable: bool = True  # cleanFileForciblyEnable: nearly full disk
    flush_interval_commit_log_ms: int = 500  # flushIntervalCommitLog
    flush_interval_consume_queue_ms: int = 1000  # flushIntervalConsumeQueue
    # the index's msync besides a full file's and the stop's (roles/dispatcher.py); recovery
    # puts the keys of what it did not cover again (docs/store.md, "Checkpoint")
    flush_interval_index_ms: int = 60_000  # mqboxFlushIntervalIndexMs
    sync_flush_timeout_ms: int = 5000  # syncFlushTimeout
    # how long the broker holds an orderly consumer's queue lock after its last grant (Java: the
    # system property rocketmq.broker.rebalance.lockMaxLiveTime); at least the 30 s after which
    # clients stop trusting a lock they did not renew (they renew every 20 s), so no queue is
    # granted to a second consumer while its owner still consumes it
    rebalance_lock_max_live_time_ms: int = 60_000  # mqboxRebalanceLockMaxLiveTimeMs
    max_message_size_bytes: int = 4 * 1024 * 1024  # maxMessageSize
    auto_create_topic_enable: bool = True  # autoCreateTopicEnable
    auto_create_subscription_group: bool = True  # autoCreateSubscriptionGroup
    default_topic_queue_nums: int = 8  # defaultTopicQueueNums
    register_name_server_period_ms: int = 30_000  # registerNameServerPeriod
    long_polling_enable: bool = True  # longPollingEnable
    short_polling_time_ms: int = 1000  # shortPollingTimeMills
    message_delay_level: str = (  # messageDelayLevel
        "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    )
    # how long the idempotent window remembers a UNIQ_KEY at least (store/idempotence.py)
    idempotent_window_ms: int = 600_000  # mqboxIdempotentWindowMs
    # RocketMQ's plain ACL (docs/acl.md): every request is checked against plain_acl.yml
    acl_enable: bool = False  # aclEnable
    acl_file: str = ""  # mqboxAclFile: "" = <home>/conf/plain_acl.yml; relative to the home
    # the account the broker signs its name-server requests with; "" = the ACL file's first
    # admin account when aclEnable is true, else unsigned
    namesrv_access_key: str = ""  # mqboxNamesrvAccessKey
    namesrv_secret_key: str = ""  # mqboxNamesrvSecretKey
    # The HTTP endpoint (/metrics, the dashboard; server/web/): rocketmq-exporter's port by
    # default, 0 = any free port (written to <home>/run/http.json), -1 = no endpoint.
    http_port: int = HTTP_PORT_DEFAULT  # mqboxHttpPort
    http_host: str = "127.0.0.1"  # mqboxHttpHost: the address it binds
    # Reads from slaves (docs/replication.md, "Slave service"): whether pull answers may suggest
    # a slave, the share of RAM a consumer may fall behind before they do, and how often a slave
    # copies its master's metadata (RocketMQ 4.9: every 10 s, the first 3 s after start).
    access_message_in_memory_max_ratio_percent: int = 40  # accessMessageInMemoryMaxRatio
    offset_check_in_slave: bool = False  # offsetCheckInSlave
    slave_sync_interval_ms: int = 10_000  # mqboxSlaveSyncIntervalMs
    pools: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    limits: LimitConfig = dataclasses.field(default_factory=LimitConfig)
    restarts: RestartConfig = dataclasses.field(default_factory=RestartConfig)
    unknown_keys: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class NamesrvConfig:
    listen_port: int = NAMESRV_PORT_DEFAULT  # listenPort
    listen_address: str = LOOPBACK_ADDRESS  # mqboxListenAddress: the IPv4 address it binds
    # who may send 103/104/205 (namesrv/admission.py): "local", "*", addresses, CIDR networks;
    # () = unset, which broker_white_list_of reads as "local" (ACL off) or "*" (ACL on)
    broker_white_list: tuple[str, ...] = ()  # mqboxNamesrvBrokerWhiteList
    scan_not_active_broker_interval_ms: int = 10_000  # scanNotActiveBrokerInterval
    broker_channel_expired_time_ms: int = 120_000  # brokerChannelExpiredTime (RocketMQ constant)
    order_message_enable: bool = False  # orderMessageEnable
    # Bounds on what clients can make the name server hold (issue 9; namesrv/server.py).
    connection_count_max: int = 4096  # mqboxConnectionCountMax: more are closed at accept
    connection_idle_time_s: int = 120  # serverChannelMaxIdleTimeSeconds (RocketMQ's Netty key)
    kv_entry_count_max: int = 10_000  # mqboxKvEntryCountMax: KV entries in all namespaces
    kv_namespace_entry_count_max: int = 1000  # mqboxKvNamespaceEntryCountMax
    kv_key_size_bytes_max: int = 1024  # mqboxKvKeyBytesMax: namespace and key, UTF-8
    kv_value_size_bytes_max: int = 16 * 1024  # mqboxKvValueBytesMax: UTF-8
    broker_count_max: int = 1024  # mqboxNamesrvBrokerCountMax: registered broker addresses
    topic_count_max: int = 65_536  # mqboxNamesrvTopicCountMax: routed topics
    # plain ACL (docs/acl.md): registrations, wipes and other changes must be signed by an admin
    acl_enable: bool = False  # aclEnable
    acl_file: str = ""  # mqboxAclFile: "" = the broker's ACL file (mqbox start passes it)
    unknown_keys: tuple[str, ...] = ()


# RocketMQ key -> (field name, parser). Pool keys map to "pools.<field>", limits to "limits.<x>".
def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if not low <= value <= high:
            raise ValueError(f"{value} is outside [{low}, {high}]")
        return value

    return parse


_PORT = _int_in(0, 65535)


def _listen_address(text: str) -> str:
    """An IPv4 address to bind (the listeners are IPv4 only); 0.0.0.0 = every interface."""
    address = text.strip()
    ipaddress.IPv4Address(address)  # ValueError names what is wrong
    return address


def _optional_listen_address(text: str) -> str:
    return _listen_address(text) if text.strip() else ""


def parse_broker_white_list(text: str) -> tuple[str, ...]:
    """The entries of mqboxNamesrvBrokerWhiteList (comma-separated): `local`, `*`, IP
    addresses and CIDR networks; ValueError names the first that is none of them."""
    entries = tuple(part.strip() for part in text.split(",") if part.strip())
    if not entries:
        raise ValueError(f"empty: give {WHITE_LIST_LOCAL}, {WHITE_LIST_ANYONE} or addresses")
    for entry in entries:
        if entry in (WHITE_LIST_LOCAL, WHITE_LIST_ANYONE):
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{entry!r} is neither {WHITE_LIST_LOCAL}, {WHITE_LIST_ANYONE}, an IP address "
                "nor a CIDR network"
            ) from None
    return entries


def broker_white_list_of(config: NamesrvConfig, acl_on: bool = False) -> tuple[str, ...]:
    """mqboxNamesrvBrokerWhiteList as the name server applies it: unset = `local`, or `*` when
    the ACL is on (then a broker proves who it is by an admin signature, docs/acl.md)."""
    if config.broker_white_list:
        return config.broker_white_list
    return (WHITE_LIST_ANYONE,) if acl_on else (WHITE_LIST_LOCAL,)


def is_loopback(address: str) -> bool:
    """True for an address only this host reaches (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def broker_listen_address(config: BrokerConfig) -> str:
    """The address the broker's listener binds: mqboxListenAddress, else brokerIP1 (what
    mqbox always did), else loopback."""
    return config.listen_address or config.broker_ip1 or LOOPBACK_ADDRESS


_POSITIVE = _int_in(1, 1 << 62)
_POOL = _int_in(1, 256)

_BROKER_KEYS: dict[str, tuple[str, Any]] = {
    "brokerClusterName": ("broker_cluster_name", str.strip),
    "brokerName": ("broker_name", str.strip),
    "brokerId": ("broker_id", _int_in(0, 1 << 30)),
    "brokerRole": ("broker_role", lambda text: BrokerRole(text.strip().upper())),
    "flushDiskType": ("flush_disk_type", lambda text: FlushDiskType(text.strip().upper())),
    "namesrvAddr": ("namesrv_addr", str.strip),
    "listenPort": ("listen_port", _PORT),
    "brokerIP1": ("broker_ip1", str.strip),
    "mqboxListenAddress": ("listen_address", _optional_listen_address),
    "brokerIP2": ("broker_ip2", str.strip),
    "haListenPort": ("ha_listen_port", _PORT),  # read, then overridden as RocketMQ does
    "haMasterAddress": ("ha_master_address", str.strip),
    "slaveReadEnable": ("slave_read_enable", _parse_bool),
    "storePathRootDir": ("store_path_root_dir", str.strip),
    "haSlaveFallbehindMax": ("ha_slave_fallbehind_max_bytes", _int_in(0, 1 << 40)),
    "haTransferBatchSize": ("ha_transfer_batch_size_bytes", _int_in(4096, 4 * 1024 * 1024)),
    "haSendHeartbeatInterval": ("ha_send_heartbeat_interval_ms", _int_in(10, 600_000)),
    "haHousekeepingInterval": ("ha_housekeeping_interval_ms", _int_in(100, 3_600_000)),
    "mqboxHaReconnectIntervalMs": ("ha_reconnect_interval_ms", _int_in(10, 600_000)),
    "mapedFileSizeCommitLog": ("commit_log_segment_size_bytes", _int_in(4096, 1 << 40)),
    "mappedFileSizeCommitLog": ("commit_log_segment_size_bytes", _int_in(4096, 1 << 40)),
    "mapedFileSizeConsumeQueue": ("consume_queue_entry_count", lambda t: _cq_entries(t)),
    "mappedFileSizeConsumeQueue": ("consume_queue_entry_count", lambda t: _cq_entries(t)),
    "fileReservedTime": ("file_reserved_time_hours", _int_in(0, 1 << 20)),
    "deleteWhen": ("delete_when", str.strip),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio_percent", _int_in(10, 95)),
    "cleanResourceInterval": ("clean_resource_interval_ms", _POSITIVE),
    "cleanFileForciblyEnable": ("clean_file_forcibly_enable", _parse_bool),
    "flushIntervalCommitLog": ("flush_interval_commit_log_ms", _POSITIVE),
    "flushIntervalConsumeQueue": ("flush_interval_consume_queue_ms", _POSITIVE),
    "mqboxFlushIntervalIndexMs": ("flush_interval_index_ms", _int_in(1, 86_400_000)),
    "syncFlushTimeout": ("sync_flush_timeout_ms", _POSITIVE),
    "mqboxRebalanceLockMaxLiveTimeMs": (
        "rebalance_lock_max_live_time_ms",
        _int_in(30_000, 86_400_000),
    ),
    "maxMessageSize": ("max_message_size_bytes", _int_in(1024, 64 * 1024 * 1024)),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _parse_bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", _parse_bool),
    "defaultTopicQueueNums": ("default_topic_queue_nums", _int_in(1, 1024)),
    "registerNameServerPeriod": ("register_name_server_period_ms", _int_in(1000, 60_000)),
    "longPollingEnable": ("long_polling_enable", _parse_bool),
    "shortPollingTimeMills": ("short_polling_time_ms", _POSITIVE),
    "messageDelayLevel": ("message_delay_level", str.strip),
    "mqboxReactorCount": ("pools.reactor_count", _POOL),
    "mqboxCodecCount": ("pools.codec_count", _POOL),
    "mqboxWorkerCount": ("pools.worker_count", _POOL),
    "mqboxSendProcessorCount": ("pools.send_processor_count", _POOL),
    "mqboxPullProcessorCount": ("pools.pull_processor_count", _POOL),
    "mqboxAdminProcessorCount": ("pools.admin_processor_count", _POOL),
    "mqboxConnectionCountMax": ("limits.connection_count_max", _int_in(1, 1 << 20)),
    "serverChannelMaxIdleTimeSeconds": ("limits.connection_idle_time_s", _int_in(1, 1 << 20)),
    "mqboxHeartbeatGroupCountMax": ("limits.heartbeat_group_count_max", _int_in(1, 1 << 20)),
    "mqboxHeartbeatSubscriptionCountMax": (
        "limits.heartbeat_subscription_count_max",
        _int_in(1, 1 << 20),
    ),
    "mqboxAutoCreateTopicCountMax": ("limits.auto_create_topic_count_max", _int_in(1, 1 << 24)),
    "mqboxAutoCreateGroupCountMax": ("limits.auto_create_group_count_max", _int_in(1, 1 << 24)),
    "mqboxSpillBytesMax": ("limits.spill_size_bytes_max", _int_in(1 << 20, 1 << 40)),
    "mqboxConnectionInFlightCountMax": (
        "limits.connection_in_flight_count_max",
        _int_in(2, 1 << 20),
    ),
    "mqboxConnectionOutputBytesMax": (
        "limits.connection_output_size_bytes_max",
        _int_in(1 << 16, 1 << 40),
    ),
    "mqboxResponseBufferBytesMax": (
        "limits.response_buffer_size_bytes_max",
        _int_in(1 << 20, 1 << 40),
    ),
    "mqboxPartialFrameBytesMax": (
        "limits.partial_frame_size_bytes_max",
        _int_in(1 << 20, 1 << 40),
    ),
    "mqboxHttpPort": ("http_port", _int_in(-1, 65535)),
    "mqboxHttpHost": ("http_host", str.strip),
    "mqboxIdempotentWindowMs": ("idempotent_window_ms", _int_in(1, 7 * 86_400_000)),
    "accessMessageInMemoryMaxRatio": (
        "access_message_in_memory_max_ratio_percent",
        _int_in(0, 100),
    ),
    "offsetCheckInSlave": ("offset_check_in_slave", _parse_bool),
    "mqboxSlaveSyncIntervalMs": ("slave_sync_interval_ms", _int_in(100, 3_600_000)),
    "mqboxIdempotentKeyCountMax": ("limits.idempotent_key_count_max", _int_in(1, 1 << 28)),
    "aclEnable": ("acl_enable", _parse_bool),
    "mqboxAclFile": ("acl_file", str.strip),
    "mqboxNamesrvAccessKey": ("namesrv_access_key", str.strip),
    "mqboxNamesrvSecretKey": ("namesrv_secret_key", str.strip),
    "mqboxRestartWindowMs": ("restarts.window_ms", _int_in(1000, 86_400_000)),
    "mqboxRoleRestartCountMax": ("restarts.role_restart_count_max", _int_in(0, 10_000)),
    "mqboxBrokerRestartCountMax": ("restarts.broker_restart_count_max", _int_in(0, 10_000)),
    "mqboxRestartBackoffMs": ("restarts.backoff_ms", _int_in(0, 3_600_000)),
    "mqboxRestartBackoffMaxMs": ("restarts.backoff_ms_max", _int_in(0, 3_600_000)),
}

_NAMESRV_KEYS: dict[str, tuple[str, Any]] = {
    "listenPort": ("listen_port", _PORT),
    "mqboxListenAddress": ("listen_address", _listen_address),
    "mqboxNamesrvBrokerWhiteList": ("broker_white_list", parse_broker_white_list),
    "scanNotActiveBrokerInterval": ("scan_not_active_broker_interval_ms", _POSITIVE),
    "brokerChannelExpiredTime": ("broker_channel_expired_time_ms", _POSITIVE),
    "orderMessageEnable": ("order_message_enable", _parse_bool),
    "mqboxConnectionCountMax": ("connection_count_max", _int_in(1, 1 << 20)),
    "serverChannelMaxIdleTimeSeconds": ("connection_idle_time_s", _int_in(1, 1 << 20)),
    "mqboxKvEntryCountMax": ("kv_entry_count_max", _int_in(1, 1 << 24)),
    "mqboxKvNamespaceEntryCountMax": ("kv_namespace_entry_count_max", _int_in(1, 1 << 24)),
    "mqboxKvKeyBytesMax": ("kv_key_size_bytes_max", _int_in(1, 1 << 20)),
    "mqboxKvValueBytesMax": ("kv_value_size_bytes_max", _int_in(1, 1 << 24)),
    "mqboxNamesrvBrokerCountMax": ("broker_count_max", _int_in(1, 1 << 20)),
    "mqboxNamesrvTopicCountMax": ("topic_count_max", _int_in(1, 1 << 24)),
    "aclEnable": ("acl_enable", _parse_bool),
    "mqboxAclFile": ("acl_file", str.strip),
}

CQ_ENTRY_SIZE_BYTES = 20


def _cq_entries(text: str) -> int:
    """RocketMQ gives the consume-queue segment size in bytes; mqbox keeps the entry count."""
    size_bytes = _int_in(CQ_ENTRY_SIZE_BYTES, 1 << 34)(text)
    if size_bytes % CQ_ENTRY_SIZE_BYTES != 0:
        raise ValueError(f"{size_bytes} is not a multiple of {CQ_ENTRY_SIZE_BYTES}")
    return size_bytes // CQ_ENTRY_SIZE_BYTES


def parse_properties(text: str) -> dict[str, str]:
    """Parse a Java-properties style text: `key=value` or `key: value`, `#`/`!` comments.

    Line continuations are not supported (RocketMQ configuration files do not use them).
    A key given twice keeps its last value, as java.util.Properties does.
    """
    result: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            raise ValueError(f"no '=' in line {raw_line!r}")
        result[line[:cut].strip()] = line[cut + 1 :].strip()
    return result


@dataclasses.dataclass(frozen=True, slots=True)
class RefusedKey:
    """A RocketMQ broker key that changes behaviour and that mqbox does not implement."""

    # The value with which RocketMQ behaves as mqbox does (booleans compare as booleans);
    # None: any value at all changes what RocketMQ does.
    harmless: str | None
    does: str  # what RocketMQ does with it, for the error


# The one table of refused keys (RocketMQ 4.9's BrokerConfig and MessageStoreConfig). A branch that
# implements one of these adds it to _BROKER_KEYS and drops its row here.
REFUSED_BROKER_KEYS: Mapping[str, RefusedKey] = {
    "enablePropertyFilter": RefusedKey("false", "lets consumers subscribe with SQL92 filters"),
    "filterSupportRetry": RefusedKey("false", "applies SQL92 filters to retry topics"),
    "enableCalcFilterBitMap": RefusedKey("false", "builds filter bit maps at dispatch"),
    "enableConsumeQueueExt": RefusedKey("false", "writes extended consume-queue files"),
    "transientStorePoolEnable": RefusedKey(
        "false", "writes the CommitLog through an off-heap buffer pool"
    ),
    "enableDLegerCommitLog": RefusedKey("false", "replicates the CommitLog with DLedger (Raft)"),
    "duplicationEnable": RefusedKey("false", "keeps a slave's store times as the master's"),
    "enableLmq": RefusedKey("false", "enables light message queues"),
    "enableMultiDispatch": RefusedKey("false", "dispatches one message to several queues"),
    "traceTopicEnable": RefusedKey("false", "creates the message trace topic"),
    "rejectTransactionMessage": RefusedKey("false", "refuses transactional messages"),
    "fetchNamesrvAddrByAddressServer": RefusedKey(
        "false", "asks an HTTP address server for the name servers"
    ),
    "brokerPermission": RefusedKey("6", "makes the whole broker read-only or write-only"),
    "startAcceptSendRequestTimeStamp": RefusedKey("0", "refuses sends before a time"),
    "storePathCommitLog": RefusedKey(None, "keeps the CommitLog outside storePathRootDir"),
    "storePathConsumeQueue": RefusedKey(None, "keeps consume queues outside storePathRootDir"),
    "storePathIndex": RefusedKey(None, "keeps the index outside storePathRootDir"),
    "readOnlyCommitLogStorePaths": RefusedKey(None, "reads CommitLog segments from more paths"),
}


def _refusal(key: str, text: str, source: str) -> str | None:
    """Why `key=text` cannot be honoured, or None if it is harmless to ignore."""
    refused = REFUSED_BROKER_KEYS.get(key)
    if refused is not None:
        harmless = refused.harmless
        if harmless is not None:
            if harmless in ("true", "false"):
                with contextlib.suppress(ValueError):
                    if _parse_bool(text) == _parse_bool(harmless):
                        return None
            elif text.strip() == harmless:
                return None
        return (
            f"{source}: {key}={text}: RocketMQ {refused.does}, which mqbox does not implement; "
            + ("remove the key" if harmless is None else f"remove it or set {key}={harmless}")
        )
    return None


def _unknown_own_key(key: str, keys: Mapping[str, Any], source: str) -> str | None:
    """The error for an `mqbox...` key mqbox does not have (a typo), or None."""
    if not key.lower().startswith("mqbox"):
        return None
    near = difflib.get_close_matches(key, [k for k in keys if k.startswith("mqbox")], n=2)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    return f"{source}: {key} is not an mqbox key{hint}"


def ignored_keys_warning(source: str | Path, unknown_keys: Sequence[str]) -> str | None:
    """The one line `mqbox start` prints about keys it ignores, or None if there are none."""
    if not unknown_keys:
        return None
    return f"{source}: ignoring {len(unknown_keys)} key(s) mqbox does not use: " + ", ".join(
        unknown_keys
    )


def _apply(
    target: Any,
    keys: Mapping[str, tuple[str, Any]],
    values: Mapping[str, str],
    source: str,
    refuse: Callable[[str, str, str], str | None] = lambda key, text, source: None,
) -> Any:
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for key, text in values.items():
        if key not in keys:
            problem = refuse(key, text, source) or _unknown_own_key(key, keys, source)
            if problem is not None:
                raise ConfigError(problem)
            unknown.append(key)
            continue
        field_name, parse = keys[key]
        try:
            value = parse(text)
        except ValueError as error:
            raise ConfigError(f"{source}: {key}={text!r}: {error}") from None
        if "." in field_name:
            group, inner = field_name.split(".", 1)
            nested.setdefault(group, {})[inner] = value
        else:
            top[field_name] = value
    for group, inner_values in nested.items():
        top[group] = dataclasses.replace(getattr(target, group), **inner_values)
    top["unknown_keys"] = tuple(sorted(unknown))
    return dataclasses.replace(target, **top)


def _read(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    try:
        return parse_properties(text)
    except ValueError as error:
        raise ConfigError(f"{path}: {error}") from None


def load_broker_config(
    path: Path | None = None, overrides: Mapping[str, str] | None = None
) -> BrokerConfig:
    """Defaults, then the file's keys, then `overrides` (RocketMQ key names)."""
    values = _read(path) if path is not None else {}
    values.update(overrides or {})
    config: BrokerConfig = _apply(
        BrokerConfig(), _BROKER_KEYS, values, str(path or "overrides"), _refusal
    )
    validate_broker_config(config)
    return config


def load_namesrv_config(
    path: Path | None = None, overrides: Mapping[str, str] | None = None
) -> NamesrvConfig:
    values = _read(path) if path is not None else {}
    values.update(overrides or {})
    config: NamesrvConfig = _apply(NamesrvConfig(), _NAMESRV_KEYS, values, str(path or "overrides"))
    return config


_SECRET_KEYS: Final = frozenset({"mqboxNamesrvSecretKey"})


def key_values(config: BrokerConfig | NamesrvConfig) -> dict[str, Any]:
    """The configuration by RocketMQ key name (the first spelling of each), as a .conf file
    states it: sizes in the keys' own units, enums by name. What `mqbox config` prints."""
    keys = _BROKER_KEYS if isinstance(config, BrokerConfig) else _NAMESRV_KEYS
    shown: dict[str, Any] = {}
    seen: set[str] = set()
    for key, (field_name, _) in keys.items():
        if field_name in seen:
            continue
        seen.add(field_name)
        value: Any = config
        for part in field_name.split("."):
            value = getattr(value, part)
        if field_name == "consume_queue_entry_count":
            value *= CQ_ENTRY_SIZE_BYTES  # the key is a size in bytes
        shown[key] = value.value if isinstance(value, enum.Enum) else value
        if key in _SECRET_KEYS and value:  # a secret is never shown nor written to run files
            shown[key] = "<hidden>"
    return shown


def validate_broker_config(config: BrokerConfig) -> None:
    """Cross-field rules that a single key's parser cannot see."""
    if config.broker_role is BrokerRole.SLAVE and config.broker_id == 0:
        raise ConfigError("brokerRole=SLAVE needs brokerId > 0 (0 is the master)")
    if config.broker_role is not BrokerRole.SLAVE and config.broker_id != 0:
        raise ConfigError(f"brokerRole={config.broker_role.value} needs brokerId=0")
    if not config.broker_name:
        raise ConfigError("brokerName is empty")
    if config.ha_master_address and not is_host_port(config.ha_master_address):
        raise ConfigError(f"haMasterAddress={config.ha_master_address!r}: not host:port")
    if config.max_message_size_bytes > config.commit_log_segment_size_bytes // 2:
        raise ConfigError("maxMessageSize must be at most half of mapedFileSizeCommitLog")
    for hour in config.delete_when.split(";"):
        if not hour.strip().isdigit() or not 0 <= int(hour) <= 23:
            raise ConfigError(f"deleteWhen={config.delete_when!r}: hours 00-23, ';'-separated")
    delay_level_durations_ms(config.message_delay_level)
    if bool(config.namesrv_access_key) != bool(config.namesrv_secret_key):
        raise ConfigError("mqboxNamesrvAccessKey and mqboxNamesrvSecretKey go together")


def effective_ha_listen_port(config: BrokerConfig, listen_port: int) -> int:
    """The HA port of a broker bound to `listen_port`: listenPort + 1, as RocketMQ's
    BrokerStartup sets it over any configured haListenPort (docs/replication.md)."""
    del config  # haListenPort in a file changes nothing, as in RocketMQ
    return listen_port + 1


def is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Bounds of messageDelayLevel. Java has none; these keep a typo from becoming thousands of
# per-level timers in the schedule role, or a delivery time that overflows the int64 tag field.
DELAY_LEVEL_COUNT_MAX = 64
DELAY_LEVEL_DURATION_MS_MAX = 10 * 365 * 86_400_000  # ten years


def delay_level_durations_ms(text: str) -> tuple[int, ...]:
    """`messageDelayLevel` ("1s 5s ... 2h", RocketMQ's units s, m, h, d) as durations in ms;
    level n is item n - 1. ConfigError names the bad item: not `<digits><unit>`, over ten years,
    or more than DELAY_LEVEL_COUNT_MAX levels (or none)."""
    durations: list[int] = []
    for item in text.split():
        unit = item[-1:]
        digits = item[:-1]
        if unit not in _DELAY_UNITS_MS or not (digits.isascii() and digits.isdigit()):
            raise ConfigError(f"messageDelayLevel: {item!r} is not <number><s|m|h|d>")
        duration_ms = int(digits) * _DELAY_UNITS_MS[unit]
        if duration_ms > DELAY_LEVEL_DURATION_MS_MAX:
            raise ConfigError(f"messageDelayLevel: {item!r} is longer than ten years")
        durations.append(duration_ms)
    if not durations:
        raise ConfigError("messageDelayLevel is empty")
    if len(durations) > DELAY_LEVEL_COUNT_MAX:
        raise ConfigError(
            f"messageDelayLevel has {len(durations)} levels, more than {DELAY_LEVEL_COUNT_MAX}"
        )
    return tuple(durations)


# ---------------------------------------------------------------------------------------------
# Layouts: several brokers (and their name server) started together on one host
# ---------------------------------------------------------------------------------------------

LAYOUT_FILE_NAME = "mqbox.conf"  # the file `--layout DIRECTORY` reads
_LAYOUT_KEYS = frozenset({"namesrv", "brokers"})


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutMember:
    """One broker of a layout."""

    name: str  # member_name(broker): `--broker NAME`, and its sub-home's directory name
    config_path: Path
    broker: BrokerConfig


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutConfig:
    """A layout file: `namesrv = FILE` (optional) and `brokers = FILE;FILE;...`, paths relative
    to the layout file."""

    path: Path
    namesrv_config_path: Path | None
    namesrv: NamesrvConfig
    members: tuple[LayoutMember, ...]

    def member(self, name: str) -> LayoutMember:
        """The broker called `name`; ConfigError naming the ones there are."""
        for member in self.members:
            if member.name == name:
                return member
        known = ", ".join(member.name for member in self.members)
        raise ConfigError(f"{self.path}: no broker {name!r} (the layout has {known})")


def member_name(broker: BrokerConfig) -> str:
    """How a layout names a broker: brokerName for the master (brokerId 0), brokerName-s for
    the slave with brokerId 1, brokerName-sN for brokerId N > 1."""
    if broker.broker_id == 0:
        return broker.broker_name
    if broker.broker_id == 1:
        return f"{broker.broker_name}-s"
    return f"{broker.broker_name}-s{broker.broker_id}"


def layout_file(path: Path) -> Path:
    """A layout directory's mqbox.conf, or the file itself."""
    return path / LAYOUT_FILE_NAME if path.is_dir() else path


def load_layout(path: Path) -> LayoutConfig:
    """Load a layout and every file it names; ConfigError for a bad file, a broker named twice,
    or fixed ports that collide (a broker's HA port is its listenPort + 1)."""
    file = layout_file(path.expanduser()).resolve()
    values = _read(file)
    for key in values:
        if key not in _LAYOUT_KEYS:
            raise ConfigError(f"{file}: unknown key {key!r} (a layout has namesrv and brokers)")
    base = file.parent
    namesrv_text = values.get("namesrv", "").strip()
    namesrv_path = (base / namesrv_text).resolve() if namesrv_text else None
    items = [item.strip() for item in values.get("brokers", "").split(";")]
    paths = [(base / item).resolve() for item in items if item]
    if not paths:
        raise ConfigError(f"{file}: brokers names no broker file")
    members: list[LayoutMember] = []
    for broker_path in paths:
        broker = load_broker_config(broker_path)
        member = LayoutMember(member_name(broker), broker_path, broker)
        clash = next((m for m in members if m.name == member.name), None)
        if clash is not None:
            raise ConfigError(
                f"{file}: {clash.config_path} and {broker_path} are both brokerName="
                f"{broker.broker_name} brokerId={broker.broker_id}"
            )
        members.append(member)
    namesrv = load_namesrv_config(namesrv_path)
    _check_layout_ports(file, namesrv, members)
    return LayoutConfig(file, namesrv_path, namesrv, tuple(members))


def _check_layout_ports(
    file: Path, namesrv: NamesrvConfig, members: Sequence[LayoutMember]
) -> None:
    taken: dict[int, str] = {}
    wanted = [(namesrv.listen_port, "the name server")]
    for member in members:
        port = member.broker.listen_port
        if port != 0:
            wanted += [(port, member.name), (port + 1, f"{member.name}'s HA port")]
    for port, what in wanted:
        if port == 0:
            continue
        if port in taken:
            raise ConfigError(f"{file}: {what} and {taken[port]} both want port {port}")
        taken[port] = what

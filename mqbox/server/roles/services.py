"""The SERVICES role: the broker's background duties that carry no request traffic.

Owns: keeping the broker registered with every name server of namesrvAddr
(REGISTER_BROKER every registerNameServerPeriod, at once when `config/topics.json` changes, and
UNREGISTER_BROKER on an orderly stop), through mqbox.client.registration's BrokerRegistrar,
whose threads live in this process only. Never: writes to the store or its config files (the
admin processor and the store writer own them; this role only reads topics.json), or anything
on a ring. Retention runs where the files are owned (the store writer's housekeeping thread and
the dispatcher), and delayed delivery has a role of its own (schedule.py), because it appends
through the store writer and must not wait behind a registration; later duties without a store
of their own (HA bookkeeping, statistics) belong in this loop.

Registration happens here rather than in the supervisor because the supervisor must stay
single-threaded (it forks) and must not speak the remoting protocol; a services process that
dies is simply re-forked, and the name server drops the broker's routes only when the
registering connection closes and no new registration follows.

The topic table is read afresh for every registration (`registration_request`), so a topic the
admin processor created a moment ago goes out with its new dataVersion; a missing topics.json
registers an empty table (a new store).
"""

from __future__ import annotations

import logging
import threading
from typing import Final, NoReturn

from mqbox.acl.signature import SessionCredentials
from mqbox.client.namesrv_api import RegisterBrokerOutcome
from mqbox.client.registration import BrokerRegistrar, RegisteredCallback
from mqbox.config import BrokerConfig, BrokerRole
from mqbox.errors import MqboxError
from mqbox.ipc.ring import ParcelBatch, Ring
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
)
from mqbox.run_files import write_json_atomically
from mqbox.server import runtime
from mqbox.server.home import HomeLayout
from mqbox.server.learned_master import record_master
from mqbox.server.runtime import RoleContext
from mqbox.server.web.server import WebEndpoint
from mqbox.server.web.sources import BrokerSources
from mqbox.store import config_files
from mqbox.store.layout import TOPICS_FILE_NAME, config_dir

log = logging.getLogger("mqbox.services")

TICK_INTERVAL_MS: Final = 1000
FIRST_REGISTRATION_WAIT_MS: Final = 3000
UNREGISTER_TIMEOUT_MS: Final = 5000


def registration_request(
    ctx: RoleContext,
) -> tuple[RegisterBrokerRequestHeader, RegisterBrokerBody]:
    """REGISTER_BROKER's header and body for this broker, with the topic table as stored now.
    Raises ConfigError (an MqboxError: the registrar retries) if topics.json is unreadable."""
    broker = ctx.broker
    ha_host = broker.broker_ip2 or broker.broker_ip1 or "127.0.0.1"  # RocketMQ: brokerIP2
    header = RegisterBrokerRequestHeader(
        broker_name=broker.broker_name,
        broker_addr=ctx.broker_address,
        cluster_name=broker.broker_cluster_name,
        ha_server_addr=f"{ha_host}:{broker.ha_listen_port}",
        broker_id=broker.broker_id,
    )
    table = config_files.load_topics(config_dir(ctx.store_root), use_backup_if_corrupt=True)
    topics = {
        name: TopicConfig(
            topic_name=topic.topic_name,
            read_queue_nums=topic.read_queue_nums,
            write_queue_nums=topic.write_queue_nums,
            perm=topic.perm,
            topic_filter_type=topic.topic_filter_type,
            topic_sys_flag=topic.topic_sys_flag,
            order=topic.order,
        )
        for name, topic in table.topics.items()
    }
    version = DataVersion(
        counter=table.data_version.counter, timestamp_ms=table.data_version.timestamp_ms
    )
    return header, RegisterBrokerBody(data_version=version, topic_config_table=topics)


class _TopicsWatcher:
    """Notices a replaced topics.json (its inode, size or mtime changed) between ticks."""

    def __init__(self, ctx: RoleContext) -> None:
        self._path = config_dir(ctx.store_root) / TOPICS_FILE_NAME
        self._seen = self._signature()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            status = self._path.stat()
        except OSError:
            return None
        return (status.st_ino, status.st_size, status.st_mtime_ns)

    def changed_nowait(self) -> bool:
        signature = self._signature()
        if signature == self._seen:
            return False
        self._seen = signature
        return True


def start_web(ctx: RoleContext) -> tuple[BrokerSources, WebEndpoint] | None:
    """The statistics sampler and the HTTP endpoint (server/web/), unless mqboxHttpPort is -1.
    A port that cannot be bound is logged and leaves the broker without the endpoint (the
    sampler still runs: 315 and 28 need it), never stops it."""
    if ctx.statistics is None:
        return None
    sources = BrokerSources(ctx)
    sources.start()
    broker = ctx.broker
    if broker.http_port < 0:
        return None
    try:
        endpoint = WebEndpoint(sources, broker.http_host, broker.http_port)
    except OSError as error:
        log.warning(
            "no HTTP endpoint: cannot bind %s:%d: %s",
            broker.http_host,
            broker.http_port,
            error.strerror or error,
        )
        write_json_atomically(
            HomeLayout(ctx.home).http_path, {"error": f"cannot bind: {error.strerror or error}"}
        )
        return None
    endpoint.start(ctx.home)
    log.info("HTTP endpoint: %s", endpoint.url)
    return sources, endpoint


def namesrv_credentials(broker: BrokerConfig) -> SessionCredentials | None:
    """The account registrations are signed with: mqboxNamesrvAccessKey/SecretKey, which
    `mqbox start` fills from the ACL file's first admin account when the ACL is on and they
    are not given (supervisor._check_acl); None: unsigned."""
    if not broker.namesrv_access_key:
        return None
    return SessionCredentials(broker.namesrv_access_key, broker.namesrv_secret_key)


def master_learner(ctx: RoleContext) -> RegisteredCallback | None:
    """For a slave without haMasterAddress: the callback that files the master's HA address
    each registration answer carries (learned_master.py; the HA client follows the file).
    One lock, because each name server's registration runs on its own thread."""
    if ctx.broker.broker_role is not BrokerRole.SLAVE or ctx.broker.ha_master_address:
        return None
    lock = threading.Lock()

    def on_registered(namesrv: str, outcome: RegisterBrokerOutcome) -> None:
        with lock:
            if record_master(ctx.home, outcome.ha_server_addr, outcome.master_addr):
                log.info("master's HA address from %s: %s", namesrv, outcome.ha_server_addr)

    return on_registered


def main(ctx: RoleContext) -> NoReturn:
    """The services role (runtime.py has the contract)."""
    rings = runtime.attach_rings(ctx)
    registrar = BrokerRegistrar(
        ctx.broker.namesrv_addr,
        lambda: registration_request(ctx),
        period_ms=ctx.broker.register_name_server_period_ms,
        on_registered=master_learner(ctx),
        credentials=namesrv_credentials(ctx.broker),
    )
    topics = _TopicsWatcher(ctx)
    web = start_web(ctx)
    registrar.start()
    # Report ready once the name servers know the broker, so `mqbox start` returns with routes
    # in place; a name server that is down only delays that by FIRST_REGISTRATION_WAIT_MS.
    if not registrar.wait_registered(FIRST_REGISTRATION_WAIT_MS):
        log.warning("not registered with every name server of %s yet", ctx.broker.namesrv_addr)
    ctx.report_ready(
        {"namesrv_addr": ctx.broker.namesrv_addr, "http": web[1].url if web is not None else ""}
    )
    log.info("ready: registering %s with %s", ctx.broker_address, ctx.broker.namesrv_addr)

    def on_batch(producer: str, ring: Ring, batch: ParcelBatch) -> None:
        raise AssertionError(f"services drains no ring, but {producer} sent {batch.count}")

    def on_tick() -> None:
        if topics.changed_nowait():
            registrar.register_now()

    def on_stop() -> None:
        if web is not None:
            web[1].stop()
            web[0].stop()
        try:
            registrar.stop(UNREGISTER_TIMEOUT_MS)
        except MqboxError as error:
            log.warning("unregistering failed: %s", error)

    loop = runtime.RoleLoop(
        ctx,
        rings,
        on_batch,
        tick_interval_ms=TICK_INTERVAL_MS,
        on_tick=on_tick,
        on_stop=on_stop,
    )
    loop.run()
    raise AssertionError("unreachable")

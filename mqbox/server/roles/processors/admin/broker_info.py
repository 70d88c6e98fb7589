"""The broker as a whole: its runtime figures, its configuration, its system topics.

Owns the handlers of GET_BROKER_RUNTIME_INFO (28, the table of runtime_info.py),
GET_BROKER_CONFIG (26), UPDATE_BROKER_CONFIG (25, the runtime keys of server/runtime_config.py,
persisted in the home's broker.conf) and GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305). Any admin
processor serves them (docs/protocol.md section 4.7).
"""

from __future__ import annotations

import contextlib
import logging

from mqbox.config import parse_properties
from mqbox.message import STORETIMESTAMP_POSITION_BYTES
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.headers import KvTable, TopicList
from mqbox.server import runtime_config
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import _STORE_TIMESTAMP, AdminBase
from mqbox.server.roles.processors.admin.runtime_info import RuntimeSources, runtime_info
from mqbox.server.roles.processors.topics import system_topics
from mqbox.server.statistics_history import runtime_info_from_document

log = logging.getLogger("mqbox.admin")


class BrokerInfo(AdminBase):
    """Handlers of the broker's own figures and configuration (any admin processor)."""

    def _earliest_message_timestamp_ms(self) -> int:
        """Store time of the oldest record the CommitLog still holds; -1 for none (Java's
        pickupStoreTimestamp)."""
        positions = self.store.positions()
        reader = self.store.for_log()
        if positions is None or reader is None:
            return -1
        if positions.min_log_offset_bytes >= positions.write_log_offset_bytes:
            return -1
        record = reader.read_message(positions.min_log_offset_bytes)
        if record is None:
            return -1
        value: int = _STORE_TIMESTAMP.unpack_from(record, STORETIMESTAMP_POSITION_BYTES)[0]
        return value

    @handles(RequestCode.GET_BROKER_RUNTIME_INFO)
    def _broker_runtime_info(self, request: Request) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (28): Java's KVTable {"table": {key: text}} of the keys of
        runtime_info.RUNTIME_INFO_KEYS that have a value now, and the statistics keys (putTps,
        getTransferedTps, ...) of the sampler's last document."""
        sources = RuntimeSources(
            broker=self.ctx.broker,
            store_root=self.ctx.store_root,
            boot_timestamp_ms=self.boot_timestamp_ms,
            now_ms=self.wall_clock_ms(),
            positions=self.store.positions(),
            counters=self.store.counters(),
            earliest_message_timestamp_ms=self._earliest_message_timestamp_ms(),
        )
        table = runtime_info(sources)
        table.update(runtime_info_from_document(self.published_statistics()))
        body = KvTable(table).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

    @handles(RequestCode.GET_BROKER_CONFIG)
    def _broker_config(self, request: Request) -> RemotingCommand:
        """GET_BROKER_CONFIG (26): the body is Java-properties text, `key=value` a line, of every
        key mqbox reads (runtime_config.broker_properties); ext `version` is a DataVersion's
        JSON whose timestamp is the last update's (the broker's start without one)."""
        properties = runtime_config.broker_properties(self.ctx.broker)
        body = "".join(f"{key}={value}\n" for key, value in properties.items())
        timestamp_ms = self.boot_timestamp_ms
        with contextlib.suppress(OSError):
            path = runtime_config.home_broker_conf(self.ctx.home)
            timestamp_ms = path.stat().st_mtime_ns // 1_000_000
        version = dumps_json({"counter": 0, "timestamp": timestamp_ms}).decode()
        return request.make_response(
            ResponseCode.SUCCESS, {"version": version}, body=body.encode("utf-8")
        )

    @handles(RequestCode.UPDATE_BROKER_CONFIG)
    def _update_broker_config(self, request: Request) -> RemotingCommand:
        """UPDATE_BROKER_CONFIG (25): the body is Java-properties text. Every key must be one of
        runtime_config.RUNTIME_KEYS with a value its parser takes, else 1 with a remark naming
        the keys and nothing changes; then the keys are merged into the home's broker.conf, and
        every processor applies them at its next tick (this one at once). An empty body changes
        nothing (Java)."""
        text = request.command.body.decode("utf-8", errors="replace")
        try:
            values = parse_properties(text)
        except ValueError as error:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, {}, remark=f"string2Properties error: {error}"
            )
        if not values:
            return request.make_response(ResponseCode.SUCCESS, {})
        problems = runtime_config.update_problems(values, self.ctx.broker)
        if problems:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                {},
                remark="mqbox: nothing updated: " + "; ".join(problems[:5]),
            )
        runtime_config.persist_overrides(self.ctx.home, values)
        log.info("broker config updated: %s", ", ".join(f"{k}={v}" for k, v in values.items()))
        self._refresh_broker_config()
        return request.make_response(ResponseCode.SUCCESS, {})

    @handles(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)
    def _system_topic_list(self, request: Request) -> RemotingCommand:
        """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): TopicList of the broker's system topics
        (topics.system_topics), which Java's admin adds to the name server's list (304)."""
        names = sorted(config.topic_name for config in system_topics(self.ctx.broker))
        body = TopicList(tuple(names)).to_json()
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

"""The broker's identity and replication state for `mqbox cluster list`.

Owns the handler of MQBOX_BROKER_STATUS (10010). Any admin processor serves it. The HA fields
come from one place, the broker home's `run/replication.json` (server/home.HaState), which the
HA roles write; without that file they are "n/a" and null. Never: state of its own.
"""

from __future__ import annotations

import functools
import importlib.metadata

from mqbox.protocol.codes import ResponseCode
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.mqbox_codes import MQBOX_BROKER_STATUS
from mqbox.server.home import read_ha_state
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import AdminBase


@functools.cache
def mqbox_version() -> str:
    """The installed package's version ("mqbox 0.1.0"); "mqbox" if it is not installed."""
    try:
        return f"mqbox {importlib.metadata.version('mqbox')}"
    except importlib.metadata.PackageNotFoundError:
        return "mqbox"


class BrokerStatus(AdminBase):
    """Handler of the broker's own status (any admin processor)."""

    @handles(MQBOX_BROKER_STATUS)
    def _broker_status(self, request: Request) -> RemotingCommand:
        """MQBOX_BROKER_STATUS (10010): no ext. Body {"clusterName", "brokerName", "brokerId",
        "brokerRole" (ASYNC_MASTER, SYNC_MASTER or SLAVE), "version", "haState" ("n/a" until
        replication reports), "slaveLagBytes", "slaveLagMessages" (null when unknown)}."""
        broker = self.ctx.broker
        ha = read_ha_state(self.ctx.home)
        body = dumps_json(
            {
                "clusterName": broker.broker_cluster_name,
                "brokerName": broker.broker_name,
                "brokerId": broker.broker_id,
                "brokerRole": broker.broker_role.value,
                "version": mqbox_version(),
                "haState": ha.state,
                "slaveLagBytes": ha.slave_lag_bytes,
                "slaveLagMessages": ha.slave_lag_messages,
            }
        )
        return request.make_response(ResponseCode.SUCCESS, {}, body=body)

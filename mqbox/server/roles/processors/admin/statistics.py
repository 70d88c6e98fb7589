"""Broker statistics for RocketMQ's tools: VIEW_BROKER_STATS_DATA (315).

Owns the handler of 315 (any admin processor), answered from the document the services role's
sampler publishes once a second (`<home>/run/broker-statistics.json`, statistics_history.py):
the minute, hour and day windows of one stats item, RocketMQ's BrokerStatsData. Never: reads
the statistics block itself (the sampler owns the history the windows need) or keeps state.

The statistics keys of GET_BROKER_RUNTIME_INFO (28) come from the same document through
`runtime_info_from_document`; 28's handler (another section, with the other runtime keys) merges
them (docs/metrics.md section 4).
"""

from __future__ import annotations

from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, dumps_json
from mqbox.protocol.headers import ViewBrokerStatsDataRequestHeader
from mqbox.server.roles.processors import Request, handles
from mqbox.server.roles.processors.admin.base import AdminBase, _shown
from mqbox.server.statistics_history import (
    runtime_info_from_document,
    stats_item_from_document,
)


class BrokerStatistics(AdminBase):
    """Handlers of the broker statistics codes (any admin processor)."""

    def runtime_statistics(self) -> dict[str, str]:
        """The statistics keys of GET_BROKER_RUNTIME_INFO (28), every value a string."""
        return runtime_info_from_document(self.published_statistics())

    @handles(RequestCode.VIEW_BROKER_STATS_DATA)
    def _view_broker_stats_data(self, request: Request) -> RemotingCommand:
        """VIEW_BROKER_STATS_DATA (315): BrokerStatsData of (statsName, statsKey); an item
        nobody counted yet: SYSTEM_ERROR with Java's remark."""
        header = ViewBrokerStatsDataRequestHeader.from_ext(request.command.ext_fields)
        item = stats_item_from_document(
            self.published_statistics(), header.stats_name, header.stats_key
        )
        if item is None:
            remark = (
                f"The stats <{_shown(header.stats_name)}> <{_shown(header.stats_key)}> not exist"
            )
            return request.make_response(ResponseCode.SYSTEM_ERROR, {}, remark=remark)
        body = {
            window: {
                "sum": int(item[window]["sum"]),
                "tps": float(item[window]["tps"]),
                "avgpt": float(item[window]["avgpt"]),
            }
            for window in ("statsMinute", "statsHour", "statsDay")
        }
        return request.make_response(ResponseCode.SUCCESS, {}, body=dumps_json(body))

"""The admin processor: every request that is neither a SEND nor a PULL.

Owns: the answers that need no store: HEART_BEAT (34) and UNREGISTER_CLIENT (35) are
acknowledged with SUCCESS, MQBOX_NOOP answers SUCCESS at once, and every other code gets
REQUEST_CODE_NOT_SUPPORTED (3) with the Java broker's remark " request type <code> not
supported". It also does the admin pool's share of the plumbing the base class provides:
answering the worker's REQUEST_FAILED and forwarding its idle CLOSE_CONNECTION. Never: the
store, sockets, or a client's response (a reply to a broker request is counted and dropped).

Not yet: heartbeats are acknowledged without keeping the client table; consumer lists (38),
locks (41/42), offsets (14/15) and topic admin belong here or in heartbeat.py once the store
and the consumer-group tables exist.

MQBOX_NOOP (10000) is mqbox's own request code, far above every RocketMQ code (the largest is in
the 300s), for bench/hop.py: it measures the round trip through reactor, codec, worker and a
processor and back, with nothing else in it. It takes no extFields and no body and answers
SUCCESS with an empty extFields.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NoReturn

from mqbox.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.server.processors import Processor, Request, run_processor
from mqbox.server.topology import RoleContext, RoleKind

MQBOX_NOOP: Final = 10_000

Handler = Callable[[Request], RemotingCommand | None]


class AdminProcessor(Processor):
    """Answers by request code from `handlers`; codes without a handler get 3."""

    kind = RoleKind.ADMIN

    def __init__(self, ctx: RoleContext, **options: Any) -> None:
        super().__init__(ctx, **options)
        self.handlers: dict[int, Handler] = {
            RequestCode.HEART_BEAT: self._acknowledge,
            RequestCode.UNREGISTER_CLIENT: self._acknowledge,
            MQBOX_NOOP: self._acknowledge,
        }
        self.client_responses = 0
        self.unsupported_requests = 0

    def handle(self, request: Request) -> None:
        if request.flag & FLAG_RESPONSE:
            self.client_responses += 1  # nothing waits for one yet: the broker sends no requests
            return
        handler = self.handlers.get(request.code)
        if handler is None:
            self.unsupported_requests += 1
            super().handle(request)  # REQUEST_CODE_NOT_SUPPORTED
            return
        response = handler(request)
        if response is not None:
            self.reply(request, response)

    def _acknowledge(self, request: Request) -> RemotingCommand:
        return request.make_response(ResponseCode.SUCCESS, {})


def main(ctx: RoleContext) -> NoReturn:
    """The admin processor role: serve until SIGTERM (runtime.py)."""
    run_processor(ctx, AdminProcessor)

"""Goal: routing.py is the one table of request codes, and the handler tables agree with it.

Method: read each processor class's handler table (made by `processors.handles`) and compare it
with the codes routing.py sends to that class's pool; a code served by a pool that never gets it,
or routed to a pool without a handler for it, fails here.
"""

from __future__ import annotations

import pytest

from mqbox.protocol.codes import RequestCode
from mqbox.protocol.mqbox_codes import MQBOX_CODE_FIRST, MQBOX_CODE_LAST
from mqbox.server import routing
from mqbox.server.roles.processors import Processor
from mqbox.server.roles.processors.admin import AdminProcessor
from mqbox.server.roles.processors.pull import PullProcessor
from mqbox.server.roles.processors.send import SendProcessor
from mqbox.server.topology import RoleKind


@pytest.mark.parametrize("processor", [SendProcessor, PullProcessor, AdminProcessor])
def test_each_pool_handles_exactly_the_codes_routed_to_it(processor: type[Processor]) -> None:
    assert set(processor.handler_names) == routing.codes_of(processor.kind)


def test_every_routed_code_has_one_pool_and_member_zero_codes_are_admin_codes() -> None:
    handled = [set(p.handler_names) for p in (SendProcessor, PullProcessor, AdminProcessor)]
    assert set.union(*handled) == set(routing.ROUTES)
    assert sum(len(codes) for codes in handled) == len(routing.ROUTES)
    assert routing.codes_of(RoleKind.ADMIN) >= routing.MEMBER_ZERO_CODES
    assert routing.route_of(RequestCode.HEART_BEAT).member_zero_only
    assert not routing.route_of(RequestCode.GET_MAX_OFFSET).member_zero_only
    assert routing.route_of(12_345) == routing.DEFAULT_ROUTE
    assert routing.DEFAULT_ROUTE.kind is RoleKind.ADMIN
    assert all(
        code in set(RequestCode) or MQBOX_CODE_FIRST <= code <= MQBOX_CODE_LAST or code == 222
        for code in routing.ROUTES
    )


def test_a_code_with_two_handlers_is_refused_when_the_class_is_made() -> None:
    from mqbox.server.roles.processors import handles

    with pytest.raises(AssertionError, match="two handlers"):

        class _Twice(Processor):  # pyright: ignore[reportUnusedClass]
            kind = RoleKind.ADMIN

            @handles(RequestCode.HEART_BEAT)
            def _one(self, request: object) -> None:
                del request

            @handles(RequestCode.HEART_BEAT)
            def _two(self, request: object) -> None:
                del request

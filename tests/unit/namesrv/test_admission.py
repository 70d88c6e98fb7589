"""Goal: only brokers and operators change the name server's broker tables (docs/security.md):
103/104/205 from a peer outside mqboxNamesrvBrokerWhiteList get 16 and change nothing, while
routes and KV requests from anyone are served; `local` admits loopback and this host's own
addresses, `*` everyone, addresses and CIDR networks what they name; and a registration cannot
take a (brokerName, brokerId) slot held by a live broker at another address, until that broker
unregisters, its connection closes or it has been silent past the expiry, while the same
address re-registers freely.

Method: the pure handler and route table with explicit peer hosts and `now_ms`; the host's
addresses given as a fixed set and the clock as a counter.
"""

from __future__ import annotations

import pytest

from mqbox.config import parse_broker_white_list
from mqbox.namesrv.admission import LOCAL_ADDRESSES_REFRESH_NS, BrokerWhiteList
from mqbox.namesrv.routes import RouteTable
from mqbox.namesrv.server import NamesrvRequestHandler
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand, make_request
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
)

EXPIRED_MS = 120_000
HOST_ADDRESSES = frozenset({"10.1.2.3", "fe80::1"})


def white_list(text: str) -> BrokerWhiteList:
    return BrokerWhiteList(parse_broker_white_list(text), local_addresses=lambda: HOST_ADDRESSES)


@pytest.mark.parametrize(
    ("text", "peer", "admitted"),
    [
        ("local", "127.0.0.1", True),
        ("local", "127.0.0.2", True),
        ("local", "::1", True),
        ("local", "::ffff:127.0.0.1", True),
        ("local", "10.1.2.3", True),
        ("local", "10.1.2.4", False),
        ("local", "192.168.0.9", False),
        ("local", "not an address", False),
        ("*", "192.168.0.9", True),
        ("10.0.0.0/8", "10.200.0.1", True),
        ("10.0.0.0/8", "127.0.0.1", False),
        ("10.0.0.0/8,local", "127.0.0.1", True),
        ("192.168.0.9", "192.168.0.9", True),
        ("192.168.0.9", "192.168.0.10", False),
    ],
)
def test_the_white_list_admits_what_it_names(text: str, peer: str, admitted: bool) -> None:
    assert white_list(text).admits(peer) is admitted


@pytest.mark.parametrize("text", ["", " , ", "10.0.0.0/33", "example.com", "locals", "1.2.3"])
def test_a_bad_white_list_is_refused_at_load(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_broker_white_list(text)


def test_host_addresses_are_read_again_after_the_refresh_interval() -> None:
    addresses = {"10.1.2.3"}
    now = [0]
    checker = BrokerWhiteList(
        ("local",), local_addresses=lambda: frozenset(addresses), clock_ns=lambda: now[0]
    )
    assert not checker.admits("10.9.9.9")
    addresses.add("10.9.9.9")  # DHCP gave the host another address
    assert not checker.admits("10.9.9.9")
    now[0] = LOCAL_ADDRESSES_REFRESH_NS
    assert checker.admits("10.9.9.9")


class Handler:
    def __init__(self, text: str = "local") -> None:
        self.routes = RouteTable()
        self.handler = NamesrvRequestHandler(
            self.routes, broker_white_list=white_list(text), broker_expired_ms=EXPIRED_MS
        )
        self.opaque = 0

    def call(
        self,
        code: int,
        ext: dict[str, str],
        body: bytes = b"",
        *,
        peer: str = "127.0.0.1",
        connection_id: int = 1,
        now_ms: int = 0,
    ) -> RemotingCommand:
        self.opaque += 1
        request = make_request(code, self.opaque, ext, body=body)
        response = self.handler.handle(request, connection_id, now_ms, peer_host=peer)
        assert response is not None
        self.routes.check_invariants()
        return response

    def register(
        self, addr: str, *, broker_id: int = 0, peer: str = "127.0.0.1", **options: int
    ) -> RemotingCommand:
        header = RegisterBrokerRequestHeader("broker-a", addr, "C", "", broker_id)
        body = RegisterBrokerBody(DataVersion(1, 1), {"T": TopicConfig("T", 4, 4, 6)})
        return self.call(
            RequestCode.REGISTER_BROKER, header.to_ext(), body.to_json(), peer=peer, **options
        )

    def addresses(self) -> dict[int, str]:
        return dict(self.routes.cluster_info().broker_addr_table["broker-a"].broker_addrs)


def test_a_fake_broker_outside_the_white_list_is_refused_and_changes_nothing() -> None:
    handler = Handler()
    assert handler.register("127.0.0.1:10911").code == ResponseCode.SUCCESS
    before = handler.routes.cluster_info()
    fake = handler.register("192.168.0.9:10911", broker_id=1, peer="192.168.0.9")
    assert fake.code == ResponseCode.NO_PERMISSION
    assert "mqboxNamesrvBrokerWhiteList" in (fake.remark or "")
    wipe = WipeWritePermOfBrokerRequestHeader("broker-a").to_ext()
    unregister = UnregisterBrokerRequestHeader("broker-a", "127.0.0.1:10911", "C", 0).to_ext()
    for code, ext in (
        (RequestCode.WIPE_WRITE_PERM_OF_BROKER, wipe),
        (RequestCode.UNREGISTER_BROKER, unregister),
    ):
        assert handler.call(code, ext, peer="192.168.0.9").code == ResponseCode.NO_PERMISSION
    assert handler.routes.cluster_info() == before
    route = handler.routes.route("T")
    assert route is not None
    assert route.queue_datas[0].perm == 6  # not wiped
    # Clients from anywhere are still served.
    answer = handler.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, peer="192.168.0.9")
    assert answer.code == ResponseCode.SUCCESS
    statistics = handler.handler.statistics()
    assert statistics.broker_change_refused_count == 3


def test_a_live_brokers_slot_is_not_taken_by_another_address() -> None:
    handler = Handler()
    assert handler.register("127.0.0.1:10911", now_ms=1000).code == ResponseCode.SUCCESS
    taken = handler.register("127.0.0.1:20911", connection_id=2, now_ms=2000)
    assert taken.code == ResponseCode.NO_PERMISSION
    assert "127.0.0.1:10911" in (taken.remark or "")
    assert handler.addresses() == {0: "127.0.0.1:10911"}
    # The broker itself, restarted on its address (a new connection), is accepted.
    again = handler.register("127.0.0.1:10911", connection_id=3, now_ms=3000)
    assert again.code == ResponseCode.SUCCESS
    # A slave of the same name takes its own id.
    slave = handler.register("127.0.0.1:10921", broker_id=1, connection_id=4, now_ms=3000)
    assert slave.code == ResponseCode.SUCCESS
    assert handler.handler.statistics().slot_refused_count == 1


def test_the_slot_is_free_once_the_holder_expired_unregistered_or_disconnected() -> None:
    handler = Handler()
    handler.register("127.0.0.1:10911", now_ms=0)
    silent_until = EXPIRED_MS  # not yet: `last + expired < now` is Java's test
    assert handler.register("127.0.0.1:20911", now_ms=silent_until).code == 16
    moved = handler.register("127.0.0.1:20911", connection_id=2, now_ms=EXPIRED_MS + 1)
    assert moved.code == ResponseCode.SUCCESS
    assert handler.addresses() == {0: "127.0.0.1:20911"}

    unregister = UnregisterBrokerRequestHeader("broker-a", "127.0.0.1:20911", "C", 0).to_ext()
    assert handler.call(RequestCode.UNREGISTER_BROKER, unregister).code == ResponseCode.SUCCESS
    assert handler.register("127.0.0.1:30911", connection_id=3).code == ResponseCode.SUCCESS

    handler.routes.on_connection_closed(3)
    assert handler.register("127.0.0.1:40911", connection_id=4).code == ResponseCode.SUCCESS
    assert handler.addresses() == {0: "127.0.0.1:40911"}

"""The pure parts of the client instance: its address, its heartbeat, its name server list.

Goal: (1) the client IP follows Java's RemotingUtil.getLocalAddress (first IPv4 outside 127.0
and 192.168, else the last IPv4, else the first IPv6; loopback never), and the client id is
`ip@pid#nanotime`; (2) the HEART_BEAT body is Java's HeartbeatData with enum names, every key
present, and each subscription's codeSet holding the tags' String.hashCode values, and the
broker's own decoder reads it back; (3) NamesrvList asks the name server that answered last,
else each of the list in turn, raises a name server's refusal at once, and names every address
when none answers; the namesrvAddr list is split and checked.

Method: plain values and small fake callers standing for name server connections (no sockets).
"""

from __future__ import annotations

import json
import os

import pytest

from mqbox.client.errors import (
    NamesrvUnreachableError,
    RemotingConnectError,
    RemotingResponseError,
)
from mqbox.client.instance import (
    ClientInstance,
    HeartbeatConsumer,
    heartbeat_body,
    ipv4_bytes,
    pick_client_ip,
)
from mqbox.client.namesrv_api import NamesrvList, split_namesrv_addr
from mqbox.client.remoting import RemotingCaller, RemotingClient
from mqbox.client.subscription import build_subscription
from mqbox.errors import ConfigError
from mqbox.message import java_string_hash
from mqbox.protocol.codes import ConsumeFromWhere, ConsumeType, MessageModel
from mqbox.protocol.headers import HeartbeatData


@pytest.mark.parametrize(
    ("addresses", "expected"),
    [
        (["127.0.0.1", "192.168.1.5", "10.1.2.3", "10.9.9.9"], "10.1.2.3"),
        (["192.168.1.5", "192.168.1.6", "::1"], "192.168.1.6"),
        (["127.0.0.1", "fe80::1%eth0", "2001:db8::5"], "fe80::1"),
        (["127.0.0.1", "::1"], "127.0.0.1"),
        (["not an address", "172.16.0.9"], "172.16.0.9"),
    ],
)
def test_client_ip_follows_java(addresses: list[str], expected: str) -> None:
    assert pick_client_ip(addresses) == expected


def test_client_id_and_uniq_key_ip() -> None:
    instance = ClientInstance("127.0.0.1:9876", client_ip="10.1.2.3")
    ip, name = instance.client_id.split("@")
    pid, nanotime = name.split("#")
    assert (ip, int(pid)) == ("10.1.2.3", os.getpid())
    assert int(nanotime) > 0
    assert ClientInstance("127.0.0.1:9876", client_ip="10.1.2.3").client_id != instance.client_id
    assert ClientInstance("127.0.0.1:9876", instance_name="A").instance_name == "A"
    assert ipv4_bytes("10.1.2.3") == bytes((10, 1, 2, 3))
    assert ipv4_bytes("2001:db8::5") == bytes((127, 0, 0, 1))


def test_heartbeat_body_is_javas_heartbeat_data() -> None:
    subscription = build_subscription("Orders", "TagA || TagB", 1_700_000_000_000)
    consumer = HeartbeatConsumer(
        "CG",
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        (subscription,),
    )
    body = heartbeat_body("10.0.0.1@1#2", ["PG2", "PG1"], [consumer])
    document = json.loads(body)
    assert document["clientID"] == "10.0.0.1@1#2"
    assert document["producerDataSet"] == [{"groupName": "PG1"}, {"groupName": "PG2"}]
    (entry,) = document["consumerDataSet"]
    assert entry["consumeType"] == "CONSUME_PASSIVELY"
    assert entry["messageModel"] == "CLUSTERING"
    assert entry["consumeFromWhere"] == "CONSUME_FROM_FIRST_OFFSET"
    assert entry["unitMode"] is False
    (sub,) = entry["subscriptionDataSet"]
    assert sub["tagsSet"] == ["TagA", "TagB"]
    assert sub["codeSet"] == [java_string_hash("TagA"), java_string_hash("TagB")]
    decoded = HeartbeatData.from_json(body)  # the broker's reader
    assert [p.group_name for p in decoded.producer_data_set] == ["PG1", "PG2"]
    assert decoded.consumer_data_set[0].subscription_data_set[0].tags_set == ("TagA", "TagB")
    producers_only = json.loads(heartbeat_body("c", ["PG"], []))
    assert producers_only["consumerDataSet"] == []


def test_split_namesrv_addr() -> None:
    assert split_namesrv_addr(" a:1; b:2 ;a:1;") == ("a:1", "b:2")
    with pytest.raises(ConfigError):
        split_namesrv_addr(" ; ")
    with pytest.raises(ConfigError):
        split_namesrv_addr("no-port")


class FakeNamesrv(RemotingClient):
    """A stand-in for one name server connection (never connected): `ask` below makes it
    answer, refuse, or be unreachable."""

    def __init__(self, address: str, behaviour: dict[str, str], calls: list[str]) -> None:
        super().__init__(address)
        self.behaviour = behaviour
        self.calls = calls
        self.closed = False

    def close(self) -> None:
        self.closed = True


def ask(remote: RemotingCaller, question: str) -> str:
    assert isinstance(remote, FakeNamesrv)
    caller = remote
    caller.calls.append(caller.address)
    what = caller.behaviour[caller.address]
    if what == "down":
        raise RemotingConnectError("refused", caller.address)
    if what == "refuse":
        raise RemotingResponseError(caller.address, 105, 1, "no")
    return f"{question} from {caller.address}"


def test_namesrv_list_sticks_with_the_one_that_answered() -> None:
    behaviour = {"a:1": "down", "b:2": "up", "c:3": "up"}
    calls: list[str] = []
    made: list[FakeNamesrv] = []

    def connect(address: str) -> FakeNamesrv:
        made.append(FakeNamesrv(address, behaviour, calls))
        return made[-1]

    namesrvs = NamesrvList("a:1;b:2;c:3", connect)
    assert namesrvs.call(ask, "route") == "route from b:2"
    assert namesrvs.call(ask, "again") == "again from b:2"
    assert calls == ["a:1", "b:2", "b:2"]
    behaviour["b:2"] = "down"
    behaviour["a:1"] = "up"
    assert namesrvs.call(ask, "third") == "third from c:3"
    behaviour["c:3"] = "refuse"
    with pytest.raises(RemotingResponseError):
        namesrvs.call(ask, "refused")
    behaviour.update({"a:1": "down", "b:2": "down", "c:3": "down"})
    with pytest.raises(NamesrvUnreachableError) as caught:
        namesrvs.call(ask, "none")
    assert "cannot reach the name server" in str(caught.value)
    for address in ("a:1", "b:2", "c:3"):
        assert address in str(caught.value)
    namesrvs.close()
    assert all(caller.closed for caller in made)
    assert len(made) == 3  # one connection per address, kept

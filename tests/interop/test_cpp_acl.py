"""The official C++ client with session credentials produces and consumes on an ACL broker, and
is refused without them (issue 13).

Goal: (1) a C++ producer with `set_session_credentials` stores every message (Unicode properties
and bodies over the 4 KiB at which it compresses included: the signature covers the properties
text and the compressed body as sent), and a C++ push consumer with credentials receives each
one; (2) the same producer without credentials, or with a wrong secret, gets every send refused
and stores nothing. This is the check the facts file could not make against a Java broker
(section F.4): a C++ signature verifies on mqbox's.
Method: one real appliance for the module with `aclEnable=true` and <home>/conf/plain_acl.yml;
the C++ clients in child processes (tests/interop/cpp_client.py); the topic created by an
admin account over mqbox's own signed RemotingClient; what the broker stored read back raw with
the admin account.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.acl.signature import SessionCredentials
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import UpdateAndCreateTopicRequestHeader
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    acknowledged,
    assert_exactly_once,
    cpp_child,
    produce,
    push_spec,
    received_seqs,
    received_view,
    sample_messages,
    wait_routed,
)
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.read_back import wait_dispatched

pytestmark = pytest.mark.interop

ACL_TEXT = """
accounts:
  - accessKey: cpp-admin
    secretKey: admin-secret
    admin: true
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
  - accessKey: cpp-user
    secretKey: user-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
ADMIN = SessionCredentials("cpp-admin", "admin-secret")
QUEUE_COUNT = 4
DELIVERY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    home = tmp_path_factory.mktemp("cpp-acl")
    (home / "conf").mkdir()
    (home / "conf" / "plain_acl.yml").write_text(ACL_TEXT, encoding="utf-8")
    pids: list[int] = []
    try:
        with running_appliance(home, pids, BROKER_CONF + "aclEnable=true\n") as running:
            yield running
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def create_topic(appliance: Appliance, topic: str) -> None:
    header = UpdateAndCreateTopicRequestHeader(topic, "TBW102", QUEUE_COUNT, QUEUE_COUNT, 6)
    with RemotingClient(appliance.broker_address, credentials=ADMIN) as broker:
        response = broker.invoke(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert response.code == ResponseCode.SUCCESS, response
    wait_routed(appliance, topic)


def max_offsets(appliance: Appliance, topic: str) -> list[int]:
    """GET_MAX_OFFSET of each queue once the dispatcher caught up: a send stored by mistake
    before the call is counted in them."""
    offsets = []
    with RemotingClient(appliance.broker_address, credentials=ADMIN) as broker:
        wait_dispatched(broker)
        for queue_id in range(QUEUE_COUNT):
            ext = {"topic": topic, "queueId": str(queue_id)}
            response = broker.invoke(RequestCode.GET_MAX_OFFSET, ext)
            assert response.code == ResponseCode.SUCCESS, response
            offsets.append(int(response.ext_fields["offset"]))
    return offsets


def test_cpp_clients_with_credentials_produce_and_consume(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppAcl")
    create_topic(appliance, topic)
    messages = sample_messages("acl", 24, big_every=6)
    credentials = ["cpp-user", "user-secret", "ALIYUN"]
    events = produce(
        tmp_path / "producer", appliance, topic, messages, reap_pids, credentials=credentials
    )
    assert sorted(acknowledged(events)) == sorted(m.seq for m in messages), events
    spec = {**push_spec(appliance, unique_name("CG-acl"), topic, messages)}
    spec["credentials"] = credentials
    wanted = {m.seq for m in messages}
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        consumer.wait_for(
            lambda child: wanted <= received_seqs(child), DELIVERY_TIMEOUT_S, "every message"
        )
        consumer.finish()
    assert_exactly_once([received_view(e) for e in consumer.messages()], messages, "delivered")


@pytest.mark.parametrize("credentials", [None, ["cpp-user", "wrong-secret", "ALIYUN"]])
def test_a_cpp_producer_without_valid_credentials_is_refused(
    appliance: Appliance, tmp_path: Path, reap_pids: list[int], credentials: list[str] | None
) -> None:
    topic = unique_name("CppAclRefused")
    create_topic(appliance, topic)
    messages = sample_messages("refused", 3)
    events = produce(
        tmp_path / "producer", appliance, topic, messages, reap_pids, credentials=credentials
    )
    assert acknowledged(events) == {}, events
    failed = [e for e in events if e.get("event") == "send_failed"]
    assert len(failed) == len(messages), events
    assert max_offsets(appliance, topic) == [0] * QUEUE_COUNT

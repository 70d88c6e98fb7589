"""Goal: with `aclEnable=true` the appliance serves signed clients by the rules of plain_acl.yml
and refuses everyone else, without a restart when the file changes (issue 13): mqbox's producer
and consumer with credentials work; unsigned, wrongly signed and unknown-key requests, and
requests an account may not make, get SYSTEM_ERROR with RocketMQ's AclException remark; the
issue's probes (TBW102 set to permission 0, a topic deleted, a group's offsets reset, the broker's
write permission wiped, a fake broker registered) fail for a non-admin account and succeed for
an admin one; a white-listed address needs no credentials; the broker signs its own
registration; the CLI signs with --access-key/--secret-key.

Method: one real appliance for the module (xdist group "acl", so one worker owns it and its
file) with the ACL file in <home>/conf/plain_acl.yml; requests through mqbox.client's
RemotingClient, Producer and PullConsumer, and the CLI through typer's CliRunner. The tests that
rewrite the file put it back and wait until the broker applied it (about a second).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mqbox.acl.signature import SessionCredentials, sign_request
from mqbox.admin import broker_ops
from mqbox.admin.cli import app
from mqbox.client import (
    ClientError,
    ConsumeResult,
    Producer,
    PullConsumer,
    PushConsumer,
    admin_api,
    namesrv_api,
)
from mqbox.client.remoting import RemotingClient, RemotingResponseError
from mqbox.message import BatchElement, encode_batch
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import RemotingCommand
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    SendMessageRequestHeader,
    TopicConfig,
    UpdateAndCreateTopicRequestHeader,
)
from mqbox.protocol.mqbox_codes import INVOKE_BROKER_TO_RESET_OFFSET, MQBOX_RESET_CONSUMER_OFFSET
from tests.support.appliance import BROKER_CONF, Appliance, module_appliance, running_appliance
from tests.support.consumers import Collector, group_name
from tests.support.namesrv_process import running_namesrv
from tests.support.read_back import wait_dispatched
from tests.support.waiting import wait_until

pytestmark = pytest.mark.xdist_group("acl")

ADMIN = SessionCredentials("acl-admin", "admin-secret")
USER = SessionCredentials("acl-user", "user-secret")
READER = SessionCredentials("acl-reader", "reader-secret")
ACL_TEXT = """
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: acl-admin
    secretKey: admin-secret
    admin: true
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
  - accessKey: acl-user
    secretKey: user-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
    topicPerms: [AclDenied=DENY]
    groupPerms: [AclDeniedGroup=DENY]
  - accessKey: acl-reader
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""
REMARK_PREFIX = "org.apache.rocketmq.acl.common.AclException: "
DELIVERY_S = 60.0  # a loaded box: the bound of a wait, not a timed assertion
SEND_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    home = tmp_path_factory.mktemp("acl")
    (home / "conf").mkdir()
    (home / "conf" / "plain_acl.yml").write_text(ACL_TEXT, encoding="utf-8")
    with module_appliance(home, BROKER_CONF + "aclEnable=true\n") as running:
        yield running


def acl_path(appliance: Appliance) -> Path:
    return appliance.home / "conf" / "plain_acl.yml"


def broker_call(
    appliance: Appliance,
    credentials: SessionCredentials | None,
    code: int,
    ext: dict[str, str],
    body: bytes = b"",
    timeout_ms: int | None = None,
) -> RemotingCommand:
    with RemotingClient(appliance.broker_address, credentials=credentials) as client:
        return client.invoke(code, ext, body, timeout_ms=timeout_ms)


def namesrv_call(
    appliance: Appliance,
    credentials: SessionCredentials | None,
    code: int,
    ext: dict[str, str],
    body: bytes = b"",
) -> RemotingCommand:
    with RemotingClient(appliance.namesrv_address, credentials=credentials) as client:
        return client.invoke(code, ext, body)


def assert_refused(response: RemotingCommand, fragment: str) -> None:
    assert response.code == ResponseCode.SYSTEM_ERROR, response
    assert response.remark is not None
    assert response.remark.startswith(REMARK_PREFIX), response.remark
    assert fragment in response.remark, response.remark


def max_offset_ext(topic: str = "TBW102") -> dict[str, str]:
    return {"topic": topic, "queueId": "0"}


def unsigned_refused(appliance: Appliance) -> bool:
    response = broker_call(appliance, None, RequestCode.GET_MAX_OFFSET, max_offset_ext())
    return response.code == ResponseCode.SYSTEM_ERROR


def holds_steadily(condition: Callable[[], bool], count: int = 5) -> Callable[[], bool]:
    """`condition` true `count` times in a row: every codec process (each reloads the file on
    its own clock) applies the file, not just the one a connection happened to reach."""

    def steady() -> bool:
        return all(condition() for _ in range(count))

    return steady


@contextlib.contextmanager
def rewritten_acl(
    appliance: Appliance, text: str, back_in_force: Callable[[], bool]
) -> Iterator[None]:
    """The ACL file replaced by `text` for the block; the original back afterwards, and in
    force (`back_in_force` holds steadily) before the next test."""
    path = acl_path(appliance)
    path.write_text(text, encoding="utf-8")
    try:
        yield
    finally:
        path.write_text(ACL_TEXT, encoding="utf-8")
        wait_until(holds_steadily(back_in_force), "the original ACL back in force")


def test_unsigned_wrongly_signed_and_unknown_requests_are_refused(appliance: Appliance) -> None:
    code = RequestCode.GET_MAX_OFFSET
    assert_refused(broker_call(appliance, None, code, max_offset_ext()), "No accessKey")
    unknown = SessionCredentials("acl-nobody", "user-secret")
    assert_refused(broker_call(appliance, unknown, code, max_offset_ext()), "No acl config")
    wrong = SessionCredentials("acl-user", "not-the-secret")
    assert_refused(broker_call(appliance, wrong, code, max_offset_ext()), "Check signature failed")
    assert broker_call(appliance, USER, code, max_offset_ext()).code == ResponseCode.SUCCESS
    # a raw frame with the right key and a signature of another body
    with RemotingClient(appliance.broker_address) as client:
        ext = sign_request(USER, max_offset_ext(), b"other")
        assert_refused(client.invoke(code, ext, b""), "Check signature failed")
    # refusals are logged by the codec that made them (rate-limited: the first one at least)
    codec_logs = sorted((appliance.home / "logs").glob("codec*.log"))
    assert codec_logs
    assert any("acl: refused code 30 from 127.0.0.1" in log.read_text() for log in codec_logs)


def test_a_signed_producer_and_consumer_work_and_unsigned_ones_do_not(
    appliance: Appliance,
) -> None:
    topic = group_name("AclTopic")
    group = group_name("AclGroup")
    with Producer(
        group_name("AclProducer"), appliance.namesrv_address, credentials=USER
    ) as producer:
        sent = [producer.send(topic, f"message {n}".encode()) for n in range(10)]
    assert len(sent) == 10
    got: list[bytes] = []
    with PullConsumer(
        group,
        appliance.namesrv_address,
        credentials=USER,
        consume_from="first",
        rebalance_interval_ms=1000,
    ) as consumer:
        consumer.subscribe(topic, "*")

        def all_polled() -> bool:
            got.extend(message.body for message in consumer.poll(200))
            return len(got) >= 10

        wait_until(all_polled, "the signed consumer's messages", DELIVERY_S)
        consumer.commit()
    assert sorted(got) == sorted(f"message {n}".encode() for n in range(10))
    unsigned = Producer(group_name("AclProducer"), appliance.namesrv_address, retry_times=0)
    with unsigned, pytest.raises(ClientError, match="No accessKey"):
        unsigned.send(topic, b"refused")
    reader = Producer(group_name("AclProducer"), appliance.namesrv_address, credentials=READER)
    with reader, pytest.raises(ClientError, match=f"No default permission for topic {topic}"):
        reader.send(topic, b"refused")


def batch_send_ext(topic: str, *, cpp: bool = False) -> dict[str, str]:
    """The header of a batch send to queue 0 of `topic`: Java's 320 (V2 names) or the C++
    client's code 10 with batch=true."""
    header = SendMessageRequestHeader(
        "AclBatchProducer", topic, "TBW102", 4, 0, 0, 1_700_000_000_000, 0, "", batch=True
    )
    return header.to_ext() if cpp else header.to_ext_v2()


def stored_count(appliance: Appliance, topic: str) -> int:
    """Queue 0's count once the dispatcher caught up: it counts a send a moment after the answer,
    in log order, so a refused batch stored by mistake before the call is counted too."""
    with RemotingClient(appliance.broker_address, credentials=ADMIN) as client:
        wait_dispatched(client)
        return admin_api.get_max_offset(client, topic, 0)


def test_a_send_batch_is_stored_only_with_a_right_signature(appliance: Appliance) -> None:
    """A batch (320, and the C++ client's 10 with batch=true) with a wrong signature, a
    signature of another body, no key, or from an account without PUB is refused with
    SYSTEM_ERROR and the AclException remark and stores nothing (no message, no auto-created
    topic); the same batch rightly signed is stored whole (docs/acl.md section 4)."""
    topic = group_name("AclBatch")
    body = encode_batch([BatchElement(f"m{n}".encode(), 0, b"") for n in range(5)])
    v2 = RequestCode.SEND_BATCH_MESSAGE
    wrong = SessionCredentials("acl-user", "not-the-secret")
    # Nothing exists before a right send: a refused first batch must not auto-create the topic.
    with RemotingClient(appliance.broker_address) as raw:
        assert_refused(
            raw.invoke(v2, sign_request(wrong, batch_send_ext(topic), body), body),
            "Check signature failed for accessKey=acl-user",
        )
    (topics_file,) = (appliance.home / "store").glob("*/config/topics.json")
    assert topic not in topics_file.read_text(encoding="utf-8")
    # The first send auto-creates the topic: on a loaded box that took seconds.
    stored = broker_call(appliance, USER, v2, batch_send_ext(topic), body, SEND_TIMEOUT_MS)
    assert stored.code == ResponseCode.SUCCESS, stored
    assert stored_count(appliance, topic) == 5
    refusals = [
        (None, v2, batch_send_ext(topic), "No accessKey is configured"),
        (wrong, v2, batch_send_ext(topic), "Check signature failed"),
        (wrong, RequestCode.SEND_MESSAGE, batch_send_ext(topic, cpp=True), "Check signature"),
        (READER, v2, batch_send_ext(topic), f"No default permission for topic {topic}"),
    ]
    with RemotingClient(appliance.broker_address) as raw:
        for credentials, code, ext, fragment in refusals:
            signed = ext if credentials is None else sign_request(credentials, ext, body)
            assert_refused(raw.invoke(code, signed, body), fragment)
        # the right key and a signature of another body
        other_body = sign_request(USER, batch_send_ext(topic), body + b"x")
        assert_refused(raw.invoke(v2, other_body, body), "Check signature failed")
    cpp_ext = batch_send_ext(topic, cpp=True)
    cpp = broker_call(appliance, USER, RequestCode.SEND_MESSAGE, cpp_ext, body, SEND_TIMEOUT_MS)
    assert cpp.code == ResponseCode.SUCCESS, cpp
    # The refused batches sit before this one in the log if any was stored: 10 means none was.
    assert stored_count(appliance, topic) == 10


def test_a_signed_push_consumer_retries_through_send_back(appliance: Appliance) -> None:
    """Heartbeat, pull, send-back (36) and the pulls of its retry topic, all signed."""
    topic = group_name("AclPushTopic")
    group = group_name("AclPushGroup")
    with Producer(
        group_name("AclProducer"), appliance.namesrv_address, credentials=USER
    ) as producer:
        producer.send(topic, b"retried once")
    answers = [ConsumeResult.RECONSUME_LATER, ConsumeResult.SUCCESS]
    collector = Collector(answer=lambda _: answers.pop(0) if answers else ConsumeResult.SUCCESS)
    with PushConsumer(
        group,
        appliance.namesrv_address,
        retry_delay_level=1,
        credentials=USER,
        rebalance_interval_ms=1000,
        consume_from="first",
    ) as consumer:
        consumer.subscribe(topic, "*", collector)
        wait_until(lambda: collector.count() >= 2, "the message and its retry", DELIVERY_S)
        statistics = consumer.statistics()
    assert [seen.reconsume_times for seen in collector.seen()] == [0, 1]
    assert statistics.sent_back == 1


def test_each_permission_is_applied_per_resource(appliance: Appliance) -> None:
    def pull(credentials: SessionCredentials, topic: str, group: str) -> RemotingCommand:
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
        }
        return broker_call(appliance, credentials, RequestCode.PULL_MESSAGE, ext)

    assert pull(USER, "TBW102", "AclAnyGroup").code != ResponseCode.SYSTEM_ERROR
    assert_refused(pull(USER, "AclDenied", "AclAnyGroup"), "No default permission for topic")
    assert_refused(pull(USER, "TBW102", "AclDeniedGroup"), "No default permission for group")
    assert pull(READER, "TBW102", "AclAnyGroup").code != ResponseCode.SYSTEM_ERROR
    commit = {"consumerGroup": "AclDeniedGroup", "topic": "TBW102", "queueId": "0"}
    commit["commitOffset"] = "0"
    response = broker_call(appliance, USER, RequestCode.UPDATE_CONSUMER_OFFSET, commit)
    assert_refused(response, "No default permission for group AclDeniedGroup")


def test_the_issue_s_probes_fail_for_a_user_and_work_for_an_admin(appliance: Appliance) -> None:
    tbw_perm_0 = UpdateAndCreateTopicRequestHeader("TBW102", "TBW102", 8, 8, 0).to_ext()
    probes: list[tuple[str, int, dict[str, str], bytes]] = [
        ("broker", RequestCode.UPDATE_AND_CREATE_TOPIC, tbw_perm_0, b""),
        ("broker", RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TBW102"}, b""),
        (
            "broker",
            INVOKE_BROKER_TO_RESET_OFFSET,
            {"group": "G", "topic": "T", "timestamp": "0"},
            b"",
        ),
        (
            "broker",
            MQBOX_RESET_CONSUMER_OFFSET,
            {"consumerGroup": "G", "topic": "T", "to": "latest"},
            b"",
        ),
        ("namesrv", RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}, b""),
        ("namesrv", RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "TBW102"}, b""),
        (
            "namesrv",
            RequestCode.REGISTER_BROKER,
            {
                "brokerName": "broker-a",
                "brokerAddr": "127.0.0.1:1",
                "clusterName": "DefaultCluster",
                "haServerAddr": "127.0.0.1:2",
                "brokerId": "0",
                "compressed": "false",
                "bodyCrc32": "0",
            },
            b'{"topicConfigSerializeWrapper":{"topicConfigTable":{}},"filterServerList":[]}',
        ),
        (
            "namesrv",
            RequestCode.UNREGISTER_BROKER,
            {"brokerName": "broker-a", "brokerAddr": "x", "clusterName": "c", "brokerId": "0"},
            b"",
        ),
    ]
    for where, code, ext, body in probes:
        call = broker_call if where == "broker" else namesrv_call
        for credentials in (None, USER):
            response = call(appliance, credentials, code, ext, body)
            expected = "No accessKey" if credentials is None else "Need admin permission"
            assert_refused(response, expected)
    # the broker is still whole: TBW102 writable, routes in place
    with Producer(
        group_name("AclProducer"), appliance.namesrv_address, credentials=USER
    ) as producer:
        producer.send(group_name("AclAfterProbes"), b"still writable")
    # an admin account passes the ACL (what the code then does is the processor's answer)
    created = UpdateAndCreateTopicRequestHeader(
        group_name("AclAdminTopic"), "TBW102", 2, 2, 6
    ).to_ext()
    response = broker_call(appliance, ADMIN, RequestCode.UPDATE_AND_CREATE_TOPIC, created)
    assert response.code == ResponseCode.SUCCESS, response


def test_the_broker_signs_its_registration(appliance: Appliance) -> None:
    """The appliance is ready only once the name server took a registration; the route of
    TBW102 names the broker."""
    with RemotingClient(appliance.namesrv_address) as client:
        response = client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert response.code == ResponseCode.SUCCESS
    assert appliance.broker_address.encode() in response.body


def test_a_white_listed_address_needs_no_credentials(appliance: Appliance) -> None:
    white = ACL_TEXT.replace(
        "globalWhiteRemoteAddresses: []", "globalWhiteRemoteAddresses: [127.0.0.*]"
    )
    with rewritten_acl(appliance, white, lambda: unsigned_refused(appliance)):
        wait_until(
            holds_steadily(lambda: not unsigned_refused(appliance)), "the white list in force"
        )
        # even an admin code, and on the name server too (the route stays: it is a read)
        ext = UpdateAndCreateTopicRequestHeader(
            group_name("AclWhiteTopic"), "TBW102", 1, 1, 6
        ).to_ext()
        assert broker_call(appliance, None, RequestCode.UPDATE_AND_CREATE_TOPIC, ext).code == 0


def test_a_changed_file_applies_to_a_running_producer(appliance: Appliance) -> None:
    topic = group_name("AclReload")
    denied = ACL_TEXT.replace(
        "topicPerms: [AclDenied=DENY]", f"topicPerms: [AclDenied=DENY, {topic}=SUB]"
    )
    producer = Producer(
        group_name("AclProducer"), appliance.namesrv_address, credentials=USER, retry_times=0
    )
    with producer:
        producer.send(topic, b"before")

        def refused() -> bool:
            try:
                producer.send(topic, b"during")
            except ClientError as error:
                if "No default permission for topic" not in str(error):
                    raise
                return True
            return False

        with rewritten_acl(appliance, denied, lambda: not refused()):
            wait_until(refused, "the new rule applied to the running producer")
        producer.send(topic, b"after")


def test_the_cli_signs_with_access_and_secret_key(appliance: Appliance) -> None:
    runner = CliRunner()
    topic = group_name("AclCliTopic")
    namesrv = ["--namesrv", appliance.namesrv_address]
    try:
        result = runner.invoke(app, ["topic", "create", topic, "--wait-s", "0", *namesrv])
        assert result.exit_code == 1
        assert "No accessKey is configured" in result.output
        keys = ["--access-key", "acl-admin", "--secret-key", "admin-secret"]
        result = runner.invoke(app, [*keys, "topic", "create", topic, *namesrv])
        assert result.exit_code == 0, result.output
        result = runner.invoke(
            app,
            ["send", "hello", "--topic", topic, *namesrv],
            env={"MQBOX_ACCESS_KEY": "acl-user", "MQBOX_SECRET_KEY": "user-secret"},
        )
        assert result.exit_code == 0, result.output
    finally:
        broker_ops.use_credentials(None)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("accounts: [", "not YAML"),
        ("accounts:\n  - {accessKey: only-user, secretKey: user-secret}\n", "add one to"),
    ],
)
def test_start_refuses_a_bad_acl_file_or_one_without_an_admin(
    tmp_path: Path, reap_pids: list[int], text: str, fragment: str
) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "plain_acl.yml").write_text(text, encoding="utf-8")
    conf = BROKER_CONF + "aclEnable=true\n"
    with (
        pytest.raises(AssertionError, match="the supervisor did not start") as caught,
        running_appliance(tmp_path, reap_pids, conf),
    ):
        pass
    assert fragment in str(caught.value)
    assert "plain_acl.yml" in str(caught.value)


def test_a_standalone_name_server_with_acl_enable_checks_registrations(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    """namesrv.conf's aclEnable and mqboxAclFile, without `mqbox start`: an unsigned or
    non-admin registration is refused and counted, an admin's is taken, reads stay open."""
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_TEXT, encoding="utf-8")
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"aclEnable=true\nmqboxAclFile={acl_file}\n", encoding="utf-8")
    topic = group_name("AclNamesrvTopic")
    header = RegisterBrokerRequestHeader(
        "broker-fake", "127.0.0.1:1", "DefaultCluster", "127.0.0.1:2", 0
    )
    body = RegisterBrokerBody(
        DataVersion(1, 1_700_000_000_000), {topic: TopicConfig(topic, 4, 4, 6)}
    )
    with running_namesrv(tmp_path / "namesrv", reap_pids, config_file=conf) as namesrv:
        for credentials, fragment in ((None, "No accessKey"), (USER, "Need admin permission")):
            with (
                RemotingClient(namesrv.address, credentials=credentials) as client,
                pytest.raises(RemotingResponseError) as refused,
            ):
                namesrv_api.register_broker(client, header, body)
            assert refused.value.remark is not None
            assert fragment in refused.value.remark
        with RemotingClient(namesrv.address) as client:
            assert namesrv_api.get_route(client, topic) is None
        # (the registration lives as long as its connection, as a broker's does)
        with RemotingClient(namesrv.address, credentials=ADMIN) as client:
            namesrv_api.register_broker(client, header, body)
            assert namesrv_api.get_route(client, topic) is not None
        namesrv.stop()
        assert namesrv.statistics()["acl"]["denied_count"] == 2

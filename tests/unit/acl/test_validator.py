"""Goal: the validator decides each request as Java's PlainPermissionManager.validate does, per
code class and permission value, and picks up a changed file without a restart.

Method: a real plain_acl.yml in tmp_path; requests signed by mqbox's signer (checked against the
golden vector in test_signature.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mqbox.acl.plain import AclConfigError
from mqbox.acl.signature import SessionCredentials, sign_request
from mqbox.acl.validator import REMARK_PREFIX, AclValidator, acl_file_path
from mqbox.protocol.codes import ConsumeFromWhere, ConsumeType, MessageModel, RequestCode
from mqbox.protocol.headers import ConsumerData, HeartbeatData, SubscriptionData
from mqbox.protocol.mqbox_codes import INVOKE_BROKER_TO_RESET_OFFSET, MQBOX_RESET_CONSUMER_OFFSET

ACL = """
globalWhiteRemoteAddresses: [10.9.9.*]
accounts:
  - accessKey: perm-user
    secretKey: secret-perm
    defaultTopicPerm: {perm}
    defaultGroupPerm: {perm}
  - accessKey: listed-user
    secretKey: secret-listed
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [TopicP=PUB, TopicS=SUB, TopicD=DENY]
    groupPerms: [GroupS=SUB, GroupD=DENY]
    whiteRemoteAddress: 10.1.1.1
  - accessKey: admin-user
    secretKey: secret-admin
    admin: true
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
"""
PEER = "127.0.0.1"


def write_acl(path: Path, perm: str = "PUB|SUB") -> Path:
    path.write_text(
        ACL.replace("{perm}", perm.replace("|", ""))
        .replace("defaultTopicPerm: " + perm.replace("|", ""), "defaultTopicPerm: " + perm)
        .replace("defaultGroupPerm: " + perm.replace("|", ""), "defaultGroupPerm: " + perm)
    )
    return path


def signed(user: str, ext: dict[str, str], body: bytes = b"") -> dict[str, str]:
    secret = "secret-" + user.removesuffix("-user")
    return sign_request(SessionCredentials(user, secret), ext, body)


def heartbeat(group: str, topic: str) -> bytes:
    data = HeartbeatData(
        "client",
        (),
        (
            ConsumerData(
                group,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                (SubscriptionData(topic, "*"),),
            ),
        ),
    )
    return data.to_json()


@pytest.fixture
def validator(tmp_path: Path) -> AclValidator:
    return AclValidator(write_acl(tmp_path / "plain_acl.yml"))


def test_without_credentials_unknown_key_and_wrong_signature(validator: AclValidator) -> None:
    ext = {"topic": "T"}
    code = RequestCode.GET_MAX_OFFSET
    assert validator.check(code, ext, b"", PEER) == REMARK_PREFIX + "No accessKey is configured"
    unknown = sign_request(SessionCredentials("nobody-user", "secret-x"), ext, b"")
    assert (
        validator.check(code, unknown, b"", PEER) == REMARK_PREFIX + "No acl config for nobody-user"
    )
    wrong = sign_request(SessionCredentials("admin-user", "secret-wrong"), ext, b"")
    assert validator.check(code, wrong, b"", PEER) == (
        REMARK_PREFIX + "Check signature failed for accessKey=admin-user"
    )
    tampered = signed("admin-user", ext, b"body")
    assert validator.check(code, tampered, b"bodY", PEER) is not None
    assert validator.check(code, signed("admin-user", ext), b"", PEER) is None
    assert validator.statistics().denied_count == 4


def test_white_lists_need_no_credentials(validator: AclValidator) -> None:
    ext = {"topic": "T"}
    assert validator.check(RequestCode.UPDATE_AND_CREATE_TOPIC, ext, b"", "10.9.9.7") is None
    # the account's own white address: its key, no signature
    keyed = {**ext, "AccessKey": "listed-user"}
    assert validator.check(RequestCode.GET_MAX_OFFSET, keyed, b"", "10.1.1.1") is None
    assert validator.check(RequestCode.GET_MAX_OFFSET, keyed, b"", "10.1.1.2") is not None
    assert validator.statistics().allowed_white_count == 2


# (code, ext, body, needs) per code class: needs is "PUB" / "SUB" on a topic, "GROUP" for SUB on a
# group, "ADMIN", or "" for codes that need only a signature.
def send_v2(topic: str, group: str = "P") -> dict[str, str]:
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": "0"}


CASES: list[tuple[str, int, dict[str, str], bytes, str]] = [
    ("send", RequestCode.SEND_MESSAGE, {"topic": "Topic", "producerGroup": "P"}, b"x", "PUB"),
    ("send v2", RequestCode.SEND_MESSAGE_V2, send_v2("Topic"), b"x", "PUB"),
    ("batch", RequestCode.SEND_BATCH_MESSAGE, send_v2("Topic"), b"x", "PUB"),
    ("send retry", RequestCode.SEND_MESSAGE_V2, send_v2("%RETRY%Group", "Group"), b"x", "GROUP"),
    (
        "send back",
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {"group": "Group", "offset": "1"},
        b"",
        "GROUP",
    ),
    (
        "pull",
        RequestCode.PULL_MESSAGE,
        {"topic": "Topic", "consumerGroup": "Group"},
        b"",
        "SUB+GROUP",
    ),
    ("query", RequestCode.QUERY_MESSAGE, {"topic": "Topic", "key": "k"}, b"", "SUB"),
    ("heartbeat", RequestCode.HEART_BEAT, {}, heartbeat("Group", "Topic"), "SUB+GROUP"),
    ("unregister", RequestCode.UNREGISTER_CLIENT, {"consumerGroup": "Group"}, b"", "GROUP"),
    ("consumers", RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Group"}, b"", "GROUP"),
    (
        "commit",
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": "Group", "topic": "Topic"},
        b"",
        "SUB+GROUP",
    ),
    (
        "query offset",
        RequestCode.QUERY_CONSUMER_OFFSET,
        {"consumerGroup": "Group", "topic": "Topic"},
        b"",
        "",
    ),
    ("max offset", RequestCode.GET_MAX_OFFSET, {"topic": "Topic", "queueId": "0"}, b"", ""),
    ("create topic", RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Topic"}, b"", "ADMIN"),
    ("delete topic", RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Topic"}, b"", "ADMIN"),
    ("broker config", 25, {}, b"", "ADMIN"),
    ("subscription group", 200, {}, b"{}", "ADMIN"),
    ("delete group", 207, {"groupName": "Group"}, b"", "ADMIN"),
    (
        "reset 222",
        INVOKE_BROKER_TO_RESET_OFFSET,
        {"group": "Group", "topic": "Topic"},
        b"",
        "ADMIN",
    ),
    (
        "reset mqbox",
        MQBOX_RESET_CONSUMER_OFFSET,
        {"group": "Group", "topic": "Topic"},
        b"",
        "ADMIN",
    ),
    ("register", RequestCode.REGISTER_BROKER, {"brokerName": "b"}, b"{}", "ADMIN"),
    ("wipe", RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "b"}, b"", "ADMIN"),
]


def allowed(needs: str, perm: str) -> bool:
    """What an account with this default topic and group permission may do."""
    if needs == "ADMIN":
        return False
    owned = {"DENY": set(), "PUB": {"PUB"}, "SUB": {"SUB"}, "PUB|SUB": {"PUB", "SUB"}}[perm]
    for need in filter(None, needs.split("+")):
        if need == "GROUP" and "SUB" not in owned:
            return False
        if need in ("PUB", "SUB") and need not in owned:
            return False
    return True


@pytest.mark.parametrize("perm", ["DENY", "PUB", "SUB", "PUB|SUB"])
@pytest.mark.parametrize(("what", "code", "ext", "body", "needs"), CASES, ids=[c[0] for c in CASES])
def test_every_code_class_with_each_permission_value(
    tmp_path: Path, perm: str, what: str, code: int, ext: dict[str, str], body: bytes, needs: str
) -> None:
    validator = AclValidator(write_acl(tmp_path / "plain_acl.yml", perm))
    verdict = validator.check(code, signed("perm-user", ext, body), body, PEER)
    if allowed(needs, perm):
        assert verdict is None, what
    else:
        assert verdict is not None, what
        assert verdict.startswith(REMARK_PREFIX), what
        if needs == "ADMIN":
            assert "Need admin permission" in verdict
    # an admin account may do all of it; nobody may do it without credentials
    assert validator.check(code, signed("admin-user", ext, body), body, PEER) is None, what
    assert validator.check(code, ext, body, PEER) is not None, what


def test_explicit_resource_permissions_win_over_the_defaults(validator: AclValidator) -> None:
    def verdict(code: int, ext: dict[str, str], body: bytes = b"") -> str | None:
        return validator.check(code, signed("listed-user", ext, body), body, PEER)

    assert verdict(RequestCode.SEND_MESSAGE_V2, send_v2("TopicP"), b"x") is None
    assert verdict(RequestCode.SEND_MESSAGE_V2, send_v2("TopicS"), b"x") == (
        REMARK_PREFIX + "No default permission for topic TopicS"
    )
    assert verdict(RequestCode.SEND_MESSAGE_V2, send_v2("Other"), b"x") is not None
    pull = {"topic": "TopicS", "consumerGroup": "GroupS"}
    assert verdict(RequestCode.PULL_MESSAGE, pull) is None
    assert verdict(RequestCode.PULL_MESSAGE, {**pull, "consumerGroup": "GroupD"}) == (
        REMARK_PREFIX + "No default permission for group GroupD"
    )
    assert verdict(RequestCode.PULL_MESSAGE, {**pull, "topic": "TopicD"}) is not None


def test_a_trace_topic_send_skips_the_permission_check(validator: AclValidator) -> None:
    ext = signed("listed-user", send_v2("RMQ_SYS_TRACE_TOPIC"), b"x")
    assert validator.check(RequestCode.SEND_MESSAGE_V2, ext, b"x", PEER) is None


def test_a_heartbeat_body_that_is_not_one_is_refused(validator: AclValidator) -> None:
    ext = signed("admin-user", {}, b"not json")
    verdict = validator.check(RequestCode.HEART_BEAT, ext, b"not json", PEER)
    assert verdict is not None
    assert "cannot read the heartbeat body" in verdict


def test_a_changed_file_is_reloaded_and_a_broken_one_ignored(tmp_path: Path) -> None:
    path = write_acl(tmp_path / "plain_acl.yml", "DENY")
    validator = AclValidator(path, reload_check_interval_ns=1)
    ext = signed("perm-user", send_v2("Topic"), b"x")
    assert validator.check(RequestCode.SEND_MESSAGE_V2, ext, b"x", PEER) is not None
    write_acl(path, "PUB")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert validator.check(RequestCode.SEND_MESSAGE_V2, ext, b"x", PEER) is None
    assert validator.statistics().reload_count == 1
    path.write_text("accounts: [")  # an edit in progress: the last good rules stay
    assert validator.check(RequestCode.SEND_MESSAGE_V2, ext, b"x", PEER) is None
    assert validator.statistics().reload_failed_count == 1


def test_a_bad_file_at_start_is_an_error_or_refuses_everything(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    with pytest.raises(AclConfigError, match="cannot read"):
        AclValidator(path)
    closed = AclValidator(path, fail_closed=True)
    ext = {"AccessKey": "admin-user"}
    assert closed.check(RequestCode.GET_MAX_OFFSET, ext, b"", PEER) is not None


def test_the_file_path_follows_the_home(tmp_path: Path) -> None:
    assert acl_file_path("", tmp_path) == tmp_path / "conf" / "plain_acl.yml"
    assert acl_file_path("acl.yml", tmp_path) == tmp_path / "acl.yml"
    assert acl_file_path("/etc/acl.yml", tmp_path) == Path("/etc/acl.yml")

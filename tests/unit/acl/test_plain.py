"""Goal: plain_acl.yml is read as RocketMQ reads it, refused with a clear error where it is not
valid, and its rules (permissions, address patterns) decide as Java's do.

Method: texts and tables of cases; hypothesis for the permission rule against its definition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.acl.plain import (
    ANY,
    DENY,
    PUB,
    SUB,
    AclConfigError,
    check_permission,
    parse_acl_text,
    parse_address_pattern,
    perm_text,
)

SAMPLE = """
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: "12345678"
    whiteRemoteAddress: 192.168.1.*
    admin: true
dataVersion:
  - counter: 1
    timestamp: 0
"""


def test_the_rocketmq_sample_file_is_read() -> None:
    config = parse_acl_text(SAMPLE, "sample")
    assert [pattern.text for pattern in config.global_white_remote_addresses] == [
        "10.10.103.*",
        "192.168.0.*",
    ]
    user = config.accounts["RocketMQ"]
    assert user.secret_key == "12345678"  # a YAML number, read as Java reads a String
    assert not user.admin
    assert user.owned_perm("topicA") == DENY
    assert user.owned_perm("topicB") == PUB | SUB
    assert user.owned_perm("unlisted") == DENY
    assert user.owned_perm("%RETRY%groupC") == SUB
    assert user.owned_perm("%RETRY%groupA") == DENY
    assert user.owned_perm("%RETRY%unlisted") == SUB
    admin = config.accounts["rocketmq2"]
    assert admin.admin
    assert admin.default_topic_perm == DENY  # missing = DENY, as in Java
    assert admin.white_remote_address.matches("192.168.1.7")
    assert config.admin_account() == admin
    assert "12345678" not in repr(user)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("accounts: {}", "accounts is a list"),
        ("[1, 2]", "top level is a mapping"),
        ("accounts:\n  - accessKey: short\n    secretKey: 12345678", "accessKey is missing or"),
        ("accounts:\n  - accessKey: RocketMQ\n    secretKey: 123", "secretKey is missing or"),
        (
            "accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    admin: maybe",
            "admin is true or false",
        ),
        (
            "accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n"
            "    defaultTopicPerm: PUBSUB",
            "defaultTopicPerm: 'PUBSUB' is not DENY",
        ),
        (
            "accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    topicPerms: [topicA]",
            "'topicA' is not name=PERM",
        ),
        (
            "accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    secretkey: x",
            "unknown keys secretkey",
        ),
        (
            "accounts:\n  - {accessKey: RocketMQ, secretKey: 12345678}\n"
            "  - {accessKey: RocketMQ, secretKey: 87654321}",
            "given twice",
        ),
        ("globalWhiteRemoteAddresses: [10.0.0.300]", "is not an IP address"),
        ("globalWhiteRemoteAddresses: ['10.*.0.1']", "every part after"),
        ("oops: [", "not YAML"),
        ("acounts: []", "unknown keys acounts"),
    ],
)
def test_a_file_that_is_not_valid_is_refused_naming_the_place(text: str, fragment: str) -> None:
    with pytest.raises(AclConfigError, match=r"^f\.yml: ") as caught:
        parse_acl_text(text, "f.yml")
    assert fragment in str(caught.value)


def test_an_empty_file_has_no_account() -> None:
    config = parse_acl_text("", "f.yml")
    assert config.accounts == {}
    assert config.global_white_remote_addresses == ()


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        ("", [], ["127.0.0.1"]),
        ("*", ["1.2.3.4", "::1"], []),
        ("*.*.*.*", ["1.2.3.4"], []),
        ("192.168.1.{1,2,3}", ["192.168.1.2"], ["192.168.1.4"]),
        ("192.168.1.1,192.168.1.9", ["192.168.1.9"], ["192.168.1.2"]),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "::1"]),
        ("192.168.*.*", ["192.168.77.1"], ["192.169.0.1"]),
        ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
        ("192.168.3-5.*", ["192.168.4.200"], ["192.168.6.1"]),
        ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
        ("2001:db8:0:0:0:0:0:*", ["2001:db8::1"], ["2001:db9::1"]),
    ],
)
def test_address_patterns_match_as_rocketmq_s(
    pattern: str, inside: list[str], outside: list[str]
) -> None:
    parsed = parse_address_pattern(pattern, "here")
    for host in inside:
        assert parsed.matches(host), host
    for host in outside:
        assert not parsed.matches(host), host


@pytest.mark.parametrize("pattern", ["1-2.0.0.1", "1.2.3", "1.2.300-400.*", "1.2.3.{a,b}"])
def test_bad_address_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(AclConfigError, match="here"):
        parse_address_pattern(pattern, "here")


@given(needed=st.sampled_from([PUB, SUB, ANY, PUB | SUB]), owned=st.integers(0, 15))
def test_check_permission_is_java_s_rule(needed: int, owned: int) -> None:
    if owned & DENY:
        expected = False
    elif needed & ANY:
        expected = bool(owned & (PUB | SUB))
    else:
        expected = bool(needed & owned)
    assert check_permission(needed, owned) is expected


def test_perm_words_round_trip() -> None:
    assert [perm_text(perm) for perm in (DENY, PUB, SUB, PUB | SUB, 0)] == [
        "DENY",
        "PUB",
        "SUB",
        "PUB|SUB",
        "DENY",
    ]

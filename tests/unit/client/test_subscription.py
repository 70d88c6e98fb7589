"""Subscription expressions and the client-side tag check, as Java's FilterAPI and PullAPIWrapper.

Goal: build_subscription splits, trims, de-duplicates and hashes exactly as Java 4.9.7's
FilterAPI.buildSubscriptionData (String.split on `||`, String.trim, String.hashCode), refuses
what it refuses, and produces the heartbeat JSON Java writes, which mqbox's own broker parses;
accepts()/accepts_utf8() keep exactly the messages PullAPIWrapper keeps.

Method: a table of expressions with the subString, tags and codes Java gives (hash values from
docs/protocol.md section 7.1: TagA 2598919, TagB 2598920, 中文 646394), the JSON compared
key for key, and a hypothesis property that the bytes fast path agrees with the str check on
Java-decoded TAGS.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client.subscription import (
    SubscriptionExpressionError,
    build_subscription,
    java_trim,
)
from mqbox.message import java_utf8_decode
from mqbox.protocol.headers import SubscriptionData

NOW_MS = 1_700_000_000_123


@pytest.mark.parametrize(
    ("expression", "sub_string", "tags", "codes"),
    [
        ("*", "*", (), ()),
        ("", "*", (), ()),
        ("TagA", "TagA", ("TagA",), (2598919,)),
        ("TagA || TagB", "TagA || TagB", ("TagA", "TagB"), (2598919, 2598920)),
        ("TagA||TagA", "TagA||TagA", ("TagA",), (2598919,)),
        (" * ", " * ", ("*",), (42,)),  # only "*" exactly means everything
        ("TagA ||", "TagA ||", ("TagA",), (2598919,)),
        ("||TagA", "||TagA", ("TagA",), (2598919,)),
        ("a|||b", "a|||b", ("a", "|b"), (97, 3942)),  # "|b": 124 * 31 + 98
        ("|||", "|||", ("|",), (124,)),
        (" ", " ", (), ()),  # no tags, yet not "*": the broker matches nothing by hash
        ("中文", "中文", ("中文",), (646394,)),
        (
            "\tTagA\x01 || TagB\u3000",
            "\tTagA\x01 || TagB\u3000",
            ("TagA", "TagB\u3000"),
            (2598919, 80578808),
        ),  # 2598920 * 31 + 0x3000
    ],
)
def test_build_subscription_follows_java_filter_api(
    expression: str, sub_string: str, tags: tuple[str, ...], codes: tuple[int, ...]
) -> None:
    subscription = build_subscription("Orders", expression, NOW_MS)
    assert subscription.sub_string == sub_string
    assert subscription.tags == tags
    assert subscription.codes == codes
    assert subscription.sub_version_ms == NOW_MS


@pytest.mark.parametrize("expression", ["||", "||||"])
def test_an_expression_of_separators_only_is_refused(expression: str) -> None:
    with pytest.raises(SubscriptionExpressionError):
        build_subscription("Orders", expression, NOW_MS)


def test_java_trim_strips_control_characters_but_not_unicode_spaces() -> None:
    assert java_trim("\x00\x1f A \n") == "A"
    assert java_trim("\u00a0A\u2003") == "\u00a0A\u2003"


def test_tag_check_drops_messages_without_tags_when_tags_are_given() -> None:
    subscription = build_subscription("Orders", "TagA || TagB", NOW_MS)
    assert subscription.accepts("TagA")
    assert subscription.accepts("TagB")
    assert not subscription.accepts("taga")
    assert not subscription.accepts("TagA ")
    assert not subscription.accepts(None)
    everything = build_subscription("Orders", "*", NOW_MS)
    assert everything.accepts(None)
    assert everything.accepts("anything")


def test_tag_check_on_stored_bytes_decodes_malformed_utf8_as_java() -> None:
    subscription = build_subscription("Orders", "\ufffd || 中文", NOW_MS)
    assert subscription.accepts_utf8("中文".encode())
    assert subscription.accepts_utf8(b"\xff")  # Java reads it as U+FFFD
    assert subscription.accepts_utf8(b"\xe4\xb8")  # a cut sequence: one U+FFFD as well
    assert not subscription.accepts_utf8(b"\xff\xff")  # two of them
    lone = build_subscription("Orders", "\ud800", NOW_MS)
    assert not lone.accepts_utf8(b"\xed\xa0\x80")  # Java decodes it to U+FFFD, not U+D800


def test_heartbeat_json_is_javas_and_mqbox_broker_reads_it() -> None:
    subscription = build_subscription("Orders", "TagA || TagB", NOW_MS)
    value = subscription.to_json_value()
    assert value == {
        "classFilterMode": False,
        "codeSet": [2598919, 2598920],
        "expressionType": "TAG",
        "subString": "TagA || TagB",
        "subVersion": NOW_MS,
        "tagsSet": ["TagA", "TagB"],
        "topic": "Orders",
    }
    parsed = SubscriptionData.from_json_value(value, "test")
    assert parsed.tags_set == ("TagA", "TagB")
    assert parsed.sub_version == NOW_MS


stored_tags = st.one_of(
    st.binary(max_size=6),
    st.sampled_from([b"TagA", b"\xef\xbf\xbd", b"\xff", "中文".encode(), b""]),
)


@given(
    expression=st.lists(
        st.sampled_from(["TagA", "\ufffd", "中文", "x", " y "]), min_size=1, max_size=3
    ).map(" || ".join),
    tags=stored_tags,
)
def test_bytes_fast_path_agrees_with_the_str_check(expression: str, tags: bytes) -> None:
    subscription = build_subscription("Orders", expression, NOW_MS)
    assert subscription.accepts_utf8(tags) == subscription.accepts(java_utf8_decode(tags))

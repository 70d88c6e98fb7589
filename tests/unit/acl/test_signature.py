"""Goal: mqbox signs and verifies exactly as RocketMQ's Java and C++ clients and broker do.

Method: the golden vector of the facts file (Java AclSigner 4.9.7, C++ spas_sign 1.2.3 and Python
hmac agree on it), and properties of the content rule."""

from __future__ import annotations

import pytest

from mqbox.acl.signature import (
    SessionCredentials,
    server_signature,
    sign_request,
    signed_text,
)

GOLDEN_EXT = {"consumerGroup": "G", "queueId": "0", "topic": "TopicTest"}
GOLDEN_SIGNATURE = "YeoPzG2h7lOpxpc8b2sS66e/ON0="


def test_the_golden_vector() -> None:
    signed = sign_request(SessionCredentials("RocketMQ", "12345678"), GOLDEN_EXT, b"hello")
    assert signed["AccessKey"] == "RocketMQ"
    assert signed["Signature"] == GOLDEN_SIGNATURE
    assert server_signature("12345678", signed, b"hello") == GOLDEN_SIGNATURE
    assert GOLDEN_EXT == {"consumerGroup": "G", "queueId": "0", "topic": "TopicTest"}


def test_the_content_is_the_values_in_key_order_without_the_signature() -> None:
    ext = {"b": "2", "a": "1", "Signature": "x", "C": "3"}
    assert signed_text(ext, frozenset({"Signature"})) == b"312"


def test_java_key_order_is_utf16_code_units() -> None:
    # U+FF5E sorts before U+1F600 in code points, after it in UTF-16 (the pair D83D DE00).
    ext = {"\uff5e": "tilde", "\U0001f600": "emoji"}
    assert sorted(ext) == ["\uff5e", "\U0001f600"]
    assert signed_text(ext, frozenset()) == b"emojitilde"


def test_the_server_skips_the_unique_key_query_flag() -> None:
    signed = sign_request(SessionCredentials("RocketMQ", "12345678"), GOLDEN_EXT, b"hello")
    signed["_UNIQUE_KEY_QUERY"] = "true"
    assert server_signature("12345678", signed, b"hello") == GOLDEN_SIGNATURE


def test_token_and_channel_are_sent_and_signed() -> None:
    credentials = SessionCredentials("RocketMQ", "12345678", "token", "ALIYUN")
    signed = sign_request(credentials, {"topic": "T"}, b"")
    assert signed["SecurityToken"] == "token"
    assert signed["OnsChannel"] == "ALIYUN"
    assert server_signature("12345678", signed, b"") == signed["Signature"]
    assert server_signature("12345678", {**signed, "OnsChannel": "X"}, b"") != signed["Signature"]


def test_a_changed_body_or_field_breaks_the_signature() -> None:
    signed = sign_request(SessionCredentials("RocketMQ", "12345678"), GOLDEN_EXT, b"hello")
    assert server_signature("12345678", signed, b"hellO") != GOLDEN_SIGNATURE
    assert server_signature("12345678", {**signed, "queueId": "1"}, b"hello") != GOLDEN_SIGNATURE
    assert server_signature("12345679", signed, b"hello") != GOLDEN_SIGNATURE


def test_credentials_need_both_keys_and_hide_the_secret() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        SessionCredentials("RocketMQ", "")
    assert "12345678" not in repr(SessionCredentials("RocketMQ", "12345678"))

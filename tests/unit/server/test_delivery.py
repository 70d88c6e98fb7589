"""Goal: the rewrites of delayed delivery, retry and the DLQ (processors/delivery.py) do what
docs/protocol.md section 9 says the Java broker does: a DELAY > 0 goes under
SCHEDULE_TOPIC_XXXX at queue level - 1 with REAL_TOPIC / REAL_QID (the level cut to the last
configured one), only for transaction types NOT and COMMIT; a due delivery restores the topic
and queue and removes DELAY, REAL_TOPIC and REAL_QID, keeping everything else; a send-back goes
to %RETRY%<group> with delay 3 + reconsumeTimes (or the one asked), or to %DLQ%<group> past the
limit or for a negative level, with RETRY_TOPIC, ORIGIN_MESSAGE_ID and reconsumeTimes + 1; and
messageDelayLevel parses RocketMQ's units and refuses bad values with ConfigError.

Method: pure functions on message.py's types; the central property (schedule, store, read back,
deliver = the original without its DELAY) under hypothesis, through encode_record and
decode_record so the stored bytes are the ones checked.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox import message as m
from mqbox.config import (
    DELAY_LEVEL_COUNT_MAX,
    delay_level_durations_ms,
    load_broker_config,
)
from mqbox.errors import ConfigError, MessageIllegalError
from mqbox.server.roles.processors import delivery
from mqbox.server.roles.processors.topics import SCHEDULE_TOPIC, TRANS_HALF_TOPIC

TOPIC_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789%|_-"
RESERVED = {b"DELAY", b"REAL_TOPIC", b"REAL_QID"}
topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=60).filter(
    lambda topic: topic not in (SCHEDULE_TOPIC, TRANS_HALF_TOPIC)
)
property_names = st.binary(min_size=1, max_size=12).filter(
    lambda name: b"\x01" not in name and b"\x02" not in name and name not in RESERVED
)
property_values = st.binary(min_size=1, max_size=24).filter(lambda value: b"\x02" not in value)
hosts = st.builds(
    m.pack_host,
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda parts: ".".join(map(str, parts))),
    st.integers(0, 0xFFFF),
)
LEVEL_COUNT = 18
STORE_HOST = m.pack_host("10.0.0.9", 10911)


def stored(message: m.MessageToStore, log_offset_bytes: int = 4096) -> m.StoredMessage:
    """`message` as the commit log would hold it at `log_offset_bytes`."""
    record = m.encode_record(
        message,
        log_offset_bytes=log_offset_bytes,
        queue_index=7,
        store_timestamp_ms=1_700_000_000_123,
        store_host=STORE_HOST,
    )
    return m.decode_record(record)


def with_properties(**values: str) -> bytes:
    return m.encode_properties_str(values)


def sample(**overrides: object) -> m.MessageToStore:
    fields: dict[str, object] = {
        "topic": "OrderTopic",
        "queue_id": 2,
        "body": b"body \x00\xff",
        "properties": with_properties(TAGS="TagA", KEYS="k1 k2", UNIQ_KEY="U" * 32, color="red"),
        "flag": 5,
        "sysflag": 0,
        "born_timestamp_ms": 1_699_999_999_000,
        "born_host": m.pack_host("10.1.2.3", 40001),
        "reconsume_times": 0,
        **overrides,
    }
    return m.MessageToStore(**fields)  # type: ignore[arg-type]


def properties_of(message: m.MessageToStore | m.StoredMessage) -> dict[str, str]:
    return m.decode_properties_str(message.properties)


# --- messageDelayLevel --------------------------------------------------------------------------


def test_delay_levels_parse_every_unit() -> None:
    assert delay_level_durations_ms("1s 2m 3h 4d") == (1000, 120_000, 10_800_000, 345_600_000)
    assert delay_level_durations_ms("  1s\t5s ") == (1000, 5000)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "1x",
        "s",
        "1",
        "-1s",
        "1.5s",
        "1 s",
        "\u0661s",
        "\u00b2s",
        "99999d",
        " ".join(["1s"] * 65),
    ],
)
def test_bad_delay_levels_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        delay_level_durations_ms(text)
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        load_broker_config(None, {"messageDelayLevel": text})


def test_the_most_levels_allowed_load() -> None:
    text = " ".join(["1s"] * DELAY_LEVEL_COUNT_MAX)
    config = load_broker_config(None, {"messageDelayLevel": text})
    assert len(delay_level_durations_ms(config.message_delay_level)) == DELAY_LEVEL_COUNT_MAX


# --- DELAY routing ------------------------------------------------------------------------------


def test_a_delayed_message_goes_under_the_schedule_topic_with_its_real_place() -> None:
    original = sample(properties=with_properties(TAGS="TagA", DELAY="3"))
    routed = delivery.route_delayed(original, LEVEL_COUNT)
    assert (routed.topic, routed.queue_id) == (SCHEDULE_TOPIC, 2)
    assert properties_of(routed) == {
        "TAGS": "TagA",
        "DELAY": "3",
        "REAL_TOPIC": "OrderTopic",
        "REAL_QID": "2",
    }
    assert dataclasses.replace(routed, topic="", queue_id=0, properties=b"") == (
        dataclasses.replace(original, topic="", queue_id=0, properties=b"")
    )


def test_a_level_past_the_last_is_cut_to_the_last() -> None:
    routed = delivery.route_delayed(sample(properties=with_properties(DELAY="99")), 4)
    assert routed.queue_id == 3
    assert properties_of(routed)["DELAY"] == "4"


@pytest.mark.parametrize("value", ["0", "-2", "+0"])
def test_no_positive_delay_means_no_schedule(value: str) -> None:
    original = sample(properties=with_properties(DELAY=value))
    assert delivery.route_delayed(original, LEVEL_COUNT) is original


def test_messages_without_delay_are_returned_as_they_are() -> None:
    original = sample()
    assert delivery.route_delayed(original, LEVEL_COUNT) is original


@pytest.mark.parametrize(
    ("sysflag", "scheduled"),
    [
        (m.SYSFLAG_TRANSACTION_NOT_TYPE, True),
        (m.SYSFLAG_TRANSACTION_COMMIT_TYPE, True),
        (m.SYSFLAG_TRANSACTION_PREPARED_TYPE, False),
        (m.SYSFLAG_TRANSACTION_ROLLBACK_TYPE, False),
        (m.SYSFLAG_COMPRESSED | m.SYSFLAG_TRANSACTION_COMMIT_TYPE, True),
    ],
)
def test_only_not_and_commit_transaction_types_are_delayed(sysflag: int, scheduled: bool) -> None:
    routed = delivery.route_delayed(
        sample(sysflag=sysflag, properties=with_properties(DELAY="1")), LEVEL_COUNT
    )
    assert (routed.topic == SCHEDULE_TOPIC) is scheduled


@pytest.mark.parametrize("value", ["one", "1.0", " 1", "1_0", "99999999999", "0x1"])
def test_a_delay_that_java_cannot_parse_is_illegal(value: str) -> None:
    with pytest.raises(MessageIllegalError, match="DELAY"):
        delivery.route_delayed(sample(properties=with_properties(DELAY=value)), LEVEL_COUNT)


@given(
    topic=topics,
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=300),
    user=st.dictionaries(property_names, property_values, max_size=6),
    level=st.integers(1, 200),
    level_count=st.integers(1, 64),
    flag=st.integers(-(2**31), 2**31 - 1),
    compressed=st.booleans(),
    commit=st.booleans(),
    born_timestamp_ms=st.integers(0, 2**62),
    born_host=hosts,
    reconsume_times=st.integers(0, 2**31 - 1),
)
def test_schedule_store_and_deliver_gives_back_the_message_without_its_delay(
    topic: str,
    queue_id: int,
    body: bytes,
    user: dict[bytes, bytes],
    level: int,
    level_count: int,
    flag: int,
    compressed: bool,
    commit: bool,
    born_timestamp_ms: int,
    born_host: bytes,
    reconsume_times: int,
) -> None:
    sysflag = (m.SYSFLAG_COMPRESSED if compressed else 0) | (
        m.SYSFLAG_TRANSACTION_COMMIT_TYPE if commit else 0
    )
    original = m.MessageToStore(
        topic,
        queue_id,
        body,
        m.encode_properties({**user, b"DELAY": str(level).encode()}),
        flag,
        sysflag,
        born_timestamp_ms,
        born_host,
        reconsume_times,
    )
    routed = delivery.route_delayed(original, level_count)
    assert routed.topic == SCHEDULE_TOPIC
    assert routed.queue_id == min(level, level_count) - 1
    delivered = delivery.route_from_schedule(stored(routed))
    assert delivered == dataclasses.replace(original, properties=m.encode_properties(user))


# --- delivery of a due entry ---------------------------------------------------------------------


def scheduled_record(**properties: str) -> m.StoredMessage:
    return stored(
        sample(topic=SCHEDULE_TOPIC, queue_id=0, properties=with_properties(**properties))
    )


@pytest.mark.parametrize(
    ("properties", "problem"),
    [
        ({"REAL_QID": "1"}, "REAL_TOPIC"),
        ({"REAL_TOPIC": "T"}, "REAL_QID"),
        ({"REAL_TOPIC": "T", "REAL_QID": "x"}, "REAL_QID"),
        ({"REAL_TOPIC": "T", "REAL_QID": "-1"}, "negative"),
        ({"REAL_TOPIC": SCHEDULE_TOPIC, "REAL_QID": "0"}, "takes no deliveries"),
        ({"REAL_TOPIC": TRANS_HALF_TOPIC, "REAL_QID": "0"}, "takes no deliveries"),
        ({"REAL_TOPIC": "T" * 128, "REAL_QID": "0"}, "over 127"),
    ],
)
def test_an_undeliverable_schedule_record_is_illegal(
    properties: dict[str, str], problem: str
) -> None:
    with pytest.raises(MessageIllegalError, match=problem):
        delivery.route_from_schedule(scheduled_record(**properties))


def test_a_non_utf8_real_topic_is_illegal() -> None:
    record = stored(
        sample(
            topic=SCHEDULE_TOPIC,
            properties=m.encode_properties({b"REAL_TOPIC": b"\xff\xfe", b"REAL_QID": b"0"}),
        )
    )
    with pytest.raises(MessageIllegalError, match="UTF-8"):
        delivery.route_from_schedule(record)


# --- send-back ----------------------------------------------------------------------------------


def send_back(record: m.StoredMessage, **overrides: object) -> m.MessageToStore:
    arguments: dict[str, object] = {
        "group": "CG",
        "delay_level": 0,
        "reconsume_times_max": 16,
        "retry_queue_id": 0,
        "origin_msg_id": m.encode_offset_msg_id(record.store_host, record.log_offset_bytes),
        **overrides,
    }
    return delivery.send_back_message(record, **arguments)  # type: ignore[arg-type]


def test_a_first_send_back_goes_to_the_retry_topic_at_level_3() -> None:
    record = stored(sample(sysflag=m.SYSFLAG_COMPRESSED))
    message = send_back(record, retry_queue_id=0)
    assert (message.topic, message.queue_id) == ("%RETRY%CG", 0)
    assert message.reconsume_times == 1
    assert (message.body, message.flag, message.sysflag) == (
        record.body,
        record.flag,
        record.sysflag,
    )
    assert (message.born_timestamp_ms, message.born_host) == (
        record.born_timestamp_ms,
        record.born_host,
    )
    assert properties_of(message) == {
        **properties_of(record),
        "RETRY_TOPIC": "OrderTopic",
        "WAIT": "false",
        "DELAY": "3",
        "ORIGIN_MESSAGE_ID": m.encode_offset_msg_id(STORE_HOST, 4096),
    }
    routed = delivery.route_delayed(message, LEVEL_COUNT)
    assert (routed.topic, routed.queue_id) == (SCHEDULE_TOPIC, 2)
    assert properties_of(routed)["REAL_TOPIC"] == "%RETRY%CG"


def test_a_later_send_back_keeps_the_origin_and_retry_topic_and_waits_longer() -> None:
    first = send_back(stored(sample()))
    retried = stored(delivery.route_from_schedule(stored(delivery.route_delayed(first, 18))))
    assert retried.topic == "%RETRY%CG"
    second = send_back(retried, origin_msg_id="IGNORED", delay_level=0)
    properties = properties_of(second)
    assert properties["RETRY_TOPIC"] == "OrderTopic"
    assert properties["ORIGIN_MESSAGE_ID"] == m.encode_offset_msg_id(STORE_HOST, 4096)
    assert properties["DELAY"] == "4"  # 3 + reconsumeTimes 1
    assert second.reconsume_times == 2


def test_the_level_asked_for_wins_over_the_default() -> None:
    assert properties_of(send_back(stored(sample()), delay_level=7))["DELAY"] == "7"


@pytest.mark.parametrize(
    ("reconsume_times", "maximum", "delay_level", "dead"),
    [(0, 16, 0, False), (15, 16, 0, False), (16, 16, 0, True), (3, 1, 5, True), (0, 16, -1, True)],
)
def test_the_dlq_takes_what_reached_the_limit_or_asks_for_no_retry(
    reconsume_times: int, maximum: int, delay_level: int, dead: bool
) -> None:
    record = stored(sample(reconsume_times=reconsume_times))
    message = send_back(
        record, reconsume_times_max=maximum, delay_level=delay_level, retry_queue_id=0
    )
    assert message.topic == ("%DLQ%CG" if dead else "%RETRY%CG")
    assert message.reconsume_times == reconsume_times + 1
    assert ("DELAY" in properties_of(message)) is not dead
    if dead:
        assert message.queue_id == 0
        assert delivery.route_delayed(message, LEVEL_COUNT) is message


def test_a_retry_topic_send_goes_to_the_dlq_only_past_its_limit() -> None:
    assert delivery.dead_letter_topic("%RETRY%G1", 16, 16) == "%DLQ%G1"
    assert delivery.dead_letter_topic("%RETRY%G1", 15, 16) is None
    assert delivery.dead_letter_topic("Plain", 99, 16) is None


def test_a_record_sent_back_counts_as_its_topic_and_a_retried_one_as_its_first_topic_too() -> None:
    plain = stored(sample(topic="Orders"))
    assert delivery.send_back_topics(plain) == ("Orders",)
    retried = stored(
        sample(topic="%RETRY%CG", properties=with_properties(RETRY_TOPIC="Orders", TAGS="T"))
    )
    assert delivery.send_back_topics(retried) == ("%RETRY%CG", "Orders")
    # RETRY_TOPIC counts only under a %RETRY% topic: elsewhere anyone could have set it.
    claimed = stored(sample(topic="Secret", properties=with_properties(RETRY_TOPIC="Orders")))
    assert delivery.send_back_topics(claimed) == ("Secret",)
    bare_retry = stored(sample(topic="%RETRY%CG"))
    assert delivery.send_back_topics(bare_retry) == ("%RETRY%CG",)

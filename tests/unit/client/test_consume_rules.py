"""The consumers' decisions: start positions, rebalance changes, pull waits, orderly answers,
reconsume limits, consume timestamps and reset bodies.

Goal: each function answers what docs/client.md B.5 to B.10 say Java does: the B.6 table for
every consume_from on retry and plain topics, with -1 and -2 from the store; a rebalance drops
exactly the queues no longer allocated or not pulled for 120 s and adds exactly the new ones;
B.7's checks in Java's order; an orderly failure retries what is under the limit and
dead-letters the rest; both RESET_CONSUMER_CLIENT_OFFSET bodies the broker writes parse to the
same table, and damaged ones are refused.

Method: worked tables. The reset bodies come from the broker's own encoders
(mqbox/server/admin_parcels.py), so the client reads exactly what the broker sends.
"""

from __future__ import annotations

import datetime

import pytest

from mqbox.client.consume_rules import (
    CONSUME_TIMESTAMP_LOOKBACK_MS,
    RECONSUME_TIMES_MAX_CONCURRENT,
    RECONSUME_TIMES_MAX_ORDERLY,
    ConsumeFrom,
    ResetBodyError,
    clamp_suspend_ms,
    consume_timestamp_ms,
    orderly_outcome,
    parse_consume_from,
    parse_reset_offsets,
    pull_delay_ms,
    queue_changes,
    queues_by_broker,
    reconsume_times_max,
    start_offset,
)
from mqbox.client.process_queue import FLOW_CONTROL_DELAY_MS, FlowControl
from mqbox.errors import ConfigError
from mqbox.protocol.codes import ConsumeFromWhere
from mqbox.protocol.headers import MessageQueue
from mqbox.protocol.mqbox_codes import encode_reset_offset_body_cpp, encode_reset_offset_body_java

MAX_OFFSET = 500
FOUND_BY_TIME = 123
TIMESTAMP_MS = 1_700_000_000_000


def start(stored: int, consume_from: ConsumeFrom, retry: bool) -> int:
    def search(timestamp_ms: int) -> int:
        assert timestamp_ms == TIMESTAMP_MS
        return FOUND_BY_TIME

    return start_offset(
        stored,
        consume_from,
        retry,
        max_offset=lambda: MAX_OFFSET,
        search_offset=search,
        timestamp_ms=TIMESTAMP_MS,
    )


@pytest.mark.parametrize(
    ("consume_from", "retry", "expected"),
    [
        (ConsumeFrom.LAST, False, MAX_OFFSET),
        (ConsumeFrom.LAST, True, 0),
        (ConsumeFrom.FIRST, False, 0),
        (ConsumeFrom.FIRST, True, 0),
        (ConsumeFrom.TIMESTAMP, False, FOUND_BY_TIME),
        (ConsumeFrom.TIMESTAMP, True, MAX_OFFSET),
    ],
)
def test_a_queue_without_a_stored_offset_starts_where_b6_says(
    consume_from: ConsumeFrom, retry: bool, expected: int
) -> None:
    assert start(-1, consume_from, retry) == expected


@pytest.mark.parametrize("consume_from", list(ConsumeFrom))
def test_a_stored_offset_wins_and_a_failed_read_skips_the_queue(consume_from: ConsumeFrom) -> None:
    assert start(0, consume_from, False) == 0
    assert start(42, consume_from, True) == 42
    assert start(-2, consume_from, False) == -1


def test_consume_from_names_and_heartbeat_values() -> None:
    assert parse_consume_from("timestamp") is ConsumeFrom.TIMESTAMP
    assert ConsumeFrom.LAST.where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    assert ConsumeFrom.FIRST.where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    with pytest.raises(ConfigError):
        parse_consume_from("middle")


def test_consume_timestamp_forms() -> None:
    now = TIMESTAMP_MS
    assert consume_timestamp_ms(None, now) == now - CONSUME_TIMESTAMP_LOOKBACK_MS
    assert consume_timestamp_ms(5, now) == 5
    local = datetime.datetime(2024, 3, 1, 12, 30, 15)
    assert consume_timestamp_ms("20240301123015", now) == int(local.timestamp() * 1000)
    assert consume_timestamp_ms(local, now) == int(local.timestamp() * 1000)
    with pytest.raises(ConfigError):
        consume_timestamp_ms("2024-03-01", now)
    with pytest.raises(ConfigError):
        consume_timestamp_ms(-1, now)


def q(queue_id: int, broker: str = "broker-a", topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def test_a_rebalance_drops_what_left_or_expired_and_adds_what_came() -> None:
    held = {q(0): False, q(1): False, q(2): True, q(3): False}
    changes = queue_changes(held, [q(1), q(2), q(4), q(0, "broker-b")])
    assert changes.drop == (q(0), q(2), q(3))  # q(2) is still mine, but its pulls expired
    assert changes.add == (q(4), q(0, "broker-b"))
    assert queue_changes(held, list(held)).drop == (q(2),)
    assert queue_changes({}, []).add == ()


def test_queues_by_broker_groups_and_sorts() -> None:
    grouped = queues_by_broker([q(3, "b"), q(1, "a"), q(0, "b"), q(2, "a")])
    assert grouped == {"a": [q(1, "a"), q(2, "a")], "b": [q(0, "b"), q(3, "b")]}


def test_pull_checks_run_in_javas_order() -> None:
    def delay(**changed: object) -> int | None:
        facts: dict[str, object] = {
            "dropped": False,
            "running": True,
            "paused": False,
            "flow": None,
            "orderly_unlocked": False,
        }
        facts.update(changed)
        return pull_delay_ms(**facts)  # type: ignore[arg-type]

    assert delay() == 0
    assert delay(dropped=True, running=False, paused=True) is None
    assert delay(running=False, paused=True, flow=FlowControl.COUNT) == 1000
    assert delay(paused=True, flow=FlowControl.COUNT) == 1000
    assert delay(flow=FlowControl.SPAN, orderly_unlocked=True) == FLOW_CONTROL_DELAY_MS
    assert delay(orderly_unlocked=True) == 1000


def test_an_orderly_success_commits_everything() -> None:
    outcome = orderly_outcome(True, [0, 99, 5], 3, 1000)
    assert outcome.commit
    assert (outcome.retry, outcome.dead_letter) == ((), ())


def test_an_orderly_suspension_retries_under_the_limit_and_dead_letters_the_rest() -> None:
    outcome = orderly_outcome(False, [0, 3, 2, 7], 3, 1000)
    assert not outcome.commit
    assert outcome.retry == (0, 2)
    assert outcome.dead_letter == (1, 3)
    assert outcome.suspend_ms == 1000
    every_one_dead = orderly_outcome(False, [3, 4], 3, 1000)
    assert every_one_dead.commit
    assert every_one_dead.dead_letter == (0, 1)


def test_suspend_time_and_reconsume_limits_follow_java() -> None:
    assert clamp_suspend_ms(1) == 10
    assert clamp_suspend_ms(60_000) == 30_000
    assert orderly_outcome(False, [0], 1, 5).suspend_ms == 10
    assert reconsume_times_max(None, orderly=False) == RECONSUME_TIMES_MAX_CONCURRENT == 16
    assert reconsume_times_max(-1, orderly=True) == RECONSUME_TIMES_MAX_ORDERLY == 2**31 - 1
    assert reconsume_times_max(2, orderly=True) == 2


@pytest.mark.parametrize("encode", [encode_reset_offset_body_java, encode_reset_offset_body_cpp])
def test_both_reset_bodies_the_broker_writes_parse_to_one_table(encode: object) -> None:
    assert callable(encode)
    body = encode("broker-a", 'T "quoted" ✓', {0: 17, 3: 0, 1: 2**40})
    topic = 'T "quoted" ✓'
    assert parse_reset_offsets(body) == {
        MessageQueue(topic, "broker-a", 0): 17,
        MessageQueue(topic, "broker-a", 1): 2**40,
        MessageQueue(topic, "broker-a", 3): 0,
    }
    assert parse_reset_offsets(encode("broker-a", "T", {})) == {}


@pytest.mark.parametrize(
    "body",
    [
        b"\xff",
        b"[]",
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:}}',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:1',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:-1}}',
        b'{"offsetTable":{"x":1}}',
        b'{"offsetTable":[{"brokerName":"b","queueId":"0","topic":"T","offset":1}]}',
        b'{"offsetTable":[{"brokerName":"b","queueId":0,"topic":"T"}]}',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:1}} tail',
    ],
)
def test_a_damaged_reset_body_is_refused(body: bytes) -> None:
    with pytest.raises(ResetBodyError):
        parse_reset_offsets(body)

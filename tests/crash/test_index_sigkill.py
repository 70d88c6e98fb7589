"""Goal: the dispatcher flushes the index far less often than the consume queues
(mqboxFlushIntervalIndexMs), so a SIGKILL of the whole broker finds index entries no flush
covered, under a checkpoint whose index position lags its consume-queue position; after the
restart every acknowledged message is found by each of its keys (QUERY_MESSAGE), exactly once,
and the index itself holds each key once.

Method: the real appliance (tests/support/appliance.py) in a fresh home, consume queues flushed
every 200 ms and the index every 10 minutes, so no index flush comes by the clock while the test
runs, whatever the load. Phase 1 sends messages A and stops the broker in order: the stop flushes
the index, so the checkpoint's index position is the end of A. Phase 2 starts it again (the
clean path), sends messages B, waits until the checkpoint's consume-queue position covers B while
its index position still says the end of A, and SIGKILLs the supervisor, its name server and
every role by PID. Phase 3 starts it again: the store writer's log shows the unclean path, the
index keys of B cut and the dispatch resumed at the end of A; every key of A and B answers
QUERY_MESSAGE with its one message; after an orderly stop the index files, opened read-only,
hold each key once. Each message carries a UNIQ_KEY and KEYS of two tokens.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Final

import pytest

from mqbox.client.remoting import RemotingClient
from mqbox.message import StoredMessage, index_key_hash
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.store.checkpoint import CheckpointState, read_checkpoint
from mqbox.store.index import IndexService
from mqbox.store.layout import StoreGeometry, abort_path, checkpoint_path
from tests.integration import test_checkpoint_owner
from tests.integration.test_checkpoint_owner import (
    kill_whole_broker,
    last_recovery_line,
    wait_checkpoint_state,
)
from tests.support.appliance import Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.read_back import REQUEST_TIMEOUT_MS, decode_records, pull_queue
from tests.support.send_requests import send_to_queue_header

pytestmark = [pytest.mark.integration, pytest.mark.crash]

# test_checkpoint_owner.py's broker, its index flushed every 10 minutes instead of 200 ms.
BROKER_CONF: Final = (
    test_checkpoint_owner.BROKER_CONF.replace(
        "mqboxFlushIntervalIndexMs=200\n", "mqboxFlushIntervalIndexMs=600000\n"
    )
    + "mqboxHttpPort=0\n"
)
assert "=600000" in BROKER_CONF
TOPIC: Final = "IndexKillTopic"
COUNT_A: Final = 120
COUNT_B: Final = 180
WAIT_S: Final = 60.0


def keys_of(number: int) -> list[str]:
    """The three keys message `number` is indexed by: two KEYS tokens and its UNIQ_KEY."""
    return [f"k{number}", f"order-{number}", f"U{number:032d}"]


def send(client: FrontClient, number: int) -> None:
    keys = keys_of(number)
    properties = {"KEYS": f"{keys[0]} {keys[1]}", "UNIQ_KEY": keys[2]}
    header = send_to_queue_header(TOPIC, properties=properties)
    response = client.call(RequestCode.SEND_MESSAGE, header.to_ext(), f"body {number}".encode())
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert int(response.ext_fields["queueOffset"]) == number


def pull_all(appliance: Appliance, count: int) -> list[StoredMessage]:
    """Every message of queue 0, in order, once the dispatcher has all `count`."""
    deadline = time.monotonic() + WAIT_S
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        while len(found := pull_queue(broker, TOPIC, 0)) < count:
            assert time.monotonic() < deadline, f"only {len(found)} of {count} messages"
            time.sleep(0.05)
    assert [message.queue_index for message in found] == list(range(count))
    return found


def query_each_key(client: FrontClient, stored: list[StoredMessage]) -> None:
    """QUERY_MESSAGE by every key of every message answers that message alone."""
    for message in stored:
        for key in keys_of(message.queue_index):
            response = client.call(
                RequestCode.QUERY_MESSAGE,
                {
                    "topic": TOPIC,
                    "key": key,
                    "maxNum": "32",
                    "beginTimestamp": "0",
                    "endTimestamp": str(2**62),
                },
            )
            assert response.code == ResponseCode.SUCCESS, (key, response.remark)
            assert decode_records(response.body) == [message], key


def end_of(stored: list[StoredMessage]) -> int:
    return stored[-1].log_offset_bytes + stored[-1].size_bytes


def recovery_number(line: str, field: str) -> int:
    match = re.search(rf"\b{field}=(\d+)", line)
    assert match is not None, (field, line)
    return int(match.group(1))


def test_keys_the_index_flush_did_not_cover_are_found_once_after_a_sigkill(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    store_root = home / "store" / "broker-a"
    path = checkpoint_path(store_root)
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        client = appliance.client()
        try:
            for number in range(COUNT_A):
                send(client, number)
            stored_a = pull_all(appliance, COUNT_A)
        finally:
            client.close()
        assert appliance.stop() == 0
    end_a = end_of(stored_a)
    state = read_checkpoint(path)
    assert state is not None
    assert (state.logics_log_offset_bytes, state.index_log_offset_bytes) == (end_a, end_a)

    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        assert "was_clean=True" in last_recovery_line(home)
        client = appliance.client()
        try:
            for number in range(COUNT_A, COUNT_A + COUNT_B):
                send(client, number)
            stored = pull_all(appliance, COUNT_A + COUNT_B)
        finally:
            client.close()
        assert stored[:COUNT_A] == stored_a
        end_b = end_of(stored)

        def consume_queues_cover_b(state: CheckpointState) -> bool:
            return state.logics_log_offset_bytes == end_b

        state = wait_checkpoint_state(path, consume_queues_cover_b)
        assert state.index_log_offset_bytes == end_a  # B's keys: put, not known flushed
        assert state.index_msg_timestamp_ms <= stored_a[-1].store_timestamp_ms
        kill_whole_broker(appliance)
        assert abort_path(store_root).exists()

    key_count_b = COUNT_B * len(keys_of(0))
    with running_appliance(home, reap_pids, BROKER_CONF) as appliance:
        recovery = last_recovery_line(home)
        assert "was_clean=False" in recovery
        assert "flushed_damage=False" in recovery
        assert recovery_number(recovery, "write_log_offset_bytes") == end_b
        assert recovery_number(recovery, "redispatch_from_log_offset_bytes") == end_a
        # A SIGKILL keeps the page cache: every key of B was there, past the index position.
        assert recovery_number(recovery, "index_entry_dropped_count") == key_count_b
        assert recovery_number(recovery, "redispatched_record_count") == COUNT_B
        client = appliance.client()
        try:
            assert pull_all(appliance, COUNT_A + COUNT_B) == stored
            query_each_key(client, stored)
        finally:
            client.close()
        assert appliance.stop() == 0

    index = IndexService(store_root, StoreGeometry(), writable=False)
    index.load()
    try:
        for message in stored:
            for key in keys_of(message.queue_index):
                candidates = index.query(index_key_hash(TOPIC, key), 0, 2**62, 8)
                assert candidates == [message.log_offset_bytes], key
    finally:
        index.close()

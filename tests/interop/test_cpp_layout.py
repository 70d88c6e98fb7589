"""The official C++ producer sends to a 2m-2s layout: its sends spread over both masters' queues.

Goal: with `mqbox start --layout etc/examples/2m-2s` (two masters, each with a slave registered
under brokerId 1), the C++ client's route holds both broker names, it sends to the masters only,
over the queues of both, and every acknowledged message is stored exactly once on one master.
Method: the real layout started by the console script (tests/support/layout.py, every port 0);
the slaves waited for until they follow their masters (SYNC_MASTER acks need them); the topic
created on every master by `mqbox topic create`; one C++ producer child
(tests/interop/cpp_client.py); each master's queues read back over the raw protocol from index 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mqbox.client.remoting import RemotingClient
from tests.conftest import unique_name
from tests.integration.test_layout_replication import WAIT_S
from tests.interop.cpp_client import (
    acknowledged,
    assert_exactly_once,
    produce,
    sample_messages,
    stored_view,
)
from tests.support.layout import create_topic_by_cli, running_layout, wait_slaves_connected
from tests.support.read_back import REQUEST_TIMEOUT_MS, pull_queue, wait_dispatched

pytestmark = pytest.mark.interop

QUEUE_COUNT = 4
MESSAGE_COUNT = 40


def test_cpp_sends_spread_over_both_masters_of_a_2m_2s_layout(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with running_layout(tmp_path / "layout") as layout:
        # The masters are SYNC_MASTER: a send is acknowledged once a slave has it.
        wait_slaves_connected(layout, WAIT_S)
        topic = unique_name("CppLayout")
        created = create_topic_by_cli(layout, topic, QUEUE_COUNT)
        assert created.count('"broker_name"') == 2  # both masters, no slave

        messages = sample_messages("layout", MESSAGE_COUNT)
        events = produce(tmp_path / "producer", layout.namesrv, topic, messages, reap_pids)
        sent = acknowledged(events)
        assert sorted(sent) == sorted(m.seq for m in messages), events

        stored_by_master = {}
        for name in ("broker-a", "broker-b"):
            with RemotingClient(layout.brokers[name], REQUEST_TIMEOUT_MS) as broker:
                wait_dispatched(broker)  # the last sends were answered before they were pullable
                stored_by_master[name] = {
                    queue_id: pull_queue(broker, topic, queue_id) for queue_id in range(QUEUE_COUNT)
                }
        for name, queues in stored_by_master.items():
            used = [queue_id for queue_id, records in queues.items() if records]
            assert len(used) == QUEUE_COUNT, (name, {q: len(r) for q, r in queues.items()})
        records = [
            record
            for queues in stored_by_master.values()
            for queue_records in queues.values()
            for record in queue_records
        ]
        assert_exactly_once([stored_view(r) for r in records], messages, "stored")

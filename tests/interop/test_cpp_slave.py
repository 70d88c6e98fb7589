"""The official C++ client (PyPI `rocketmq==0.4.4`) with a master and its slave.

Goal: (1) a C++ producer whose route leads it to a slave's address gets RocketMQ's answer for a
put on a slave, SERVICE_NOT_AVAILABLE (14) with the remark "service not available now. ...
messages are put to the slave ...", on each of its attempts, and the slave stores nothing;
(2) a C++ push consumer follows suggestWhichBrokerId: with slaveReadEnable and
accessMessageInMemoryMaxRatio=0 on the master, each pull that found messages sends its next pull
to the slave (brokerId 1), whose empty queue sends it back to the master, and every message is
still consumed once.

Method: a real master and slave (tests/support/master_slave.py). A name server only ever routes
a brokerName's queues to its master (brokerId 0), so a C++ producer never picks a slave by
itself; the test therefore starts a second real name server and registers the slave's address
there as the master of a broker name of its own (a REGISTER_BROKER the test sends and keeps its
connection open for, as a broker would). The producer runs in a child process
(tests/interop/cpp_client.py) pointed at that name server. The wheel raises only "No route info"
once its attempts are spent, so what the slave answered is read in the client's own log; the
slave's stored queue is read back over the wire. For (2) messages are sent to the master with
mqbox.client and the slave's pull counters (MQBOX_PULL_STATUS, one pull processor) show the
C++ consumer's pulls reaching it. The slave holds no messages until the HA stream replicates
them (another branch), which is why the consumer returns to the master.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.client import Producer, namesrv_api
from mqbox.client.admin_api import all_topic_config, get_max_offset
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.headers import (
    DataVersion,
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    TopicConfig,
)
from mqbox.protocol.mqbox_codes import MQBOX_PULL_STATUS
from tests.conftest import unique_name
from tests.interop.cpp_client import (
    SentMessage,
    cpp_child,
    create_topic,
    push_spec,
    received_seqs,
)
from tests.support.master_slave import MASTER_CONF, MasterSlave, running_master_slave
from tests.support.namesrv_process import running_namesrv
from tests.support.read_back import wait_dispatched

pytestmark = pytest.mark.interop

CHILD_TIMEOUT_S = 90.0


DELIVERY_TIMEOUT_S = 60.0
MASTER_BEHIND_CONF = MASTER_CONF + "slaveReadEnable=true\naccessMessageInMemoryMaxRatio=0\n"


@pytest.fixture
def pair(tmp_path: Path, reap_pids: list[int]) -> Iterator[MasterSlave]:
    with running_master_slave(
        tmp_path / "pair", reap_pids, master_conf=MASTER_BEHIND_CONF
    ) as running:
        yield running


def test_cpp_producer_gets_service_not_available_from_a_slave(
    pair: MasterSlave, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppSlaveT")
    slave_address = pair.slave.broker_address
    with (
        running_namesrv(tmp_path / "namesrv2", reap_pids) as namesrv,
        RemotingClient(namesrv.address) as registrar,
    ):
        header = RegisterBrokerRequestHeader(
            broker_name=unique_name("slave-as-master"),
            broker_addr=slave_address,
            cluster_name="CppSlaveCluster",
            ha_server_addr="127.0.0.1:1",
            broker_id=0,
        )
        body = RegisterBrokerBody(
            DataVersion(1, int(time.time() * 1000)), {topic: TopicConfig(topic, 1, 1, 6)}
        )
        namesrv_api.register_broker(registrar, header, body)
        message = SentMessage(seq="s0", body="to the slave")
        spec = {
            "mode": "produce",
            "namesrv": namesrv.address,
            "group": unique_name("CppSlavePG"),
            "topic": topic,
            "method": "sync",
            "messages": [message.to_json()],
        }
        with cpp_child(tmp_path / "producer", spec, reap_pids) as child:
            events = child.finish(CHILD_TIMEOUT_S)

    failures = [event for event in events if event.get("event") == "send_failed"]
    assert len(failures) == 1, events
    assert not [event for event in events if event.get("event") == "sent"]
    # The wheel surfaces only its last words ("No route info of this topic": after the failed
    # attempts it has no other broker to try); its log has what the slave answered each time.
    refusals = [
        line
        for line in cpp_log(tmp_path / "producer").splitlines()
        if "processSendResponse error" in line
    ]
    assert refusals, cpp_log(tmp_path / "producer")
    for line in refusals:
        assert "error code:14" in line, line
        assert "service not available now" in line, line
        assert "messages are put to the slave" in line, line
    with RemotingClient(slave_address) as slave:
        wait_dispatched(slave)  # a send the slave stored by mistake is counted once this returns
        stored = get_max_offset(slave, topic, 0) if topic_known(slave, topic) else 0
    assert stored == 0


def cpp_log(directory: Path) -> str:
    """The C++ client's own log (it writes under $HOME/logs/rocketmq-cpp)."""
    return "".join(
        path.read_text(encoding="utf-8", errors="replace")
        for path in sorted((directory / "logs" / "rocketmq-cpp").glob("*"))
    )


def topic_known(broker: RemotingClient, topic: str) -> bool:
    return topic in all_topic_config(broker).topic_config_table


def pulls_served(address: str) -> int:
    with RemotingClient(address) as broker:
        response = broker.invoke(MQBOX_PULL_STATUS)
    assert response.code == 0, response.remark
    pulls: int = json.loads(response.body)["pulls"]
    return pulls


def test_cpp_push_consumer_follows_the_suggested_broker(
    pair: MasterSlave, tmp_path: Path, reap_pids: list[int]
) -> None:
    topic = unique_name("CppSlaveConsume")
    group = unique_name("CppSlaveCG")
    create_topic(pair.master, topic, 1)
    messages = [SentMessage(f"c{index}", f"message {index}") for index in range(6)]
    with Producer(unique_name("CppSlaveP"), pair.namesrv_address) as producer:
        for message in messages:
            producer.send(topic, message.body.encode(), properties=message.user_properties())
    slave_pulls = pulls_served(pair.slave.broker_address)
    spec = push_spec(pair.master, group, topic, messages)
    with cpp_child(tmp_path / "consumer", spec, reap_pids) as consumer:
        consumer.wait_started()
        consumer.wait_for(
            lambda child: received_seqs(child) >= {m.seq for m in messages},
            DELIVERY_TIMEOUT_S,
            "every message",
        )
        consumer.finish()
    seqs = [str(event["properties"]["mqboxSeq"]) for event in consumer.messages()]
    assert sorted(seqs) == sorted(m.seq for m in messages)  # once each
    assert pulls_served(pair.slave.broker_address) > slave_pulls

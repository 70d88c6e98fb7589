"""Goal: mqbox.client reads from a master/slave pair as RocketMQ 4.9's client does (docs/
replication.md, "Slave service"): a push consumer's next pull of a queue goes to the broker the
previous answer suggested (the slave, when the master says the consumer is behind); a pull for
the master's id goes to the slave while the master is out of the route; offsets are committed to
the master, to the slave while the master is gone, and to the master again once it is back, so
an offset made while the master was down is the master's afterwards, and the slave's after its
next sync (the master's stale copy is not what stays).

Method: a real name server, master and slave (tests/support/master_slave.py; the master with
slaveReadEnable and accessMessageInMemoryMaxRatio=0, so every pull that finds messages suggests
brokerId 1); the client's own ClientInstance refreshing routes every 300 ms; which broker a pull
reached is read from each broker's pull counters (MQBOX_PULL_STATUS, one pull processor each);
offsets are read with QUERY_CONSUMER_OFFSET on each broker. The slave holds no messages (the HA
stream is another branch), so what is tested is where requests go and what the offsets become.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.client import ClientInstance, Producer, PushConsumer
from mqbox.client.admin_api import all_topic_config
from mqbox.client.consumer_offsets import RemoteOffsetStore
from mqbox.client.pull import PullStatus, pull, query_consumer_offset
from mqbox.client.remoting import RemotingClient
from mqbox.protocol.headers import MessageQueue
from mqbox.protocol.mqbox_codes import MQBOX_PULL_STATUS
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.consumers import Collector
from tests.support.master_slave import (
    BROKER_NAME,
    MASTER_CONF,
    MasterSlave,
    running_master_slave,
)
from tests.support.read_back import create_topic
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

WAIT_S = 30.0
ROUTE_REFRESH_MS = 300
MASTER_BEHIND_CONF = MASTER_CONF + "slaveReadEnable=true\naccessMessageInMemoryMaxRatio=0\n"


@pytest.fixture
def pair(tmp_path: Path, reap_pids: list[int]) -> Iterator[MasterSlave]:
    with running_master_slave(tmp_path, reap_pids, master_conf=MASTER_BEHIND_CONF) as running:
        yield running


@pytest.fixture
def instance(pair: MasterSlave) -> Iterator[ClientInstance]:
    client = ClientInstance(pair.namesrv_address, route_refresh_interval_ms=ROUTE_REFRESH_MS)
    client.start()
    yield client
    client.shutdown()


def pulls_served(appliance: Appliance) -> int:
    """The pulls the broker's (one) pull processor answered so far."""
    with RemotingClient(appliance.broker_address) as broker:
        response = broker.invoke(MQBOX_PULL_STATUS)
    assert response.code == 0, response.remark
    pulls: int = json.loads(response.body)["pulls"]
    return pulls


def committed(appliance: Appliance, group: str, queue: MessageQueue) -> int | None:
    with RemotingClient(appliance.broker_address) as broker:
        return query_consumer_offset(broker, group, queue.topic, queue.queue_id)


def topic_on(appliance: Appliance, topic: str) -> bool:
    with RemotingClient(appliance.broker_address) as broker:
        return topic in all_topic_config(broker).topic_config_table


def routed_ids(instance: ClientInstance, topic: str) -> set[int]:
    instance.update_route(topic)
    route = instance.route(topic)
    assert route is not None
    return {
        broker_id
        for broker in route.broker_datas
        if broker.broker_name == BROKER_NAME
        for broker_id in broker.broker_addrs
    }


def test_push_consumer_pulls_from_the_suggested_broker(
    pair: MasterSlave, instance: ClientInstance
) -> None:
    topic = unique_name("SlaveT")
    group = unique_name("SlaveG")
    create_topic(pair.master, topic, 1)
    with Producer(unique_name("SlaveP"), instance=instance) as producer:
        for number in range(5):
            producer.send(topic, b"%d" % number)
    slave_pulls = pulls_served(pair.slave)
    collector = Collector()
    with PushConsumer(group, instance=instance, pull_batch_size=1) as consumer:
        consumer.subscribe(topic, "*", collector)
        wait_until(lambda: collector.count() >= 5, "every message", WAIT_S)
    # Each answer that found a message suggested brokerId 1, so the next pull went to the slave
    # (whose empty queue then sent the consumer back to the master, brokerId 0).
    assert pulls_served(pair.slave) >= slave_pulls + 4
    assert collector.bodies() == {b"%d" % number: 1 for number in range(5)}


def test_offsets_made_while_the_master_is_down_outlive_its_return(
    pair: MasterSlave, instance: ClientInstance
) -> None:
    topic = unique_name("SlaveT")
    group = unique_name("SlaveG")
    create_topic(pair.master, topic, 1)
    queue = MessageQueue(topic, BROKER_NAME, 0)
    offsets = RemoteOffsetStore(group, instance)
    offsets.update(queue, 4, increase_only=False)
    assert offsets.persist(queue, 3000)
    assert committed(pair.master, group, queue) == 4
    wait_until(lambda: topic_on(pair.slave, topic), "the topic on the slave", WAIT_S)
    wait_until(lambda: committed(pair.slave, group, queue) == 4, "the slave's copy", WAIT_S)

    pair.stop_master()
    wait_until(lambda: routed_ids(instance, topic) == {1}, "a route without the master", WAIT_S)
    # A pull for the master's id reaches the slave, which answers from its (empty) queue.
    slave_pulls = pulls_served(pair.slave)
    result = pull(instance, BROKER_NAME, topic, 0, 4, 1, group=group, subscription="*")
    assert result.status in (PullStatus.NO_NEW_MSG, PullStatus.NO_MATCHED_MSG)
    assert result.next_begin_offset == 4  # a slave never moves the consumer back
    assert pulls_served(pair.slave) == slave_pulls + 1
    # The consumer went on (on the slave's messages, once they are replicated): its commits go
    # to the slave.
    offsets.update(queue, 9, increase_only=False)
    assert offsets.persist(queue, 3000)
    assert committed(pair.slave, group, queue) == 9

    pair.restart_master()
    assert committed(pair.master, group, queue) == 4  # the master's copy is stale
    wait_until(lambda: routed_ids(instance, topic) == {0, 1}, "the master routed again", WAIT_S)
    # The slave's next sync takes the master's stale copy, as Java's SlaveSynchronize does ...
    wait_until(lambda: committed(pair.slave, group, queue) == 4, "the slave's sync", WAIT_S)
    # ... and the client, which kept its offset, commits it to the master.
    assert offsets.persist(queue, 3000)
    assert committed(pair.master, group, queue) == 9
    wait_until(lambda: committed(pair.slave, group, queue) == 9, "the slave's next sync", WAIT_S)
    # Pulls for the master's id go to the master again.
    master_pulls = pulls_served(pair.master)
    pull(instance, BROKER_NAME, topic, 0, 9, 1, group=group, subscription="*")
    assert pulls_served(pair.master) == master_pulls + 1

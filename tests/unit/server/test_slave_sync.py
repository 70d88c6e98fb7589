"""Goal: admin.0 applies a round of its master's metadata as RocketMQ 4.9's SlaveSynchronize
does (docs/replication.md, "Metadata copied from the master"): topics and subscription groups
are replaced whole, with the master's dataVersion, only when the versions differ; each consumer
offset entry the master names replaces the local one whole while the others stay, and the file
is saved at once; delay offsets are written to delayOffset.json; what the broker could not hold
(bad names, negative indexes) is dropped, and the rest still applies. The wire bodies of 43, 45
and 201 read back what they write, fastjson's bare integer keys included.

Method: the admin processor as an object in this process (tests/support/front_in_process.py),
fed MasterMetadata values directly (the fetching thread and the wire are the integration tests'
part: tests/integration/test_slave_wire.py); the files are read back with store/config_files.
"""

from __future__ import annotations

import dataclasses

from mqbox.client.admin_api import AllTopicConfig
from mqbox.protocol.headers import (
    ConsumerOffsetSerializeWrapper,
    DataVersion,
    DelayOffsetSerializeWrapper,
    DeleteSubscriptionGroupRequestHeader,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
)
from mqbox.server.roles.processors.admin.slave_sync import MasterFetcher, MasterMetadata
from mqbox.store import config_files
from tests.support.front_in_process import FrontInProcess

MASTER = "127.0.0.1:1"


def metadata(
    *,
    topics: AllTopicConfig | None = None,
    offsets: ConsumerOffsetSerializeWrapper | None = None,
    delay: DelayOffsetSerializeWrapper | None = None,
    groups: SubscriptionGroupWrapper | None = None,
) -> MasterMetadata:
    return MasterMetadata(MASTER, topics, offsets, delay, groups)


def test_topics_are_replaced_with_the_masters_version_and_bad_ones_dropped(
    front: FrontInProcess,
) -> None:
    admin = front.admins[0]
    version = DataVersion(counter=77, timestamp_ms=1_700_000_000_000)
    table = {
        "Orders": TopicConfig("Orders", 4, 4, 6),
        "bad topic": TopicConfig("bad topic", 1, 1, 6),
        "NoQueues": TopicConfig("NoQueues", 0, 0, 6),
    }
    admin.apply_master_metadata(metadata(topics=AllTopicConfig(table, version)))
    stored = config_files.load_topics(admin.config_dir)
    assert set(stored.topics) == {"Orders"}
    assert stored.topics["Orders"].read_queue_nums == 4
    assert (stored.data_version.counter, stored.data_version.timestamp_ms) == (
        77,
        1_700_000_000_000,
    )
    # The same version again changes nothing, even if the table differs.
    admin.apply_master_metadata(metadata(topics=AllTopicConfig({}, version)))
    assert set(config_files.load_topics(admin.config_dir).topics) == {"Orders"}


def test_offsets_replace_the_entries_the_master_names_and_keep_the_others(
    front: FrontInProcess,
) -> None:
    admin = front.admins[0]
    now_ns = admin.clock_ns()
    admin.offsets.commit("G", "T", 0, 5, now_ns)
    admin.offsets.commit("G", "T", 1, 6, now_ns)
    admin.offsets.commit("Other", "T", 0, 9, now_ns)
    master = ConsumerOffsetSerializeWrapper(
        {"T@G": {1: 10}, "nonsense": {0: 1}, "T@Neg": {0: -1}, "U@G": {2: 3}}
    )
    admin.apply_master_metadata(metadata(offsets=master))
    assert admin.offsets.topic_offsets("G", "T") == {1: 10}  # queue 0 went with the entry
    assert admin.offsets.topic_offsets("Other", "T") == {0: 9}
    assert admin.offsets.topic_offsets("G", "U") == {2: 3}
    assert admin.offsets.topic_offsets("Neg", "T") == {}
    saved = config_files.load_consumer_offsets(admin.config_dir)
    assert saved[("T", "G")] == {1: 10}


def test_delay_offsets_are_written_as_the_master_has_them(front: FrontInProcess) -> None:
    admin = front.admins[0]
    admin.apply_master_metadata(metadata(delay=DelayOffsetSerializeWrapper({1: 4, 3: 2, 0: 7})))
    assert config_files.load_delay_offsets(admin.config_dir) == {1: 4, 3: 2}


def test_subscription_groups_are_replaced_when_the_version_differs(front: FrontInProcess) -> None:
    admin = front.admins[0]
    version = DataVersion(counter=5, timestamp_ms=123)
    table = {
        "CG": SubscriptionGroupConfig("CG", retry_max_times=3, which_broker_when_consume_slowly=2),
        "bad group!": SubscriptionGroupConfig("bad group!"),
    }
    admin.apply_master_metadata(metadata(groups=SubscriptionGroupWrapper(table, version)))
    stored = config_files.load_subscription_groups(admin.config_dir)
    assert set(stored.groups) == {"CG"}
    assert stored.groups["CG"].retry_max_times == 3
    assert stored.groups["CG"].which_broker_when_consume_slowly == 2
    assert (stored.data_version.counter, stored.data_version.timestamp_ms) == (5, 123)
    assert admin.subscription_groups == stored


def test_bodies_read_back_and_accept_fastjsons_bare_keys() -> None:
    offsets = ConsumerOffsetSerializeWrapper({"T@G": {0: 12, 3: 4}})
    assert ConsumerOffsetSerializeWrapper.from_json(offsets.to_json()) == offsets
    fastjson = b'{"offsetTable":{"T@G":{0:12,3:4}}}'
    assert ConsumerOffsetSerializeWrapper.from_json(fastjson) == offsets
    delay = DelayOffsetSerializeWrapper.from_json(b'{"offsetTable":{1:5,2:0}}')
    assert delay.offset_table == {1: 5, 2: 0}
    groups = SubscriptionGroupWrapper(
        {"CG": SubscriptionGroupConfig("CG", consume_enable=False)}, DataVersion(2, 3)
    )
    assert SubscriptionGroupWrapper.from_json(groups.to_json()) == groups
    # Absent fields take Java's defaults.
    assert SubscriptionGroupConfig.from_json(b'{"groupName":"CG"}') == SubscriptionGroupConfig("CG")
    header = DeleteSubscriptionGroupRequestHeader("CG", remove_offset=True)
    assert DeleteSubscriptionGroupRequestHeader.from_ext(header.to_ext()) == header
    assert not DeleteSubscriptionGroupRequestHeader.from_ext({"groupName": "CG"}).remove_offset


def test_a_round_without_a_reachable_name_server_fetches_nothing(front: FrontInProcess) -> None:
    admin = front.admins[0]
    broker = dataclasses.replace(admin.ctx.broker, namesrv_addr="127.0.0.1:1")
    fetcher = MasterFetcher(broker, admin.ctx.broker_address)
    admin.slave_fetcher = fetcher
    try:
        assert fetcher.fetch_round() is None
        assert not admin.apply_slave_sync_nowait()
        statistics = admin.statistics_slave_sync()
        assert statistics is not None
        assert (statistics.rounds, statistics.rounds_without_master) == (0, 1)
        assert statistics.master_address is None
    finally:
        fetcher.stop()

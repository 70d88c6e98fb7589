"""Goal: the pull processor's suggestWhichBrokerId follows RocketMQ 4.9 (docs/replication.md,
"Suggesting a broker for pulls"): 0 without slaveReadEnable; with it, the group's brokerId for a
consumer that is not behind, its whichBrokerWhenConsumeSlowly for one whose last scanned entry
is more than accessMessageInMemoryMaxRatio percent of RAM before the commit log's end; an answer
that scanned nothing is never behind; the group's values come from subscriptionGroup.json, and a
group whose consumeEnable is false is refused (16, Java's remark).

Method: test_send.py's StoreGraph (writer, dispatcher, send and pull processors as objects over
real rings and a real store); the ratio is 0 (every read that found something is behind) or 40
(nothing a test writes is); group settings are written to subscriptionGroup.json as admin.0
would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.protocol import RemotingCommand
from mqbox.protocol.codes import ResponseCode
from mqbox.store import config_files
from mqbox.store.config_files import DataVersion, SubscriptionGroupConfig, SubscriptionGroupTable
from mqbox.store.layout import config_dir
from tests.unit.server.test_pull import make_topic, pull, put, settle
from tests.unit.server.test_send import StoreGraph, small_broker


def graph_with(shm_instance: str, home: Path, **overrides: object) -> StoreGraph:
    return StoreGraph(shm_instance, home, small_broker(**overrides))


@pytest.fixture
def behind(shm_instance: str, tmp_path: Path) -> Iterator[StoreGraph]:
    """slaveReadEnable, ratio 0: every read that scanned entries is behind."""
    graph = graph_with(
        shm_instance,
        tmp_path / "home",
        slave_read_enable=True,
        access_message_in_memory_max_ratio_percent=0,
    )
    try:
        yield graph
    finally:
        graph.close()


def suggested(response: RemotingCommand) -> int:
    return int(response.ext_fields["suggestWhichBrokerId"])


def test_without_slave_read_enable_the_master_is_always_suggested(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = graph_with(
        shm_instance, tmp_path / "home", access_message_in_memory_max_ratio_percent=0
    )
    try:
        make_topic(graph, "Plain")
        put(graph, "Plain", 3)
        settle(graph)
        found = pull(graph, "Plain", 0, message_count_max=1)
        assert (found.code, suggested(found)) == (ResponseCode.SUCCESS, 0)
    finally:
        graph.close()


def test_a_reader_behind_the_memory_share_is_sent_to_the_slow_consumers_broker(
    behind: StoreGraph,
) -> None:
    make_topic(behind, "Behind")
    put(behind, "Behind", 3)
    settle(behind)
    found = pull(behind, "Behind", 0, message_count_max=1)
    assert (found.code, suggested(found)) == (ResponseCode.SUCCESS, 1)
    # Nothing scanned (at the end of the queue): never behind, the group's brokerId.
    at_end = pull(behind, "Behind", 3)
    assert (at_end.code, suggested(at_end)) == (ResponseCode.PULL_NOT_FOUND, 0)


def test_the_groups_settings_choose_the_broker(behind: StoreGraph) -> None:
    groups = {"CG": SubscriptionGroupConfig("CG", broker_id=2, which_broker_when_consume_slowly=3)}
    config_files.save_subscription_groups(
        config_dir(behind.store_root), SubscriptionGroupTable(groups, DataVersion(1, 1))
    )
    make_topic(behind, "Grouped")
    put(behind, "Grouped", 2)
    settle(behind)
    found = pull(behind, "Grouped", 0, message_count_max=1)
    assert (found.code, suggested(found)) == (ResponseCode.SUCCESS, 3)
    at_end = pull(behind, "Grouped", 2)
    assert (at_end.code, suggested(at_end)) == (ResponseCode.PULL_NOT_FOUND, 2)


def test_a_reader_within_the_memory_share_stays_on_the_groups_broker(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = graph_with(shm_instance, tmp_path / "home", slave_read_enable=True)
    try:
        make_topic(graph, "Near")
        put(graph, "Near", 3)
        settle(graph)
        found = pull(graph, "Near", 0, message_count_max=1)
        assert (found.code, suggested(found)) == (ResponseCode.SUCCESS, 0)
    finally:
        graph.close()


def test_a_group_whose_consumption_is_disabled_is_refused(behind: StoreGraph) -> None:
    groups = {"CG": SubscriptionGroupConfig("CG", consume_enable=False)}
    config_files.save_subscription_groups(
        config_dir(behind.store_root), SubscriptionGroupTable(groups, DataVersion(1, 1))
    )
    make_topic(behind, "Disabled")
    put(behind, "Disabled", 1)
    settle(behind)
    refused = pull(behind, "Disabled", 0)
    assert refused.code == ResponseCode.NO_PERMISSION
    assert refused.remark == "subscription group no permission, CG"

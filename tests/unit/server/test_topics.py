"""Goal: the topic table is shared safely by the broker's processes: a new store gets the system
topics of docs/protocol.md section 9 once, creations from several processes at once all land
(the file lock and the re-read inside it), readers see another process's change within the check
interval (or at once with get_fresh), every change bumps dataVersion, topic admin's put and
delete reach every reader, auto-creation follows the Java broker's rules, and topic admin may
not touch the system topics nor take from a group's %RETRY% / %DLQ% topic what the broker
needs. The services role reads the same file in the same format.

Method: TopicConfigStore objects over a store root in tmp_path; concurrency with several Python
processes started with subprocess, each creating its own topics through its own store object;
a fake monotonic clock for the reload interval.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqbox.config import BrokerConfig, LimitConfig
from mqbox.errors import AutoCreateLimitError
from mqbox.server.roles.processors.topics import (
    PERM_ALL,
    SCHEDULE_QUEUE_COUNT,
    TopicConfigStore,
    group_topic_perm_refusal,
    system_topic_refusal,
    system_topics,
)
from mqbox.store import config_files
from mqbox.store.config_files import TopicConfig
from mqbox.store.layout import config_dir

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_a_new_store_gets_the_system_topics_once(tmp_path: Path) -> None:
    broker = BrokerConfig(default_topic_queue_nums=6)
    store = TopicConfigStore(tmp_path, broker)
    added = store.ensure_system_topics()
    names = {config.topic_name for config in system_topics(broker)}
    assert set(added) == names
    assert {
        "TBW102",
        "SELF_TEST_TOPIC",
        "SCHEDULE_TOPIC_XXXX",
        "OFFSET_MOVED_EVENT",
        "BenchmarkTest",
        "RMQ_SYS_TRACE_TOPIC",
        broker.broker_cluster_name,
        broker.broker_name,
    } <= names
    tbw102 = store.get("TBW102")
    assert tbw102 is not None
    assert (tbw102.read_queue_nums, tbw102.write_queue_nums, tbw102.perm) == (6, 6, PERM_ALL)
    schedule = store.get("SCHEDULE_TOPIC_XXXX")
    assert schedule is not None
    assert schedule.write_queue_nums == SCHEDULE_QUEUE_COUNT
    version = store.data_version.counter
    assert TopicConfigStore(tmp_path, broker).ensure_system_topics() == []
    assert TopicConfigStore(tmp_path, broker).data_version.counter == version


def test_no_tbw102_without_auto_create(tmp_path: Path) -> None:
    store = TopicConfigStore(tmp_path, BrokerConfig(auto_create_topic_enable=False))
    store.ensure_system_topics()
    assert store.get("TBW102") is None
    assert store.auto_create("NewTopic", "TBW102", 4) is None


def test_the_services_role_reads_what_the_store_writes(tmp_path: Path) -> None:
    store = TopicConfigStore(tmp_path, BrokerConfig())
    store.ensure_system_topics()
    store.create_if_absent(TopicConfig("Shared", 3, 3, 6))
    table = config_files.load_topics(config_dir(tmp_path), use_backup_if_corrupt=True)
    assert table.topics["Shared"] == TopicConfig("Shared", 3, 3, 6)
    assert table.data_version == store.data_version


def test_readers_see_changes_after_the_check_interval_or_at_once_when_fresh(
    tmp_path: Path,
) -> None:
    now = [0]
    broker = BrokerConfig()
    writer = TopicConfigStore(tmp_path, broker)
    reader = TopicConfigStore(tmp_path, broker, clock_ns=lambda: now[0])
    assert reader.get("Late") is None
    writer.create_if_absent(TopicConfig("Late", 1, 1, 6))
    writer.create_if_absent(TopicConfig("Later", 1, 1, 6))
    now[0] += 50_000_000
    assert reader.get("Late") is None  # checked less than 100 ms ago
    assert reader.get_fresh("Later") is not None
    now[0] += 100_000_000
    assert reader.get("Late") is not None
    checks = reader.statistics().check_count
    reader.get("Late")
    assert reader.statistics().check_count == checks  # no stat within the interval


def test_create_if_absent_keeps_the_first_and_bumps_the_version(tmp_path: Path) -> None:
    store = TopicConfigStore(tmp_path, BrokerConfig())
    first, created = store.create_if_absent(TopicConfig("Once", 2, 2, 6))
    assert created
    counter = store.data_version.counter
    again, created_again = TopicConfigStore(tmp_path, BrokerConfig()).create_if_absent(
        TopicConfig("Once", 9, 9, 6)
    )
    assert not created_again
    assert again == first
    store.create_if_absent(TopicConfig("Twice", 1, 1, 6))
    assert store.data_version.counter == counter + 1


def test_auto_creation_writes_once_per_batch_and_stops_at_the_cap(tmp_path: Path) -> None:
    broker = BrokerConfig(limits=LimitConfig(auto_create_topic_count_max=5))
    store = TopicConfigStore(tmp_path, broker)
    store.put(TopicConfig("Admin1", 1, 1, 6))  # topic admin is not limited
    version = store.data_version.counter
    wanted = [TopicConfig(f"%RETRY%G{index}", 1, 1, 6) for index in range(6)]
    created, refused = store.create_many_if_absent(wanted)
    assert created == [f"%RETRY%G{index}" for index in range(4)]
    assert refused == ["%RETRY%G4", "%RETRY%G5"]
    assert store.data_version.counter == version + 1  # one write for the whole batch
    assert store.create_many_if_absent(wanted[:4]) == ([], [])
    assert store.create_if_absent(wanted[0]) == (wanted[0], False)  # existing ones still fine
    with pytest.raises(AutoCreateLimitError, match="mqboxAutoCreateTopicCountMax=5"):
        store.create_if_absent(TopicConfig("T6", 1, 1, 6))
    with pytest.raises(AutoCreateLimitError):
        store.auto_create("%RETRY%Late", "", 1)
    assert store.put(TopicConfig("Admin2", 1, 1, 6))
    assert len(TopicConfigStore(tmp_path, broker).topics()) == 6


def test_put_replaces_and_delete_removes_for_every_reader(tmp_path: Path) -> None:
    writer = TopicConfigStore(tmp_path, BrokerConfig())
    reader = TopicConfigStore(tmp_path, BrokerConfig())
    assert writer.put(TopicConfig("Put", 2, 2, 6))
    version = writer.data_version.counter
    assert not writer.put(TopicConfig("Put", 2, 2, 6))  # the same again writes nothing
    assert writer.data_version.counter == version
    assert writer.put(TopicConfig("Put", 4, 3, 4))
    assert writer.data_version.counter == version + 1
    found = reader.get_fresh("Put")
    assert found is not None
    assert (found.read_queue_nums, found.write_queue_nums, found.perm) == (4, 3, 4)
    assert reader.delete("Put")  # any process's store object may delete
    assert not reader.delete("Put")
    assert writer.get_fresh("Put") is None
    assert writer.data_version.counter == version + 2


def test_auto_create_follows_the_template(tmp_path: Path) -> None:
    store = TopicConfigStore(tmp_path, BrokerConfig(default_topic_queue_nums=8))
    store.ensure_system_topics()
    small = store.auto_create("Small", "TBW102", 3)
    assert small is not None
    assert (small.write_queue_nums, small.read_queue_nums, small.perm) == (3, 3, 6)
    capped = store.auto_create("Capped", "TBW102", 64)
    assert capped is not None
    assert capped.write_queue_nums == 8
    retry = store.auto_create("%RETRY%Group", "", 4)
    assert retry is not None
    assert (retry.write_queue_nums, retry.perm) == (1, 6)
    assert store.auto_create("Orphan", "Missing", 4) is None


_CREATOR = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mqbox.config import BrokerConfig
    from mqbox.server.roles.processors.topics import TopicConfigStore
    from mqbox.store.config_files import TopicConfig

    root, prefix, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    store = TopicConfigStore(root, BrokerConfig())
    for number in range(count):
        store.create_if_absent(TopicConfig(f"{prefix}{number}", 1, 1, 6))
    """
)


def test_processes_creating_topics_at_once_lose_none(tmp_path: Path) -> None:
    count = 25
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATOR, str(tmp_path), f"P{index}-", str(count)],
            cwd=REPO_ROOT,
        )
        for index in range(4)
    ]
    try:
        for process in processes:
            assert process.wait(timeout=120) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    table = config_files.load_topics(config_dir(tmp_path))
    expected = {f"P{index}-{number}" for index in range(4) for number in range(count)}
    assert expected <= set(table.topics)
    assert table.data_version.counter == 4 * count


def test_every_system_topic_of_a_new_store_is_refused_to_topic_admin() -> None:
    broker = BrokerConfig(broker_cluster_name="ClusterX", broker_name="broker-x")
    for config in system_topics(broker):
        assert system_topic_refusal(config.topic_name, broker) == (
            f"The topic[{config.topic_name}] is conflict with system topic."
        )
    for topic in ("rmq_sys_x", "RMQ_SYS_X", "ClusterX", "broker-x"):
        assert system_topic_refusal(topic, broker) is not None
    for topic in ("Orders", "%RETRY%CG", "%DLQ%CG", "rmq_sysx", "TBW1020"):
        assert system_topic_refusal(topic, broker) is None


@pytest.mark.parametrize(
    ("topic", "perm", "refused"),
    [
        ("%RETRY%CG", 6, False),
        ("%RETRY%CG", 7, False),
        ("%RETRY%CG", 4, True),
        ("%RETRY%CG", 2, True),
        ("%RETRY%CG", 0, True),
        ("%DLQ%CG", 2, False),
        ("%DLQ%CG", 6, False),
        ("%DLQ%CG", 4, True),
        ("%DLQ%CG", 0, True),
        ("Orders", 0, False),
    ],
)
def test_group_topics_keep_the_perm_the_broker_needs(topic: str, perm: int, refused: bool) -> None:
    assert (group_topic_perm_refusal(topic, perm) is not None) is refused

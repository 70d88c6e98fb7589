"""Goal: consumer offsets (processors/consumer_offsets.py) answer QUERY_CONSUMER_OFFSET by checklist
rule 7 (committed -> it; nothing committed and the queue starts at 0 -> 0; otherwise not found),
refuse negative indexes, let a pull's commit (forward_only) move an index forward only while
UPDATE_CONSUMER_OFFSET sets it either way, and reach config/consumerOffset.json no sooner than 5 s
after the first unsaved change, at once on `persist_now` (the stop path), never when nothing
changed, and in the file format RocketMQ tools read
(`{"offsetTable": {"<topic>@<group>": {"<queueId>": index}}}`), so a restart reads back exactly
what was committed.

Method: the table with explicit monotonic times over a tmp config directory; files read back
with config_files and with the json module; hypothesis for the save/load round trip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.errors import ConfigError
from mqbox.server.roles.processors.consumer_offsets import (
    PERSIST_INTERVAL_MS_DEFAULT,
    ConsumerOffsets,
    starting_queue_index,
)
from mqbox.store import config_files
from mqbox.store.layout import CONSUMER_OFFSET_FILE_NAME

SECOND_NS = 1_000_000_000
INTERVAL_NS = PERSIST_INTERVAL_MS_DEFAULT * 1_000_000


def test_rule_7_decides_where_a_group_starts() -> None:
    assert starting_queue_index(12, 0) == 12
    assert starting_queue_index(12, 50) == 12  # committed wins, even below the min offset
    assert starting_queue_index(0, 50) == 0
    assert starting_queue_index(None, 0) == 0  # new group, queue starts at 0: read it all
    assert starting_queue_index(None, 7) is None  # 22 QUERY_NOT_FOUND: consumeFromWhere decides


def test_commit_then_query_and_negative_indexes_are_refused() -> None:
    offsets = ConsumerOffsets(None)
    assert offsets.query("CG", "T", 0) is None
    assert offsets.commit("CG", "T", 0, 5, 0)
    assert offsets.commit("CG", "T", 1, 0, 0)
    assert offsets.query("CG", "T", 0) == 5
    assert offsets.query("CG", "T", 1) == 0
    assert offsets.query("OTHER", "T", 0) is None
    assert not offsets.commit("CG", "T", 0, -1, 0)
    assert not offsets.commit("CG", "T", -1, 3, 0)
    assert offsets.query("CG", "T", 0) == 5
    assert offsets.statistics().refused_count == 2
    assert offsets.topics_of("CG") == ["T"]
    assert offsets.topic_offsets("CG", "T") == {0: 5, 1: 0}
    assert offsets.groups() == ["CG"]


def test_a_pulls_commit_never_moves_an_index_back_but_an_update_does() -> None:
    offsets = ConsumerOffsets(None)
    assert offsets.commit("CG", "T", 0, 3, 0, forward_only=True)  # nothing stored yet: stored
    assert offsets.query("CG", "T", 0) == 3
    assert offsets.commit("CG", "T", 0, 9, 0)  # the consumer's UPDATE as it hands the queue over
    assert offsets.commit("CG", "T", 0, 7, 0, forward_only=True)  # its last pull, relayed late
    assert offsets.query("CG", "T", 0) == 9
    assert offsets.commit("CG", "T", 0, 9, 0, forward_only=True)
    assert offsets.commit("CG", "T", 0, 12, 0, forward_only=True)
    assert offsets.query("CG", "T", 0) == 12
    assert offsets.commit("CG", "T", 0, 4, 0)  # an UPDATE (a reset, a repair) moves it back
    assert offsets.query("CG", "T", 0) == 4
    statistics = offsets.statistics()
    assert (statistics.behind_count, statistics.refused_count) == (1, 0)


def test_saves_wait_for_the_interval_and_happen_only_when_something_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / CONSUMER_OFFSET_FILE_NAME
    offsets = ConsumerOffsets(tmp_path)
    assert offsets.load() == 0
    assert not offsets.persist_if_due(100 * SECOND_NS)
    assert offsets.next_persist_ns() is None
    offsets.commit("CG", "T", 0, 1, 10 * SECOND_NS)
    offsets.commit("CG", "T", 0, 2, 12 * SECOND_NS)  # the due time counts from the first change
    assert offsets.next_persist_ns() == 10 * SECOND_NS + INTERVAL_NS
    assert not offsets.persist_if_due(10 * SECOND_NS + INTERVAL_NS - 1)
    assert not path.exists()
    assert offsets.persist_if_due(10 * SECOND_NS + INTERVAL_NS)
    assert json.loads(path.read_text()) == {"offsetTable": {"T@CG": {"0": 2}}}
    assert not offsets.dirty
    offsets.commit("CG", "T", 0, 2, 20 * SECOND_NS)  # the same index again: nothing to save
    assert not offsets.dirty
    assert not offsets.persist_if_due(100 * SECOND_NS)
    assert offsets.statistics().persist_count == 1


def test_persist_now_saves_at_once_and_a_restart_reads_it_back(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.load()
    offsets.commit("CG", "%RETRY%CG", 0, 3, 0)
    offsets.commit("CG", "T", 2, 40, 0)
    offsets.persist_now()
    offsets.persist_now()  # nothing new: no second save
    assert offsets.statistics().persist_count == 1
    restarted = ConsumerOffsets(tmp_path)
    assert restarted.load() == 2
    assert restarted.query("CG", "%RETRY%CG", 0) == 3
    assert restarted.query("CG", "T", 2) == 40
    assert not restarted.dirty


def test_a_corrupt_file_falls_back_to_its_backup_and_fails_loudly_without_one(
    tmp_path: Path,
) -> None:
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("CG", "T", 0, 1, 0)
    offsets.persist_now()
    offsets.commit("CG", "T", 0, 2, 0)
    offsets.persist_now()  # the first version is now consumerOffset.json.bak
    path = tmp_path / CONSUMER_OFFSET_FILE_NAME
    path.write_text("{not json")
    recovered = ConsumerOffsets(tmp_path)
    recovered.load()
    assert recovered.query("CG", "T", 0) == 1
    (tmp_path / (CONSUMER_OFFSET_FILE_NAME + ".bak")).write_text("{not json either")
    with pytest.raises(ConfigError):
        ConsumerOffsets(tmp_path).load()


def test_replace_topic_sets_the_named_queues_and_keeps_the_others() -> None:
    offsets = ConsumerOffsets(None)
    offsets.commit("CG", "T", 0, 10, 0)
    offsets.commit("CG", "T", 3, 30, 0)
    offsets.replace_topic("CG", "T", {0: 0, 1: 0}, 0)
    assert offsets.topic_offsets("CG", "T") == {0: 0, 1: 0, 3: 30}
    assert offsets.dirty
    assert not offsets.persist_if_due(10**15)  # no directory: memory only


names = st.text(alphabet="abcXYZ019_-%|", min_size=1, max_size=12)


@given(
    st.dictionaries(st.tuples(names, names, st.integers(0, 63)), st.integers(0, 2**62), max_size=20)
)
def test_what_is_committed_is_what_a_restart_reads(
    tmp_path_factory: pytest.TempPathFactory, commits: dict[tuple[str, str, int], int]
) -> None:
    directory = tmp_path_factory.mktemp("offsets")
    offsets = ConsumerOffsets(directory)
    for (group, topic, queue_id), queue_index in commits.items():
        offsets.commit(group, topic, queue_id, queue_index, 0)
    offsets.persist_now()
    loaded = config_files.load_consumer_offsets(directory)
    assert loaded == offsets.snapshot()
    restarted = ConsumerOffsets(directory)
    restarted.load()
    for (group, topic, queue_id), queue_index in commits.items():
        assert restarted.query(group, topic, queue_id) == queue_index

"""Goal: the send processor's view of what a consumer group consumes (processors/group_topics.py)
says yes for a topic the group's heartbeat subscribes to, or one it committed an offset for (the
late send-back after its members left), and no otherwise; a change of either file is seen, the
offsets file at most once per reload interval.

Method: the real files in a temporary store, written by the same functions admin.0 uses; a
counter as the clock.
"""

from __future__ import annotations

from pathlib import Path

from mqbox.server import admin_parcels
from mqbox.server.roles.processors.client_manager import Subscription
from mqbox.server.roles.processors.group_topics import GroupTopics
from mqbox.store import config_files
from mqbox.store.layout import config_dir


class Clock:
    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def subscribe(store_root: Path, group: str, *topics: str, counter: int = 1) -> None:
    table = {group: {topic: Subscription(topic, "*", (), (), 1) for topic in topics}}
    admin_parcels.write_group_subscriptions(store_root, table, counter, 1_700_000_000_000)


def commit(store_root: Path, *pairs: tuple[str, str]) -> None:
    directory = config_dir(store_root)
    directory.mkdir(parents=True, exist_ok=True)
    config_files.save_consumer_offsets(directory, {pair: {0: 5} for pair in pairs})


def test_a_subscribed_topic_is_consumed_and_another_is_not(tmp_path: Path) -> None:
    subscribe(tmp_path, "CG", "Orders")
    view = GroupTopics(tmp_path)
    assert view.consumes_any("CG", ("Orders",))
    assert view.consumes_any("CG", ("%RETRY%CG", "Orders"))
    assert not view.consumes_any("CG", ("Secret",))
    assert not view.consumes_any("Other", ("Orders",))


def test_a_new_heartbeat_is_seen_at_once(tmp_path: Path) -> None:
    view = GroupTopics(tmp_path)
    assert not view.consumes_any("CG", ("Orders",))
    subscribe(tmp_path, "CG", "Orders")
    assert view.consumes_any("CG", ("Orders",))


def test_a_committed_offset_counts_when_the_group_has_no_live_member(tmp_path: Path) -> None:
    clock = Clock()
    commit(tmp_path, ("Orders", "CG"))
    view = GroupTopics(tmp_path, offsets_reload_interval_ns=1000, clock_ns=clock)
    assert view.consumes_any("CG", ("Orders",))
    assert not view.consumes_any("CG", ("Secret",))
    assert not view.consumes_any("Other", ("Orders",))


def test_the_offsets_file_is_read_again_only_after_the_interval(tmp_path: Path) -> None:
    clock = Clock()
    commit(tmp_path, ("Orders", "CG"))
    view = GroupTopics(tmp_path, offsets_reload_interval_ns=1000, clock_ns=clock)
    assert not view.consumes_any("CG", ("Late",))
    commit(tmp_path, ("Orders", "CG"), ("Late", "CG"))
    clock.now_ns = 999
    assert not view.consumes_any("CG", ("Late",))
    clock.now_ns = 1000
    assert view.consumes_any("CG", ("Late",))
    assert view.offsets_reload_count == 2
    clock.now_ns = 5000
    assert view.consumes_any("CG", ("Late",))
    assert view.offsets_reload_count == 2  # unchanged file: not parsed again

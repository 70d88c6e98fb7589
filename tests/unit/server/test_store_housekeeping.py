"""Goal: the appliance's store roles run retention where the files are owned and keep one owner
of the checkpoint. The store writer deletes expired commit-log segments (RocketMQ's rules) and
publishes the new minimum before each unlink; the dispatcher then deletes the consume-queue
segments below it; the pull processor's read-only reader notices by itself and tells a pull below
the minimum where to go (21, nextBeginOffset = the new minimum), while pulls above it still get
their messages. The dispatcher publishes the store times its flushes covered and no longer
writes the checkpoint; the store writer writes it with them, also at its stop. The dispatcher
flushes the index on its own long interval and at its stop, the consume queues every second, and
the checkpoint's index position follows only the index's flushes. A nearly full disk makes the
writer refuse sends with SERVICE_NOT_AVAILABLE (14).

Method: test_send.py's StoreGraph (store writer, dispatcher, send and pull processors as objects
in this process over real rings and a real store in tmp_path) with 64 KiB commit-log segments,
16-entry consume-queue segments, fileReservedTime=0 and every hour in deleteWhen, so every
segment the writer rolled past has expired. The housekeeping thread is not started: the test
runs its rounds, so nothing is deleted behind its back. The flush schedule's test replaces the
dispatcher module's monotonic clock with one it moves itself.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.message import decode_record
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.server.roles import dispatcher as dispatcher_role
from mqbox.server.roles.store_housekeeper import UNLINK_GRACE_MS, StoreHousekeeper
from mqbox.store.checkpoint import read_checkpoint
from mqbox.store.cleanup import DiskSpaceGuard
from mqbox.store.config_files import TopicConfig
from mqbox.store.layout import checkpoint_path, commit_log_dir, consume_queue_dir
from tests.support.pull_requests import pull_everything_header
from tests.unit.server.test_send import StoreGraph, properties_text, send_header, small_broker

SEGMENT_SIZE_BYTES = 64 * 1024
EVERY_HOUR = ";".join(f"{hour:02d}" for hour in range(24))
BODY_SIZE_BYTES = 2000
TOPIC = "Aging"


@pytest.fixture
def graph(
    shm_instance: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StoreGraph]:
    monkeypatch.setattr(StoreHousekeeper, "start", lambda self: None)
    broker = small_broker(
        commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
        max_message_size_bytes=16 * 1024,
        consume_queue_entry_count=16,
        file_reserved_time_hours=0,
        delete_when=EVERY_HOUR,
    )
    built = StoreGraph(shm_instance, tmp_path / "home", broker)
    built.send.topics.create_if_absent(TopicConfig(TOPIC, 1, 1, 6))
    try:
        yield built
    finally:
        built.close()


def body_of(number: int) -> bytes:
    return f"{number:08d}".encode() * (BODY_SIZE_BYTES // 8)


def put(graph: StoreGraph, first: int, count: int) -> None:
    for number in range(first, first + count):
        header = send_header(TOPIC, properties=properties_text(KEYS=f"key{number}"))
        response = graph.send_command(RequestCode.SEND_MESSAGE, header, body_of(number))
        assert response.code == ResponseCode.SUCCESS, response.remark
    graph.pump(3)


def pull(graph: StoreGraph, queue_index: int) -> RemotingCommand:
    header = pull_everything_header(TOPIC, queue_index)
    opaque = graph.next_opaque()
    assert graph.pull is not None
    graph.submit(graph.pull, make_request(RequestCode.PULL_MESSAGE, opaque, header.to_ext()))
    return graph.wait_reply(opaque)


def queue_offsets_in(graph: StoreGraph, response: RemotingCommand) -> list[int]:
    """Queue indexes of the records a found pull carries, checked against their bodies."""
    body = response.body
    indexes = []
    position = 0
    while position < len(body):
        message = decode_record(body, position)
        assert message.body == body_of(message.queue_index)
        indexes.append(message.queue_index)
        position += message.size_bytes
    return indexes


def test_the_writer_deletes_the_dispatcher_follows_and_pulls_are_told_where_to_go(
    graph: StoreGraph,
) -> None:
    put(graph, 0, 120)  # 240 KB: four segments
    writer = graph.writer
    writer.flusher.flush_now()
    starts_before = writer.commit_log.segment_starts_bytes
    assert len(starts_before) >= 4
    assert pull(graph, 0).code == ResponseCode.SUCCESS  # the reader knows the queue now
    cq_files_before = sorted(consume_queue_dir(graph.store_root, TOPIC, 0).iterdir())

    deleted = writer.housekeeper.run_retention(int(time.time() * 1000))
    assert deleted == len(starts_before) - 1  # every segment the writer rolled past
    min_log_offset_bytes = writer.commit_log.min_log_offset_bytes
    assert min_log_offset_bytes == starts_before[-1]
    assert writer.positions.min_log_offset_bytes == min_log_offset_bytes
    assert writer.positions.deleted_segment_total == deleted
    assert [path.name for path in commit_log_dir(graph.store_root).iterdir()] == [
        f"{min_log_offset_bytes:020d}"
    ]

    assert graph.dispatcher.follow_retention_nowait() > 0
    assert graph.dispatcher.counters.derived_min_log_offset_bytes == min_log_offset_bytes
    cq_files_after = sorted(consume_queue_dir(graph.store_root, TOPIC, 0).iterdir())
    assert 0 < len(cq_files_after) < len(cq_files_before)
    queue = graph.dispatcher.consume_queues.find_queue(TOPIC, 0)
    assert queue is not None
    first_kept = queue.min_queue_index
    assert queue.entry(first_kept) is not None
    assert queue.entry(first_kept).log_offset_bytes >= min_log_offset_bytes  # type: ignore[union-attr]

    time.sleep(0.15)  # the pull's reader looks at the log at most every 100 ms
    response = pull(graph, 0)
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    ext = response.ext_fields
    assert (ext["nextBeginOffset"], ext["minOffset"], ext["maxOffset"]) == (
        str(first_kept),
        str(first_kept),
        "120",
    )
    response = pull(graph, first_kept)
    assert response.code == ResponseCode.SUCCESS
    indexes = queue_offsets_in(graph, response)
    assert indexes == list(range(first_kept, first_kept + len(indexes)))

    # The broker goes on: new messages are stored and read after the deleted ones.
    put(graph, 120, 5)
    response = pull(graph, 120)
    assert response.code == ResponseCode.SUCCESS
    assert queue_offsets_in(graph, response) == [120, 121, 122, 123, 124]


def test_a_published_minimum_stands_for_the_grace_period_before_its_segment_goes(
    graph: StoreGraph,
) -> None:
    put(graph, 0, 40)  # more than one segment
    writer = graph.writer
    writer.flusher.flush_now()
    oldest = commit_log_dir(graph.store_root) / f"{writer.commit_log.segment_starts_bytes[0]:020d}"
    published_before = writer.positions.min_log_offset_bytes
    seen: list[tuple[float, bool]] = []  # (seconds after the publish, file still there)

    def watch() -> None:
        while writer.positions.min_log_offset_bytes == published_before:
            time.sleep(0.0005)
        published_s = time.monotonic()
        while oldest.exists() and time.monotonic() - published_s < 5:
            seen.append((time.monotonic() - published_s, True))
            time.sleep(0.01)
        seen.append((time.monotonic() - published_s, oldest.exists()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert writer.housekeeper.run_retention(int(time.time() * 1000)) >= 1
    watcher.join(10)
    assert not watcher.is_alive()
    present = [after_s for after_s, there in seen if there]
    assert present, seen
    assert max(present) >= UNLINK_GRACE_MS / 1000 * 0.5, seen[-3:]
    assert not seen[-1][1]  # gone once the grace passed


def test_the_store_writer_alone_writes_the_checkpoint_with_the_dispatchers_times(
    graph: StoreGraph,
) -> None:
    put(graph, 0, 10)
    graph.writer.flusher.flush_now()
    path = checkpoint_path(graph.store_root)
    path.unlink()
    graph.dispatcher.flush()  # flushes consume queues and index, publishes their times
    assert not path.exists()
    counters = graph.dispatcher.counters
    logics_ms = counters.logics_flushed_timestamp_ms
    index_ms = counters.index_flushed_timestamp_ms
    assert logics_ms > 0
    assert index_ms > 0
    assert graph.writer.housekeeper.write_checkpoint()
    stored = read_checkpoint(path)
    assert stored is not None
    assert stored.physic_msg_timestamp_ms == graph.writer.commit_log.flushed_store_timestamp_ms
    assert (stored.logics_msg_timestamp_ms, stored.index_msg_timestamp_ms) == (logics_ms, index_ms)
    assert not graph.writer.housekeeper.write_checkpoint()  # nothing changed, nothing written

    put(graph, 10, 3)  # the stop (dispatcher, then writer) leaves the newest times
    newest_ms = graph.writer.commit_log.last_store_timestamp_ms
    graph.close()
    stored = read_checkpoint(path)
    assert stored is not None
    assert stored.physic_msg_timestamp_ms == newest_ms
    assert stored.logics_msg_timestamp_ms == newest_ms
    graph.close = lambda: None  # type: ignore[method-assign]  # the fixture's second close


def test_a_nearly_full_disk_refuses_sends_with_service_not_available(graph: StoreGraph) -> None:
    full = [True]
    graph.writer.store.disk_guard = DiskSpaceGuard(
        graph.store_root, 90, disk_usage=lambda _path: 0.99 if full[0] else 0.5, cache_ns=0
    )
    response = graph.send_command(RequestCode.SEND_MESSAGE, send_header(TOPIC), b"x")
    assert response.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert response.remark is not None
    assert "99.0% full" in response.remark
    full[0] = False
    response = graph.send_command(RequestCode.SEND_MESSAGE, send_header(TOPIC), b"x")
    assert response.code == ResponseCode.SUCCESS


class FakeMonotonic:
    """The dispatcher's monotonic clock, moved only by the test."""

    def __init__(self) -> None:
        self.now_ns = 1_000_000 * 1_000_000_000

    def __call__(self) -> int:
        return self.now_ns

    def advance_s(self, seconds: int) -> None:
        self.now_ns += seconds * 1_000_000_000


def test_the_index_is_flushed_on_its_own_long_interval_and_at_the_stop(
    shm_instance: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flushIntervalConsumeQueue 1 s, mqboxFlushIntervalIndexMs 60 s (the default): each turn a
    second later flushes the consume queues and publishes their position, the index's stays
    where its last flush left it, and so does the checkpoint's, until 60 s have passed; the stop
    flushes both."""
    clock = FakeMonotonic()
    monkeypatch.setattr(dispatcher_role, "time", types.SimpleNamespace(monotonic_ns=clock))
    monkeypatch.setattr(StoreHousekeeper, "start", lambda self: None)
    broker = small_broker(flush_interval_consume_queue_ms=1000)
    assert broker.flush_interval_index_ms == 60_000
    graph = StoreGraph(shm_instance, tmp_path / "home", broker)
    closed = False
    try:
        graph.send.topics.create_if_absent(TopicConfig(TOPIC, 1, 1, 6))
        dispatcher = graph.dispatcher
        counters = dispatcher.counters
        path = checkpoint_path(graph.store_root)

        def checkpoint_offsets() -> tuple[int | None, int | None]:
            graph.writer.housekeeper.write_checkpoint()
            stored = read_checkpoint(path)
            assert stored is not None
            return stored.logics_log_offset_bytes, stored.index_log_offset_bytes

        put(graph, 0, 5)
        dispatched_bytes = dispatcher.dispatcher.dispatched_log_offset_bytes
        assert dispatched_bytes > 0
        assert dispatcher.statistics().flush_rounds == 0  # the clock has not moved
        for second in range(1, 60):
            clock.advance_s(1)
            dispatcher.run_once(0)
            statistics = dispatcher.statistics()
            assert (statistics.flush_rounds, statistics.index_flush_rounds) == (second, 0)
            if second == 30:
                put(graph, 5, 5)  # dispatched, flushed at the next turn
                dispatched_bytes = dispatcher.dispatcher.dispatched_log_offset_bytes
        assert counters.logics_flushed_log_offset_bytes == dispatched_bytes
        assert counters.index_flushed_log_offset_bytes == 0
        assert counters.index_flushed_timestamp_ms == 0
        assert checkpoint_offsets() == (dispatched_bytes, 0)

        clock.advance_s(1)  # 60 s since the dispatcher started
        dispatcher.run_once(0)
        statistics = dispatcher.statistics()
        assert (statistics.flush_rounds, statistics.index_flush_rounds) == (60, 1)
        assert counters.index_flushed_log_offset_bytes == dispatched_bytes
        assert (
            counters.index_flushed_timestamp_ms == graph.writer.commit_log.last_store_timestamp_ms
        )
        assert checkpoint_offsets() == (dispatched_bytes, dispatched_bytes)
        index_flushed_bytes = dispatched_bytes

        put(graph, 10, 5)
        dispatched_bytes = dispatcher.dispatcher.dispatched_log_offset_bytes
        clock.advance_s(59)  # one consume-queue flush after 59 s: not the index's turn yet
        dispatcher.run_once(0)
        assert dispatcher.statistics().index_flush_rounds == 1
        assert checkpoint_offsets() == (dispatched_bytes, index_flushed_bytes)

        put(graph, 15, 5)
        dispatched_bytes = dispatcher.dispatcher.dispatched_log_offset_bytes
        closed = True
        graph.close()  # the dispatcher's stop flushes the index, the writer's writes it down
        stored = read_checkpoint(path)
        assert stored is not None
        assert stored.index_log_offset_bytes == dispatched_bytes
        assert stored.logics_log_offset_bytes == dispatched_bytes
    finally:
        if not closed:
            graph.close()

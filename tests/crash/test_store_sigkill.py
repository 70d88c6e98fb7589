"""Goal: a real process killed with SIGKILL at any moment (appending, flushing, rolling a
segment, dispatching, or in the middle of its own recovery) loses no acknowledged record: after
each kill, recovery finds every record whose flush the writer reported, exactly once, with its
queue offset and body, in order per queue, and the consume queues and the index point at them.

Method: a small Python script (`ZYGOTE`, run with `python -c`) imports the store once, compiles
its kernels, then forks one writer per command, so each writer starts in milliseconds instead of
re-importing numba. A writer opens the store (recovering it), appends random batches to several
queues (a fifth of the records with a NUL in a property; its clock stepped back by up to a
minute every seventh batch), flushes now and then, and only after a flush covers a record writes
`acked <queue_id> <queue_index> <log_offset> <body hash>` to the pipe, one os.write per batch of
whole lines (atomic below PIPE_BUF, so a kill never leaves half a line). The test kills the writer
with SIGKILL after a random delay, recovers the store in its own process, checks every record
ever acknowledged plus the order of QUEUEOFFSET in the whole log, then closes the store cleanly
or drops it (so the next writer sees both clean and unclean stops), and starts the next writer
on the same store. Processes are killed by PID in `finally`. Marked `crash`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mqbox.message import decode_record, is_blank, pack_host
from mqbox.store.layout import StoreGeometry
from mqbox.store.message_store import MessageStore, StoreConfig
from tests.support.faulty_file import abandon_store, open_store_with_recovery

pytestmark = pytest.mark.crash

REPO_ROOT = Path(__file__).resolve().parents[2]
KILL_COUNT = 24
BUDGET_S = 50.0
SEGMENT_SIZE_BYTES = 256 * 1024
TOPIC = "KillTopic"
QUEUE_COUNT = 4
CONFIG = StoreConfig(
    geometry=StoreGeometry(
        commit_log_segment_size_bytes=SEGMENT_SIZE_BYTES,
        cq_segment_entry_count=64,
        index_slot_count=256,
        index_entry_count_max=2000,
    ),
    max_message_size_bytes=4096,
    store_host=pack_host("127.0.0.1", 10911),
)

ZYGOTE = r"""
import hashlib, os, random, shutil, sys, tempfile, time
from pathlib import Path

import numpy as np

from mqbox.message import MessageToStore, encode_properties_str, encode_record
from mqbox.store.message_store import warm_up_kernels
from tests.crash.test_store_sigkill import CONFIG, QUEUE_COUNT, TOPIC
from tests.support.faulty_file import abandon_store, open_store_with_recovery

ROOT = Path(sys.argv[1])


def say(text):
    data = text.encode()
    while data:  # whole lines, at most 4000 bytes per write: atomic on a pipe
        cut = data.rfind(b"\n", 0, 4000) + 1
        os.write(1, data[:cut])
        data = data[cut:]


def append_batch(store, rng, serial):
    queue_id = rng.randrange(QUEUE_COUNT)
    records, hashes = [], []
    for _ in range(rng.randint(1, 6)):
        body = rng.randbytes(rng.randint(0, 300))
        digest = hashlib.blake2b(body, digest_size=8).hexdigest()
        uniq_key = f"{serial}-{len(hashes)}"
        fields = {"KEYS": digest, "UNIQ_KEY": uniq_key}
        if rng.random() < 0.2:
            fields["note"] = "a\0b"  # Java strings may hold NUL; it must never look torn
        properties = encode_properties_str(fields)
        message = MessageToStore(TOPIC, queue_id, body, properties=properties)
        records.append(bytes(encode_record(message)))
        hashes.append(digest)
    sizes = np.array([len(record) for record in records], dtype=np.int32)
    data = np.frombuffer(b"".join(records), dtype=np.uint8)
    result = store.append_batch(data, sizes, TOPIC, queue_id)
    placed, offset = [], result.log_offset_bytes
    for position, digest in enumerate(hashes):
        end = offset + int(sizes[position])
        placed.append((queue_id, result.queue_index + position, offset, digest, end))
        offset = end
    return placed


class SteppingClock:
    # The wall clock, stepped back now and then as NTP or a restored VM snapshot would.

    def __init__(self):
        self.offset_ms = 0

    def __call__(self):
        return time.time_ns() // 1_000_000 + self.offset_ms


def write_forever(seed):
    clock = SteppingClock()
    store, report = open_store_with_recovery(ROOT, CONFIG, clock_ms=clock)
    say(f"recovered {report.write_log_offset_bytes} {int(report.was_clean)}\n")
    rng = random.Random(seed)
    pending, batch = [], 0
    while True:
        batch += 1
        if batch % 7 == 0:
            clock.offset_ms -= rng.choice((0, 5_000, 60_000))
        pending.extend(append_batch(store, rng, f"{seed}-{batch}"))
        if batch % 3 == 0:
            store.dispatch()
        if batch % 5 == 0:
            if batch % 15 == 0:
                store.flush()  # commit log, index, consume queues, checkpoint
            else:
                store.flush_commit_log()
            flushed = store.commit_log.flushed_log_offset_bytes
            acked = [item for item in pending if item[4] <= flushed]
            pending = [item for item in pending if item[4] > flushed]
            say("".join(f"acked {q} {i} {o} {d}\n" for q, i, o, d, _ in acked))


def warm_up():
    warm_up_kernels()
    directory = Path(tempfile.mkdtemp(prefix="mqbox-zygote-"))
    try:
        store, _ = open_store_with_recovery(directory, CONFIG)
        append_batch(store, random.Random(0), "warm")
        store.dispatch()
        store.flush()
        append_batch(store, random.Random(1), "warm2")
        abandon_store(store)
        store, _ = open_store_with_recovery(directory, CONFIG)
        store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


warm_up()
sys.stdout.flush()
say("ready\n")
for line in sys.stdin:
    command, seed = line.split()
    assert command == "run"
    pid = os.fork()
    if pid == 0:
        try:
            write_forever(int(seed))
        finally:
            os._exit(3)
    say(f"pid {pid}\n")
    _, status = os.waitpid(pid, 0)
    say(f"exited {pid} {status}\n")
"""


class Zygote:
    """The zygote process and a thread that moves its output lines into a queue."""

    def __init__(self, root: Path, reap_pids: list[int]):
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            text=True,
        )
        reap_pids.append(self.process.pid)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("eof")

    def next_line(self, timeout_s: float) -> str:
        line = self.lines.get(timeout=timeout_s)
        assert line != "eof", "the zygote died"
        return line

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()


class LogChecker:
    """What the test knows: acknowledged records, and the log read so far."""

    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], tuple[int, str]] = {}
        self.next_queue_index = [0] * QUEUE_COUNT
        self.read_end_bytes = 0
        self.last_read_record_end_bytes = 0

    def note_line(self, line: str) -> None:
        if not line.startswith("acked "):
            return
        _, queue_id, queue_index, log_offset, digest = line.split()
        key = (int(queue_id), int(queue_index))
        value = (int(log_offset), digest)
        assert self.acked.get(key, value) == value, "one queue offset acknowledged twice"
        self.acked[key] = value

    def check(self, store: MessageStore) -> None:
        end_bytes = store.commit_log.write_log_offset_bytes
        assert store.dispatcher.dispatched_log_offset_bytes == end_bytes
        # What an earlier check read was whole and flushed by recovery: it must still be there.
        assert end_bytes >= self.last_read_record_end_bytes
        self.read_new_records(store, end_bytes)
        for queue_id in range(QUEUE_COUNT):
            assert store.max_offset(TOPIC, queue_id) == self.next_queue_index[queue_id]
        for (queue_id, queue_index), (log_offset_bytes, digest) in self.acked.items():
            queue_ = store.consume_queues.find_queue(TOPIC, queue_id)
            assert queue_ is not None
            entry = queue_.entry(queue_index)
            assert entry is not None, f"acknowledged {queue_id}/{queue_index} has no entry"
            assert entry.log_offset_bytes == log_offset_bytes
            record = store.read_message(log_offset_bytes)
            assert record is not None
            message = decode_record(record)
            assert (message.queue_id, message.queue_index) == (queue_id, queue_index)
            assert hashlib.blake2b(message.body, digest_size=8).hexdigest() == digest
        for (_queue_id, _queue_index), (log_offset_bytes, digest) in list(self.acked.items())[-50:]:
            found = store.query_by_key(TOPIC, digest, 0, 2**62, 8)
            assert log_offset_bytes in [message.log_offset_bytes for message in found]

    def read_new_records(self, store: MessageStore, end_bytes: int) -> None:
        """Walk the log from where the last check stopped: QUEUEOFFSET must count up by one per
        queue, so no record appears twice and none is missing in between."""
        position_bytes = self.last_read_record_end_bytes
        while position_bytes < end_bytes:
            record = store.read_message(position_bytes)
            if record is None:
                segment_start_bytes = position_bytes - position_bytes % SEGMENT_SIZE_BYTES
                buffer = store.commit_log.segment_view(segment_start_bytes)
                assert buffer is not None
                assert is_blank(buffer.data, position_bytes - segment_start_bytes)
                position_bytes = segment_start_bytes + SEGMENT_SIZE_BYTES
                continue
            message = decode_record(record)
            assert message.queue_index == self.next_queue_index[message.queue_id]
            self.next_queue_index[message.queue_id] += 1
            position_bytes += len(record)
        assert position_bytes == end_bytes
        self.last_read_record_end_bytes = end_bytes


def test_sigkill_never_loses_an_acknowledged_record(tmp_path: Path, reap_pids: list[int]) -> None:
    root = tmp_path / "store"
    started_s = time.monotonic()
    zygote = Zygote(root, reap_pids)
    checker = LogChecker()
    rng = random.Random(20240521)
    kill_count = 0
    recovered_clean = 0
    child_pid = 0
    try:
        assert zygote.next_line(timeout_s=300) == "ready"
        while kill_count < KILL_COUNT and time.monotonic() - started_s < BUDGET_S:
            zygote.send(f"run {kill_count}")
            line = zygote.next_line(timeout_s=30)
            assert line.startswith("pid "), line
            child_pid = int(line.split()[1])
            time.sleep(rng.uniform(0.0, 0.4))
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
            while True:
                line = zygote.next_line(timeout_s=30)
                if line.startswith("exited "):
                    break
                checker.note_line(line)
                if line.startswith("recovered ") and line.endswith(" 1"):
                    recovered_clean += 1
            _, pid, status = line.split()
            assert int(pid) == child_pid
            assert os.WIFSIGNALED(int(status)), f"the writer ended by itself: status {status}"
            assert os.WTERMSIG(int(status)) == signal.SIGKILL
            child_pid = 0
            kill_count += 1
            store, report = open_store_with_recovery(root, CONFIG)
            assert not report.was_clean
            checker.check(store)
            if rng.random() < 0.4:
                store.close()
            else:
                abandon_store(store)
    finally:
        if child_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
        if zygote.process.stdin is not None:
            zygote.process.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygote.process.pid, signal.SIGKILL)
        zygote.process.wait(timeout=30)
        zygote.reader.join(timeout=30)
        if zygote.process.stdout is not None:
            zygote.process.stdout.close()
    assert kill_count >= 20, f"only {kill_count} kills within {BUDGET_S} s"
    assert len(checker.acked) > 100
    assert recovered_clean >= 1  # some writers started after a clean close

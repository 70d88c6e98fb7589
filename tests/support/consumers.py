"""What the consumer tests share: a handler that records what it was given, as plain values.

Owns: `Seen` (one delivery, every field a ReceivedMessage carries, read at delivery time) and
`Collector` (a thread-safe push handler recording Seen values, answering what the test says),
`Load` (a producer thread sending numbered messages until stopped) and `group_name` (a unique
group or topic name the broker's checks accept). Never: the consumer under test's
settings, or sleeps (tests wait with tests/support/waiting.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mqbox.client import ClientError, ConsumeResult, Producer, ReceivedMessage
from tests.conftest import unique_name


def group_name(kind: str) -> str:
    """A unique group name of the characters groups may hold."""
    return unique_name(kind).replace("-", "_")


@dataclass(frozen=True)
class Seen:
    """One message as a handler received it."""

    label: str  # which consumer got it
    topic: str
    pulled_topic: str
    broker: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    tags: str | None
    keys: tuple[str, ...]
    properties: tuple[tuple[str, str], ...]
    body: bytes
    born_timestamp_ms: int
    store_timestamp_ms: int
    born_host: tuple[str, int]
    store_host: tuple[str, int]
    reconsume_times: int
    at: float  # time.monotonic() at delivery

    @classmethod
    def of(cls, label: str, message: ReceivedMessage) -> Seen:
        return cls(
            label,
            message.topic,
            message.pulled_topic,
            message.broker_name,
            message.queue_id,
            message.queue_offset,
            message.commit_log_offset,
            message.msg_id,
            message.offset_msg_id,
            message.tags,
            tuple(message.keys),
            tuple(sorted(message.properties.items())),
            message.body,
            message.born_timestamp_ms,
            message.store_timestamp_ms,
            message.born_host,
            message.store_host,
            message.reconsume_times,
            time.monotonic(),
        )

    @property
    def property_map(self) -> dict[str, str]:
        return dict(self.properties)


class Collector:
    """A push handler recording every message it is given; it answers `answer(messages)`
    (SUCCESS by default)."""

    def __init__(
        self,
        label: str = "",
        answer: Callable[[Sequence[ReceivedMessage]], ConsumeResult | None] | None = None,
    ) -> None:
        self.label = label
        self.answer = answer
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self.calls = 0

    def __call__(self, messages: Sequence[ReceivedMessage]) -> ConsumeResult | None:
        seen = [Seen.of(self.label, message) for message in messages]
        with self._lock:
            self._seen.extend(seen)
            self.calls += 1
        return ConsumeResult.SUCCESS if self.answer is None else self.answer(messages)

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def bodies(self) -> Counter[bytes]:
        return Counter(seen.body for seen in self.seen())

    def count(self) -> int:
        with self._lock:
            return len(self._seen)


class Load:
    """A thread sending numbered messages (`<prefix>-<n>`) to a topic until stopped, in batches
    of `batch` sync sends, `pause_s` apart; `acknowledged` holds the bodies the broker took. A
    send that fails (a broker restarting) is retried with the next number, not counted."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        prefix: str = "load",
        *,
        batch: int = 10,
        pause_s: float = 0.02,
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.prefix = prefix
        self.batch = batch
        self.pause_s = pause_s
        self.acknowledged: list[bytes] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{topic}", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the load thread did not stop"

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            for _ in range(self.batch):
                body = f"{self.prefix}-{number}".encode()
                number += 1
                try:
                    self.producer.send(self.topic, body, timeout_ms=2000)
                except ClientError:
                    self.failures += 1
                    continue
                self.acknowledged.append(body)
            self._stop.wait(self.pause_s)

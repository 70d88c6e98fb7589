"""Producer queue choice: the publish queue list, round robin, and latency fault avoidance.

Owns, restated from RocketMQ 4.9.7 (docs/client.md A.1 to A.3):

    TopicPublishInfo        publish queues of one route, its round-robin counter, select_one()
    SendIndex               ThreadLocalIndex: the counter, one per TopicPublishInfo here
    LatencyFaultTolerance   LatencyFaultToleranceImpl: per-broker fault items, pick_one_at_least()
    MQFaultStrategy         the latency tables, update_fault_item(), select_one() with the strategy

Never: sockets, threads, logging, or a clock read inside. Every method that needs the time takes
`now_ms` (wall-clock ms, as Java's System.currentTimeMillis; only differences matter), and the
counters' random starts come from a `random.Random` the caller may seed.

Differences from Java, on purpose:
- One counter per TopicPublishInfo, not one per thread: a producer's sends share the round robin
  (as C++ shares it per topic). Java builds a new TopicPublishInfo, and so a new counter, at every
  route change; so should the caller.
- The fallback broker of pick_one_at_least() comes back as a new MessageQueue (Java 4.9.8);
  4.9.0 to 4.9.7 overwrite the broker and queue id of an entry of the shared publish list.
- Fault items that compare equal keep their insertion order when sorted (Java's come in
  ConcurrentHashMap order, which is arbitrary).

Counters are Java ints: they wrap at 2**31 and every index is masked or abs'd exactly as Java
does, so a long-running producer never picks a negative position.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from mqbox.client.allocate import java_string_sort_key
from mqbox.errors import MqboxError
from mqbox.protocol.codes import PERM_WRITE
from mqbox.protocol.headers import MessageQueue, TopicRouteData

MASTER_ID: Final = 0
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
POSITIVE_MASK: Final = 0x7FFFFFFF

# MQFaultStrategy's tables: a send that took at least LATENCY_MAX_MS[i] makes its broker
# unavailable for NOT_AVAILABLE_DURATION_MS[i] (the largest i that applies).
LATENCY_MAX_MS: Final = (50, 100, 550, 1_000, 2_000, 3_000, 15_000)
NOT_AVAILABLE_DURATION_MS: Final = (0, 0, 30_000, 60_000, 120_000, 180_000, 600_000)
# An isolated broker (a send that failed) counts as this latency: 600 s out.
ISOLATION_LATENCY_MS: Final = 30_000

assert len(LATENCY_MAX_MS) == len(NOT_AVAILABLE_DURATION_MS)
assert list(LATENCY_MAX_MS) == sorted(LATENCY_MAX_MS)
assert LATENCY_MAX_MS[-1] <= ISOLATION_LATENCY_MS  # isolation means the longest duration


class PublishRouteError(MqboxError):
    """A route's orderTopicConf is not `brokerName:count;...` (Java fails the route update)."""


def wrap_int32(value: int) -> int:
    """`value` as a Java int: two's complement, 32 bits."""
    return (value + 2**31) % 2**32 - 2**31


def java_abs_index(index: int, size: int) -> int:
    """Java's `pos = Math.abs(index) % size; if (pos < 0) pos = 0;` for a Java int `index`.

    Math.abs(Integer.MIN_VALUE) is still negative, so that one index maps to position 0.
    """
    assert size > 0
    assert INT32_MIN <= index <= INT32_MAX
    return 0 if index == INT32_MIN else abs(index) % size


def random_start_index(rng: random.Random) -> int:
    """ThreadLocalIndex's first value, Math.abs(random.nextInt()): uniform over [0, 2**31)."""
    return rng.getrandbits(31)


class SendIndex:
    """Java's ThreadLocalIndex: a counter pre-incremented on each call (wrapping as a Java int),
    whose result is masked to 31 bits (4.9.5 and later), so it is never negative."""

    __slots__ = ("_index",)

    def __init__(self, start: int) -> None:
        assert INT32_MIN <= start <= INT32_MAX
        self._index = start

    def increment_and_get(self) -> int:
        """The next index, in [0, 2**31)."""
        self._index = wrap_int32(self._index + 1)
        return self._index & POSITIVE_MASK


# --- Publish queues (A.1, A.2) ------------------------------------------------------------------


def _order_topic_queues(topic: str, order_topic_conf: str) -> list[MessageQueue]:
    """orderTopicConf `"brokerA:N;brokerB:M"` expanded in the order it is written, as Java does
    (String.split drops trailing empty parts; Integer.parseInt on the count)."""
    queues: list[MessageQueue] = []
    items = order_topic_conf.split(";")
    while items and not items[-1]:
        items.pop()
    for item in items:
        parts = item.split(":")
        if len(parts) < 2 or not re.fullmatch(r"[+-]?[0-9]+", parts[1]):
            raise PublishRouteError(f"orderTopicConf item {item!r} is not brokerName:count")
        count = int(parts[1])
        if not INT32_MIN <= count <= INT32_MAX:
            raise PublishRouteError(f"orderTopicConf count {parts[1]!r} is not a Java int")
        queues.extend(MessageQueue(topic, parts[0], queue_id) for queue_id in range(count))
    return queues


def publish_queues(topic: str, route: TopicRouteData) -> tuple[list[MessageQueue], bool]:
    """(the publish queue list of `route`, whether it came from orderTopicConf).

    Java's topicRouteData2TopicPublishInfo, which C++ 1.2.3 matches: orderTopicConf, when set, is
    the whole list. Otherwise the QueueDatas sorted by brokerName (a stable sort, as
    Collections.sort), keeping those with the WRITE perm whose broker has a master (id 0) in the
    route's BrokerDatas (the first BrokerData of that name), each adding queues
    0..writeQueueNums-1. Raises PublishRouteError for a malformed orderTopicConf.
    """
    if route.order_topic_conf:
        return _order_topic_queues(topic, route.order_topic_conf), True
    queues: list[MessageQueue] = []
    for queue_data in sorted(
        route.queue_datas, key=lambda data: java_string_sort_key(data.broker_name)
    ):
        if not queue_data.perm & PERM_WRITE:
            continue
        broker = next(
            (data for data in route.broker_datas if data.broker_name == queue_data.broker_name),
            None,
        )
        if broker is None or MASTER_ID not in broker.broker_addrs:
            continue
        queues.extend(
            MessageQueue(topic, queue_data.broker_name, queue_id)
            for queue_id in range(queue_data.write_queue_nums)
        )
    return queues, False


@dataclass(slots=True)
class TopicPublishInfo:
    """One topic's publish queues and the round-robin counter that picks among them.

    Build one per route (`from_route`), and a new one whenever the route changes, as Java does.
    """

    topic: str
    queues: tuple[MessageQueue, ...]
    order_topic: bool  # the list came from orderTopicConf
    route: TopicRouteData
    send_index: SendIndex

    @classmethod
    def from_route(
        cls, topic: str, route: TopicRouteData, rng: random.Random | None = None
    ) -> TopicPublishInfo:
        """The publish info of `route`, its counter started as ThreadLocalIndex starts (from
        `rng`, a fresh unseeded one when None). Raises PublishRouteError as publish_queues()."""
        queues, order_topic = publish_queues(topic, route)
        start = random_start_index(rng if rng is not None else random.Random())
        return cls(topic, tuple(queues), order_topic, route, SendIndex(start))

    def ok(self) -> bool:
        """True when there is a queue to send to; select_one() needs it (Java's ok())."""
        return bool(self.queues)

    def select_one(self, last_broker: str | None = None) -> MessageQueue:
        """The next queue round robin; with `last_broker`, the next one on another broker.

        Java's selectOneMessageQueue(lastBrokerName): up to len(queues) tries, each advancing the
        counter, for a queue whose broker is not `last_broker`; when every queue is on it, the
        plain next queue. The caller checks ok() first.
        """
        assert self.queues, "no publish queue: check ok() first"
        size = len(self.queues)
        if last_broker is not None:
            for _ in range(size):
                queue = self.queues[java_abs_index(self.send_index.increment_and_get(), size)]
                if queue.broker_name != last_broker:
                    return queue
        return self.queues[java_abs_index(self.send_index.increment_and_get(), size)]

    def write_queue_count(self, broker_name: str) -> int:
        """writeQueueNums of the route's first QueueData for `broker_name`, whatever its perm;
        -1 when there is none (Java's getQueueIdByBroker)."""
        for queue_data in self.route.queue_datas:
            if queue_data.broker_name == broker_name:
                return queue_data.write_queue_nums
        return -1


# --- Latency fault tolerance (A.3) --------------------------------------------------------------


def not_available_duration_ms(
    latency_ms: int,
    latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
    durations_ms: Sequence[int] = NOT_AVAILABLE_DURATION_MS,
) -> int:
    """How long a broker is avoided after a send that took `latency_ms`: the duration of the
    largest threshold `latency_ms` reaches, scanning from the top as Java does; 0 below all."""
    assert len(latency_max_ms) == len(durations_ms)
    for threshold_ms, duration_ms in zip(
        reversed(latency_max_ms), reversed(durations_ms), strict=True
    ):
        if latency_ms >= threshold_ms:
            return duration_ms
    return 0


@dataclass(slots=True)
class FaultItem:
    """One broker's last send latency and the time from which it is available again."""

    name: str
    current_latency_ms: int
    start_timestamp_ms: int  # available when now_ms >= this

    def is_available(self, now_ms: int) -> bool:
        return now_ms - self.start_timestamp_ms >= 0


@dataclass(slots=True)
class LatencyFaultTolerance:
    """LatencyFaultToleranceImpl: a fault item per broker name, and the least bad of them.

    `worst_index` is Java's whichItemWorst, a second ThreadLocalIndex.
    """

    worst_index: SendIndex
    items: dict[str, FaultItem] = field(default_factory=dict)

    def update_fault_item(
        self, name: str, current_latency_ms: int, not_available_ms: int, now_ms: int
    ) -> None:
        """Record a send to `name`: its latency, and unavailable until now + not_available_ms."""
        item = self.items.get(name)
        if item is None:
            self.items[name] = FaultItem(name, current_latency_ms, now_ms + not_available_ms)
        else:
            item.current_latency_ms = current_latency_ms
            item.start_timestamp_ms = now_ms + not_available_ms

    def is_available(self, name: str, now_ms: int) -> bool:
        """True for a broker without a fault item or whose item's time has come."""
        item = self.items.get(name)
        return item is None or item.is_available(now_ms)

    def remove(self, name: str) -> None:
        self.items.pop(name, None)

    def pick_one_at_least(self, now_ms: int) -> str | None:
        """The broker to fall back on when none is available; None without fault items.

        Items sorted: available first, then by current latency, then by start timestamp. With one
        item (half = 0) that one; else item `worst_index.increment_and_get() % half`, so the
        better half takes turns.
        """
        if not self.items:
            return None
        ranked = sorted(
            self.items.values(),
            key=lambda item: (
                not item.is_available(now_ms),
                item.current_latency_ms,
                item.start_timestamp_ms,
            ),
        )
        half = len(ranked) // 2
        if half <= 0:
            return ranked[0].name
        return ranked[self.worst_index.increment_and_get() % half].name


class MQFaultStrategy:
    """MQFaultStrategy: latency fault avoidance, off by default as in RocketMQ.

    Callers (DefaultMQProducerImpl, A.3) report every send with update_fault_item(): a sync send
    that returned, with its round trip and isolation False; a transport, client or broker
    exception with isolation True; an async send's OK answer False, its failure or missing answer
    True. While disabled, update_fault_item() records nothing and select_one() is
    TopicPublishInfo.select_one(last_broker).
    """

    __slots__ = ("_durations_ms", "_latency_max_ms", "enabled", "tolerance")

    def __init__(
        self,
        *,
        enabled: bool = False,
        latency_max_ms: Sequence[int] = LATENCY_MAX_MS,
        not_available_durations_ms: Sequence[int] = NOT_AVAILABLE_DURATION_MS,
        rng: random.Random | None = None,
    ) -> None:
        assert len(latency_max_ms) == len(not_available_durations_ms)
        self.enabled = enabled
        self._latency_max_ms = tuple(latency_max_ms)
        self._durations_ms = tuple(not_available_durations_ms)
        start = random_start_index(rng if rng is not None else random.Random())
        self.tolerance = LatencyFaultTolerance(SendIndex(start))

    def update_fault_item(
        self, broker_name: str, latency_ms: int, isolation: bool, now_ms: int
    ) -> None:
        """Record one send's outcome (see the class docstring); an isolation lasts as a 30 s
        latency does, 600 s with the default tables."""
        if not self.enabled:
            return
        duration_ms = not_available_duration_ms(
            ISOLATION_LATENCY_MS if isolation else latency_ms,
            self._latency_max_ms,
            self._durations_ms,
        )
        self.tolerance.update_fault_item(broker_name, latency_ms, duration_ms, now_ms)

    def is_available(self, broker_name: str, now_ms: int) -> bool:
        return self.tolerance.is_available(broker_name, now_ms)

    def select_one(
        self, info: TopicPublishInfo, last_broker: str | None, now_ms: int
    ) -> MessageQueue:
        """The queue for the next attempt of a send (the caller checks info.ok() first).

        Enabled: from the counter's next index, the first queue (of len(queues) tried in turn)
        whose broker is available; `last_broker` is ignored, as in Java. When none is, the broker
        pick_one_at_least() names, on the queue id `counter % its writeQueueNums`, after one
        plain select_one() that only advances the counter; a named broker without write queues
        loses its fault item, and the plain next queue is used.
        """
        if not self.enabled:
            return info.select_one(last_broker)
        assert info.queues, "no publish queue: check ok() first"
        size = len(info.queues)
        index = info.send_index.increment_and_get()
        for _ in range(size):
            queue = info.queues[java_abs_index(index, size)]
            index = wrap_int32(index + 1)
            if self.tolerance.is_available(queue.broker_name, now_ms):
                return queue
        not_best = self.tolerance.pick_one_at_least(now_ms)
        if not_best is None:
            return info.select_one()
        write_queue_count = info.write_queue_count(not_best)
        if write_queue_count <= 0:
            self.tolerance.remove(not_best)
            return info.select_one()
        queue = info.select_one()
        queue_id = info.send_index.increment_and_get() % write_queue_count
        return MessageQueue(queue.topic, not_best, queue_id)

"""What consumers hand to applications: received messages, batches of them, consume results.

Owns: ReceivedMessage (a PulledMessage view with the consumer's names: topic as the application
subscribed it, queue, queue offset, commit-log offset), MessageBatch (a lazy sequence of them
over one pulled body, which is what a push handler receives), and ConsumeResult (what a handler
answers). Never: threads, sockets or clocks, and no object per message until one is asked for:
a handler that only counts, or reads columns, costs nothing per message.

Retry topics (docs/client.md B.9, Java's resetRetryAndNamespace): a message pulled from
`%RETRY%<group>` shows the topic it was first sent to (its RETRY_TOPIC property) as `topic`;
`queue` stays the retry queue it was pulled from, which is where its offset is committed.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterator, Sequence
from typing import Final, overload

import numpy as np
from numpy.typing import NDArray

from mqbox.client.pull_decode import PulledBatch, PulledMessage
from mqbox.client.pull_kernels import COLUMN_BODY_SIZE_BYTES, COLUMN_QUEUE_INDEX
from mqbox.message import PROPERTY_RETRY_TOPIC
from mqbox.protocol.headers import MessageQueue

RETRY_TOPIC_PREFIX: Final = "%RETRY%"
DLQ_TOPIC_PREFIX: Final = "%DLQ%"


def retry_topic(group: str) -> str:
    """`%RETRY%<group>`: where a group's failed messages come back (docs/protocol.md section 9)."""
    return RETRY_TOPIC_PREFIX + group


def dead_letter_topic(group: str) -> str:
    """`%DLQ%<group>`: where a group's messages go after their last retry."""
    return DLQ_TOPIC_PREFIX + group


class ConsumeResult(enum.Enum):
    """A push handler's answer for its whole batch (Java's ConsumeConcurrentlyStatus and
    ConsumeOrderlyStatus). Concurrent handlers answer SUCCESS or RECONSUME_LATER; orderly ones
    SUCCESS or SUSPEND_CURRENT_QUEUE_A_MOMENT. An exception, None, or another value counts as
    the failure of its kind (Java: a null status is RECONSUME_LATER)."""

    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class ReceivedMessage(PulledMessage):
    """One received message: every field of PulledMessage (body, tags, keys, properties, msg_id,
    offset_msg_id, born and store timestamps and hosts, reconsume_times, flag, sysflag), read
    when asked for, and the names below."""

    __slots__ = ()

    @property
    def topic(self) -> str:
        """The topic the producer sent to: RETRY_TOPIC for a message of a retry topic."""
        topic = self.batch.topic_at(self._index)
        if topic.startswith(RETRY_TOPIC_PREFIX):
            return self.properties.get(PROPERTY_RETRY_TOPIC) or topic
        return topic

    @property
    def pulled_topic(self) -> str:
        """The topic the message was pulled from (`%RETRY%<group>` for a retry)."""
        return self.batch.topic_at(self._index)

    @property
    def queue(self) -> MessageQueue:
        """The queue it was pulled from, whose offset its acknowledgement moves."""
        return MessageQueue(self.batch.topic_at(self._index), self.batch.broker_name, self.queue_id)

    @property
    def position(self) -> int:
        """Its position in the pulled body's records (MessageBatch.positions)."""
        return self._index

    @property
    def queue_offset(self) -> int:
        """Its index in the queue (QUEUEOFFSET)."""
        return self.queue_index

    @property
    def commit_log_offset(self) -> int:
        """Its position in the broker's commit log (PHYSICALOFFSET), what send-back names."""
        return self.log_offset_bytes

    def __repr__(self) -> str:
        return (
            f"ReceivedMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_index}, msg_id={self.msg_id!r})"
        )


class MessageBatch(Sequence[ReceivedMessage]):
    """Some messages of one pulled body, in queue order: the positions `positions` of `batch`.
    Indexing and iteration make ReceivedMessage views on the fly; `len`, `queue_offsets()`,
    `body_sizes()` and `first_offset` / `last_offset` make none."""

    __slots__ = ("batch", "positions")

    def __init__(self, batch: PulledBatch, positions: range | list[int]) -> None:
        self.batch = batch
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, index: int) -> ReceivedMessage: ...

    @overload
    def __getitem__(self, index: slice) -> MessageBatch: ...

    def __getitem__(self, index: int | slice) -> ReceivedMessage | MessageBatch:
        if isinstance(index, slice):
            return MessageBatch(self.batch, self.positions[index])
        return ReceivedMessage(self.batch, self.positions[index])

    def __iter__(self) -> Iterator[ReceivedMessage]:
        return map(functools.partial(ReceivedMessage, self.batch), self.positions)

    def __repr__(self) -> str:
        return f"MessageBatch({len(self)} messages of {self.batch.broker_name})"

    def _column(self, column: int) -> NDArray[np.int64]:
        values: NDArray[np.int64] = self.batch.table[column]
        positions = self.positions
        if isinstance(positions, range):
            return values[positions.start : positions.stop : positions.step]
        return values[np.asarray(positions, dtype=np.int64)]

    def queue_offsets(self) -> NDArray[np.int64]:
        """Every message's queue offset, as an int64 array (a view when it can be one)."""
        return self._column(COLUMN_QUEUE_INDEX)

    def body_sizes(self) -> NDArray[np.int64]:
        """Every message's stored (possibly compressed) body size."""
        return self._column(COLUMN_BODY_SIZE_BYTES)

    @property
    def first_offset(self) -> int:
        """The first message's queue offset; IndexError when the batch is empty."""
        return self.batch.column(COLUMN_QUEUE_INDEX)[self.positions[0]]

    @property
    def last_offset(self) -> int:
        """The last message's queue offset; IndexError when the batch is empty."""
        return self.batch.column(COLUMN_QUEUE_INDEX)[self.positions[-1]]

    def body_size_bytes(self) -> int:
        """The stored body bytes of the whole batch (what flow control counts)."""
        sizes = self.batch.column(COLUMN_BODY_SIZE_BYTES)
        positions = self.positions
        if isinstance(positions, range) and positions.step == 1:
            return sum(sizes[positions.start : positions.stop])
        return sum(map(sizes.__getitem__, positions))

    def chunks(self, size: int) -> list[MessageBatch]:
        """The batch cut into consecutive batches of at most `size` messages."""
        assert size > 0
        positions = self.positions
        return [
            MessageBatch(self.batch, positions[start : start + size])
            for start in range(0, len(positions), size)
        ]

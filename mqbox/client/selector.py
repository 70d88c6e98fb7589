"""Orderly send selectors: which publish queue a sharding key goes to.

Owns: Java's SelectMessageQueueByHash and SelectMessageQueueByRandom
(`producer/selector/`, docs/client.md A.6), and the Python wheel's
`hashing_queue_selector` for producers that must place int keys where the wheel does. The
queue list is TopicPublishInfo.queues (fault.py), the same ordered list Java and C++ select from.

Never: sockets, clocks, or retries (an orderly send is one attempt in Java).

Java's rule: `v = arg.hashCode() % size` (Java's `%` truncates toward zero, so v may be
negative), then `abs(v)`. For str keys the hash is String.hashCode (message.java_string_hash);
for int keys it is how Java would box the value: Integer.hashCode (the value itself) when it fits
in 32 bits, else Long.hashCode (`(int)(v ^ (v >>> 32))`). abs(v % size) equals
abs(hash) % size, Integer.MIN_VALUE included.

The Python wheel (rocketmq 0.4.x, `hashing_queue_selector`) differs for negative ints: it passes
the key through ctypes.c_int (wrapping it to 32 bits) and takes Python's `%`, which is never
negative but is not Java's: for -7 over 4 queues the wheel picks 1 and Java picks 3. For
non-negative keys below 2**31 both pick `key % size`. The wheel has no str keys.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from mqbox.client.fault import INT32_MAX, INT32_MIN, wrap_int32
from mqbox.message import java_string_hash
from mqbox.protocol.headers import MessageQueue


def java_hash_code(sharding_key: str | int) -> int:
    """The Java hashCode of `sharding_key` as the module docstring says (a signed 32-bit int)."""
    if isinstance(sharding_key, str):
        return java_string_hash(sharding_key)
    assert isinstance(sharding_key, int)
    if INT32_MIN <= sharding_key <= INT32_MAX:
        return sharding_key
    assert -(2**63) <= sharding_key < 2**63, "a sharding key int must fit a Java long"
    unsigned = sharding_key & 0xFFFF_FFFF_FFFF_FFFF
    return wrap_int32(unsigned ^ (unsigned >> 32))


def hash_index(hash_code: int, queue_count: int) -> int:
    """Java's `abs(hashCode % size)` for a signed 32-bit hash code."""
    assert queue_count > 0
    assert INT32_MIN <= hash_code <= INT32_MAX
    return abs(hash_code) % queue_count


def by_hash(queues: Sequence[MessageQueue], sharding_key: str | int) -> MessageQueue:
    """SelectMessageQueueByHash: the same key, the same queue, as long as the list is the same."""
    assert queues, "no publish queue: check TopicPublishInfo.ok() first"
    return queues[hash_index(java_hash_code(sharding_key), len(queues))]


def by_hash_like_python_wheel(queues: Sequence[MessageQueue], sharding_key: int) -> MessageQueue:
    """The queue the wheel's hashing_queue_selector picks: c_int(key) % size, Python's `%`."""
    assert queues, "no publish queue: check TopicPublishInfo.ok() first"
    return queues[wrap_int32(sharding_key) % len(queues)]


def by_random(queues: Sequence[MessageQueue], rng: random.Random) -> MessageQueue:
    """SelectMessageQueueByRandom: a uniformly random queue."""
    assert queues, "no publish queue: check TopicPublishInfo.ok() first"
    return queues[rng.randrange(len(queues))]

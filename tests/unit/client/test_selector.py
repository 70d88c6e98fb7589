"""Orderly selectors: Java's SelectMessageQueueByHash index for str and int keys.

Goal: by_hash picks `abs(hashCode % size)` with Java's truncating `%`, negative hashes and
Integer.MIN_VALUE included; int keys hash as Java boxes them (Integer, or Long past 32 bits);
by_hash_like_python_wheel keeps the wheel's Python `%`, which differs for negative ints.

Method: a table of keys with negative String.hashCode values (the hash values are checked too,
"polygenelubricants" being Java's well-known Integer.MIN_VALUE hash) and the index Java's
arithmetic gives, worked out by hand next to each row; plus a hypothesis property that the index
equals Java's two-step rule restated with math.fmod.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client.selector import (
    by_hash,
    by_hash_like_python_wheel,
    by_random,
    hash_index,
    java_hash_code,
)
from mqbox.protocol.headers import MessageQueue


def queues(count: int) -> list[MessageQueue]:
    return [MessageQueue("Orders", "broker-a", queue_id) for queue_id in range(count)]


@pytest.mark.parametrize(
    ("key", "hash_code", "size", "index"),
    [
        ("order-17", 1234255109, 8, 5),  # 1234255109 = 8 * 154281888 + 5
        ("order-1", -1207111310, 8, 6),  # Java: -6 -> 6 (Python's % would give 2)
        ("user-42", -147182656, 5, 1),  # Java: -1 -> 1 (Python: 4)
        ("key-negative", -1289770013, 3, 2),  # Java: -2 -> 2 (Python: 1)
        ("polygenelubricants", -(2**31), 3, 2),  # MIN % 3 = -2 -> 2
        ("Aa", 2112, 10, 2),
        ("BB", 2112, 10, 2),  # a Java hash collision: same queue
    ],
)
def test_by_hash_uses_java_string_hash_and_truncating_remainder(
    key: str, hash_code: int, size: int, index: int
) -> None:
    assert java_hash_code(key) == hash_code
    assert by_hash(queues(size), key).queue_id == index


@pytest.mark.parametrize(
    ("key", "size", "java_index", "wheel_index"),
    [
        (-7, 4, 3, 1),  # the facts doc's example: Java abs(-7 % 4) = 3, Python -7 % 4 = 1
        (7, 4, 3, 3),
        (-(2**31), 3, 2, 1),
        (2**31, 3, 2, 1),  # Java Long.hashCode(2^31) = MIN_VALUE; the wheel's c_int wraps too
        (2**40, 7, 4, 0),  # Long.hashCode = 2^8 = 256 -> 4; c_int(2^40) = 0
    ],
)
def test_int_keys_hash_as_java_boxes_them_and_the_wheel_differs_when_negative(
    key: int, size: int, java_index: int, wheel_index: int
) -> None:
    assert by_hash(queues(size), key).queue_id == java_index
    assert by_hash_like_python_wheel(queues(size), key).queue_id == wheel_index


@given(hash_code=st.integers(-(2**31), 2**31 - 1), size=st.integers(1, 1024))
def test_hash_index_is_javas_remainder_then_abs(hash_code: int, size: int) -> None:
    remainder = int(math.fmod(hash_code, size))  # truncates toward zero, as Java's %
    java_value = abs(remainder) if remainder < 0 else remainder
    assert hash_index(hash_code, size) == java_value


def test_by_random_is_reproducible_with_a_seed() -> None:
    first = [by_random(queues(8), random.Random(3)).queue_id for _ in range(5)]
    assert len(set(first)) == 1
    picks = random.Random(3)
    assert {by_random(queues(8), picks).queue_id for _ in range(200)} == set(range(8))

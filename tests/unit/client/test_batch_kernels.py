"""encode_plain_batch: the kernel writes the bytes the general batch path writes.

Goal: for any batch of plain bodies and any UNIQ_KEY counter (wrapping at 65536 included), the
kernel's batch body equals message.encode_batch_elements over UniqKeyGenerator.next_keys's keys
(each element: the body, flag 0, properties `UNIQ_KEY 0x01 key 0x02`), its joined keys equal the
keys joined by commas, and the broker's decoder reads the elements back; and the producer's two
paths (outgoing.encode_plain_batch and outgoing.encode_batch) give equal OutgoingMessages and
refuse the same inputs.
Method: hypothesis draws bodies (1 to 300 bytes, 1 to 60 of them), the generator's counter and
time; both paths start from generators in the same state.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.client import batch_kernels
from mqbox.client.errors import InvalidMessageError
from mqbox.client.outgoing import encode_batch, encode_plain_batch
from mqbox.message import UniqKeyGenerator, decode_batch, encode_batch_elements

BODIES = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=60)


def generators(counter: int) -> tuple[UniqKeyGenerator, UniqKeyGenerator]:
    first = UniqKeyGenerator(bytes((10, 1, 2, 3)), pid=4242, salt=0xBEEF)
    second = UniqKeyGenerator(bytes((10, 1, 2, 3)), pid=4242, salt=0xBEEF)
    first.next_keys(0, counter)
    second.next_keys(0, counter)
    return first, second


@given(
    bodies=BODIES,
    counter=st.integers(0, 0xFFFF),
    now_ms=st.integers(1_700_000_000_000, 1_900_000_000_000),
)
def test_the_kernel_writes_the_general_paths_bytes(
    bodies: list[bytes], counter: int, now_ms: int
) -> None:
    kernel_keys, reference_keys = generators(counter)
    head, start = kernel_keys.reserve(now_ms, len(bodies))
    keys = reference_keys.next_keys(now_ms, len(bodies))
    expected = encode_batch_elements(
        bodies, [b"UNIQ_KEY\x01" + key.encode() + b"\x02" for key in keys], [0] * len(bodies)
    )
    out = np.full(
        batch_kernels.plain_batch_size_bytes(sum(map(len, bodies)), len(bodies)), 7, np.uint8
    )
    out_keys = np.full(batch_kernels.joined_keys_size_bytes(len(bodies)), 7, np.uint8)
    written = batch_kernels.encode_plain_batch(
        np.frombuffer(b"".join(bodies), np.uint8),
        np.array([len(body) for body in bodies], np.int64),
        np.frombuffer(head.encode(), np.uint8),
        start,
        out,
        out_keys,
    )
    assert written == len(expected) == len(out)
    assert out.tobytes() == expected
    assert out_keys.tobytes().decode() == ",".join(keys)
    assert [element.body for element in decode_batch(out.tobytes())] == bodies


@given(bodies=BODIES, counter=st.integers(0, 0xFFFF))
def test_the_producers_two_batch_paths_agree(bodies: list[bytes], counter: int) -> None:
    plain_keys, general_keys = generators(counter)
    now_ms = 1_800_000_000_000
    head, start = plain_keys.reserve(now_ms, len(bodies))
    plain = encode_plain_batch("Orders", bodies, head, start)
    general = encode_batch("Orders", bodies, general_keys.next_keys(now_ms, len(bodies)))
    assert plain == general


@pytest.mark.parametrize(
    ("bodies", "maximum", "fragment"),
    [
        ([], 64, "empty"),
        ([b"a", b""], 64, "empty"),
        ([b"x" * 65], 64, "over the maximum"),
        ([b"x" * 20, b"y" * 20], 100, "batch body"),  # 2 x (20 + 64) bytes encoded
    ],
)
def test_both_paths_refuse_alike(bodies: list[bytes], maximum: int, fragment: str) -> None:
    keys = [f"{index:032X}" for index in range(len(bodies))]
    with pytest.raises(InvalidMessageError, match=fragment):
        encode_plain_batch("T", bodies, "0" * 28, 0, body_size_bytes_max=maximum)
    with pytest.raises(InvalidMessageError, match=fragment):
        encode_batch("T", bodies, keys, body_size_bytes_max=maximum)

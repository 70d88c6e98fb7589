"""Plain-Python twins of mqbox/spark/kernels.py, for tests.

Owns: a second statement of each kernel's contract written with bytes slicing, dicts and the
message.py functions (decode_properties for the parsing rules, encode_batch_elements for the
batch layout); it shares no helper with the kernels. tests/unit/spark/test_kernels.py asserts
that both give the same answers.

Never: used on the data plane, or changed without its kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqbox.message import encode_batch_elements, java_string_hash, java_utf8_decode

_MASK64 = (1 << 64) - 1

Span = tuple[int, int]  # (start, size); start < 0 is null


def gather_spans_ref(data: bytes, spans: Sequence[Span]) -> tuple[bytes, list[int]]:
    out = b""
    offsets = [0]
    for start, size in spans:
        if start >= 0:
            out += data[start : start + size]
        offsets.append(len(out))
    return out, offsets


def split_properties_ref(
    data: bytes, spans: Sequence[Span]
) -> list[tuple[list[tuple[bytes, bytes]], bytes | None, bytes | None]]:
    """Per record: its (name, value) entries in first-seen order with the last value, its KEYS
    and its UNIQ_KEY value."""
    found: list[tuple[list[tuple[bytes, bytes]], bytes | None, bytes | None]] = []
    for start, size in spans:
        entries: dict[bytes, bytes] = {}
        for part in data[start : start + size].split(b"\x02"):
            name, separator, value = part.partition(b"\x01")
            if separator and name and value:
                entries[name] = value
        found.append((list(entries.items()), entries.get(b"KEYS"), entries.get(b"UNIQ_KEY")))
    return found


def _fold(high: int, low: int, byte: int) -> tuple[int, int]:
    high = ((high ^ byte) * 0x100000001B3) & _MASK64
    low = ((low ^ byte) * 0x9E3779B97F4A7C15) & _MASK64
    low ^= low >> 29
    return high, low


def hash_spans_ref(
    data: bytes, spans: Sequence[Span], hashes: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    result: list[tuple[int, int]] = []
    for (start, size), (high, low) in zip(spans, hashes, strict=True):
        if start < 0:
            high, low = _fold(high, low, 0xFF)
        else:
            high, low = _fold(high, low, 0xFE)
            for byte in size.to_bytes(8, "little"):
                high, low = _fold(high, low, byte)
            for byte in data[start : start + size]:
                high, low = _fold(high, low, byte)
        result.append((high, low))
    return result


def count_occurrences_ref(
    seen: dict[tuple[int, int], int], hashes: Sequence[tuple[int, int]]
) -> list[int]:
    occurrences: list[int] = []
    for pair in hashes:
        occurrences.append(seen.get(pair, 0))
        seen[pair] = occurrences[-1] + 1
    return occurrences


def encode_map_properties_ref(rows: Sequence[Sequence[tuple[bytes, bytes, bool]]]) -> list[bytes]:
    return [
        b"".join(name + b"\x01" + value + b"\x02" for name, value, keep in entries if keep)
        for entries in rows
    ]


def encode_elements_ref(
    bodies: Sequence[bytes],
    flags: Sequence[int],
    user_properties: Sequence[bytes | None],
    tags: Sequence[bytes | None],
    keys: Sequence[bytes | None],
    uniq_keys: Sequence[bytes],
) -> bytes:
    properties = [
        (user or b"")
        + (b"TAGS\x01" + tag + b"\x02" if tag else b"")
        + (b"KEYS\x01" + key + b"\x02" if key else b"")
        + b"UNIQ_KEY\x01"
        + uniq
        + b"\x02"
        for user, tag, key, uniq in zip(user_properties, tags, keys, uniq_keys, strict=True)
    ]
    return encode_batch_elements(list(bodies), properties, list(flags))


def java_hashes_ref(data: bytes, spans: Sequence[Span]) -> list[int]:
    return [
        0 if start < 0 else java_string_hash(java_utf8_decode(data[start : start + size]))
        for start, size in spans
    ]

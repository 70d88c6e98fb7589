"""Shared by the store benches (store_append, store_dispatch, store_read): record batches, a
temporary store, and a checksum of files.

Records are built once per queue as a batch template with message.encode_record(); what varies
per batch (the digits of KEYS and UNIQ_KEY, so index keys are distinct) is patched in place with
numpy, so building a million records costs well under a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from mqbox.message import MessageToStore, encode_properties_str, encode_record, pack_host
from mqbox.store.message_store import MessageStore, StoreConfig

TOPIC = "BenchTopic"
STORE_HOST = pack_host("127.0.0.1", 10911)
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_KEY_DIGIT_COUNT = 8


def properties_for(size_bytes: int) -> dict[str, str]:
    """The richest property set a record of `size_bytes` has room for (TAGS, then KEYS with an
    8-digit key, then a 32-character UNIQ_KEY), as a C++ producer would send them."""
    fixed_bytes = 91 + len(TOPIC)
    candidates = [
        {"KEYS": "0" * _KEY_DIGIT_COUNT, "TAGS": "TagA", "UNIQ_KEY": "7F000001" + "0" * 24},
        {"KEYS": "0" * _KEY_DIGIT_COUNT, "TAGS": "TagA"},
        {"TAGS": "TagA"},
        {},
    ]
    for properties in candidates:
        if fixed_bytes + len(encode_properties_str(properties)) <= size_bytes:
            return properties
    raise SystemExit(f"--size-bytes must be at least {fixed_bytes}")


class BatchTemplate:
    """`batch_count` records of exactly `size_bytes` bound for (TOPIC, queue_id), back to back,
    with the positions of their key digits so each batch can get fresh keys."""

    def __init__(self, queue_id: int, size_bytes: int, batch_count: int):
        properties = properties_for(size_bytes)
        encoded_properties = encode_properties_str(properties)
        body_size_bytes = size_bytes - 91 - len(TOPIC) - len(encoded_properties)
        body = bytes(index * 7 % 251 for index in range(body_size_bytes))
        one = encode_record(MessageToStore(TOPIC, queue_id, body, properties=encoded_properties))
        assert len(one) == size_bytes
        self.data: NDArray[np.uint8] = np.frombuffer(one * batch_count, dtype=np.uint8).copy()
        self.sizes_bytes = np.full(batch_count, size_bytes, dtype=np.int32)
        self.batch_count = batch_count
        key_at: list[int] = []
        for marker in (b"KEYS\x01", b"UNIQ_KEY\x01"):
            found = one.find(marker)
            if found >= 0:
                value_end = one.index(b"\x02", found)
                key_at.append(value_end - _KEY_DIGIT_COUNT)
        record_starts = np.arange(batch_count, dtype=np.int64) * size_bytes
        self._digit_positions = [
            record_starts + at + digit for at in key_at for digit in range(_KEY_DIGIT_COUNT)
        ]

    def set_keys(self, first_number: int) -> None:
        """Give record i of the batch key number first_number + i (8 hex digits)."""
        if not self._digit_positions:
            return
        numbers = np.arange(first_number, first_number + self.batch_count, dtype=np.int64)
        per_key = len(self._digit_positions) // _KEY_DIGIT_COUNT
        for key in range(per_key):
            for digit in range(_KEY_DIGIT_COUNT):
                shift = 4 * (_KEY_DIGIT_COUNT - 1 - digit)
                positions = self._digit_positions[key * _KEY_DIGIT_COUNT + digit]
                self.data[positions] = _HEX_DIGITS[(numbers >> shift) & 0xF]


@contextlib.contextmanager
def temporary_store(directory: str | None, config: StoreConfig) -> Iterator[MessageStore]:
    """A fresh store under `directory` (default: the system temp dir), deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="mqbox-bench-", dir=directory))
    store = MessageStore.open(root, config)
    try:
        yield store
    finally:
        store.stop_background_threads()
        shutil.rmtree(root, ignore_errors=True)


def commit_log_digest(store: MessageStore) -> str:
    """blake2b of every commit-log byte written, in log order (outside any timing)."""
    digest = hashlib.blake2b(digest_size=8)
    segment_size_bytes = store.commit_log.segment_size_bytes
    end_bytes = store.commit_log.write_log_offset_bytes
    for segment_start_bytes in store.commit_log.segment_starts_bytes:
        buffer = store.commit_log.segment_view(segment_start_bytes)
        assert buffer is not None
        stop_bytes = min(end_bytes - segment_start_bytes, segment_size_bytes)
        if stop_bytes > 0:
            digest.update(buffer[:stop_bytes].data)
    return digest.hexdigest()

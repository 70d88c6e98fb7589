"""decode_pull_body: lazy messages over one kernel call, bounded inflation, the tag check.

Goal: every field of a PulledMessage equals what message.decode_record reads from the same
record (and the properties what decode_properties_str reads); compressed bodies inflate on
access, within the batch's bound; msg_id is UNIQ_KEY or the offset msgId Java builds, for IPv4
and IPv6 store hosts; a damaged body keeps the records before the damage and says where it
stopped instead of dropping the rest silently; accepted() keeps what Java's PullAPIWrapper keeps.

Method: bodies built with message.encode_record (hypothesis for the field-by-field comparison,
hand-made ones for the rest); IPv6 records by widening hosts as tests/unit/client/
test_pull_kernels.py does.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox import message as m
from mqbox.client.pull_decode import PullBodyError, decode_pull_body
from mqbox.client.pull_kernels import DECODE_STOP_TRUNCATED
from mqbox.client.subscription import build_subscription
from mqbox.errors import MessageIllegalError, MessageTooLargeError
from tests.support.pull_bodies import Body, bodies, widen_hosts

STORE_HOST = m.pack_host("192.168.7.9", 10911)
BORN_HOST = m.pack_host("10.1.2.3", 50123)


def record(
    body: bytes = b"hello",
    *,
    topic: str = "Orders",
    properties: dict[str, str] | None = None,
    queue_index: int = 0,
    log_offset_bytes: int = 4096,
    sysflag: int = 0,
) -> bytes:
    encoded_properties = m.encode_properties_str(
        properties if properties is not None else {"TAGS": "TagA"}
    )
    return bytes(
        m.encode_record(
            m.MessageToStore(
                topic,
                3,
                body,
                encoded_properties,
                flag=7,
                sysflag=sysflag,
                born_timestamp_ms=1_700_000_000_000,
                born_host=BORN_HOST,
                reconsume_times=2,
            ),
            queue_index=queue_index,
            log_offset_bytes=log_offset_bytes,
            store_timestamp_ms=1_700_000_000_500,
            store_host=STORE_HOST,
        )
    )


@given(body=bodies(ipv6=False))
def test_fields_are_what_decode_record_reads(body: Body) -> None:
    data = body.data
    positions = body.record_positions_bytes
    batch = decode_pull_body(data, broker_name="broker-a")
    assert batch.complete
    assert len(batch) == len(positions)
    for message, position in zip(batch, positions, strict=True):
        stored = m.decode_record(data, position)
        assert message.queue_index == stored.queue_index
        assert message.queue_id == stored.queue_id
        assert message.log_offset_bytes == stored.log_offset_bytes
        assert message.size_bytes == stored.size_bytes
        assert message.flag == stored.flag
        assert message.sysflag == stored.sysflag
        assert message.born_timestamp_ms == stored.born_timestamp_ms
        assert message.store_timestamp_ms == stored.store_timestamp_ms
        assert message.reconsume_times == stored.reconsume_times
        assert message.stored_body == stored.body
        assert message.body_size_bytes == len(stored.body)
        assert message.topic == stored.topic
        assert message.properties == m.decode_properties_str(stored.properties)
        assert message.born_host == m.unpack_host(stored.born_host)
        assert message.store_host == m.unpack_host(stored.store_host)
        assert message.offset_msg_id == m.encode_offset_msg_id(
            stored.store_host, stored.log_offset_bytes
        )
        assert message.broker_name == "broker-a"
    assert batch.queue_indexes().tolist() == [
        m.decode_record(data, p).queue_index for p in positions
    ]


def test_a_message_reads_its_fields_and_ids() -> None:
    uniq = "0A0B0C0D00002A9F0000000000000001"
    data = record(properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": uniq}, queue_index=41)
    data += record(properties={}, queue_index=42, log_offset_bytes=8192)
    first, second = decode_pull_body(data)
    assert (first.tags, first.keys, first.msg_id) == ("TagA", ["k1", "k2"], uniq)
    assert first.offset_msg_id == "C0A8070900002A9F0000000000001000"
    assert (second.tags, second.keys) == (None, [])
    assert second.msg_id == second.offset_msg_id == "C0A8070900002A9F0000000000002000"
    assert first.born_host == ("10.1.2.3", 50123)
    assert "queue_index=41" in repr(first)


def test_compressed_bodies_inflate_on_access_within_the_bound() -> None:
    plain = b"x" * 10_000
    compressed, sysflag = m.compress_body(plain, 0)
    data = record(
        compressed, sysflag=sysflag | (m.COMPRESSION_TYPE_ZLIB << m.SYSFLAG_COMPRESSION_TYPE_SHIFT)
    )
    (message,) = decode_pull_body(data)
    assert message.body_size_bytes == len(compressed)
    assert message.body == plain
    (bounded,) = decode_pull_body(data, body_size_bytes_max=9_999)
    assert bounded.queue_index == 0  # other fields stay readable
    with pytest.raises(MessageTooLargeError):
        _ = bounded.body
    (broken,) = decode_pull_body(record(b"not zlib", sysflag=m.SYSFLAG_COMPRESSED))
    with pytest.raises(MessageIllegalError):
        _ = broken.body


def test_a_damaged_body_keeps_the_records_before_and_says_where_it_stopped() -> None:
    data = record(queue_index=1) + record(queue_index=2)
    cut = data[: len(data) - 5]
    batch = decode_pull_body(cut)
    assert [message.queue_index for message in batch] == [1]
    assert not batch.complete
    assert batch.stop_reason == DECODE_STOP_TRUNCATED
    assert batch.stop_position_bytes == len(data) // 2
    with pytest.raises(PullBodyError) as raised:
        batch.raise_for_damage()
    assert raised.value.position_bytes == len(data) // 2
    decode_pull_body(data).raise_for_damage()


def test_an_empty_body_is_a_complete_empty_batch() -> None:
    batch = decode_pull_body(b"")
    assert batch.complete
    assert len(batch) == 0
    assert list(batch) == []


def test_a_batch_is_a_sequence() -> None:
    batch = decode_pull_body(b"".join(record(queue_index=index) for index in range(4)))
    assert batch[-1].queue_index == 3
    assert [message.queue_index for message in batch[1:3]] == [1, 2]
    with pytest.raises(IndexError):
        batch[4]


def test_ipv6_hosts_and_their_offset_msg_id() -> None:
    data = widen_hosts(record(log_offset_bytes=1), born_v6=True, store_v6=True)
    (message,) = decode_pull_body(data)
    assert message.born_host == ("2001:db8::a01:203", 50123)
    assert message.store_host == ("fe80::c0a8:709", 10911)
    host_hex = "FE80" + "00" * 10 + "C0A80709" + "00002A9F"
    assert message.offset_msg_id == host_hex + "0000000000000001"  # 28 bytes, as Java
    assert message.topic == "Orders"
    assert message.tags == "TagA"


def test_accepted_keeps_what_javas_tag_check_keeps() -> None:
    data = b"".join(
        [
            record(properties={"TAGS": "TagA"}, queue_index=0),
            record(properties={}, queue_index=1),
            record(properties={"TAGS": "TagB"}, queue_index=2),
            record(properties={"TAGS": "TagC"}, queue_index=3),
            record(properties={"TAGS": "中文"}, queue_index=4),
        ]
    )
    batch = decode_pull_body(data)
    picked = batch.accepted(build_subscription("Orders", "TagA || TagB || 中文", 0))
    assert [message.queue_index for message in picked] == [0, 2, 4]
    everything = batch.accepted(build_subscription("Orders", "*", 0))
    assert [message.queue_index for message in everything] == [0, 1, 2, 3, 4]


def test_topics_decode_as_java_and_are_shared_within_a_batch() -> None:
    data = record(topic="Orders") + record(topic="Orders") + record(topic="订单")
    batch = decode_pull_body(data)
    assert [message.topic for message in batch] == ["Orders", "Orders", "订单"]
    assert batch[0].topic is batch[1].topic


@given(st.binary(max_size=300))
def test_noise_never_raises_while_decoding_or_reading_fields(noise: bytes) -> None:
    batch = decode_pull_body(noise)
    assert batch.complete or batch.stop_position_bytes < len(noise)
    for message in batch:
        assert message.size_bytes >= m.RECORD_SIZE_BYTES_MIN
        assert isinstance(message.topic, str)
        assert isinstance(message.properties, dict)
        assert isinstance(message.msg_id, str)

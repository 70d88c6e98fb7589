"""Goal: a PULL body becomes an Arrow batch holding, row for row, what the client's lazy decoder
(mqbox.client.pull_decode.PulledMessage, the reference) reads of each record: queue id and
offset, msgId (UNIQ_KEY, else the offset msgId), tags, keys, user properties (names the client
or broker own left out; Java's text rule for broken UTF-8), the body (inflated when stored
compressed), both timestamps and reconsumeTimes; rows at or past the range's end are left out and
the next offset says where the read goes on; the tag filter is exact; the batch's schema is the
one Spark derives from the source's StructType.

Method: records from message.encode_record (hypothesis strategies of tests/support), their
properties drawn with separators, duplicates and broken UTF-8; the same body is decoded by both.
"""

from __future__ import annotations

import dataclasses
import zlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox import message as m
from mqbox.client.outgoing import RESERVED_PROPERTY_NAMES
from mqbox.client.pull_decode import decode_pull_body
from mqbox.spark.arrow_decode import READ_SCHEMA, decode_pull_to_arrow
from tests.support.stored_records import messages

TOPIC = "DecodeTopic"


def java_text(value: str | None) -> str | None:
    """The reference keeps broken UTF-8 as surrogate escapes; an Arrow string holds Java's
    reading of the same bytes (each malformed sequence one U+FFFD)."""
    if value is None:
        return None
    return m.java_utf8_decode(value.encode("utf-8", "surrogateescape"))


property_maps = st.dictionaries(
    st.sampled_from([b"TAGS", b"KEYS", b"UNIQ_KEY", b"WAIT", b"user", b"\xff\xfe", b"x"]),
    st.binary(min_size=1, max_size=6).filter(lambda value: b"\x02" not in value),
    max_size=5,
).map(m.encode_properties)
records = st.lists(
    st.builds(
        dataclasses.replace,
        messages,
        topic=st.just(TOPIC),
        sysflag=st.just(0),
        born_timestamp_ms=st.integers(-(2**40), 2**43),
        properties=st.one_of(property_maps, property_maps.map(lambda raw: raw + raw)),
    ),
    min_size=1,
    max_size=6,
)


def encode_all(stored: list[m.MessageToStore], first_index: int = 5) -> bytes:
    return b"".join(
        bytes(
            m.encode_record(
                message,
                queue_index=first_index + number,
                log_offset_bytes=1000 * number,
                store_timestamp_ms=1_700_000_000_000 + number,
                store_host=m.pack_host("10.0.0.1", 10911),
            )
        )
        for number, message in enumerate(stored)
    )


@given(records, st.integers(0, 7))
@settings(max_examples=200)
def test_rows_hold_what_the_reference_decoder_reads(
    stored: list[m.MessageToStore], cut: int
) -> None:
    body = encode_all(stored)
    end = 5 + cut
    batch, next_index = decode_pull_to_arrow(
        body, topic=TOPIC, broker="broker-x", queue_index_end=end
    )
    reference = list(decode_pull_body(body, broker_name="broker-x"))
    kept = [message for message in reference if message.queue_index < end]
    assert batch.schema == READ_SCHEMA
    assert batch.num_rows == len(kept)
    assert next_index == (kept[-1].queue_index + 1 if kept else -1)
    born = batch.column("bornTimestamp").cast(pa.int64()).to_pylist()
    stored_at = batch.column("storeTimestamp").cast(pa.int64()).to_pylist()
    for index, (row, message) in enumerate(zip(batch.to_pylist(), kept, strict=True)):
        properties = message.properties
        assert row["topic"] == TOPIC
        assert row["broker"] == "broker-x"
        assert row["queueId"] == message.queue_id
        assert row["queueOffset"] == message.queue_index
        assert row["msgId"] == java_text(message.msg_id)
        assert row["tags"] == java_text(properties.get("TAGS"))
        assert row["keys"] == java_text(properties.get("KEYS"))
        assert dict(row["properties"]) == {
            java_text(name): java_text(value)
            for name, value in properties.items()
            if name not in RESERVED_PROPERTY_NAMES
        }
        assert row["body"] == message.body
        assert born[index] == message.born_timestamp_ms * 1000
        assert stored_at[index] == message.store_timestamp_ms * 1000
        assert row["reconsumeTimes"] == message.reconsume_times


def test_a_compressed_body_is_inflated_and_the_tag_filter_is_exact() -> None:
    plain = b"compressible " * 500
    stored = [
        m.MessageToStore(
            TOPIC,
            0,
            zlib.compress(plain),
            m.encode_properties({b"TAGS": b"A"}),
            sysflag=m.SYSFLAG_COMPRESSED,
        ),
        m.MessageToStore(TOPIC, 0, b"b", m.encode_properties({b"TAGS": b"B"})),
        m.MessageToStore(TOPIC, 0, b"none"),
    ]
    body = encode_all(stored)
    batch, next_index = decode_pull_to_arrow(
        body, topic=TOPIC, broker="b", queue_index_end=100, accepted_tags={"A"}
    )
    assert next_index == 8  # every record was read, though only one is kept
    assert batch.column("body").to_pylist() == [plain]
    everything, _ = decode_pull_to_arrow(body, topic=TOPIC, broker="b", queue_index_end=100)
    assert everything.column("tags").to_pylist() == ["A", "B", None]
    without, _ = decode_pull_to_arrow(
        body, topic=TOPIC, broker="b", queue_index_end=100, include_properties=False
    )
    assert without.column("properties").null_count == 3


def test_the_schema_is_the_one_spark_derives_from_the_sources_struct_type() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from mqbox.spark.source import READ_STRUCT_TYPE

    assert to_arrow_schema(READ_STRUCT_TYPE, timezone="UTC").equals(READ_SCHEMA)
    assert isinstance(READ_SCHEMA.field("properties").type, pa.MapType)

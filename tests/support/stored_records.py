"""Hypothesis strategies for stored records: messages with random fields and properties.

Shared by the store's scan kernel tests and the client's pull decode tests, which both feed
message.encode_record output to a kernel and its twin. TAGS values are valid or broken UTF-8;
properties are well-formed entries or raw bytes; hosts are IPv4 (the sysflag's IPv6 bits are
cleared, as encode_record requires).
"""

from __future__ import annotations

from hypothesis import strategies as st

from mqbox import message as m

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)

tags_values = st.one_of(
    st.sampled_from([b"TagA", b"TagB", "中文".encode(), "😀".encode(), b"\xed\xa0\x80", b"\xff"]),
    st.binary(min_size=1, max_size=8).filter(lambda value: b"\x02" not in value),
)
properties = st.one_of(
    st.fixed_dictionaries(
        {b"TAGS": tags_values, b"UNIQ_KEY": st.just(b"7F0000012345DEADBEEF000004D20000")}
    ).map(m.encode_properties),
    st.dictionaries(
        st.sampled_from([b"KEYS", b"TAGS", b"WAIT", b"T"]),
        tags_values,
        max_size=3,
    ).map(m.encode_properties),
    st.binary(max_size=40),
)
messages = st.builds(
    m.MessageToStore,
    topic=st.text(alphabet="abcXYZ019%|_-", min_size=1, max_size=12),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=48),
    properties=properties,
    flag=INT32,
    sysflag=INT32.map(lambda sysflag: sysflag & ~m.SYSFLAG_HOSTS_V6),
    born_timestamp_ms=INT64,
    reconsume_times=INT32,
)

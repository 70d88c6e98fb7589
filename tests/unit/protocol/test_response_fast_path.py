"""Goal: the fast response encoder writes exactly what the general one writes.

Method: hypothesis draws requests (both serialize types, any opaque), response codes, remarks and
extFields (unicode and surrogate-escaped text included); `Connection.send_response` must equal
`Connection.send(request.make_response(...))` byte for byte, and `encode_response_header` must
equal `encode_header` of the same response. A non-string ext value must fail the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqbox.protocol import Connection, LocalProtocolError, Role, SerializeType
from mqbox.protocol.command import (
    RemotingCommand,
    encode_header,
    encode_response_header,
    make_request,
)

INT32 = st.integers(min_value=0, max_value=2**31 - 1)
# Text as a header may carry it: any code point, and lone surrogates from surrogateescape.
TEXT = st.text(st.characters(codec=None, exclude_categories=["Cs"]), max_size=20) | st.binary(
    max_size=12
).map(lambda raw: raw.decode("utf-8", "surrogateescape"))
EXT = st.dictionaries(st.text(min_size=1, max_size=10), TEXT, max_size=6)


def request_of(opaque: int, serialize_type: SerializeType) -> RemotingCommand:
    return make_request(10, opaque, {"topic": "t"}, serialize_type=serialize_type)


@given(
    opaque=INT32,
    serialize_type=st.sampled_from(SerializeType),
    code=st.integers(min_value=0, max_value=32767),
    ext=EXT,
    remark=st.none() | TEXT,
    body=st.binary(max_size=64),
)
def test_send_response_equals_send_of_make_response(
    opaque: int,
    serialize_type: SerializeType,
    code: int,
    ext: dict[str, str],
    remark: str | None,
    body: bytes,
) -> None:
    request = request_of(opaque, serialize_type)
    general = Connection(Role.BROKER).send(
        request.make_response(code, dict(ext), remark=remark, body=body)
    )
    fast = Connection(Role.BROKER).send_response(request, code, dict(ext), remark=remark, body=body)
    assert fast == general
    response = request.make_response(code, dict(ext), remark=remark)
    assert encode_response_header(opaque, serialize_type, code, dict(ext), remark) == (
        encode_header(response)
    )


def test_a_non_string_ext_value_is_our_bug_on_both_paths() -> None:
    request = request_of(7, SerializeType.JSON)
    bad: dict[str, str] = {"queueOffset": 5}  # type: ignore[dict-item]
    with pytest.raises(LocalProtocolError):
        Connection(Role.BROKER).send(request.make_response(0, dict(bad)))
    with pytest.raises(LocalProtocolError):
        Connection(Role.BROKER).send_response(request, 0, dict(bad))

"""Goal: bench/compare.py's links count the peers' replies exactly, however TCP splits them.

Method: a socket pair stands in for nats-server and redis-server; the test writes recorded
replies (JetStream acks, an API answer, statuses, PING, -ERR; RESP XADD IDs, errors, XRANGE
answers) cut at every byte, or in three pieces, and checks the link's answers, failures,
deliveries and the CRC32 of the payloads it copied against the whole stream read at once. The
servers themselves run in the bench's smoke test (test_bench_smoke.py).
"""

from __future__ import annotations

import socket
import sys
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

# bench/ is not a package: its helpers import each other as top-level modules
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

from _peers import NatsLink, RedisLink, ScannedLink, command, pub, reply_to

TEST_BUFFER_SIZE_BYTES = 4096
BODY_A = b"a" * 128
BODY_B = b"MSG 9 9 9\r\n" + b"b" * 117  # a payload that looks like a frame must not fool it

ACK_1 = b'{"stream":"PRODUCE","seq":1}'
ACK_2 = b'{"stream":"PRODUCE","seq":2}'
STATUS_404 = b"NATS/1.0 404 No Messages\r\n\r\n"


def msg(subject_sid_reply: bytes, payload: bytes) -> bytes:
    return b"MSG %s %d\r\n%s\r\n" % (subject_sid_reply, len(payload), payload)


NATS_STREAM = (
    b'INFO {"server_id":"x","jetstream":true}\r\n'
    + msg(b"_INBOX.bench.p 1", ACK_1)
    + b"PING\r\n"
    + msg(b"_INBOX.bench.p 1", ACK_2)
    + b"HMSG _INBOX.bench.fetch 1 %d %d\r\n%s\r\n" % (len(STATUS_404), len(STATUS_404), STATUS_404)
    + msg(b"bench.backlog 1 $JS.ACK.BACKLOG.c.1.1.1.1.0", BODY_A)
    + msg(b"bench.backlog 1", BODY_B)
    + b"-ERR 'Unknown Protocol Operation'\r\n"
    + b"+OK\r\n"
)

XRANGE_ANSWER = (
    b"*2\r\n"
    b"*2\r\n$3\r\n0-1\r\n*2\r\n$1\r\nd\r\n$128\r\n" + BODY_A + b"\r\n"
    b"*2\r\n$3\r\n0-2\r\n*2\r\n$1\r\nd\r\n$128\r\n" + BODY_B + b"\r\n"
)
RESP_STREAM = (
    b"$15\r\n1700000000000-0\r\n"
    + XRANGE_ANSWER
    + b"-ERR wrong number of arguments\r\n"
    + b"*0\r\n"
    + b":7\r\n"
    + b"+OK\r\n"
    + b"$-1\r\n"
    + XRANGE_ANSWER
)


@contextmanager
def linked(kind: type[ScannedLink]) -> Iterator[tuple[ScannedLink, socket.socket]]:
    ours, theirs = socket.socketpair()
    link = kind(ours, TEST_BUFFER_SIZE_BYTES)
    link.hash_payloads = True
    try:
        yield link, theirs
    finally:
        link.close()
        theirs.close()


def read_in_pieces(kind: type[ScannedLink], pieces: Sequence[bytes]) -> ScannedLink:
    with linked(kind) as (link, theirs):
        for piece in pieces:
            theirs.sendall(piece)
            link.receive()
        return link


def cuts_of(stream: bytes) -> Iterator[list[bytes]]:
    for cut in range(1, len(stream)):
        yield [stream[:cut], stream[cut:]]
    for first in range(1, len(stream), 7):
        for second in range(first + 1, len(stream), 11):
            yield [stream[:first], stream[first:second], stream[second:]]


def test_nats_link_counts_acks_statuses_errors_and_deliveries() -> None:
    link = read_in_pieces(NatsLink, [NATS_STREAM])
    assert link.answers == 5  # four MSG and one status HMSG
    assert link.delivered == 4
    # not reading: the two delivered messages are not acks; plus the 404 and the -ERR
    assert link.failures == 4
    assert link.payload_crc == zlib.crc32(ACK_1 + ACK_2 + BODY_A + BODY_B)


def test_nats_link_reading_counts_only_statuses_and_errors_as_failures() -> None:
    with linked(NatsLink) as (link, theirs):
        assert isinstance(link, NatsLink)
        link.reading = True
        theirs.sendall(NATS_STREAM)
        link.receive()
        assert link.failures == 2


def test_nats_link_answers_ping_with_pong() -> None:
    with linked(NatsLink) as (link, theirs):
        theirs.sendall(b"PING\r\nPING\r\n")
        link.receive()
        assert theirs.recv(64) == b"PONG\r\nPONG\r\n"


def test_nats_link_subscribes_to_the_inbox_of_its_role_alone() -> None:
    """Links of one server must not see each other's acks: each reads only its role's inbox."""
    with linked(NatsLink) as (link, theirs):
        assert isinstance(link, NatsLink)
        theirs.sendall(b'INFO {"jetstream":true}\r\nPONG\r\n')
        link.handshake("s3")
        sent = theirs.recv(4096)
    assert sent.startswith(b"CONNECT {")
    assert sent.endswith(b"\r\nSUB _INBOX.bench.s3.> 1\r\nPING\r\n")
    assert reply_to("s3").startswith("_INBOX.bench.s3.")
    assert not reply_to("s3").startswith("_INBOX.bench.s30")


@pytest.mark.parametrize(
    ("kind", "stream"), [(NatsLink, NATS_STREAM), (RedisLink, RESP_STREAM)], ids=["nats", "redis"]
)
def test_link_counts_the_same_however_the_stream_is_cut(
    kind: type[ScannedLink], stream: bytes
) -> None:
    whole = read_in_pieces(kind, [stream])
    for pieces in cuts_of(stream):
        link = read_in_pieces(kind, pieces)
        found = (link.answers, link.failures, link.delivered, link.payload_crc)
        assert found == (whole.answers, whole.failures, whole.delivered, whole.payload_crc)


def test_redis_link_counts_replies_errors_and_stream_entries() -> None:
    link = read_in_pieces(RedisLink, [RESP_STREAM])
    assert link.answers == 8
    assert link.failures == 1
    assert link.delivered == 4  # the entries of two XRANGE answers
    assert link.payload_crc == zlib.crc32((BODY_A + BODY_B) * 2)


def test_request_encoders_write_the_protocols() -> None:
    assert pub("s", "r", b"xy") == b"PUB s r 2\r\nxy\r\n"
    assert command(b"XADD", b"k", b"*") == b"*3\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n*\r\n"

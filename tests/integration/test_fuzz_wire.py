"""Goal (issue 9, part 4): no frame a client can send stops or bloats the broker. After random
and mutated frames of every request code the broker serves, sent over several connections, the
broker's processes are the same (same PIDs, no restart, nothing quarantined), no role caught a
bug at its request boundary (resources.FailureLog logs "unexpected ..."; every such line fails the
test, so a bug the boundary hides is still found), the memory of its processes grew by a bounded
amount, and an ordinary send and pull work.

Method: one real appliance (tests/support/appliance.py, port 0) with auto-created topics and
groups off, so what legitimately grows is bounded by the fuzzer's small pool of valid names. A
seeded generator (MQBOX_FUZZ_SEED varies the seed; the default is fixed) starts from a valid
request of a served code (routing.ROUTES, each with a valid ext
and body) and then, chosen at random: sends it as it is; replaces, drops or adds header fields
with hostile values (text JSON and Java read differently: lone surrogate escapes, bytes that are
not UTF-8; numbers out of range; huge and empty strings; wrong JSON types); breaks the header
itself (code, opaque, flag, language, version, extFields of the wrong types); replaces or
mutates the body (random bytes, flipped bytes of a valid batch or JSON body, deep nesting) or
puts hostile values in place of a JSON body's own (a heartbeat's subscriptions, a lock's queues);
flips, inserts or deletes bytes anywhere in the encoded header or body, with the frame length
kept right; sends a ROCKETMQ binary header; or sends pure garbage, which ends the connection.
Frames go out round robin over CONNECTION_COUNT sockets, each frame followed by a sync request
(MQBOX_NOOP) whose answer the next frame on that socket waits for, so the broker sets the pace
and has decoded every frame; other answers are read and dropped, and a connection the broker
closes is made again. Memory is Pss_Anon + Pss_Shmem of the supervisor and its children
(bench/memory.py's measure), taken after a warm-up share of the frames and at the end. The
default run sends 10,000 frames; the slow tier (`-m slow`) 1,000,000.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import os
import random
import socket
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import psutil
import pytest

from mqbox.admin import ops
from mqbox.message import BatchElement, encode_batch
from mqbox.protocol import Connection, RemotingCommand, Role
from mqbox.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from mqbox.protocol.command import encode_header
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.frame import FRAME_PREFIX
from mqbox.protocol.headers import (
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    UpdateAndCreateTopicRequestHeader,
)
from mqbox.protocol.mqbox_codes import (
    INVOKE_BROKER_TO_RESET_OFFSET,
    MQBOX_BROKER_STATUS,
    MQBOX_NOOP,
    MQBOX_PULL_STATUS,
    MQBOX_RESET_CONSUMER_OFFSET,
)
from mqbox.server.home import read_state
from mqbox.server.routing import ROUTES
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.front_client import FrontClient
from tests.support.pull_requests import pull_everything_header

pytestmark = pytest.mark.integration

SEED_ENV: Final = "MQBOX_FUZZ_SEED"
SEED_DEFAULT: Final = 20261125
FRAME_COUNT_DEFAULT: Final = 10_000
FRAME_COUNT_SLOW: Final = 1_000_000
WARM_UP_SHARE: Final = 0.1  # memory is measured after this share of the frames, and at the end
CONNECTION_COUNT: Final = 4
SYNC_EVERY: Final = 1  # frames a connection sends before it waits for an answer
SYNC_OPAQUE_FIRST: Final = 0x6000_0000  # far from the frames' own opaques
PROGRESS_EVERY: Final = 100_000  # frames between progress lines on stderr (the slow tier)
# Growth of the broker's Pss_Anon + Pss_Shmem allowed between warm-up and the end. What grows
# legitimately is bounded by the names of NAME_POOL (tables of clients, offsets, subscriptions,
# topics) and by the allocator keeping what a large frame once needed.
MEMORY_GROWTH_BYTES_MAX: Final = 96 << 20
QUIET_WAIT_S: Final = 30.0
FUZZ_CONF: Final = BROKER_CONF + "autoCreateTopicEnable=false\nautoCreateSubscriptionGroup=false\n"

TOPIC: Final = "FuzzTopic"
GROUP: Final = "FuzzGroup"
CLIENT_ID: Final = "10.0.0.1@fuzz"
# Valid names a mutation may put anywhere. TOPIC is not among them: a DELETE_TOPIC_IN_BROKER or
# an UPDATE_AND_CREATE_TOPIC without write permission on it would refuse every later send there.
NAME_POOL: Final = (GROUP, "FuzzOther", "%RETRY%FuzzGroup", "TBW102", "SCHEDULE_TOPIC_XXXX")


@dataclasses.dataclass(frozen=True)
class Raw:
    """Bytes put into the JSON text as they are (an escape, or bytes that are not UTF-8), between
    a string's quotes, or in place of a whole value (`value`: nesting too deep to build)."""

    data: bytes
    value: bool = False


def nested(depth: int) -> Raw:
    """A JSON value `depth` arrays deep; orjson reads up to 1024 levels."""
    return Raw(b"[" * depth + b"]" * depth, value=True)


DEEP_VALUES: Final = tuple(nested(depth) for depth in (200, 255, 256, 1000, 1023, 1024))


# -- valid requests of every served code -----------------------------------------------------------


def _send_ext(code: int) -> dict[str, str]:
    header = SendMessageRequestHeader(
        "FuzzPG", TOPIC, "TBW102", 4, 0, 0, 1_700_000_000_000, 0, properties="TAGS\x01A\x02"
    )
    return header.to_ext() if code == RequestCode.SEND_MESSAGE else header.to_ext_v2()


def _heartbeat_body() -> bytes:
    return orjson.dumps(
        {
            "clientID": CLIENT_ID,
            "producerDataSet": [{"groupName": "FuzzPG"}],
            "consumerDataSet": [
                {
                    "groupName": GROUP,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {"topic": TOPIC, "subString": "A || B", "tagsSet": ["A", "B"]}
                    ],
                }
            ],
        }
    )


def _lock_body() -> bytes:
    queue = {"topic": TOPIC, "brokerName": "broker-a", "queueId": 0}
    return orjson.dumps({"consumerGroup": GROUP, "clientId": CLIENT_ID, "mqSet": [queue]})


def _templates() -> tuple[tuple[int, dict[str, str], bytes], ...]:
    """(code, ext, body) of one valid request for every code the broker serves."""
    queue = {"topic": TOPIC, "queueId": "0"}
    group = {"consumerGroup": GROUP}
    pull = PullMessageRequestHeader(
        GROUP,
        TOPIC,
        0,
        0,
        32,
        PULL_FLAG_SUBSCRIPTION | PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND,
        0,
        200,  # a held pull ends soon
        0,
        "*",
    )
    batch = encode_batch(
        [BatchElement(b"one", 0, b"TAGS\x01A\x02"), BatchElement(b"two", 0, b"KEYS\x01k\x02")]
    )
    batch_ext = _send_ext(RequestCode.SEND_BATCH_MESSAGE)
    batch_ext["m"] = "true"
    return (
        (RequestCode.SEND_MESSAGE, _send_ext(RequestCode.SEND_MESSAGE), b"fuzz body"),
        (RequestCode.SEND_MESSAGE_V2, _send_ext(RequestCode.SEND_MESSAGE_V2), b"fuzz body"),
        (RequestCode.SEND_BATCH_MESSAGE, batch_ext, batch),
        (
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {"group": GROUP, "offset": "0", "delayLevel": "1"},
            b"",
        ),
        (RequestCode.PULL_MESSAGE, pull.to_ext(), b""),
        (MQBOX_PULL_STATUS, {}, b""),
        (MQBOX_BROKER_STATUS, {}, b""),
        (RequestCode.HEART_BEAT, {}, _heartbeat_body()),
        (RequestCode.UNREGISTER_CLIENT, {"clientID": CLIENT_ID, "consumerGroup": GROUP}, b""),
        (RequestCode.GET_CONSUMER_LIST_BY_GROUP, group, b""),
        (RequestCode.QUERY_CONSUMER_OFFSET, {**group, **queue}, b""),
        (RequestCode.UPDATE_CONSUMER_OFFSET, {**group, **queue, "commitOffset": "0"}, b""),
        (RequestCode.GET_MAX_OFFSET, queue, b""),
        (RequestCode.GET_MIN_OFFSET, queue, b""),
        (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**queue, "timestamp": "0"}, b""),
        (RequestCode.GET_EARLIEST_MSG_STORETIME, queue, b""),
        (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"}, b""),
        (
            RequestCode.QUERY_MESSAGE,
            {"topic": TOPIC, "key": "k", "maxNum": "8", "beginTimestamp": "0", "endTimestamp": "1"},
            b"",
        ),
        (
            RequestCode.VIEW_BROKER_STATS_DATA,
            {"statsName": "TOPIC_PUT_NUMS", "statsKey": TOPIC},
            b"",
        ),
        (RequestCode.LOCK_BATCH_MQ, {}, _lock_body()),
        (RequestCode.UNLOCK_BATCH_MQ, {}, _lock_body()),
        (
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            UpdateAndCreateTopicRequestHeader("FuzzOther", "TBW102", 2, 2, 6).to_ext(),
            b"",
        ),
        (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "FuzzOther"}, b""),
        (RequestCode.GET_ALL_TOPIC_CONFIG, {}, b""),
        (RequestCode.GET_ALL_CONSUMER_OFFSET, {}, b""),
        (RequestCode.GET_ALL_DELAY_OFFSET, {}, b""),
        (
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            {},
            orjson.dumps({"groupName": "FuzzGroup", "retryQueueNums": 1}),
        ),
        (RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}, b""),
        (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "FuzzGroup"}, b""),
        (
            RequestCode.CHECK_CLIENT_CONFIG,
            {},
            orjson.dumps({"subscriptionData": {"topic": TOPIC, "subString": "*"}}),
        ),
        (RequestCode.GET_CONSUMER_RUNNING_INFO, {**group, "clientId": CLIENT_ID}, b""),
        (
            INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": TOPIC, "group": GROUP, "timestamp": "-1", "isForce": "true"},
            b"",
        ),
        (MQBOX_NOOP, {}, b""),
        (RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}, b""),
        (RequestCode.GET_CONSUME_STATS, group, b""),
        (RequestCode.GET_CONSUMER_CONNECTION_LIST, group, b""),
        (RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "FuzzPG"}, b""),
        (RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC}, b""),
        (RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"}, b""),
        (RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": GROUP}, b""),
        (
            RequestCode.CONSUME_MESSAGE_DIRECTLY,
            {**group, "clientId": CLIENT_ID, "msgId": "7F000001000027430000000000000000"},
            b"",
        ),
        (RequestCode.GET_BROKER_RUNTIME_INFO, {}, b""),
        (RequestCode.GET_BROKER_CONFIG, {}, b""),
        (RequestCode.UPDATE_BROKER_CONFIG, {}, b"autoCreateSubscriptionGroup=true\n"),
        (RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, {}, b""),
        (MQBOX_RESET_CONSUMER_OFFSET, {**group, "topic": TOPIC, "to": "earliest"}, b""),
    )


TEMPLATES: Final = _templates()

# -- hostile values --------------------------------------------------------------------------------

HOSTILE_TEXT: Final[tuple[str | Raw, ...]] = (
    "",
    "-1",
    "0",
    "1",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "-9223372036854775809",
    "9" * 40,
    "1e3",
    "0x10",
    "NaN",
    "true",
    "abc",
    " 1",
    "\x00",
    "t\u00e9t\u00e9",
    "\U0001f600",
    "%RETRY%",
    "%DLQ%FuzzGroup",
    "SCHEDULE_TOPIC_XXXX",
    "*",
    "A || B || ",
    "||",
    "a b",
    "DELAY\x0199\x02",
    "DELAY\x01-3\x02WAIT\x01false\x02",
    "REAL_TOPIC\x01x\x02REAL_QID\x01y\x02",
    "\x01\x02\x02\x01",
    "TAGS\x01" + "t" * 40_000 + "\x02",
    "earliest",
    "timestamp",
    Raw(b"\\ud800"),
    Raw(b"\\udfff"),
    Raw(b"a\\ud83d"),
    Raw(b"\xff"),
    Raw(b"\xed\xa0\x80"),
    Raw(b"\xc0\x80"),
    Raw(b"\\u0000"),
    Raw(b"TAGS\\u0001\\ud800\\u0002"),
)
HOSTILE_JSON: Final[tuple[Any, ...]] = (
    None,
    0,
    -1,
    1 << 31,
    1 << 63,
    -(1 << 63),
    1.5,
    True,
    [],
    {},
    [1, "a"],
    {"a": {"b": None}},
)


def _escaped(text: str) -> bytes:
    """`text` as it stands between the quotes of a JSON string."""
    return orjson.dumps(text)[1:-1]


class FrameMaker:
    """Seeded frames: valid ones of every served code, and their mutations (module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.opaque = 0
        self.counts: dict[str, int] = {}
        self.last_kind = ""

    def frame(self) -> tuple[bytes, bool]:
        """One frame, and whether the connection must be closed after it (pure garbage)."""
        rng = self.rng
        self.opaque = (self.opaque + 1) & 0x7FFFFFFF
        code, ext, body = rng.choice(TEMPLATES)
        ext = dict(ext)
        kind = rng.choices(
            ("valid", "fields", "header", "body", "json", "bytes", "binary", "garbage"),
            weights=(10, 28, 12, 12, 8, 22, 6, 2),
        )[0]
        if kind == "json" and not body.startswith(b"{"):
            kind = "fields"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.last_kind = kind
        if kind == "garbage":
            return rng.randbytes(rng.randrange(1, 200)), True
        header: dict[str, Any] = {
            "code": code,
            "language": "JAVA",
            "version": 400,
            "opaque": self.opaque,
            "flag": 0,
            "extFields": ext,
        }
        if kind == "binary":
            return self._binary(code, ext, body), False
        if kind == "fields":
            self._mutate_fields(ext)
        elif kind == "header":
            self._mutate_header(header)
        elif kind == "body":
            body = self._mutate_body(body)
        elif kind == "json":
            body = self._json(self._mutate_leaves(json.loads(body)))
        header_bytes = self._json(header)
        if kind == "bytes":
            if rng.random() < 0.7:
                header_bytes = self._mutate_bytes(header_bytes)
            else:
                body = self._mutate_bytes(body)
        return self._framed(0, header_bytes, body), False

    def _mutate_fields(self, ext: dict[str, Any]) -> None:
        rng = self.rng
        # Mostly one field: a request with one bad field goes furthest before it is refused.
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            action = rng.random()
            keys = sorted(ext)
            if keys and action < 0.6:
                key = rng.choice(keys)
                ext[key] = self._value(ext[key])
            elif keys and action < 0.8:
                del ext[rng.choice(keys)]
            else:
                ext[rng.choice(("topic", "queueId", "x", "group", "properties", ""))] = (
                    self._value()
                )

    def _value(self, original: Any = None) -> Any:
        """A hostile value, sometimes made from `original`: its text with wire text that JSON
        and Java read differently spliced in (a lone surrogate escape, a byte that is no UTF-8)."""
        rng = self.rng
        roll = rng.random()
        if isinstance(original, str) and roll < 0.3:
            at = rng.randrange(0, len(original) + 1)
            spliced = rng.choice([value.data for value in HOSTILE_TEXT if isinstance(value, Raw)])
            return Raw(_escaped(original[:at]) + spliced + _escaped(original[at:]))
        if roll < 0.52:
            return rng.choice(HOSTILE_TEXT)
        if roll < 0.66:
            return rng.choice(NAME_POOL)
        if roll < 0.8:
            return rng.choice(HOSTILE_JSON)
        if roll < 0.85:
            return rng.choice(DEEP_VALUES)
        alphabet = "aZ09%|_- \x01\x02\u00e9"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 300)))

    def _mutate_header(self, header: dict[str, Any]) -> None:
        rng = self.rng
        key = rng.choice(("code", "opaque", "flag", "language", "version", "extFields", "remark"))
        if key == "flag":
            header["flag"] = rng.choice((FLAG_RESPONSE, FLAG_ONEWAY, 3, -1, 1 << 31, "1"))
        elif key == "code" and rng.random() < 0.5:
            header["code"] = rng.choice((-1, 0, 1 << 15, 1 << 31, 103, 220, 999, 10_099))
        elif rng.random() < 0.2:
            header.pop(key, None)
        else:
            header[key] = rng.choice((*HOSTILE_JSON, *HOSTILE_TEXT[:20], *DEEP_VALUES))

    def _mutate_leaves(self, document: Any) -> Any:
        """`document` with some of its values (at any depth) replaced by hostile ones."""
        rng = self.rng
        if isinstance(document, dict):
            return {
                key: self._value(value) if rng.random() < 0.15 else self._mutate_leaves(value)
                for key, value in document.items()
            }
        if isinstance(document, list):
            items = [self._mutate_leaves(item) for item in document]
            if rng.random() < 0.1:
                items.append(self._value())
            return items
        return self._value(document) if rng.random() < 0.3 else document

    def _mutate_body(self, body: bytes) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            return rng.randbytes(rng.randrange(0, 2000))
        if roll < 0.45:
            return self._json({"a": [self._value() for _ in range(rng.randrange(0, 5))]})
        if roll < 0.55:
            depth = rng.randrange(1, 3000)
            return b"[" * depth + b"]" * rng.randrange(0, depth + 1)
        if roll < 0.65:
            return zlib.compress(rng.randbytes(rng.randrange(0, 500)))
        if roll < 0.7:
            return rng.randbytes(rng.randrange(100_000, 400_000))
        return self._mutate_bytes(body)

    def _mutate_bytes(self, data: bytes) -> bytes:
        rng = self.rng
        mutated = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            roll = rng.random()
            at = rng.randrange(0, len(mutated) + 1)
            if roll < 0.4 and mutated:
                at = min(at, len(mutated) - 1)
                mutated[at] ^= 1 << rng.randrange(8)
            elif roll < 0.6 and mutated:
                at = min(at, len(mutated) - 1)
                mutated[at] = rng.choice((0, 0x22, 0x5C, 0x7B, 0x7D, 0xFF, 0xED, 0x80))
            elif roll < 0.8:
                mutated[at:at] = rng.randbytes(rng.randrange(1, 16))
            else:
                del mutated[at : at + rng.randrange(1, 16)]
        return bytes(mutated)

    def _binary(self, code: int, ext: dict[str, str], body: bytes) -> bytes:
        command = RemotingCommand(
            code,
            opaque=self.opaque,
            ext_fields={key: str(value) for key, value in ext.items()},
            body=body,
            serialize_type=SerializeType.ROCKETMQ,
        )
        header = encode_header(command)
        if self.rng.random() < 0.6:
            header = self._mutate_bytes(header)
        return self._framed(1, header, body)

    def _json(self, document: Any) -> bytes:
        raws: list[Raw] = []

        def placeholders(value: Any) -> Any:
            if isinstance(value, Raw):
                raws.append(value)
                return f"@@RAW{len(raws) - 1}@@"
            if isinstance(value, dict):
                return {key: placeholders(item) for key, item in value.items()}
            if isinstance(value, list):
                return [placeholders(item) for item in value]
            return value

        encoded = orjson.dumps(placeholders(document))
        for index, raw in enumerate(raws):
            placeholder = f'"@@RAW{index}@@"' if raw.value else f"@@RAW{index}@@"
            encoded = encoded.replace(placeholder.encode(), raw.data)
        return encoded

    def _framed(self, serialize_type: int, header: bytes, body: bytes) -> bytes:
        if self.rng.random() < 0.02:  # a header length word that lies about the frame
            header_word = (serialize_type << 24) | self.rng.randrange(0, 1 << 24)
            return FRAME_PREFIX.pack(4 + len(header) + len(body), header_word) + header + body
        if self.rng.random() < 0.01:
            serialize_type = self.rng.randrange(2, 256)  # no such serialize type
        prefix = FRAME_PREFIX.pack(
            4 + len(header) + len(body), (serialize_type << 24) | len(header)
        )
        return prefix + header + body


# -- the client side ---------------------------------------------------------------------------


class FuzzConnection:
    """One raw socket: sends whatever it is given, reads what comes back and drops it but for
    the answer to its sync request; a connection the broker closed is made again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock, self.reader = self._connect()
        self.reconnect_count = 0
        self.sync_opaque: int | None = None  # waiting for the answer to this MQBOX_NOOP
        self.synced_frame_count = 0
        self.pending_frame_count = 0  # sent since the last answered sync
        # The last frames sent, for the message of a wait that timed out.
        self.recent: collections.deque[bytes] = collections.deque(maxlen=SYNC_EVERY + 1)

    def _connect(self) -> tuple[socket.socket, Connection]:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setblocking(False)
        return sock, Connection(Role.CLIENT)

    def reconnect(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.sock, self.reader = self._connect()
        self.reconnect_count += 1
        self.recent.clear()
        self.sync_opaque = None  # what was sent since the last sync is lost with the connection
        self.pending_frame_count = 0

    def poll(self) -> None:
        """Read what the broker sent; note the sync's answer; reconnect if it closed."""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.reconnect()
                return
            self.reader.receive_data(data)
            try:
                while isinstance(command := self.reader.next_command(), RemotingCommand):
                    if command.flag & FLAG_RESPONSE and command.opaque == self.sync_opaque:
                        self.sync_opaque = None
                        self.synced_frame_count += self.pending_frame_count
                        self.pending_frame_count = 0
            except RemoteProtocolError as error:
                raise AssertionError(f"the broker sent what its codec refuses: {error}") from None

    def send(self, frame: bytes, connections: list[FuzzConnection], deadline: float) -> bool:
        """Write `frame`; False if the connection broke first (it is made again)."""
        view = memoryview(frame)
        while view:
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                sent = 0
            except (BrokenPipeError, ConnectionResetError):
                self.reconnect()
                return False  # the rest of this frame is dropped with the old connection
            view = view[sent:]
            if view:
                assert time.monotonic() < deadline, "the broker stopped reading"
                for connection in connections:
                    connection.poll()
                time.sleep(0.0002)
        self.pending_frame_count += 1
        return True

    def send_sync(self, opaque: int, connections: list[FuzzConnection], deadline: float) -> None:
        """Send an MQBOX_NOOP; poll() notes its answer: the broker decoded everything before."""
        header = orjson.dumps({"code": MQBOX_NOOP, "opaque": opaque, "flag": 0, "extFields": {}})
        frame = FRAME_PREFIX.pack(4 + len(header), len(header)) + header
        while not self.send(frame, connections, deadline):
            pass  # made again: send it on the new connection
        self.pending_frame_count -= 1  # the sync is no fuzz frame
        self.sync_opaque = opaque

    def close(self) -> None:
        self.sock.close()


def broker_memory_bytes(appliance: Appliance) -> int:
    """Pss_Anon + Pss_Shmem of the supervisor and every process under it."""
    root = psutil.Process(appliance.process.pid)
    total = 0
    for process in (root, *root.children(recursive=True)):
        fields = ops.smaps_rollup(process.pid)
        total += fields.get("Pss_Anon", 0) + fields.get("Pss_Shmem", 0)
    return total


def broker_pids(appliance: Appliance) -> frozenset[int]:
    return frozenset(p.pid for p in psutil.Process(appliance.process.pid).children(recursive=True))


def unexpected_failures(home: Path) -> list[str]:
    """The lines a request boundary logged (resources.FailureLog), from every role's log."""
    lines: list[str] = []
    for path in sorted((home / "logs").glob("*.log")):
        lines += [
            line for line in path.read_text(errors="replace").splitlines() if "unexpected " in line
        ]
    return lines


def send_and_pull_work(appliance: Appliance) -> None:
    client = FrontClient("127.0.0.1", appliance.broker_port)
    try:
        header = SendMessageRequestHeader("FuzzPG", "FuzzAfter", "TBW102", 1, 0, 0, 1, 0)
        created = client.call(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            UpdateAndCreateTopicRequestHeader("FuzzAfter", "TBW102", 1, 1, 6).to_ext(),
        )
        assert created.code == ResponseCode.SUCCESS, created.remark
        sent = client.call(RequestCode.SEND_MESSAGE_V2, header.to_ext_v2(), b"after the fuzz")
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        deadline = time.monotonic() + QUIET_WAIT_S
        while True:
            pull = pull_everything_header("FuzzAfter", 0)
            pulled = client.call(RequestCode.PULL_MESSAGE, pull.to_ext())
            if pulled.code == ResponseCode.SUCCESS:
                assert b"after the fuzz" in pulled.body
                return
            assert pulled.code == ResponseCode.PULL_NOT_FOUND, pulled.remark
            assert time.monotonic() < deadline, "the message sent after the fuzz never came"
            time.sleep(0.02)
    finally:
        client.close()


def run_fuzz(appliance: Appliance, frame_count: int, seed: int) -> dict[str, Any]:
    """Send `frame_count` frames, SYNC_EVERY at a time per connection, each batch followed by a
    sync request whose answer the next batch waits for (the broker sets the pace); returns what
    the run measured."""
    maker = FrameMaker(seed)
    connections = [FuzzConnection(appliance.broker_port) for _ in range(CONNECTION_COUNT)]
    memory_warm_bytes = 0
    started = time.monotonic()
    sync_opaques = itertools.count(SYNC_OPAQUE_FIRST)
    number = 0
    try:
        while number < frame_count:
            for connection in connections:
                deadline = time.monotonic() + QUIET_WAIT_S
                for _ in range(min(SYNC_EVERY, frame_count - number)):
                    if number == int(frame_count * WARM_UP_SHARE):
                        memory_warm_bytes = broker_memory_bytes(appliance)
                    if number % PROGRESS_EVERY == 0 and number:
                        progress = f"{number} frames, {time.monotonic() - started:.0f} s"
                        print(progress, file=sys.stderr, flush=True)  # noqa: T201
                    frame, then_close = maker.frame()
                    connection.recent.append(maker.last_kind.encode() + b" " + frame[:300])
                    connection.send(frame, connections, deadline)
                    number += 1
                    if then_close:
                        connection.reconnect()
                connection.send_sync(next(sync_opaques), connections, deadline)
            deadline = time.monotonic() + QUIET_WAIT_S
            while any(connection.sync_opaque is not None for connection in connections):
                stuck = [list(c.recent) for c in connections if c.sync_opaque is not None]
                assert time.monotonic() < deadline, f"the broker stopped answering after {stuck}"
                for connection in connections:
                    connection.poll()
                time.sleep(0.0002)
    finally:
        for connection in connections:
            connection.close()
    return {
        "seed": seed,
        "frames": frame_count,
        "frames_synced": sum(connection.synced_frame_count for connection in connections),
        "secs": round(time.monotonic() - started, 1),
        "kinds": maker.counts,
        "reconnects": sum(connection.reconnect_count for connection in connections),
        "memory_warm_bytes": memory_warm_bytes,
    }


def fuzz_and_check(appliance: Appliance, frame_count: int) -> None:
    seed = int(os.environ.get(SEED_ENV, SEED_DEFAULT))
    before = broker_pids(appliance)
    report = run_fuzz(appliance, frame_count, seed)
    send_and_pull_work(appliance)  # also waits out what the fuzz left in flight
    memory_end_bytes = broker_memory_bytes(appliance)
    growth_bytes = memory_end_bytes - report["memory_warm_bytes"]
    print(json.dumps({**report, "memory_end_bytes": memory_end_bytes}))  # noqa: T201
    assert broker_pids(appliance) == before, "a process of the broker died"
    state = read_state(appliance.home) or {}
    assert state.get("broker_restarts") == 0
    assert not [role for role in state["roles"] if role.get("quarantined")]
    assert appliance.process.poll() is None
    assert not unexpected_failures(appliance.home), unexpected_failures(appliance.home)[:20]
    assert growth_bytes <= MEMORY_GROWTH_BYTES_MAX, f"memory grew by {growth_bytes >> 20} MiB"


@pytest.fixture
def appliance(tmp_path: Path) -> Iterator[Appliance]:
    pids: list[int] = []
    with running_appliance(tmp_path / "fuzz", pids, FUZZ_CONF) as running:
        client = FrontClient("127.0.0.1", running.broker_port)
        try:
            for name in (TOPIC, "%RETRY%FuzzGroup"):
                header = UpdateAndCreateTopicRequestHeader(name, "TBW102", 4, 4, 6)
                created = client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
                assert created.code == ResponseCode.SUCCESS, created.remark
        finally:
            client.close()
        yield running


def test_templates_cover_every_served_code() -> None:
    served = set(ROUTES)
    assert served <= {code for code, _ext, _body in TEMPLATES}


def test_random_and_mutated_frames_kill_nothing_and_leak_nothing(appliance: Appliance) -> None:
    fuzz_and_check(appliance, FRAME_COUNT_DEFAULT)


@pytest.mark.slow
def test_a_million_random_and_mutated_frames_kill_nothing_and_leak_nothing(
    appliance: Appliance,
) -> None:
    fuzz_and_check(appliance, FRAME_COUNT_SLOW)

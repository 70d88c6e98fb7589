"""Goal: the send processor stores exactly what a SEND asks for (one message, a Java batch on 320,
a C++ batch on code 10 with batch=1, whole-batch compressed or not) as self-consistent records,
answers with the right msgIds, queue and first queue index, refuses bad sends with the Java
broker's response codes and clear remarks, auto-creates topics from TBW102 (and %RETRY% topics
with one queue), and the store writer acknowledges ASYNC_FLUSH sends after the page-cache write
and SYNC_FLUSH sends after a flush that covers them, with FLUSH_DISK_TIMEOUT only for a flush
that truly timed out. The batch kernel makes byte for byte what message.encode_record makes.

Method: the store writer, the dispatcher and the send and pull processors run as objects in this
process (`StoreGraph`) over real rings and a real store in tmp_path; a test hands a Request to a
processor's `handle`, turns every role's loop once per `pump()` and reads the REPLY parcels the
processors write toward the codec, reading sendfile runs straight from the commit-log files.
Records are read back with message.decode_record (CRC checked). test_pull.py uses the harness too.
"""

from __future__ import annotations

import dataclasses
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqbox.config import BrokerConfig, FlushDiskType, PoolConfig
from mqbox.ipc import names
from mqbox.ipc.ring import Ring
from mqbox.message import (
    SYSFLAG_COMPRESSED,
    BatchElement,
    MessageToStore,
    StoredMessage,
    decode_offset_msg_id,
    decode_record,
    encode_batch,
    encode_offset_msg_id,
    encode_properties_str,
    encode_record,
    pack_host,
)
from mqbox.message_kernels import split_batch
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.command import decode_command
from mqbox.protocol.headers import SendMessageRequestHeader
from mqbox.server import parcels, transport
from mqbox.server.roles.dispatcher import DispatcherRole
from mqbox.server.roles.processors import Request
from mqbox.server.roles.processors.pull import PullProcessor
from mqbox.server.roles.processors.send import (
    SendProcessor,
    count_unterminated_properties,
    encode_batch_records,
    offset_msg_ids,
)
from mqbox.server.roles.processors.topics import TopicConfigStore
from mqbox.server.roles.store_writer import StoreWriter
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RoleKind, broker_topology
from mqbox.server.transport import Inbox
from mqbox.store.config_files import TopicConfig
from mqbox.store.layout import abort_path, commit_log_dir, segment_name

RING_CAPACITY_BYTES = 1 << 20
BROKER_PORT = 10911
STORE_HOST = pack_host("127.0.0.1", BROKER_PORT)
PUMP_DEADLINE_S = 10.0


def _no_report(info: object) -> None:
    """report_ready of a role that is not a process."""


@dataclasses.dataclass
class Reply:
    """One REPLY a processor wrote toward the codec."""

    conn_id: int
    command: RemotingCommand
    run_count: int


def small_broker(**overrides: object) -> BrokerConfig:
    """A broker with small files: 4 MiB commit-log segments, 64-entry consume-queue segments."""
    pools = PoolConfig(
        reactor_count=1,
        codec_count=1,
        worker_count=1,
        send_processor_count=1,
        pull_processor_count=1,
        admin_processor_count=1,
    )
    fields: dict[str, object] = {
        "pools": pools,
        "listen_port": BROKER_PORT,
        "broker_ip1": "127.0.0.1",
        "commit_log_segment_size_bytes": 4 << 20,
        "consume_queue_entry_count": 64,
        "max_message_size_bytes": 256 * 1024,
        **overrides,
    }
    return BrokerConfig(**fields)  # type: ignore[arg-type]


class StoreGraph:
    """Store writer, dispatcher, send and pull processors of one broker, in this process."""

    def __init__(
        self,
        instance: str,
        home: Path,
        broker: BrokerConfig,
        *,
        start_pull: bool = True,
        pull_options: dict[str, object] | None = None,
        dispatcher_options: dict[str, int] | None = None,
    ) -> None:
        self.instance = instance
        self.home = home
        self.store_root = home / "store"
        self.broker = broker
        self.topology = broker_topology(instance, broker, RING_CAPACITY_BYTES)
        self.rings = [Ring.create(spec.name, spec.capacity_bytes) for spec in self.topology.rings]
        self.writer = StoreWriter(self.context(RoleKind.STORE_WRITER), spin_ns_max=0)
        self.dispatcher = DispatcherRole(
            self.context(RoleKind.DISPATCHER), spin_ns_max=0, **(dispatcher_options or {})
        )
        self.send = SendProcessor(self.context(RoleKind.SEND), spin_ns_max=0)
        self.pull: PullProcessor | None = None
        self._pull_options = {"error_delay_ms": 0, **(pull_options or {})}
        if start_pull:
            self.start_pull()
        self.reply_inboxes = [
            Inbox(Ring.attach(self.topology.ring(producer, "codec.0").name), producer)
            for producer in ("send.0", "pull.0")
        ]
        self.replies: list[Reply] = []
        self._opaque = 0

    def context(self, kind: RoleKind) -> RoleContext:
        return RoleContext(
            instance=self.instance,
            home=self.home,
            store_root=self.store_root,
            broker=self.broker,
            topology=self.topology,
            role=self.topology.roles_of(kind)[0],
            listen_socket=None,
            broker_address=f"127.0.0.1:{BROKER_PORT}",
            report_ready=_no_report,
        )

    def start_pull(self) -> PullProcessor:
        self.pull = PullProcessor(
            self.context(RoleKind.PULL),
            spin_ns_max=0,
            **self._pull_options,  # type: ignore[arg-type]
        )
        return self.pull

    # -- driving ----------------------------------------------------------------------------------

    def pump(self, rounds: int = 1) -> None:
        for _ in range(rounds):
            self.send.run_once(0)
            self.writer.run_once(0)
            self.send.run_once(0)
            self.dispatcher.run_once(0)
            if self.pull is not None:
                self.pull.run_once(0)
            self.collect()

    def collect(self) -> None:
        for inbox in self.reply_inboxes:
            batch = inbox.drain_nowait(transport.BATCH_COUNT_MAX)
            for parcel_type, buffer, offset, size in inbox.parcels(batch):
                assert parcel_type == parcels.REPLY
                self.replies.append(self._decode_reply(buffer, offset, size))
            inbox.release(batch)

    def _decode_reply(self, buffer: parcels.Buffer, offset: int, size: int) -> Reply:
        head = parcels.unpack_reply_head(buffer, offset)
        at = offset + parcels.REPLY_HEAD_SIZE_BYTES
        runs = parcels.unpack_runs(buffer, at, head.run_count)
        at += head.run_count * parcels.RUN_SIZE_BYTES
        header = bytes(buffer[at : at + head.header_size])
        at += head.header_size
        if runs:
            body = b"".join(self.read_run(run) for run in runs)
            assert len(body) == head.body_size
        else:
            body = bytes(buffer[at : offset + size])
        command = decode_command(head.serialize_type, header, body)
        return Reply(head.conn_id, command, head.run_count)

    def read_run(self, run: parcels.Run) -> bytes:
        path = commit_log_dir(self.store_root) / segment_name(run.segment_start)
        with path.open("rb") as file:
            file.seek(run.file_offset)
            data = file.read(run.size)
        assert len(data) == run.size
        return data

    def next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def submit(
        self, processor: SendProcessor | PullProcessor, command: RemotingCommand, conn_id: int = 1
    ) -> Request:
        request = Request.of(command, conn_id)
        request.peer_ipv4 = bytes([10, 1, 2, 3])
        request.peer_port = 40_000 + conn_id
        processor.handle(request)
        return request

    def wait_reply(self, opaque: int, deadline_s: float = PUMP_DEADLINE_S) -> RemotingCommand:
        deadline = time.monotonic() + deadline_s
        while True:
            for index, reply in enumerate(self.replies):
                if reply.command.opaque == opaque:
                    del self.replies[index]
                    return reply.command
            assert time.monotonic() < deadline, f"no reply to opaque {opaque}"
            self.pump()

    def has_reply(self, opaque: int) -> bool:
        self.collect()
        return any(reply.command.opaque == opaque for reply in self.replies)

    def send_command(
        self,
        code: int,
        header: SendMessageRequestHeader,
        body: bytes,
        *,
        conn_id: int = 1,
    ) -> RemotingCommand:
        ext = header.to_ext() if code == RequestCode.SEND_MESSAGE else header.to_ext_v2()
        opaque = self.next_opaque()
        self.submit(self.send, make_request(code, opaque, ext, body=body), conn_id)
        return self.wait_reply(opaque)

    def read_record(self, log_offset_bytes: int) -> StoredMessage:
        segment_size = self.broker.commit_log_segment_size_bytes
        segment_start = log_offset_bytes - log_offset_bytes % segment_size
        path = commit_log_dir(self.store_root) / segment_name(segment_start)
        data = path.read_bytes()
        return decode_record(data, log_offset_bytes - segment_start)

    def close(self) -> None:
        """Stop the roles as the supervisor would (pull, send, dispatcher, writer), then release
        the rings and segments."""
        for processor in (self.pull, self.send):
            if processor is not None:
                processor.epoll.close()
        self.dispatcher.close()
        self.writer.close()
        for ring in self.rings:
            ring.unlink()
            ring.close()
        names.unlink_instance(self.instance)


def send_header(topic: str, **fields: object) -> SendMessageRequestHeader:
    values: dict[str, object] = {
        "producer_group": "PG",
        "topic": topic,
        "default_topic": "TBW102",
        "default_topic_queue_nums": 4,
        "queue_id": 0,
        "sys_flag": 0,
        "born_timestamp_ms": 1_700_000_000_000,
        "flag": 0,
        "properties": "",
        **fields,
    }
    return SendMessageRequestHeader(**values)  # type: ignore[arg-type]


def properties_text(**values: str) -> str:
    return encode_properties_str(values).decode("utf-8", "surrogateescape")


def msg_ids(response: RemotingCommand) -> list[tuple[bytes, int]]:
    return [decode_offset_msg_id(msg_id) for msg_id in response.ext_fields["msgId"].split(",")]


@pytest.fixture
def graph(shm_instance: str, tmp_path: Path) -> Iterator[StoreGraph]:
    built = StoreGraph(shm_instance, tmp_path / "home", small_broker())
    try:
        yield built
    finally:
        built.close()


# --- single messages ----------------------------------------------------------------------------


def test_a_single_message_is_stored_and_answered_with_its_offset_msg_id(graph: StoreGraph) -> None:
    properties = properties_text(TAGS="TagA", KEYS="k1 k2", UNIQ_KEY="ABC", WAIT="true")
    header = send_header("TopicSingle", properties=properties, flag=7, sys_flag=0)
    graph.send.topics.create_if_absent(TopicConfig("TopicSingle", 4, 4, 6))
    first = graph.send_command(RequestCode.SEND_MESSAGE, header, b"hello")
    second = graph.send_command(RequestCode.SEND_MESSAGE, header, b"world")
    assert first.code == ResponseCode.SUCCESS, first.remark
    assert first.ext_fields["queueId"] == "0"
    assert first.ext_fields["queueOffset"] == "0"
    assert second.ext_fields["queueOffset"] == "1"
    assert all(isinstance(value, str) for value in first.ext_fields.values())
    [(host, offset)] = msg_ids(first)
    assert host == STORE_HOST
    assert offset == 0
    stored = graph.read_record(offset)
    assert stored.body == b"hello"
    assert stored.topic == "TopicSingle"
    assert stored.properties == properties.encode()
    assert stored.flag == 7
    assert stored.queue_id == 0
    assert stored.queue_index == 0
    assert stored.log_offset_bytes == 0
    assert stored.born_host == bytes([10, 1, 2, 3]) + struct.pack(">i", 40_001)
    assert stored.store_host == STORE_HOST
    assert stored.born_timestamp_ms == header.born_timestamp_ms
    [(_, second_offset)] = msg_ids(second)
    assert second_offset == stored.size_bytes
    assert graph.read_record(second_offset).queue_index == 1


def test_send_message_v2_reads_the_single_letter_header(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("TopicV2", 2, 2, 6))
    header = send_header("TopicV2", queue_id=1, properties=properties_text(TAGS="x"))
    response = graph.send_command(RequestCode.SEND_MESSAGE_V2, header, b"v2 body")
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["queueId"] == "1"
    [(_, offset)] = msg_ids(response)
    stored = graph.read_record(offset)
    assert (stored.body, stored.queue_id, stored.topic) == (b"v2 body", 1, "TopicV2")


def test_a_compressed_single_body_is_stored_as_it_came_with_its_flag(graph: StoreGraph) -> None:
    body = zlib.compress(b"z" * 5000, 5)
    graph.send.topics.create_if_absent(TopicConfig("TopicZ", 1, 1, 6))
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("TopicZ", sys_flag=SYSFLAG_COMPRESSED), body
    )
    assert response.code == ResponseCode.SUCCESS
    stored = graph.read_record(msg_ids(response)[0][1])
    assert stored.body == body
    assert stored.sysflag == SYSFLAG_COMPRESSED


def test_a_negative_queue_id_picks_a_write_queue(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("TopicRandom", 4, 3, 6))
    seen = set()
    for _ in range(30):
        response = graph.send_command(
            RequestCode.SEND_MESSAGE, send_header("TopicRandom", queue_id=-1), b"r"
        )
        assert response.code == ResponseCode.SUCCESS
        seen.add(int(response.ext_fields["queueId"]))
    assert seen <= {0, 1, 2}
    assert len(seen) > 1


# --- batches ------------------------------------------------------------------------------------


def batch_elements(count: int, prefix: str = "m") -> list[BatchElement]:
    return [
        BatchElement(
            body=f"{prefix}-{index}".encode() * (index % 3 + 1),
            flag=index,
            properties=encode_properties_str(
                {"UNIQ_KEY": f"U{index:04d}", "TAGS": f"T{index % 2}"}
            ),
        )
        for index in range(count)
    ]


def check_batch_stored(
    graph: StoreGraph, response: RemotingCommand, elements: list[BatchElement], topic: str
) -> None:
    assert response.code == ResponseCode.SUCCESS, response.remark
    ids = msg_ids(response)
    assert len(ids) == len(elements)
    first_index = int(response.ext_fields["queueOffset"])
    queue_id = int(response.ext_fields["queueId"])
    for number, ((host, offset), element) in enumerate(zip(ids, elements, strict=True)):
        assert host == STORE_HOST
        stored = graph.read_record(offset)
        assert stored.body == element.body
        assert stored.properties == element.properties
        assert stored.flag == element.flag
        assert stored.topic == topic
        assert stored.queue_id == queue_id
        assert stored.queue_index == first_index + number
        assert stored.sysflag & SYSFLAG_COMPRESSED == 0


def test_a_java_batch_on_320_stores_each_element_as_its_own_message(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("TopicBatch", 2, 2, 6))
    elements = batch_elements(50)
    header = send_header("TopicBatch", queue_id=1, batch=True)
    response = graph.send_command(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch(elements))
    check_batch_stored(graph, response, elements, "TopicBatch")
    again = graph.send_command(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch(elements[:3]))
    assert again.ext_fields["queueOffset"] == "50"


def test_a_cpp_batch_on_code_10_with_batch_1_compressed_whole_is_split(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("TopicCpp", 1, 1, 6))
    elements = batch_elements(200, prefix="compressed element")
    plain = encode_batch(elements)
    assert len(plain) >= 4096  # C++ 1.2.3 compresses such a batch as a whole
    header = send_header(
        "TopicCpp", sys_flag=SYSFLAG_COMPRESSED, properties=properties_text(WAIT="true")
    )
    ext = header.to_ext()
    ext["batch"] = "1"
    opaque = graph.next_opaque()
    command = make_request(RequestCode.SEND_MESSAGE, opaque, ext, body=zlib.compress(plain, 5))
    graph.submit(graph.send, command)
    check_batch_stored(graph, graph.wait_reply(opaque), elements, "TopicCpp")


def test_an_uncompressed_cpp_batch_and_batch_true_are_batches_too(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("TopicCpp2", 1, 1, 6))
    elements = batch_elements(3)
    for flag_text in ("1", "true"):
        ext = send_header("TopicCpp2").to_ext()
        ext["batch"] = flag_text
        opaque = graph.next_opaque()
        graph.submit(
            graph.send,
            make_request(RequestCode.SEND_MESSAGE, opaque, ext, body=encode_batch(elements)),
        )
        check_batch_stored(graph, graph.wait_reply(opaque), elements, "TopicCpp2")


@settings(max_examples=60)
@given(
    elements=st.lists(
        st.builds(
            BatchElement,
            body=st.binary(max_size=300),
            flag=st.integers(-(2**31), 2**31 - 1),
            properties=st.binary(max_size=60),
        ),
        min_size=1,
        max_size=12,
    ),
    topic=st.text(alphabet="abcXYZ09%|_-", min_size=1, max_size=127),
    queue_id=st.integers(0, 2**31 - 1),
    sysflag=st.integers(0, 0x0F),
    born_timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    reconsume_times=st.integers(-(2**31), 2**31 - 1),
)
def test_the_batch_kernel_makes_what_encode_record_makes(
    elements: list[BatchElement],
    topic: str,
    queue_id: int,
    sysflag: int,
    born_timestamp_ms: int,
    reconsume_times: int,
) -> None:
    batch = np.frombuffer(encode_batch(elements), dtype=np.uint8)
    offsets = np.zeros(len(elements), dtype=np.int64)
    sizes = np.zeros(len(elements), dtype=np.int32)
    assert split_batch(batch, 1 << 20, offsets, sizes) == len(elements)
    born_host = bytes([192, 168, 0, 7]) + struct.pack(">i", 1234)
    topic_bytes = topic.encode()
    unterminated_count = count_unterminated_properties(batch, offsets, sizes, len(elements))
    assert unterminated_count == sum(
        1 for element in elements if element.properties and element.properties[-1] != 0x02
    )
    out_size_bytes = batch.size + len(elements) * (69 + len(topic_bytes)) + unterminated_count
    out = np.full(out_size_bytes, 0xEE, dtype=np.uint8)
    out_sizes = np.zeros(len(elements), dtype=np.int32)
    written = encode_batch_records(
        batch,
        offsets,
        sizes,
        len(elements),
        np.frombuffer(topic_bytes, dtype=np.uint8),
        queue_id,
        sysflag,
        born_timestamp_ms,
        np.frombuffer(born_host, dtype=np.uint8),
        reconsume_times,
        out,
        out_sizes,
    )
    expected = b"".join(
        bytes(
            encode_record(
                MessageToStore(
                    topic,
                    queue_id,
                    element.body,
                    element.properties,
                    element.flag,
                    sysflag,
                    born_timestamp_ms,
                    born_host,
                    reconsume_times,
                )
            )
        )
        for element in elements
    )
    assert written == len(expected) == out.size
    assert out.tobytes() == expected
    assert out_sizes.sum() == written


@given(
    first=st.integers(0, 2**62),
    sizes=st.lists(st.integers(1, 2**31 - 1), min_size=1, max_size=20),
)
def test_offset_msg_ids_match_the_one_by_one_encoding(first: int, sizes: list[int]) -> None:
    joined = offset_msg_ids(STORE_HOST, first, np.array(sizes, dtype=np.int32))
    offsets = [first + sum(sizes[:index]) for index in range(len(sizes))]
    assert joined.split(",") == [encode_offset_msg_id(STORE_HOST, offset) for offset in offsets]


# --- refusals -----------------------------------------------------------------------------------


def expect_refused(response: RemotingCommand, code: int, *words: str) -> None:
    assert response.code == code, (response.code, response.remark)
    assert response.remark
    for word in words:
        assert word in response.remark, response.remark


def test_bad_topic_names_are_refused_with_system_error(graph: StoreGraph) -> None:
    for topic in ("", "has space", "x" * 128, "bad/slash"):
        response = graph.send_command(RequestCode.SEND_MESSAGE, send_header(topic), b"x")
        expect_refused(response, ResponseCode.SYSTEM_ERROR, "topic")


def test_the_schedule_topic_takes_no_direct_sends(graph: StoreGraph) -> None:
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("SCHEDULE_TOPIC_XXXX"), b"x"
    )
    expect_refused(response, ResponseCode.NO_PERMISSION, "SCHEDULE_TOPIC_XXXX")


def test_an_unknown_topic_is_created_from_tbw102(graph: StoreGraph) -> None:
    response = graph.send_command(
        RequestCode.SEND_MESSAGE,
        send_header("AutoTopic", default_topic_queue_nums=3, queue_id=2),
        b"auto",
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    created = TopicConfigStore(graph.store_root, graph.broker).get("AutoTopic")
    assert created is not None
    assert (created.read_queue_nums, created.write_queue_nums, created.perm) == (3, 3, 6)
    bigger = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("AutoTopic2", default_topic_queue_nums=99), b"x"
    )
    assert bigger.code == ResponseCode.SUCCESS
    created = graph.send.topics.get("AutoTopic2")
    assert created is not None
    assert created.write_queue_nums == graph.broker.default_topic_queue_nums  # TBW102's 8


def test_an_unknown_retry_topic_gets_one_queue(graph: StoreGraph) -> None:
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("%RETRY%GroupA", default_topic=""), b"retry"
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    created = graph.send.topics.get("%RETRY%GroupA")
    assert created is not None
    assert (created.read_queue_nums, created.write_queue_nums, created.perm) == (1, 1, 6)


def test_an_unknown_topic_without_a_template_gets_topic_not_exist(graph: StoreGraph) -> None:
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("NoTemplate", default_topic="NotThere"), b"x"
    )
    expect_refused(response, ResponseCode.TOPIC_NOT_EXIST, "NoTemplate")
    graph.send.topics.create_if_absent(TopicConfig("NoInherit", 4, 4, 6))
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("NoTemplate", default_topic="NoInherit"), b"x"
    )
    expect_refused(response, ResponseCode.TOPIC_NOT_EXIST)


def test_auto_create_disabled_gives_topic_not_exist(shm_instance: str, tmp_path: Path) -> None:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(auto_create_topic_enable=False)
    )
    try:
        assert graph.send.topics.get("TBW102") is None
        response = graph.send_command(RequestCode.SEND_MESSAGE, send_header("Unknown"), b"x")
        expect_refused(response, ResponseCode.TOPIC_NOT_EXIST, "Unknown")
    finally:
        graph.close()


def test_a_topic_without_write_permission_is_refused(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("ReadOnly", 1, 1, 4))
    response = graph.send_command(RequestCode.SEND_MESSAGE, send_header("ReadOnly"), b"x")
    expect_refused(response, ResponseCode.NO_PERMISSION, "ReadOnly")


def test_a_queue_id_past_the_queue_count_is_refused(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("FourQueues", 4, 2, 6))
    assert (
        graph.send_command(
            RequestCode.SEND_MESSAGE, send_header("FourQueues", queue_id=3), b"x"
        ).code
        == ResponseCode.SUCCESS
    )
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("FourQueues", queue_id=4), b"x"
    )
    expect_refused(response, ResponseCode.SYSTEM_ERROR, "queueId[4]")


def test_oversized_bodies_and_properties_are_message_illegal(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("Sizes", 1, 1, 6))
    size_max = graph.broker.max_message_size_bytes
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("Sizes"), b"b" * (size_max + 1)
    )
    expect_refused(response, ResponseCode.MESSAGE_ILLEGAL, "maxMessageSize")
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("Sizes"), b"b" * (size_max - 10)
    )
    expect_refused(response, ResponseCode.MESSAGE_ILLEGAL, "stored message")
    response = graph.send_command(
        RequestCode.SEND_MESSAGE, send_header("Sizes", properties="K\x01" + "v" * 40_000), b"x"
    )
    expect_refused(response, ResponseCode.MESSAGE_ILLEGAL, "properties")
    ok = graph.send_command(RequestCode.SEND_MESSAGE, send_header("Sizes"), b"b" * 1000)
    assert ok.code == ResponseCode.SUCCESS


def test_bad_batches_are_message_illegal(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("Batches", 1, 1, 6))
    good = encode_batch(batch_elements(2))
    cases = [
        (send_header("Batches", batch=True), b"", "empty"),
        (send_header("Batches", batch=True), good[:-1], "malformed"),
        (send_header("Batches", batch=True, properties=properties_text(DELAY="3")), good, "DELAY"),
        (send_header("Batches", batch=True, sys_flag=0x4), good, "transaction"),
        (send_header("%RETRY%G", batch=True, default_topic=""), good, "RETRY"),
        (send_header("Batches", batch=True, sys_flag=SYSFLAG_COMPRESSED), b"not zlib", "zlib"),
    ]
    for header, body, word in cases:
        response = graph.send_command(RequestCode.SEND_BATCH_MESSAGE, header, body)
        expect_refused(response, ResponseCode.MESSAGE_ILLEGAL, word)
    size_max = graph.broker.max_message_size_bytes
    bomb = zlib.compress(bytes(size_max + 1))
    response = graph.send_command(
        RequestCode.SEND_BATCH_MESSAGE,
        send_header("Batches", batch=True, sys_flag=SYSFLAG_COMPRESSED),
        bomb,
    )
    expect_refused(response, ResponseCode.MESSAGE_ILLEGAL)


# --- the store writer ---------------------------------------------------------------------------


def test_the_abort_marker_lives_while_the_writer_runs_and_offsets_survive_a_restart(
    shm_instance: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    graph = StoreGraph(shm_instance, home, small_broker())
    try:
        assert abort_path(graph.store_root).exists()
        graph.send.topics.create_if_absent(TopicConfig("Durable", 1, 1, 6))
        for _ in range(3):
            response = graph.send_command(RequestCode.SEND_MESSAGE, send_header("Durable"), b"d")
            assert response.code == ResponseCode.SUCCESS
    finally:
        graph.close()
    assert not abort_path(graph.store_root).exists()
    again = StoreGraph(shm_instance + "b", home, small_broker())
    try:
        assert again.writer.recovery_report.was_clean
        response = again.send_command(RequestCode.SEND_MESSAGE, send_header("Durable"), b"d")
        assert response.ext_fields["queueOffset"] == "3"
        assert again.dispatcher.counters.entry_count(b"Durable", 0) == 4
    finally:
        again.close()


def test_sync_flush_acks_after_a_flush_that_covers_the_send(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    )
    try:
        graph.send.topics.create_if_absent(TopicConfig("Sync", 1, 1, 6))
        opaques = []
        for _ in range(20):
            opaque = graph.next_opaque()
            ext = send_header("Sync", properties=properties_text(WAIT="true")).to_ext()
            graph.submit(graph.send, make_request(RequestCode.SEND_MESSAGE, opaque, ext, body=b"s"))
            opaques.append(opaque)
        for opaque in opaques:
            response = graph.wait_reply(opaque)
            assert response.code == ResponseCode.SUCCESS
            [(_, offset)] = msg_ids(response)
            assert graph.writer.positions.flushed_log_offset_bytes > offset
        statistics = graph.writer.statistics()
        assert statistics.sync_waits >= 1
        assert statistics.sync_timeouts == 0
        assert statistics.flush_count < 20  # many sends shared one flush
    finally:
        graph.close()


def test_flush_disk_timeout_only_when_the_flush_truly_timed_out(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = StoreGraph(
        shm_instance,
        tmp_path / "home",
        small_broker(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=50),
    )
    try:
        graph.send.topics.create_if_absent(TopicConfig("Stuck", 1, 1, 6))
        graph.writer.flusher.stop()  # the disk stops answering
        no_wait = graph.send_command(
            RequestCode.SEND_MESSAGE,
            send_header("Stuck", properties=properties_text(WAIT="false")),
            b"w",
        )
        assert no_wait.code == ResponseCode.SUCCESS
        waiting = graph.send_command(RequestCode.SEND_MESSAGE, send_header("Stuck"), b"w")
        assert waiting.code == ResponseCode.FLUSH_DISK_TIMEOUT
        assert waiting.ext_fields["queueOffset"] == "1"  # stored all the same
        assert graph.writer.statistics().sync_timeouts == 1
    finally:
        graph.close()


def test_appends_wait_in_order_when_the_writer_ring_is_full(graph: StoreGraph) -> None:
    graph.send.topics.create_if_absent(TopicConfig("Backlog", 1, 1, 6))
    opaques = []
    body = b"q" * 60_000
    for _ in range(40):  # 2.4 MB of records: more than the 1 MiB ring holds
        opaque = graph.next_opaque()
        ext = send_header("Backlog").to_ext()
        graph.submit(graph.send, make_request(RequestCode.SEND_MESSAGE, opaque, ext, body=body))
        graph.send.run_once(0)  # flushes what the ring takes; the writer does not run yet
        opaques.append(opaque)
    assert graph.send.writer_outbox.pending_count > 0
    offsets = [int(graph.wait_reply(opaque).ext_fields["queueOffset"]) for opaque in opaques]
    assert offsets == list(range(40))


def test_an_append_over_the_ring_inline_maximum_travels_as_a_spill_file(
    shm_instance: str, tmp_path: Path
) -> None:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(max_message_size_bytes=1 << 20)
    )
    try:
        graph.send.topics.create_if_absent(TopicConfig("Spilled", 1, 1, 6))
        elements = [BatchElement(bytes([n]) * 100_000, n) for n in range(9)]
        response = graph.send_command(
            RequestCode.SEND_BATCH_MESSAGE,
            send_header("Spilled", batch=True),
            encode_batch(elements),
        )
        check_batch_stored(graph, response, elements, "Spilled")
        assert graph.send.writer_outbox.statistics().spill_count == 1
    finally:
        graph.close()

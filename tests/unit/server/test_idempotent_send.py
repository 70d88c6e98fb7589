"""Goal: the idempotent window, end to end inside one broker: a SEND with `mqboxIdempotent=true`
whose (topic, UNIQ_KEY) the broker stored within the window is answered with the first result
(msgId, queue, queue offset) and `mqboxDuplicates`, and stores nothing; a batch stores only its
new elements and answers every element by its own record; a send that does not ask, or goes to
another topic, is stored as always; after the store writer restarts, the window is rebuilt from
the commit log and still answers the repeat with the first result.

Method: StoreGraph (tests/unit/server/test_send.py): store writer, dispatcher and send processor
as objects in this process over real rings and a real store in tmp_path. Requests are built by
hand with the extra header field; records are read back from the commit-log files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqbox.message import BatchElement, encode_batch, encode_properties, encode_properties_str
from mqbox.protocol import RemotingCommand, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SEND_DUPLICATES_KEY, SEND_IDEMPOTENT_KEY
from mqbox.store.config_files import TopicConfig
from mqbox.store.idempotence import load_idempotent_topics
from tests.unit.server.test_send import StoreGraph, msg_ids, send_header, small_broker

TOPIC = "IdemTopic"


@pytest.fixture
def graph(shm_instance: str, tmp_path: Path) -> Iterator[StoreGraph]:
    built = StoreGraph(shm_instance, tmp_path / "home", small_broker(), start_pull=False)
    built.send.topics.create_if_absent(TopicConfig(TOPIC, 4, 4, 6))
    built.send.topics.create_if_absent(TopicConfig("OtherTopic", 4, 4, 6))
    try:
        yield built
    finally:
        built.close()


def send(
    graph: StoreGraph,
    uniq_key: str,
    body: bytes = b"body",
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    idempotent: bool = True,
) -> RemotingCommand:
    properties = encode_properties_str({"UNIQ_KEY": uniq_key, "WAIT": "true"}).decode()
    header = send_header(topic, queue_id=queue_id, properties=properties)
    ext = header.to_ext_v2()
    if idempotent:
        ext[SEND_IDEMPOTENT_KEY] = "true"
    opaque = graph.next_opaque()
    graph.submit(graph.send, make_request(RequestCode.SEND_MESSAGE_V2, opaque, ext, body=body))
    response = graph.wait_reply(opaque)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response


def send_batch(graph: StoreGraph, uniq_keys: list[str], *, queue_id: int = 1) -> RemotingCommand:
    elements = [
        BatchElement(
            f"element {key}".encode(), properties=encode_properties({b"UNIQ_KEY": key.encode()})
        )
        for key in uniq_keys
    ]
    header = send_header(TOPIC, queue_id=queue_id, batch=True)
    ext = header.to_ext_v2()
    ext[SEND_IDEMPOTENT_KEY] = "true"
    opaque = graph.next_opaque()
    command = make_request(RequestCode.SEND_BATCH_MESSAGE, opaque, ext, body=encode_batch(elements))
    graph.submit(graph.send, command)
    response = graph.wait_reply(opaque)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response


def answer(response: RemotingCommand) -> tuple[str, str, str]:
    return (
        response.ext_fields["msgId"],
        response.ext_fields["queueId"],
        response.ext_fields["queueOffset"],
    )


def test_a_repeated_idempotent_send_gets_the_first_answer_and_is_stored_once(
    graph: StoreGraph,
) -> None:
    first = send(graph, "KEY-1", b"first")
    assert SEND_DUPLICATES_KEY not in first.ext_fields
    again = send(graph, "KEY-1", b"a retry's body is not compared")
    assert answer(again) == answer(first)
    assert again.ext_fields[SEND_DUPLICATES_KEY] == "1"
    # A retry that went to another queue is told where the message really is.
    elsewhere = send(graph, "KEY-1", queue_id=2)
    assert answer(elsewhere) == answer(first)
    statistics = graph.writer.statistics()
    assert statistics.append_records == 1
    assert statistics.idempotent_duplicates == 2
    [(_, offset)] = msg_ids(first)
    assert graph.read_record(offset).body == b"first"
    assert send(graph, "KEY-2").ext_fields["queueOffset"] == "1"  # nothing went in between
    assert load_idempotent_topics(graph.store_root) == {TOPIC}


def test_sends_that_do_not_ask_or_go_elsewhere_are_stored_as_always(graph: StoreGraph) -> None:
    first = send(graph, "KEY-P")
    plain = send(graph, "KEY-P", idempotent=False)
    assert plain.ext_fields["queueOffset"] == "1"
    other_topic = send(graph, "KEY-P", topic="OtherTopic")
    assert other_topic.ext_fields["queueOffset"] == "0"
    assert SEND_DUPLICATES_KEY not in other_topic.ext_fields
    # The plain send's record is not in the window; the first one still is.
    assert answer(send(graph, "KEY-P")) == answer(first)
    assert graph.writer.statistics().append_records == 3


def test_a_batch_stores_its_new_elements_and_answers_each_by_its_own_record(
    graph: StoreGraph,
) -> None:
    first = send_batch(graph, ["A", "B"])
    assert first.ext_fields["queueOffset"] == "0"
    a_id, b_id = first.ext_fields["msgId"].split(",")
    second = send_batch(graph, ["B", "C"], queue_id=3)
    b_again, c_id = second.ext_fields["msgId"].split(",")
    assert b_again == b_id
    assert c_id not in (a_id, b_id)
    assert second.ext_fields["queueId"] == "1"  # B's queue, the first element's
    assert second.ext_fields["queueOffset"] == "1"  # B's index there
    assert second.ext_fields[SEND_DUPLICATES_KEY] == "1"
    [(_, c_offset)] = msg_ids(second)[1:]
    stored_c = graph.read_record(c_offset)
    assert stored_c.body == b"element C"
    assert stored_c.queue_id == 3
    assert stored_c.queue_index == 0
    everything = send_batch(graph, ["A", "B", "C"])
    assert everything.ext_fields["msgId"] == ",".join((a_id, b_id, c_id))
    assert everything.ext_fields[SEND_DUPLICATES_KEY] == "3"
    assert graph.writer.statistics().append_records == 3


def test_the_window_survives_a_store_writer_restart(shm_instance: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    graph = StoreGraph(shm_instance, home, small_broker(), start_pull=False)
    try:
        graph.send.topics.create_if_absent(TopicConfig(TOPIC, 4, 4, 6))
        first = send(graph, "KEY-R")
        batch = send_batch(graph, ["R1", "R2"])
    finally:
        graph.close()
    graph = StoreGraph(f"{shm_instance}r", home, small_broker(), start_pull=False)
    try:
        assert graph.writer.statistics().idempotent_rebuilt_keys == 3
        again = send(graph, "KEY-R")
        assert answer(again) == answer(first)
        assert send_batch(graph, ["R1", "R2"]).ext_fields["msgId"] == batch.ext_fields["msgId"]
        assert graph.writer.statistics().append_records == 0
    finally:
        graph.close()

"""The store writer's SYNC_MASTER acknowledgements (server/roles/store_writer.py).

Goal: (1) a SYNC_MASTER send with WAIT is answered only once a slave report (REPLICATED) covers
it, and one report releases every waiting send below it; (2) with no slave connected, or one that
lags past haSlaveFallbehindMax, a send answers SLAVE_NOT_AVAILABLE at once; (3) an ASYNC_MASTER
answers at once whatever the slave does.
Method: the store writer, dispatcher and send processor of one broker in this process
(test_send.StoreGraph); the test plays ha_service.0, writing REPLICATED parcels into its ring.
"""

from __future__ import annotations

from pathlib import Path

from mqbox.config import BrokerRole
from mqbox.ipc.ring import Ring
from mqbox.protocol import make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.server import parcels
from mqbox.server.transport import Outbox, SpillWriter
from mqbox.store.config_files import TopicConfig
from tests.unit.server.test_send import StoreGraph, properties_text, send_header, small_broker


def _slave_says(graph: StoreGraph, outbox: Outbox, acked_bytes: int, slave_count: int) -> None:
    outbox.append(parcels.REPLICATED, parcels.pack_replicated(acked_bytes, slave_count))
    assert outbox.flush_nowait()
    graph.pump()


def _submit(graph: StoreGraph, count: int) -> list[int]:
    opaques = []
    for _ in range(count):
        opaque = graph.next_opaque()
        ext = send_header("Repl", properties=properties_text(WAIT="true")).to_ext()
        graph.submit(graph.send, make_request(RequestCode.SEND_MESSAGE, opaque, ext, body=b"r"))
        opaques.append(opaque)
    graph.pump(3)
    return opaques


def _graph(shm_instance: str, tmp_path: Path, role: BrokerRole) -> tuple[StoreGraph, Outbox]:
    graph = StoreGraph(
        shm_instance, tmp_path / "home", small_broker(broker_role=role), start_pull=False
    )
    graph.send.topics.create_if_absent(TopicConfig("Repl", 1, 1, 6))
    spec = graph.topology.ring("ha_service.0", "store_writer.0")
    return graph, Outbox(Ring.attach(spec.name), SpillWriter(shm_instance, "ha_service.0"))


def test_one_slave_report_releases_every_send_below_it(shm_instance: str, tmp_path: Path) -> None:
    graph, ha = _graph(shm_instance, tmp_path, BrokerRole.SYNC_MASTER)
    try:
        _slave_says(graph, ha, 0, 1)
        opaques = _submit(graph, 20)
        assert not graph.replies  # nothing confirmed yet
        _slave_says(graph, ha, graph.writer.commit_log.write_log_offset_bytes, 1)
        for opaque in opaques:
            assert graph.wait_reply(opaque).code == ResponseCode.SUCCESS
        # The slave leaves: at once SLAVE_NOT_AVAILABLE, the message stored all the same.
        _slave_says(graph, ha, graph.writer.commit_log.write_log_offset_bytes, 0)
        before = graph.writer.commit_log.write_log_offset_bytes
        [alone] = _submit(graph, 1)
        assert graph.wait_reply(alone).code == ResponseCode.SLAVE_NOT_AVAILABLE
        assert graph.writer.commit_log.write_log_offset_bytes > before
    finally:
        ha.ring.close()
        graph.close()


def test_a_slave_too_far_behind_is_not_waited_for(shm_instance: str, tmp_path: Path) -> None:
    graph, ha = _graph(shm_instance, tmp_path, BrokerRole.SYNC_MASTER)
    try:
        graph.writer.slave_fallbehind_max_bytes = 0
        _slave_says(graph, ha, 0, 1)
        [opaque] = _submit(graph, 1)
        assert graph.wait_reply(opaque).code == ResponseCode.SLAVE_NOT_AVAILABLE
    finally:
        ha.ring.close()
        graph.close()


def test_async_master_answers_at_once(shm_instance: str, tmp_path: Path) -> None:
    graph, ha = _graph(shm_instance, tmp_path, BrokerRole.ASYNC_MASTER)
    try:
        _slave_says(graph, ha, 0, 1)
        for opaque in _submit(graph, 5):
            assert graph.wait_reply(opaque).code == ResponseCode.SUCCESS
    finally:
        ha.ring.close()
        graph.close()

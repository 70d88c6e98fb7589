"""Goal (issue 9, part 3): what clients make the broker buffer is bounded, and one greedy or
slow client cannot starve the others. Measured from outside before: 24 clients that never read,
each asking 40 times for a 3.9 MB message, pushed /dev/shm spill files to 3.3 GB and the reactor
to 306 MiB while another client's SEND timed out; 8 clients pipelining 3 MB sends pushed the
spill files to about 200 MiB.

- Reads of stored messages (PULL, VIEW_MESSAGE_BY_ID, QUERY_MESSAGE) leave by sendfile from the
  commit log: however many are asked for and never read, nothing piles up in spill files or in
  the reactor, and another client's SEND is answered at once.
- Spill files of the instance stay within `mqboxSpillBytesMax` (up to twice it while a hop copies
  a payload into the next hop's file): a big frame waits in the reactor for room, and every send
  is answered.

Method: the real appliance (tests/support/appliance.py) with small limits in its broker.conf.
Raw sockets pipeline requests and do not read (a small receive buffer); a sampler lists the
instance's spill files in /dev/shm and reads the reactor's unique memory (psutil USS) every
10 ms; a probe client times a SEND meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import psutil
import pytest

from mqbox.ipc import names
from mqbox.protocol import Connection, Role, make_request
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader
from mqbox.protocol.mqbox_codes import MQBOX_NOOP
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.pull_requests import pull_everything_header
from tests.support.read_back import wait_dispatched_at

pytestmark = pytest.mark.integration

MiB: Final = 1 << 20
BIG_BODY_SIZE_BYTES: Final = 3_900_000
BIG_CONF: Final = BROKER_CONF + "mapedFileSizeCommitLog=67108864\n"
PROBE_S_MAX: Final = 1.0


def send_ext(topic: str, keys: str = "") -> dict[str, str]:
    properties = f"KEYS\x01{keys}\x02" if keys else ""
    header = SendMessageRequestHeader(
        "PG", topic, "TBW102", 1, 0, 0, int(time.time() * 1000), 0, properties
    )
    return header.to_ext()


def spill_size_bytes(instance: str) -> int:
    total = 0
    prefix = f"mqbox.{instance}.spill"
    for path in names.SHM_DIRECTORY.iterdir():
        if path.name.startswith(prefix):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
    return total


class Sampler:
    """Peaks of the instance's spill bytes and of the reactor's USS growth, every 10 ms."""

    def __init__(self, appliance: Appliance) -> None:
        self.appliance = appliance
        self.reactor = psutil.Process(appliance.roles["reactor.0"])
        self.reactor_uss_start = self.reactor.memory_full_info().uss
        self.spill_peak_bytes = 0
        self.reactor_growth_peak_bytes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._done.is_set():
            spilled = spill_size_bytes(self.appliance.instance)
            growth = self.reactor.memory_full_info().uss - self.reactor_uss_start
            self.spill_peak_bytes = max(self.spill_peak_bytes, spilled)
            self.reactor_growth_peak_bytes = max(self.reactor_growth_peak_bytes, growth)
            time.sleep(0.01)

    @contextlib.contextmanager
    def running(self) -> Iterator[Sampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._done.set()
            self._thread.join()


def probe_send_s(appliance: Appliance) -> float:
    """Seconds one small SEND of a fresh client takes."""
    with contextlib.closing(appliance.client()) as client:
        started = time.monotonic()
        response = client.call(RequestCode.SEND_MESSAGE, send_ext("ProbeTopic"), b"probe")
        assert response.code == ResponseCode.SUCCESS, response.remark
        return time.monotonic() - started


def non_reader(
    appliance: Appliance, requests: Sequence[tuple[int, dict[str, str]]]
) -> socket.socket:
    """A connection that sends `requests` pipelined and never reads an answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", appliance.broker_port))
    codec = Connection(Role.CLIENT)
    frames = b"".join(
        codec.send(make_request(code, codec.next_opaque(), ext)) for code, ext in requests
    )
    sock.sendall(frames)
    return sock


def run_non_readers(
    appliance: Appliance, request_lists: Sequence[Sequence[tuple[int, dict[str, str]]]]
) -> tuple[Sampler, float]:
    """A non-reader per list of requests; after 2 s, the peaks so far and a probe SEND's time."""
    sampler = Sampler(appliance)
    sockets: list[socket.socket] = []
    with sampler.running():
        try:
            sockets.extend(non_reader(appliance, requests) for requests in request_lists)
            time.sleep(2.0)
            probe_s = probe_send_s(appliance)
        finally:
            for sock in sockets:
                sock.close()
    return sampler, probe_s


def test_reads_of_a_big_message_by_clients_that_never_read_pile_up_nowhere(
    tmp_path: Path,
) -> None:
    pids: list[int] = []
    with running_appliance(tmp_path / "home", pids, BIG_CONF) as appliance:
        with contextlib.closing(appliance.client()) as client:
            stored = client.call(
                RequestCode.SEND_MESSAGE, send_ext("BigTopic", "big"), b"b" * BIG_BODY_SIZE_BYTES
            )
        assert stored.code == ResponseCode.SUCCESS, stored.remark
        # The query and the pull must find the big message, or their answers are small and the
        # test proves nothing: the dispatcher indexes it a moment after the answer.
        wait_dispatched_at(appliance.broker_address)
        view = (RequestCode.VIEW_MESSAGE_BY_ID, {"offset": "0"})
        query = (
            RequestCode.QUERY_MESSAGE,
            {"topic": "BigTopic", "key": "big", "maxNum": "32", "beginTimestamp": "0"}
            | {"endTimestamp": str(1 << 62)},
        )
        pull = (RequestCode.PULL_MESSAGE, pull_everything_header("BigTopic", 0).to_ext())
        sampler, probe_s = run_non_readers(appliance, ([view] * 20, [query] * 20, [pull] * 20) * 4)
        spill_mib = sampler.spill_peak_bytes / MiB
        growth_mib = sampler.reactor_growth_peak_bytes / MiB
        measured = (
            f"probe {probe_s:.2f} s, spill {spill_mib:.0f} MiB, reactor +{growth_mib:.0f} MiB"
        )
        assert probe_s < PROBE_S_MAX, measured
        assert spill_mib < 4, measured
        assert growth_mib < 32, measured


def test_spill_files_stay_within_the_budget_and_every_big_send_is_answered(
    tmp_path: Path,
) -> None:
    pids: list[int] = []
    budget_bytes = 16 * MiB
    conf = BIG_CONF.replace("67108864", "268435456") + f"mqboxSpillBytesMax={budget_bytes}\n"
    connection_count = 8
    send_count = 5
    with running_appliance(tmp_path / "home", pids, conf) as appliance:
        sampler = Sampler(appliance)
        codecs = [Connection(Role.CLIENT) for _ in range(connection_count)]
        sockets = [
            socket.create_connection(("127.0.0.1", appliance.broker_port))
            for _ in range(connection_count)
        ]

        def flood(sock: socket.socket, codec: Connection) -> None:
            for _ in range(send_count):
                request = make_request(
                    RequestCode.SEND_MESSAGE,
                    codec.next_opaque(),
                    send_ext("BigTopic"),
                    body=b"s" * 3_000_000,
                )
                sock.sendall(codec.send(request))

        with sampler.running():
            threads = [
                threading.Thread(target=flood, args=pair)
                for pair in zip(sockets, codecs, strict=True)
            ]
            for thread in threads:
                thread.start()
            try:
                for thread in threads:
                    thread.join()
                codes = [
                    read_codes(sock, codec, send_count)
                    for sock, codec in zip(sockets, codecs, strict=True)
                ]
            finally:
                for sock in sockets:
                    sock.close()
        assert codes == [[0] * send_count] * connection_count
        peak_mib = sampler.spill_peak_bytes / MiB
        assert peak_mib <= 2 * budget_bytes / MiB + 3, f"spill files peaked at {peak_mib:.0f} MiB"


def read_codes(sock: socket.socket, codec: Connection, count: int) -> list[int]:
    """The codes of the next `count` responses on a connection."""
    from mqbox.protocol import NEED_DATA, RemotingCommand

    sock.settimeout(30)
    codes: list[int] = []
    while len(codes) < count:
        command = codec.next_command()
        if isinstance(command, RemotingCommand):
            codes.append(command.code)
            continue
        assert command is NEED_DATA
        data = sock.recv(1 << 16)
        assert data, f"closed after {len(codes)} responses"
        codec.receive_data(data)
    return codes


def test_partial_frames_stay_within_the_budget_and_others_are_served(tmp_path: Path) -> None:
    """Connections that send most of a big frame and stop (16 of them with 12 MB each held
    192 MB in the reactor before) hold no more than mqboxPartialFrameBytesMax plus one read
    each; other clients are served meanwhile, and a closed one makes room for a big SEND."""
    pids: list[int] = []
    budget_bytes = 32 * MiB
    conf = BIG_CONF + f"mqboxPartialFrameBytesMax={budget_bytes}\n"
    frame_size_bytes = 12 * MiB
    with running_appliance(tmp_path / "home", pids, conf) as appliance:
        sampler = Sampler(appliance)
        codec = Connection(Role.CLIENT)
        whole = codec.send(
            make_request(
                RequestCode.SEND_MESSAGE,
                1,
                send_ext("BigTopic"),
                body=b"p" * (frame_size_bytes - 1000),
            )
        )
        stalled: list[socket.socket] = []

        def stall() -> None:
            sock = socket.create_connection(("127.0.0.1", appliance.broker_port))
            stalled.append(sock)
            sock.settimeout(3.0)
            with contextlib.suppress(TimeoutError):
                sock.sendall(whole[:-1])  # all but the last byte, never sent

        with sampler.running():
            threads = [threading.Thread(target=stall) for _ in range(16)]
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                time.sleep(0.5)
                with contextlib.closing(appliance.client()) as client:
                    assert client.call(RequestCode.SEND_MESSAGE, send_ext("T"), b"m").code == 0
                    for sock in stalled[:2]:
                        sock.close()
                    big = client.call(RequestCode.SEND_MESSAGE, send_ext("T"), b"b" * 3_000_000)
                    assert big.code == ResponseCode.SUCCESS, big.remark
            finally:
                for sock in stalled:
                    sock.close()
        growth_mib = sampler.reactor_growth_peak_bytes / MiB
        assert growth_mib < budget_bytes / MiB + 24, f"the reactor grew by {growth_mib:.0f} MiB"


def test_a_greedy_client_cannot_starve_another(tmp_path: Path) -> None:
    """A client that pipelines two thousand heartbeats of 256 groups each (about 6 s of
    admin.0's time) without waiting for answers gets at most mqboxConnectionInFlightCountMax of
    them into the broker at once; another client's requests to the same admin processor wait
    behind those few, not behind the thousands: typically under 0.3 s, and never for a third of
    the flood (one wait of 1.4 s was seen with three test workers on the 2 cores)."""
    pids: list[int] = []
    conf = BROKER_CONF + "mqboxConnectionInFlightCountMax=8\n"
    groups = [f"Greedy{index}" for index in range(256)]
    body = heartbeat_body(groups)
    with running_appliance(tmp_path / "home", pids, conf) as appliance:
        with contextlib.closing(appliance.client()) as warm:
            warm.request(RequestCode.HEART_BEAT, {}, body)  # creates the groups once
            warm.responses(1)
        codec = Connection(Role.CLIENT)
        flood = b"".join(
            codec.send(make_request(RequestCode.HEART_BEAT, codec.next_opaque(), {}, body=body))
            for _ in range(2000)
        )
        greedy = socket.create_connection(("127.0.0.1", appliance.broker_port))
        sender = threading.Thread(target=greedy.sendall, args=(flood,))
        sender.start()
        try:
            time.sleep(0.3)
            waits_s = []
            with contextlib.closing(appliance.client()) as other:
                for _ in range(5):
                    started = time.monotonic()
                    assert other.call(MQBOX_NOOP).code == 0
                    waits_s.append(time.monotonic() - started)
                    time.sleep(0.05)
        finally:
            greedy.close()
            sender.join()
        assert statistics.median(waits_s) < 0.3, waits_s
        assert max(waits_s) < 2.0, waits_s


def heartbeat_body(groups: list[str]) -> bytes:
    document = {
        "clientID": "1-127.0.0.1@GREEDY",
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": 1,
                "messageModel": 1,
                "consumeFromWhere": 0,
                "subscriptionDataSet": [{"topic": "T", "subString": "*", "subVersion": "1"}],
            }
            for group in groups
        ],
    }
    return json.dumps(document).encode()


def test_clients_that_never_read_hold_a_bounded_share_of_the_reactors_memory(
    tmp_path: Path,
) -> None:
    """Six clients pipeline 3,000 requests with answers of about 40 KB each (the topic table of
    300 topics) and read none: each may hold mqboxConnectionOutputBytesMax of answers before
    its requests stop being read, and past mqboxResponseBufferBytesMax the reactor closes the
    ones holding most, while others are served. Before, each could hold 64 MiB."""
    pids: list[int] = []
    conf = (
        BROKER_CONF
        + f"mqboxConnectionOutputBytesMax={2 * MiB}\n"
        + f"mqboxResponseBufferBytesMax={8 * MiB}\n"
    )
    with running_appliance(tmp_path / "home", pids, conf) as appliance:
        with contextlib.closing(appliance.client()) as client:
            for index in range(300):
                ext = {"topic": f"Topic{index:03}", "readQueueNums": "1", "writeQueueNums": "1"}
                ext |= {"perm": "6", "defaultTopic": "TBW102", "topicFilterType": "SINGLE_TAG"}
                response = client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
                assert response.code == ResponseCode.SUCCESS, response.remark
        request: tuple[int, dict[str, str]] = (RequestCode.GET_ALL_TOPIC_CONFIG, {})
        sampler, probe_s = run_non_readers(appliance, [[request] * 3000] * 6)
        growth_mib = sampler.reactor_growth_peak_bytes / MiB
        assert probe_s < PROBE_S_MAX, f"another client's SEND took {probe_s:.1f} s"
        assert growth_mib < 16, f"the reactor grew by {growth_mib:.0f} MiB"
        log_text = (appliance.home / "logs" / "reactor.0.log").read_text()
        assert "mqboxResponseBufferBytesMax" in log_text

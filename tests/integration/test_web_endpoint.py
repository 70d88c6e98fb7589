"""The statistics through RocketMQ's VIEW_BROKER_STATS_DATA (315), /metrics as text, and the
dashboard's JSON API, on a real appliance after real sends and pulls."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import admin_api
from mqbox.client.errors import RemotingResponseError
from mqbox.client.remoting import RemotingClient
from mqbox.message import PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import ViewBrokerStatsDataRequestHeader
from mqbox.server.home import read_http
from tests.conftest import unique_name
from tests.support.appliance import BROKER_CONF, Appliance, running_appliance
from tests.support.read_back import READ_BACK_GROUP, pull_queue
from tests.support.send_requests import send_to_queue_header

WAIT_S = 30.0
SEND_COUNT = 5
UNIQ_KEY = "7F0000010B2A18B4AAC2352B8A5B0001"


def _get(appliance: Appliance, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(appliance.http_url + path.lstrip("/"), timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read()


def _api(appliance: Appliance, path: str) -> Any:
    status, content_type, body = _get(appliance, path)
    assert status == 200, (path, body)
    assert content_type == "application/json"
    return json.loads(body)


@pytest.fixture(scope="module")
def traffic(appliance: Appliance) -> dict[str, Any]:
    """SEND_COUNT messages sent to a topic of its own (one with a KEYS property), read back by
    READ_BACK_GROUP; the statistics sampler has published them when this returns."""
    topic = unique_name("Web").replace("-", "_")
    offset_ids = []
    with RemotingClient(appliance.broker_address) as client:
        for index in range(SEND_COUNT):
            properties = {PROPERTY_UNIQ_KEY: UNIQ_KEY} if index == 1 else None
            if index == 0:
                properties = {PROPERTY_KEYS: "order-42"}
            header = send_to_queue_header(topic, properties=properties)
            answer = admin_api.send_message(client, header, f"hello {index}".encode())
            offset_ids.append(answer.msg_id)
        deadline = time.monotonic() + WAIT_S
        while len(pull_queue(client, topic, 0)) < SEND_COUNT:
            assert time.monotonic() < deadline, "the sends never became readable"
            time.sleep(0.2)
        item = None
        while time.monotonic() < deadline:  # the sampler publishes once a second
            try:
                item = admin_api.view_broker_stats_data(
                    client, "GROUP_GET_NUMS", f"{topic}@{READ_BACK_GROUP}"
                )
            except RemotingResponseError:
                item = None
            if item is not None and item["statsMinute"]["sum"] >= SEND_COUNT:
                break
            time.sleep(0.3)
        assert item is not None, "the statistics were never published"
    return {"topic": topic, "offset_ids": offset_ids}


def test_315_answers_brokerstatsdata_with_java_fields(
    appliance: Appliance, traffic: dict[str, Any]
) -> None:
    topic = traffic["topic"]
    with RemotingClient(appliance.broker_address) as client:
        header = ViewBrokerStatsDataRequestHeader("TOPIC_PUT_NUMS", topic)
        response = client.invoke(RequestCode.VIEW_BROKER_STATS_DATA, header.to_ext())
        assert response.code == ResponseCode.SUCCESS, response.remark
        body = json.loads(response.body)
        assert set(body) == {"statsMinute", "statsHour", "statsDay"}
        for window in body.values():
            assert set(window) == {"sum", "tps", "avgpt"}
            assert type(window["sum"]) is int
            assert type(window["tps"]) is float
            assert type(window["avgpt"]) is float
        assert body["statsMinute"]["sum"] == SEND_COUNT
        assert body["statsMinute"]["avgpt"] == 1.0  # one message per send request
        assert body["statsDay"]["sum"] == SEND_COUNT
        size = admin_api.view_broker_stats_data(client, "TOPIC_PUT_SIZE", topic)
        assert size["statsMinute"]["sum"] > SEND_COUNT * 91  # records, headers included
        broker = admin_api.view_broker_stats_data(client, "BROKER_PUT_NUMS", "DefaultCluster")
        assert broker["statsDay"]["sum"] >= SEND_COUNT
        unknown = ViewBrokerStatsDataRequestHeader("TOPIC_PUT_NUMS", "NoSuchTopic")
        refused = client.invoke(RequestCode.VIEW_BROKER_STATS_DATA, unknown.to_ext())
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert refused.remark == "The stats <TOPIC_PUT_NUMS> <NoSuchTopic> not exist"
        missing = client.invoke(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "X"})
        assert missing.code == ResponseCode.SYSTEM_ERROR
        assert "statsKey" in (missing.remark or "")


def test_metrics_text_has_the_counted_series(appliance: Appliance, traffic: dict[str, Any]) -> None:
    topic = traffic["topic"]
    status, content_type, body = _get(appliance, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    text = body.decode()
    labels = f'cluster="DefaultCluster",broker="broker-a",topic="{topic}"'
    assert f"mqbox_topic_put_messages_total{{{labels}}} {SEND_COUNT}\n" in text
    assert f"rocketmq_producer_offset{{{labels}}} {SEND_COUNT}\n" in text
    group_labels = (
        f'cluster="DefaultCluster",broker="broker-a",topic="{topic}",group="{READ_BACK_GROUP}"'
    )
    got = [
        int(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f"mqbox_group_get_messages_total{{{group_labels}}} ")
    ]
    assert got
    assert got[0] >= SEND_COUNT  # the read-back may pull some messages twice
    # Every family is one group: its HELP, its TYPE, then only its samples.
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families))
    current = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
        elif not line.startswith("#"):
            assert line.startswith(current), (current, line)
    assert (
        'mqbox_role_up{cluster="DefaultCluster",broker="broker-a",role="send.0",kind="send"} 1'
        in text
    )
    assert (
        'mqbox_send_latency_seconds_bucket{cluster="DefaultCluster",broker="broker-a",le="+Inf"}'
        in text
    )


def test_api_topics_topic_and_processes(appliance: Appliance, traffic: dict[str, Any]) -> None:
    topic = traffic["topic"]
    topics = {entry["topic"]: entry for entry in _api(appliance, "/api/topics")}
    assert topics[topic]["max_offset_total"] == SEND_COUNT
    assert topics[topic]["put_messages_total"] == SEND_COUNT
    detail = _api(appliance, f"/api/topic?name={topic}")
    assert detail["queues"][0]["max_offset"] == SEND_COUNT
    assert detail["queues"][0]["min_offset"] == 0
    overview = _api(appliance, "/api/overview")
    assert overview["broker"] == "broker-a"
    assert overview["address"] == appliance.broker_address
    assert overview["put_messages_total"] >= SEND_COUNT
    assert overview["store"]["write_log_offset_bytes"] > 0
    processes = {entry["role"]: entry for entry in _api(appliance, "/api/processes")["processes"]}
    assert processes["send.0"]["up"] is True
    assert processes["send.0"]["pid"] == appliance.roles["send.0"]
    assert processes["send.0"]["rss_bytes"] > 0


def test_api_message_lookup(appliance: Appliance, traffic: dict[str, Any]) -> None:
    topic = traffic["topic"]
    by_id = _api(appliance, f"/api/message?id={traffic['offset_ids'][1]}")["messages"]
    assert [message["body_preview"] for message in by_id] == ["hello 1"]
    assert by_id[0]["body_format"] == "text"
    assert by_id[0]["topic"] == topic
    uniq_key = by_id[0]["msg_id"]
    assert uniq_key == UNIQ_KEY
    by_uniq = _api(appliance, f"/api/message?id={uniq_key}&topic={topic}")["messages"]
    assert [message["body_preview"] for message in by_uniq] == ["hello 1"]
    by_key = _api(appliance, f"/api/message?key=order-42&topic={topic}")["messages"]
    assert [message["body_preview"] for message in by_key] == ["hello 0"]
    with RemotingClient(appliance.broker_address) as client:
        binary = admin_api.send_message(client, send_to_queue_header(topic), b"\x00\xffbin")
        long_text = admin_api.send_message(
            client, send_to_queue_header(topic), ("a" + "\u00e9" * 2600).encode()
        )
    shown = _api(appliance, f"/api/message?id={binary.msg_id}")["messages"][0]
    assert (shown["body_format"], shown["body_preview"]) == ("hex", "00 ff 62 69 6e")
    # The first 4 KiB cut an "é" in two: the preview stops before it and stays text.
    shown = _api(appliance, f"/api/message?id={long_text.msg_id}")["messages"][0]
    assert shown["body_format"] == "text"
    assert shown["body_truncated"] is True
    assert shown["body_preview"] == "a" + "\u00e9" * 2047
    other_broker = "0A000001" + "00002A9F" + traffic["offset_ids"][0][16:]
    status, _, body = _get(appliance, f"/api/message?id={other_broker}")
    assert status == 404
    assert "another broker" in json.loads(body)["error"]
    status, _, body = _get(appliance, f"/api/message?key=nobody&topic={topic}")
    assert status == 404
    assert "nobody" in json.loads(body)["error"]


def test_bad_requests_get_an_http_error(appliance: Appliance) -> None:
    assert _get(appliance, "/api/nothing")[0] == 404
    assert _get(appliance, "/api/topic")[0] == 400
    assert _get(appliance, "/api/topic?name=NoSuchTopic")[0] == 404
    assert _get(appliance, "/api/message")[0] == 400
    assert _get(appliance, "/../etc/passwd")[0] == 404
    request = urllib.request.Request(appliance.http_url + "metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    with raised.value:
        assert raised.value.code == 501
    status, content_type, body = _get(appliance, "/")
    assert status == 200
    assert content_type.startswith("text/html")
    assert b"mqbox" in body


def test_a_port_in_use_leaves_the_broker_running_without_the_endpoint(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = BROKER_CONF.replace("mqboxHttpPort=0\n", f"mqboxHttpPort={port}\n")
        with running_appliance(tmp_path / "home", reap_pids, conf) as running:
            assert running.http_url == ""
            problem = read_http(running.home)
            assert problem is not None
            assert "cannot bind" in problem["error"]
            with RemotingClient(running.broker_address) as client:
                admin_api.send_message(client, send_to_queue_header("AfterBindFailure"), b"x")
                # The sampler runs without the endpoint: 315 answers.
                deadline = time.monotonic() + WAIT_S
                while True:
                    try:
                        admin_api.view_broker_stats_data(
                            client, "TOPIC_PUT_NUMS", "AfterBindFailure"
                        )
                        break
                    except RemotingResponseError:
                        assert time.monotonic() < deadline, "315 never answered"
                        time.sleep(0.3)
        log_text = (tmp_path / "home" / "logs" / "services.0.log").read_text()
        assert f"cannot bind 127.0.0.1:{port}" in log_text

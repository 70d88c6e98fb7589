"""Goal: the wire commands of `mqbox` (topic, offset, cluster, message, send, tail) do what they
say against a real appliance: a created topic shows in the list, its route and its status, and
an update or delete changes them; what `send` stores, `tail` gives back, `message get` finds by
the msgId `send` printed and `message query` finds by key; `offset show` reports per-queue
offsets and lag, and `offset reset` moves them; `cluster list` names the broker; the name server
comes from --namesrv, else $MQBOX_NAMESRV, else etc/broker.conf; Ctrl-C ends a tail cleanly; and
every error path prints one line on stderr (nothing on stdout) and exits non-zero.

Method: nothing is mocked. One appliance per module, started with `mqbox start --daemon` through
typer's CliRunner (name server and broker on port 0, a fresh home under tmp, small store files,
one send and one pull processor), stopped with `mqbox stop`, and every process its run files
name is SIGKILLed by pid in the end, its shared memory swept. Every command runs through
CliRunner against mqbox.admin.cli.app; `--json` output is parsed, text output is checked for
the facts a user reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import re
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from mqbox.admin import broker_ops, ops
from mqbox.admin.cli import app
from mqbox.config import load_broker_config
from mqbox.ipc import names
from mqbox.message import encode_offset_msg_id, pack_host
from mqbox.server.home import (
    HaState,
    HomeLayout,
    process_alive,
    read_state,
    recorded_processes,
)
from tests.support.read_back import wait_dispatched_at
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

runner = CliRunner()

BROKER_CONF = (
    "brokerIP1=127.0.0.1\n"
    "mapedFileSizeCommitLog=16777216\n"
    "mapedFileSizeConsumeQueue=60000\n"
    "mqboxSendProcessorCount=1\n"
    "mqboxPullProcessorCount=1\n"
)
TAIL_TIMEOUT_S = "30"
STOP_TIMEOUT_S = "60"
ERROR_TOPIC = "CliErrTopic"
READ_ONLY_TOPIC = "CliReadOnlyTopic"


@dataclasses.dataclass(frozen=True)
class Appliance:
    home: Path
    namesrv: str  # ip:port
    broker: str  # ip:port


def _kill_recorded(state: dict[str, Any]) -> None:
    """SIGKILL every process the run files named that still runs (same pid and start time)."""
    for _, pid, create_time in recorded_processes(state):
        if process_alive(pid, create_time):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    root = tmp_path_factory.mktemp("cli-wire")
    home = root / "home"
    conf = root / "broker.conf"
    conf.write_text(BROKER_CONF, encoding="utf-8")
    state: dict[str, Any] = {}
    try:
        # `start --daemon` leaves the supervisor running on purpose and drops its Popen, which
        # then warns "subprocess ... is still running" (ResourceWarning). The real script exits
        # right after; in this process the warning is expected, and ignored here only.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            started = runner.invoke(
                app,
                [
                    *("start", "--daemon", "--home", str(home), "--config", str(conf)),
                    *("--namesrv-port", "0", "--broker-port", "0"),
                ],
            )
            gc.collect()
        state = read_state(home) or {}
        assert started.exit_code == 0, started.output
        namesrv = state["namesrv"]
        yield Appliance(home, f"{namesrv['host']}:{namesrv['port']}", state["broker"]["address"])
    finally:
        runner.invoke(app, ["stop", "--home", str(home), "--timeout-s", STOP_TIMEOUT_S])
        _kill_recorded(state or read_state(home) or {})
        instance = state.get("instance")
        if isinstance(instance, str) and instance:
            names.unlink_instance(instance)


# --- helpers ------------------------------------------------------------------------------------


def run(appliance: Appliance, *args: str) -> Result:
    """`mqbox ARGS --namesrv <the appliance's>`."""
    return runner.invoke(app, [*args, "--namesrv", appliance.namesrv])


def ok(appliance: Appliance, *args: str) -> str:
    """stdout of a command that must succeed."""
    result = run(appliance, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert result.stderr == ""
    return result.stdout


def ok_json(appliance: Appliance, *args: str) -> Any:
    return json.loads(ok(appliance, *args, "--json"))


def one_error_line(result: Result) -> str:
    """The single stderr line of a command that failed cleanly (no traceback, no stdout)."""
    assert result.exit_code != 0, result.stdout
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mqbox: ")
    return lines[0]


def create_topic(appliance: Appliance, topic: str, queue_count: int = 2, perm: str = "rw") -> None:
    ok(
        appliance,
        *("topic", "create", topic, "--read-queues", str(queue_count)),
        *("--write-queues", str(queue_count), "--perm", perm),
    )


def send_json(appliance: Appliance, topic: str, body: str, *options: str) -> dict[str, Any]:
    document: dict[str, Any] = ok_json(appliance, "send", "--topic", topic, *options, body)
    return document


def tail_json(appliance: Appliance, topic: str, *options: str) -> list[dict[str, Any]]:
    stdout = ok(appliance, "tail", "--topic", topic, "--timeout-s", TAIL_TIMEOUT_S, *options)
    return [json.loads(line) for line in stdout.splitlines()]


def closed_port() -> int:
    """A port nothing listens on: bound, then closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- without the appliance ----------------------------------------------------------------------


def test_the_name_server_is_the_option_else_the_env_else_etc_broker_conf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ops.NAMESRV_ENV, raising=False)
    monkeypatch.setenv("MQBOX_HOME", str(tmp_path))  # a home where nothing runs
    from_file = load_broker_config(ops.config_paths(None)[1]).namesrv_addr
    assert ops.namesrv_addr(None) == from_file
    monkeypatch.setenv(ops.NAMESRV_ENV, "127.0.0.1:7")
    assert ops.namesrv_addr(None) == "127.0.0.1:7"
    assert ops.namesrv_addr("127.0.0.1:8") == "127.0.0.1:8"


def test_the_help_lists_the_wire_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("topic", "offset", "cluster", "message", "send", "tail"):
        assert command in result.stdout
    topic_help = runner.invoke(app, ["topic", "--help"]).stdout
    for command in ("create", "update", "delete", "list", "route", "status"):
        assert command in topic_help


# --- cluster ------------------------------------------------------------------------------------


def test_cluster_list_names_the_broker(appliance: Appliance) -> None:
    listed = ok_json(appliance, "cluster", "list")
    (broker,) = listed["brokers"]
    assert broker["broker_id"] == 0
    assert broker["address"] == appliance.broker
    assert broker["broker_name"] == "broker-a"
    assert broker["role"] == "ASYNC_MASTER"
    assert broker["version"].startswith("mqbox")
    # A master with no slave says so (run/replication.json of its HA role), or "n/a" before
    # the HA role's first report.
    assert broker["ha_state"] in ("no-slave", "n/a")
    assert broker["slave_lag_bytes"] is None
    text = ok(appliance, "cluster", "list")
    assert "ASYNC_MASTER" in text
    assert "n/a" in text
    assert appliance.broker in text


def test_replication_s_run_file_reaches_cluster_list_and_status(appliance: Appliance) -> None:
    """run/replication.json, which the HA role writes, is what cluster list and status show
    (docs/layout.md section 4): a master without a slave says so."""
    path = HomeLayout(appliance.home).replication_path
    wait_until(path.exists, "the HA role's run/replication.json")
    (broker,) = ok_json(appliance, "cluster", "list")["brokers"]
    assert (broker["ha_state"], broker["slave_lag_bytes"]) == ("no-slave", None)
    status = ops.status(appliance.home)
    assert (status.ha_state, status.slave_lag_bytes) == ("no-slave", None)
    assert status.replication["role"] == "master"
    assert (status.broker_role, status.broker_id) == ("ASYNC_MASTER", 0)


def test_ha_state_reads_both_sides_of_replication() -> None:
    master = {"role": "master", "slaves": [{"address": "x"}], "acked_log_offset": 100}
    assert HaState.of({**master, "write_log_offset": 4196}) == HaState("serving", 4096, None)
    assert HaState.of({**master, "slaves": []}) == HaState("no-slave", None, None)
    # The HA role counts the records between the acknowledged offset and its write position;
    # with the slave gone, the lag of the last one that reported stays shown.
    counted = {**master, "write_log_offset": 4196, "slave_lag_messages": 7}
    assert HaState.of(counted) == HaState("serving", 4096, 7)
    gone = {**counted, "slaves": [], "slave_reported": True}
    assert HaState.of(gone) == HaState("no-slave", 4096, 7)
    slave = {"role": "slave", "state": "connected", "reported_log_offset": 10}
    assert HaState.of({**slave, "master_log_offset": 30}) == HaState("connected", 20, None)
    received = {**slave, "master_log_offset": 30, "slave_lag_messages": 2}
    assert HaState.of(received) == HaState("connected", 20, 2)
    assert HaState.of({**slave, "master_log_offset": 0}) == HaState("connected", None, None)
    assert HaState.of(None) == HaState("n/a", None, None)


def test_the_name_server_can_come_from_the_environment(appliance: Appliance) -> None:
    result = runner.invoke(app, ["cluster", "list"], env={ops.NAMESRV_ENV: appliance.namesrv})
    assert result.exit_code == 0, result.stderr
    assert appliance.broker in result.stdout


# --- topic --------------------------------------------------------------------------------------


def test_a_created_topic_is_listed_routed_and_has_status(appliance: Appliance) -> None:
    topic = "CliCreatedTopic"
    created = ok_json(
        appliance,
        *("topic", "create", topic, "--read-queues", "2", "--write-queues", "3"),
    )
    assert created["action"] == "created"
    assert [
        (broker["broker_name"], broker["read_queue_nums"], broker["write_queue_nums"])
        for broker in created["brokers"]
    ] == [("broker-a", 2, 3)]
    assert topic in ok_json(appliance, "topic", "list")["topics"]
    assert topic in ok(appliance, "topic", "list").splitlines()
    route = ok_json(appliance, "topic", "route", topic)
    (broker,) = route["brokers"]
    assert (broker["read_queue_nums"], broker["write_queue_nums"], broker["perm"]) == (2, 3, 6)
    assert broker["addresses"] == {"0": appliance.broker}
    assert appliance.broker in ok(appliance, "topic", "route", topic)
    status = ok_json(appliance, "topic", "status", topic)
    assert status["message_count"] == 0
    assert [queue["queue_id"] for queue in status["queues"]] == [0, 1, 2]
    assert all(queue["queue_index_max"] == 0 for queue in status["queues"])
    assert f"topic {topic}: 0 messages" in ok(appliance, "topic", "status", topic)


def test_update_changes_what_is_given_and_keeps_the_rest(appliance: Appliance) -> None:
    topic = "CliUpdatedTopic"
    create_topic(appliance, topic, 2)
    updated = ok_json(appliance, "topic", "update", topic, "--write-queues", "4", "--perm", "r")
    assert updated["brokers"][0]["write_queue_nums"] == 4
    (broker,) = ok_json(appliance, "topic", "route", topic)["brokers"]
    assert (broker["read_queue_nums"], broker["write_queue_nums"], broker["perm"]) == (2, 4, 4)
    ordered = ok_json(appliance, "topic", "update", topic, "--order")
    assert ordered["brokers"] == [
        {
            "broker_name": "broker-a",
            "order": True,
            "perm": 4,
            "read_queue_nums": 2,
            "write_queue_nums": 4,
        }
    ]
    assert "updated topic" in ok(appliance, "topic", "update", topic, "--perm", "rw")


def test_delete_drops_the_topic_from_route_and_list(appliance: Appliance) -> None:
    topic = "CliDeletedTopic"
    create_topic(appliance, topic)
    deleted = ok_json(appliance, "topic", "delete", topic)
    assert deleted["brokers"] == ["broker-a"]
    assert deleted["namesrvs"] == [appliance.namesrv]
    assert topic not in ok_json(appliance, "topic", "list")["topics"]
    line = one_error_line(run(appliance, "topic", "route", topic))
    assert f"topic {topic} does not exist" in line


# --- send, tail, message ------------------------------------------------------------------------


def test_send_then_tail_gets_it_back(appliance: Appliance) -> None:
    topic = "CliSendTopic"
    create_topic(appliance, topic)
    sent = send_json(appliance, topic, "hello tail", "--tags", "TagA", "--keys", "k1 k2")
    assert sent["topic"] == topic
    assert sent["broker_name"] == "broker-a"
    (record,) = tail_json(appliance, topic, "--from", "earliest", "--count", "1", "--json")
    assert record["body"] == "hello tail"
    assert (record["tags"], record["keys"]) == ("TagA", "k1 k2")
    assert (record["msg_id"], record["offset_msg_id"]) == (sent["msg_id"], sent["offset_msg_id"])
    assert record["properties"]["UNIQ_KEY"] == sent["msg_id"]  # RocketMQ's msgId is the UNIQ_KEY
    assert (record["queue_id"], record["queue_index"]) == (sent["queue_id"], sent["queue_index"])
    text = ok(appliance, "tail", "--topic", topic, "--from", "earliest", "--count", "1")
    assert sent["msg_id"] in text
    assert "hello tail" in text


def test_tail_prints_messages_as_they_arrive(appliance: Appliance) -> None:
    """A sender keeps sending while the tail runs, so the test needs no guess of when the tail
    has read its start offsets: it must skip what came before and return two live messages."""
    topic = "CliLiveTopic"
    create_topic(appliance, topic, 3)
    send_json(appliance, topic, "before the tail")
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_sending() -> None:
        number = 0
        try:
            while not stop.wait(0.3):
                broker_ops.send(appliance.namesrv, topic, f"live {number}".encode())
                number += 1
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        records = tail_json(appliance, topic, "--from", "latest", "--count", "2", "--json")
    finally:
        stop.set()
        sender.join()
    assert errors == []
    bodies = [record["body"] for record in records]
    assert len(bodies) == 2
    assert all(body.startswith("live ") for body in bodies), bodies


def test_ctrl_c_ends_a_tail_cleanly(appliance: Appliance) -> None:
    topic = "CliInterruptTopic"
    create_topic(appliance, topic)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    # `mqbox tail` runs with Python's own Ctrl-C handler; this test process may not have it: a
    # Spark test earlier on the same xdist worker leaves pyspark's handler installed, which
    # calls into the JVM before it raises KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    timer.start()
    try:
        result = run(appliance, "tail", "--topic", topic, "--timeout-s", TAIL_TIMEOUT_S)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stderr == ""
    assert time.monotonic() - started < float(TAIL_TIMEOUT_S)


def test_message_get_finds_what_send_printed(appliance: Appliance) -> None:
    topic = "CliGetTopic"
    create_topic(appliance, topic)
    printed = ok(appliance, "send", "--topic", topic, "--tags", "TagG", "--keys", "gk", "body g")
    match = re.match(r"msgId ([0-9A-F]{32}) offsetMsgId ([0-9A-F]{32}) ", printed)
    assert match is not None, printed
    msg_id, offset_msg_id = match.group(1), match.group(2)
    view = ok_json(appliance, "message", "get", offset_msg_id)
    assert (view["msg_id"], view["offset_msg_id"]) == (msg_id, offset_msg_id)
    assert (view["topic"], view["body"]) == (topic, "body g")
    assert (view["tags"], view["keys"]) == ("TagG", "gk")
    assert view["broker_address"] == appliance.broker
    assert view["properties"]["TAGS"] == "TagG"
    assert view["queue_index"] == 0
    text = ok(appliance, "message", "get", offset_msg_id.lower())
    for fact in (f"topic:             {topic}", "tags:              TagG", "body g", msg_id):
        assert fact in text


def test_send_reads_the_body_from_stdin(appliance: Appliance) -> None:
    topic = "CliStdinTopic"
    create_topic(appliance, topic)
    body = "line one\nline two \u00e9"
    result = runner.invoke(
        app,
        ["send", "--topic", topic, "-", "--json", "--namesrv", appliance.namesrv],
        input=body.encode(),
    )
    assert result.exit_code == 0, result.stderr
    offset_msg_id = json.loads(result.stdout)["offset_msg_id"]
    assert ok_json(appliance, "message", "get", offset_msg_id)["body"] == body
    assert "line one\\nline two \u00e9" in ok(appliance, "message", "get", offset_msg_id)


def test_message_query_finds_messages_by_key_and_uniq_key(appliance: Appliance) -> None:
    topic = "CliQueryTopic"
    create_topic(appliance, topic)
    first = send_json(appliance, topic, "q one", "--keys", "qk1 shared")
    second = send_json(appliance, topic, "q two", "--keys", "qk2 shared")
    wait_dispatched_at(appliance.broker)  # the index takes the keys a moment after the answers
    both = ok_json(appliance, "message", "query", "--topic", topic, "--key", "shared")
    assert [message["msg_id"] for message in both["messages"]] == [
        first["msg_id"],
        second["msg_id"],
    ]
    (only,) = ok_json(appliance, "message", "query", "--topic", topic, "--key", "qk2")["messages"]
    assert only["body"] == "q two"
    by_uniq = ok_json(appliance, "message", "query", "--topic", topic, "--key", first["msg_id"])
    assert [message["body"] for message in by_uniq["messages"]] == ["q one"]
    assert "q two" in ok(appliance, "message", "query", "--topic", topic, "--key", "qk2")


# --- offset -------------------------------------------------------------------------------------


def test_offset_reset_moves_the_group_and_show_reports_the_lag(appliance: Appliance) -> None:
    topic = "CliOffsetTopic"
    group = "CliOffsetGroup"
    create_topic(appliance, topic, 2)
    for number in range(3):
        send_json(appliance, topic, f"offset {number}")
    wait_dispatched_at(appliance.broker)  # the max offsets follow the answers a moment later
    earliest = ok_json(appliance, "offset", "reset", group, "--topic", topic, "--to", "earliest")
    assert earliest["to"] == "earliest"
    assert [(row["queue_id"], row["queue_index"]) for row in earliest["queues"]] == [(0, 0), (1, 0)]
    shown = ok_json(appliance, "offset", "show", group, "--topic", topic)
    assert shown["total_lag"] == 3
    assert {row["consumer_queue_index"] for row in shown["queues"]} == {0}
    assert sum(row["broker_queue_index"] for row in shown["queues"]) == 3
    latest = ok_json(appliance, "offset", "reset", group, "--topic", topic, "--to", "latest")
    assert sum(row["queue_index"] for row in latest["queues"]) == 3
    assert ok_json(appliance, "offset", "show", group)["total_lag"] == 0
    dated = ok_json(
        appliance, "offset", "reset", group, "--topic", topic, "--to", "2000-01-01T00:00:00+00:00"
    )
    assert dated["to"] == "timestamp"
    assert dated["timestamp_ms"] == 946_684_800_000
    assert sum(row["queue_index"] for row in dated["queues"]) == 0
    tailed = tail_json(appliance, topic, "--group", group, "--count", "3", "--json")
    assert sorted(record["body"] for record in tailed) == ["offset 0", "offset 1", "offset 2"]
    text = ok(appliance, "offset", "show", group, "--topic", topic)
    assert "total lag 3" in text
    assert topic in text
    assert "reset to earliest" in ok(
        appliance, "offset", "reset", group, "--topic", topic, "--to", "earliest"
    )


# --- every error path: one line on stderr, non-zero exit ----------------------------------------


@pytest.fixture(scope="module")
def error_topics(appliance: Appliance) -> Appliance:
    """A writable topic and a read-only one for the error cases."""
    create_topic(appliance, ERROR_TOPIC)
    create_topic(appliance, READ_ONLY_TOPIC, perm="r")
    return appliance


NO_TOPIC = "CliNoSuchTopic"
ERROR_CASES: list[tuple[str, list[str], str]] = [
    ("route-unknown-topic", ["topic", "route", NO_TOPIC], "does not exist"),
    ("status-unknown-topic", ["topic", "status", NO_TOPIC], "does not exist"),
    ("update-unknown-topic", ["topic", "update", NO_TOPIC, "--perm", "r"], "does not exist"),
    ("delete-unknown-topic", ["topic", "delete", NO_TOPIC], "does not exist"),
    ("tail-unknown-topic", ["tail", "--topic", NO_TOPIC, "--count", "1"], "does not exist"),
    ("query-unknown-topic", ["message", "query", "--topic", NO_TOPIC, "--key", "k"], "not exist"),
    (
        "reset-unknown-topic",
        ["offset", "reset", "G", "--topic", NO_TOPIC, "--to", "latest"],
        "does not exist",
    ),
    ("create-existing-topic", ["topic", "create", ERROR_TOPIC], "exists on broker"),
    ("create-bad-name", ["topic", "create", "bad topic!"], "characters outside"),
    ("create-no-queues", ["topic", "create", "CliZeroQueues", "--read-queues", "0"], "outside"),
    ("create-bad-perm", ["topic", "create", "CliBadPerm", "--perm", "rwx"], "--perm"),
    ("update-nothing", ["topic", "update", ERROR_TOPIC], "nothing to change"),
    ("send-read-only", ["send", "--topic", READ_ONLY_TOPIC, "x"], "no writable queue"),
    ("get-short-msgid", ["message", "get", "XYZ"], "not 32 characters"),
    ("get-non-hex-msgid", ["message", "get", "Z" * 32], "not hexadecimal"),
    ("query-no-match", ["message", "query", "--topic", ERROR_TOPIC, "--key", "nope"], "no message"),
    ("show-unknown-group", ["offset", "show", "CliNoSuchGroup"], "is unknown"),
    ("reset-bad-time", ["offset", "reset", "G", "--topic", ERROR_TOPIC, "--to", "soon"], "ISO"),
    (
        "reset-bad-group",
        ["offset", "reset", "bad group", "--topic", ERROR_TOPIC, "--to", "latest"],
        "consumerGroup",
    ),
    ("tail-bad-from", ["tail", "--topic", ERROR_TOPIC, "--from", "middle"], "--from"),
    ("tail-zero-count", ["tail", "--topic", ERROR_TOPIC, "--count", "0"], "--count"),
    (
        "tail-timeout",
        ["tail", "--topic", ERROR_TOPIC, "--count", "1", "--timeout-s", "0.5"],
        "0 of 1 messages",
    ),
]


@pytest.mark.parametrize(
    ("args", "fragment"), [case[1:] for case in ERROR_CASES], ids=[case[0] for case in ERROR_CASES]
)
def test_an_error_is_one_line_and_a_nonzero_exit(
    error_topics: Appliance, args: list[str], fragment: str
) -> None:
    line = one_error_line(run(error_topics, *args))
    assert fragment in line


def test_message_get_of_an_unknown_broker_or_offset_is_one_line(appliance: Appliance) -> None:
    ip, port = appliance.broker.rsplit(":", 1)
    elsewhere = encode_offset_msg_id(pack_host("10.255.255.1", int(port)), 0)
    line = one_error_line(run(appliance, "message", "get", elsewhere))
    assert "which the name server does not know" in line
    past_the_end = encode_offset_msg_id(pack_host(ip, int(port)), 1 << 40)
    line = one_error_line(run(appliance, "message", "get", past_the_end))
    assert "has no message at commit log offset" in line


def test_an_unreachable_or_bad_name_server_is_one_line() -> None:
    address = f"127.0.0.1:{closed_port()}"
    line = one_error_line(runner.invoke(app, ["topic", "list", "--namesrv", address]))
    assert f"cannot reach the name server {address}" in line
    line = one_error_line(runner.invoke(app, ["cluster", "list", "--namesrv", "no-port"]))
    assert "is not an ip:port address" in line

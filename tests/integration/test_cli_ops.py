"""Goal: the rough edges a first run hit are gone (issue 16, sections 4 and 5): `start` says what
its silent seconds do and ends with the logs, the ports and how to stop; wire commands find the
running appliance's name server from its home, and an unreachable one names where its address
came from; ids carry RocketMQ's names (msgId = UNIQ_KEY, offsetMsgId) and `message get` takes
either; `send` takes --property, --delay-level and --queue and auto-creates a topic as clients
do; `tail` takes --from TIME and --body-format and says on a terminal that it waits; `message
query` takes a time range; `stop` refuses a negative timeout and fails on an unclean stop;
`config` shows RocketMQ key names and, with --home, the running appliance's; `--version`;
and `mqbox top` shows rates, lag, processes and store positions, once (--once) and live on a
real terminal (tmux).

Method: nothing is mocked. One appliance per module, started by the real `mqbox start --daemon`
in a subprocess (fresh home under tmp, port 0, small store files); the wire commands run
through typer's CliRunner with $MQBOX_HOME set to that home and $MQBOX_NAMESRV unset, so each
of them finds the name server by the home. Load comes from mqbox.client's Producer and
PushConsumer. The terminal tests run `mqbox` under a tmux server of their own (`tmux -L`),
read the screen with capture-pane, and kill that server by pid. Every process is found by pid
and killed at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from mqbox.admin import broker_ops, ops
from mqbox.admin.cli import app
from mqbox.client import ConsumeResult, Producer, PushConsumer
from mqbox.client.messages import ReceivedMessage
from mqbox.ipc import names
from mqbox.server.home import read_state, recorded_processes
from tests.conftest import unique_name
from tests.integration import test_cli_wire
from tests.integration.test_cli_lifecycle import mqbox
from tests.integration.test_cli_wire import _kill_recorded, closed_port, one_error_line
from tests.support.appliance import running_supervisor
from tests.support.cli import environment, mqbox_command
from tests.support.read_back import wait_dispatched_at
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

runner = CliRunner()

BROKER_CONF = test_cli_wire.BROKER_CONF + "messageDelayLevel=1s 2s\n"
UNKNOWN_KEY = "someKeyMqboxDoesNotKnow"
WAIT_S = 60.0
STARTING = "mqbox: starting mqbox in "
COMPILING = ops.warm_up_text(compiling=True)
TAIL_TIMEOUT_S = "30"


@dataclasses.dataclass(frozen=True)
class Started:
    home: Path
    namesrv: str
    broker: str
    start: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    root = tmp_path_factory.mktemp("cli-ops")
    home = root / "home"
    conf = root / "broker.conf"
    conf.write_text(BROKER_CONF, encoding="utf-8")
    state: dict[str, Any] = {}
    try:
        result = mqbox(
            *("start", "--daemon", "--home", str(home), "--config", str(conf)),
            *("--namesrv-port", "0", "--broker-port", "0"),
        )
        state = read_state(home) or {}
        assert result.returncode == 0, result.stderr
        namesrv = state["namesrv"]
        yield Started(
            home, f"{namesrv['host']}:{namesrv['port']}", state["broker"]["address"], result
        )
    finally:
        mqbox("stop", "--home", str(home), "--timeout-s", "60")
        _kill_recorded(state or read_state(home) or {})
        instance = state.get("instance")
        if isinstance(instance, str) and instance:
            names.unlink_instance(instance)


def run(started: Started, *args: str, input_bytes: bytes | None = None) -> Result:
    """`mqbox ARGS` with $MQBOX_HOME = the appliance's home and no $MQBOX_NAMESRV."""
    return runner.invoke(
        app,
        list(args),
        env={"MQBOX_HOME": str(started.home), ops.NAMESRV_ENV: None},
        input=input_bytes,
    )


def ok(started: Started, *args: str) -> str:
    result = run(started, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    assert result.stderr == ""
    return result.stdout


def ok_json(started: Started, *args: str) -> Any:
    return json.loads(ok(started, *args, "--json"))


def create_topic(started: Started, topic: str, queue_count: int = 2) -> None:
    ok(
        started,
        *("topic", "create", topic, "--read-queues", str(queue_count)),
        *("--write-queues", str(queue_count)),
    )


def iso(timestamp_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


# --- start, stop, config, version ---------------------------------------------------------------


def test_start_ends_with_where_the_logs_ports_and_stop_are(started: Started) -> None:
    home = started.home
    # Into a pipe, a start says what it does only when it must compile the kernels.
    assert started.start.stderr in ("", f"{STARTING}{home}: {COMPILING}\n")
    stdout = started.start.stdout
    assert f"namesrv {started.namesrv}" in stdout
    assert f"broker  broker-a {started.broker}" in stdout
    assert f"logs    {home}/logs/" in stdout
    assert f"stop    mqbox stop --home {home}" in stdout
    assert (home / "logs").is_dir()


def test_a_start_that_must_compile_says_so_first(tmp_path: Path) -> None:
    """An empty numba cache: the start says it compiles before anything else. (It fails fast on
    a busy port, before compiling anything.)"""
    home = tmp_path / "home"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                *mqbox_command(),
                *("start", "--daemon", "--home", str(home)),
                *("--namesrv-port", "0", "--broker-port", str(port)),
            ],
            env={**environment(), "NUMBA_CACHE_DIR": str(tmp_path / "empty-cache")},
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
    assert result.returncode != 0
    notice, error = result.stderr.strip().splitlines()
    assert notice == f"{STARTING}{home}: {COMPILING}"
    assert f"127.0.0.1:{port}" in error


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("mqbox 0.")
    assert "RocketMQ" in result.stdout


def test_stop_refuses_a_negative_timeout(tmp_path: Path) -> None:
    result = runner.invoke(app, ["stop", "--home", str(tmp_path), "--timeout-s", "-1"])
    assert "--timeout-s -1 is negative" in one_error_line(result)


def test_config_shows_rocketmq_key_names_and_the_ignored_keys(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(f"{BROKER_CONF}{UNKNOWN_KEY}=1\n", encoding="utf-8")
    result = runner.invoke(app, ["config", "--config", str(conf)])
    assert result.exit_code == 0, result.stderr
    for line in (
        "  mapedFileSizeCommitLog = 16777216",
        "  mapedFileSizeConsumeQueue = 60000",
        "  brokerRole = ASYNC_MASTER",
        "  autoCreateTopicEnable = true",
        "  messageDelayLevel = 1s 2s",
        "  mqboxSendProcessorCount = 1",
        f"  # ignored (not known to mqbox): {UNKNOWN_KEY}",
    ):
        assert line in result.stdout.splitlines(), result.stdout


def test_config_with_home_shows_what_the_running_appliance_uses(started: Started) -> None:
    shown = json.loads(ok(started, "config", "--home", str(started.home), "--json"))
    assert shown["source"].startswith(f"the appliance running in {started.home}")
    # The ports as bound (the file asked for 0 through the options) and the name server the
    # broker registers with.
    assert shown["broker"]["listenPort"] == int(started.broker.rsplit(":", 1)[1])
    assert shown["broker"]["namesrvAddr"] == started.namesrv
    assert shown["namesrv"]["listenPort"] == int(started.namesrv.rsplit(":", 1)[1])
    assert shown["broker"]["messageDelayLevel"] == "1s 2s"
    assert shown["ignored"] == {"broker": [], "namesrv": []}


def test_config_with_a_home_where_nothing_runs_is_one_line(tmp_path: Path) -> None:
    line = one_error_line(runner.invoke(app, ["config", "--home", str(tmp_path)]))
    assert f"not running in {tmp_path}" in line


def test_an_unclean_stop_exits_nonzero_with_the_reason(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    """A role that cannot take SIGTERM (stopped with SIGSTOP) is killed by the supervisor after
    its stop timeout (1 s here); `mqbox stop` learns it from run/last-stop.json."""
    home = tmp_path / "home"
    home.mkdir()
    conf = home / "broker.conf"
    conf.write_text(BROKER_CONF, encoding="utf-8")
    arguments = ["--config", str(conf), "--broker-port", "0", "--namesrv-port", "0"]
    with running_supervisor(home, [*arguments, "--stop-timeout-s", "1"], reap_pids) as (
        process,
        ready,
        _,
    ):
        os.kill(int(ready["roles"]["services.0"]), signal.SIGSTOP)
        result = mqbox("stop", "--home", str(home), "--timeout-s", "60")
        process.wait(timeout=WAIT_S)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    line = result.stderr.strip()
    assert line.startswith(f"mqbox: stopped in {home}, not cleanly: ")
    assert "killed or exited non-zero while stopping" in line


# --- the name server of the running appliance ---------------------------------------------------


def test_wire_commands_find_the_name_server_of_the_home(started: Started) -> None:
    listed = ok_json(started, "cluster", "list")  # by $MQBOX_HOME
    assert [broker["address"] for broker in listed["brokers"]] == [started.broker]
    by_option = runner.invoke(
        app,
        ["cluster", "list", "--home", str(started.home), "--json"],
        env={"MQBOX_HOME": None, ops.NAMESRV_ENV: None},
    )
    assert by_option.exit_code == 0, by_option.stderr
    assert started.broker in by_option.stdout
    source = ops.resolve_namesrv(None, started.home)
    assert source == ops.NamesrvAddress(started.namesrv, f"the appliance running in {started.home}")


def test_an_unreachable_name_server_says_where_its_address_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    line = one_error_line(runner.invoke(app, ["topic", "list", "--namesrv", address]))
    assert line.endswith("(address from --namesrv)")
    line = one_error_line(runner.invoke(app, ["topic", "list"], env={ops.NAMESRV_ENV: address}))
    assert line.endswith(f"(address from ${ops.NAMESRV_ENV})")
    monkeypatch.delenv(ops.NAMESRV_ENV, raising=False)
    resolved = ops.resolve_namesrv(None, tmp_path)  # nothing runs there
    assert resolved.source == f"namesrvAddr of {ops.config_paths(None)[1]}"


# --- send and message get ---------------------------------------------------------------------


def test_send_prints_both_ids_and_message_get_takes_either(started: Started) -> None:
    topic = unique_name("OpsIds").replace("-", "_")
    create_topic(started, topic)
    sent = ok_json(started, "send", "--topic", topic, "--property", "color=blue", "ids body")
    text = ok(started, "send", "--topic", topic, "second")
    assert text.startswith("msgId ")
    assert " offsetMsgId " in text
    by_offset = ok_json(started, "message", "get", sent["offset_msg_id"])
    assert (by_offset["msg_id"], by_offset["offset_msg_id"]) == (
        sent["msg_id"],
        sent["offset_msg_id"],
    )
    assert by_offset["properties"]["color"] == "blue"
    assert by_offset["properties"]["UNIQ_KEY"] == sent["msg_id"]

    def found_by_msg_id(*extra: str) -> bool:
        result = run(started, "message", "get", sent["msg_id"], *extra, "--json")
        return result.exit_code == 0 and json.loads(result.stdout)["body"] == "ids body"

    # The UNIQ_KEY is found through the index, which the dispatcher writes a moment later.
    wait_until(lambda: found_by_msg_id("--topic", topic), "the msgId in the topic's index")
    assert found_by_msg_id()  # without --topic: every topic's index is asked


def test_send_auto_creates_a_topic_as_the_clients_do(started: Started) -> None:
    topic = unique_name("OpsAuto").replace("-", "_")
    sent = ok_json(started, "send", "--topic", topic, "auto")
    assert sent["topic"] == topic
    # The broker registers the new topic with the name server right after it made it.
    wait_until(
        lambda: run(started, "topic", "route", topic).exit_code == 0, "the new topic's route"
    )
    route = ok_json(started, "topic", "route", topic)
    assert [broker["broker_name"] for broker in route["brokers"]] == ["broker-a"]


def test_send_to_a_chosen_queue(started: Started) -> None:
    topic = unique_name("OpsQueue").replace("-", "_")
    create_topic(started, topic, 4)
    for queue_id in (2, 3, 2):
        assert (
            ok_json(started, "send", "--topic", topic, "--queue", str(queue_id), "q")["queue_id"]
            == queue_id
        )
    wait_dispatched_at(started.broker)  # the max offsets follow the answers a moment later
    status = ok_json(started, "topic", "status", topic)
    assert [queue["queue_index_max"] for queue in status["queues"]] == [0, 0, 2, 1]
    line = one_error_line(run(started, "send", "--topic", topic, "--queue", "9", "q"))
    assert "no writable queue 9" in line


def test_send_with_a_delay_level_arrives_later(started: Started) -> None:
    topic = unique_name("OpsDelay").replace("-", "_")
    create_topic(started, topic, 1)
    sent = ok_json(started, "send", "--topic", topic, "--delay-level", "1", "later")
    (record,) = [
        json.loads(line)
        for line in ok(
            started,
            *("tail", "--topic", topic, "--from", "earliest", "--count", "1"),
            *("--timeout-s", TAIL_TIMEOUT_S, "--json"),
        ).splitlines()
    ]
    assert record["body"] == "later"
    assert record["msg_id"] == sent["msg_id"]
    # Level 1 of this broker's messageDelayLevel is 1 s: stored again (in the topic) that late.
    assert record["store_timestamp_ms"] - record["born_timestamp_ms"] >= 1000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--property", "no-equals"], "is not NAME=VALUE"),
        (["--property", "TAGS=x"], "TAGS"),
        (["--delay-level", "-1"], "--delay-level -1 is negative"),
        (["--queue", "-1"], "--queue -1 is negative"),
    ],
    ids=["property-without-value", "system-property", "negative-delay", "negative-queue"],
)
def test_bad_send_options_are_one_line(started: Started, args: list[str], fragment: str) -> None:
    line = one_error_line(run(started, "send", "--topic", "OpsBadOptions", *args, "x"))
    assert fragment in line


# --- tail and message query -------------------------------------------------------------------


def test_tail_from_a_time_starts_at_the_first_message_stored_then(started: Started) -> None:
    topic = unique_name("OpsFrom").replace("-", "_")
    create_topic(started, topic, 1)
    first = ok_json(started, "send", "--topic", topic, "first")
    stored_ms = ok_json(started, "message", "get", first["offset_msg_id"])["store_timestamp_ms"]
    ok_json(started, "send", "--topic", topic, "second")
    second_ms = ok_json(
        started,
        "message",
        "get",
        ok_json(started, "send", "--topic", topic, "third")["offset_msg_id"],
    )["store_timestamp_ms"]
    assert second_ms > stored_ms
    stdout = ok(
        started,
        *("tail", "--topic", topic, "--from", iso(stored_ms + 1), "--count", "2"),
        *("--timeout-s", TAIL_TIMEOUT_S, "--json"),
    )
    assert [json.loads(line)["body"] for line in stdout.splitlines()] == ["second", "third"]
    line = one_error_line(
        run(
            started,
            "tail",
            "--topic",
            topic,
            "--from",
            "2999-01-01T00:00:00",
            "--count",
            "1",
            "--timeout-s",
            "1",
        )
    )
    assert "0 of 1 messages" in line
    line = one_error_line(run(started, "tail", "--topic", topic, "--from", "yesterday"))
    assert "--from 'yesterday' is not earliest, latest or an ISO 8601 time" in line


def test_tail_and_get_show_bodies_as_text_hex_or_base64(started: Started) -> None:
    topic = unique_name("OpsBody").replace("-", "_")
    create_topic(started, topic, 1)
    body = b"\x00\x01hi\xff"
    sent = json.loads(
        run(started, "send", "--topic", topic, "-", "--json", input_bytes=body).stdout
    )
    tail = ("tail", "--topic", topic, "--from", "earliest", "--count", "1", "--timeout-s", "30")
    assert ok(started, *tail, "--body-format", "hex").rstrip().endswith(body.hex())
    assert ok(started, *tail, "--body-format", "base64").rstrip().endswith("AAFoaf8=")
    (record,) = [
        json.loads(line)
        for line in ok(started, *tail, "--json", "--body-format", "hex").splitlines()
    ]
    assert (record["body"], record["body_format"]) == (body.hex(), "hex")
    shown = ok(started, "message", "get", sent["offset_msg_id"], "--body-format", "hex")
    assert f"body:              {body.hex()}" in shown.splitlines()


def test_message_query_takes_a_time_range(started: Started) -> None:
    topic = unique_name("OpsRange").replace("-", "_")
    create_topic(started, topic, 1)
    sent = ok_json(started, "send", "--topic", topic, "--keys", "rangekey", "in range")
    stored_ms = ok_json(started, "message", "get", sent["offset_msg_id"])["store_timestamp_ms"]
    query = ("message", "query", "--topic", topic, "--key", "rangekey")

    def found(*bounds: str) -> list[str]:
        result = run(started, *query, *bounds, "--json")
        if result.exit_code != 0:
            return []
        return [message["body"] for message in json.loads(result.stdout)["messages"]]

    wait_until(lambda: found() == ["in range"], "the key in the index")
    assert found("--begin", iso(stored_ms - 1000), "--end", iso(stored_ms + 1000)) == ["in range"]
    line = one_error_line(run(started, *query, "--begin", iso(stored_ms + 1000)))
    assert "stored in that time range" in line
    line = one_error_line(run(started, *query, "--end", iso(stored_ms - 1000)))
    assert "stored in that time range" in line
    line = one_error_line(
        run(started, *query, "--begin", iso(stored_ms), "--end", iso(stored_ms - 1))
    )
    assert "is after --end" in line


def test_offset_reset_help_tells_rocketmqs_nearest_message_rule() -> None:
    result = runner.invoke(app, ["offset", "reset", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "nearest" in result.stdout


# --- mqbox top ----------------------------------------------------------------------------------


@contextlib.contextmanager
def load(started: Started, topic: str, group: str) -> Iterator[Callable[[], int]]:
    """A producer sending to `topic` every 20 ms and a push consumer of `group` on it, until the
    block ends; yields a function that says how many messages were consumed."""
    consumed = 0
    lock = threading.Lock()

    def handle(messages: Sequence[ReceivedMessage]) -> ConsumeResult:
        nonlocal consumed
        with lock:
            consumed += len(messages)
        return ConsumeResult.SUCCESS

    stop = threading.Event()
    errors: list[BaseException] = []
    consumer = PushConsumer(group, started.namesrv, persist_interval_ms=200)
    consumer.subscribe(topic, "*", handle)
    consumer.start()
    producer = Producer(unique_name("OpsTopProducer"), started.namesrv)
    producer.start()

    def keep_sending() -> None:
        try:
            while not stop.wait(0.02):
                producer.send(topic, b"load")
        except BaseException as error:  # reported by the test thread
            errors.append(error)

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        yield lambda: consumed
    finally:
        stop.set()
        sender.join()
        producer.shutdown()
        consumer.shutdown()
    assert errors == []


def test_top_once_shows_rates_lag_processes_and_store(started: Started) -> None:
    topic = unique_name("OpsTop").replace("-", "_")
    group = unique_name("OpsTopGroup").replace("-", "_")
    create_topic(started, topic, 2)
    frames: list[dict[str, Any]] = []

    def moving() -> bool:
        frames.append(ok_json(started, "top", "--once"))
        topics = {row["topic"]: row for row in frames[-1]["topics"]}
        groups = {(row["group"], row["topic"]): row for row in frames[-1]["groups"]}
        row = groups.get((group, topic))
        return (
            topics.get(topic, {}).get("put_per_s", 0) > 0
            and row is not None
            and row["get_per_s"] > 0
        )

    with load(started, topic, group) as consumed:
        wait_until(moving, "put and get rates above zero in `top --once`", WAIT_S)
        assert consumed() > 0
    shown = frames[-1]
    (topic_row,) = [row for row in shown["topics"] if row["topic"] == topic]
    assert (topic_row["queue_count"], topic_row["stored_now"] > 0) == (2, True)
    (group_row,) = [row for row in shown["groups"] if row["group"] == group]
    assert group_row["consumer_count"] == 1
    assert group_row["lag"] >= 0
    assert all(not row["topic"].startswith("%RETRY%") for row in shown["topics"])
    assert "TBW102" not in {row["topic"] for row in shown["topics"]}
    processes = {row["name"]: row for row in shown["processes"]}
    assert {"supervisor", "namesrv", "store_writer.0", "send.0", "reactor.0"} <= set(processes)
    assert all(row["pid"] > 0 and row["pss_bytes"] > 0 for row in processes.values())
    store = shown["store"]
    assert store["store"]["write_log_offset_bytes"] > 0
    assert store["store"]["flushed_log_offset_bytes"] <= store["store"]["write_log_offset_bytes"]
    assert shown["problems"] == []
    text = ok(started, "top", "--once", "--all-topics")
    for fact in (topic, group, "store_writer.0", "PUT/s", "GET/s", "LAG", "TBW102", "store:"):
        assert fact in text, text


def test_top_without_an_appliance_says_what_it_cannot_read(tmp_path: Path) -> None:
    address = f"127.0.0.1:{closed_port()}"
    result = runner.invoke(
        app,
        [
            *("top", "--once", "--json", "--interval-s", "0.1"),
            *("--namesrv", address, "--home", str(tmp_path)),
        ],
    )
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert (shown["topics"], shown["groups"], shown["processes"]) == ([], [], [])
    assert shown["store"] is None
    cannot_reach, nothing_runs = shown["problems"]
    assert cannot_reach.startswith(f"cannot reach the name server {address}")
    assert nothing_runs.startswith(f"no appliance runs in {tmp_path}")


def test_top_refuses_bad_options() -> None:
    assert "--interval-s 0" in one_error_line(runner.invoke(app, ["top", "--interval-s", "0"]))
    assert "--json needs --once" in one_error_line(runner.invoke(app, ["top", "--json"]))


# --- on a real terminal (tmux) ------------------------------------------------------------------


class Tmux:
    """A tmux server of the test's own (`-L name`), one window of `width` x `height`."""

    def __init__(self, name: str, reap_pids: list[int]) -> None:
        self.name = name
        self._call("new-session", "-d", "-s", "main", "-x", "200", "-y", "60")
        reap_pids.append(int(self._call("display-message", "-p", "#{pid}").strip()))

    def _call(self, *args: str) -> str:
        completed = subprocess.run(
            ["tmux", "-L", self.name, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return completed.stdout

    def type(self, *keys: str) -> None:
        self._call("send-keys", "-t", "main", *keys)

    def screen(self) -> str:
        return self._call("capture-pane", "-p", "-t", "main")

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._call("kill-server")


@pytest.fixture
def tmux(reap_pids: list[int]) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (bin/test installs it with apt-get)")
    terminal = Tmux(unique_name("mqbox-tmux"), reap_pids)
    try:
        yield terminal
    finally:
        terminal.close()


def mqbox_line(started: Started, *args: str) -> str:
    """A shell line running `mqbox ARGS` from this checkout, then printing its exit status."""
    variables = {"PYTHONPATH": environment()["PYTHONPATH"], "MQBOX_HOME": str(started.home)}
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in variables.items())
    command = shlex.join([*mqbox_command(), *args])
    return f"env -u {ops.NAMESRV_ENV} {assignments} {command}; echo mqbox-exit=$?"


def test_top_runs_live_on_a_terminal_and_stops_on_ctrl_c(started: Started, tmux: Tmux) -> None:
    topic = unique_name("OpsLive").replace("-", "_")
    group = unique_name("OpsLiveGroup").replace("-", "_")
    create_topic(started, topic, 1)
    with load(started, topic, group):
        tmux.type(mqbox_line(started, "top"), "Enter")

        def frame_with_rates() -> bool:
            screen = tmux.screen()
            return "rates over" in screen and topic in screen and group in screen

        wait_until(frame_with_rates, "a live frame naming the topic and the group", WAIT_S)
        first = tmux.screen()
        wait_until(lambda: tmux.screen() != first, "the next refresh", WAIT_S)
    screen = tmux.screen()
    for fact in ("mqbox top", "PUT/s", "GET/s", "store_writer.0", "reactor.0", "store: written"):
        assert fact in screen, screen
    tmux.type("C-c")
    wait_until(lambda: "mqbox-exit=0" in tmux.screen(), "top to end on Ctrl-C", WAIT_S)
    assert "Traceback" not in tmux.screen()


def test_tail_says_it_waits_on_a_terminal(started: Started, tmux: Tmux) -> None:
    topic = unique_name("OpsWait").replace("-", "_")
    create_topic(started, topic, 1)
    tmux.type(mqbox_line(started, "tail", "--topic", topic, "--count", "1"), "Enter")
    wait_until(
        lambda: f"waiting for messages on {topic}" in tmux.screen(),
        "tail's waiting line",
        WAIT_S,
    )
    broker_ops.send(started.namesrv, topic, b"arrived")
    wait_until(lambda: "mqbox-exit=0" in tmux.screen(), "tail to print and end", WAIT_S)
    screen = tmux.screen()
    assert "arrived" in screen
    assert "waiting for messages" not in screen  # erased when the message came
    tmux.type("clear", "Enter")
    wait_until(lambda: "mqbox-exit" not in tmux.screen(), "a clear screen", WAIT_S)
    tmux.type(mqbox_line(started, "tail", "--topic", topic), "Enter")
    wait_until(
        lambda: f"waiting for messages on {topic}" in tmux.screen(),
        "tail's waiting line again",
        WAIT_S,
    )
    tmux.type("C-c")
    wait_until(lambda: "mqbox-exit=0" in tmux.screen(), "tail to end on Ctrl-C", WAIT_S)
    assert "waiting for messages" not in tmux.screen()  # erased on the way out


def test_start_on_a_terminal_shows_a_spinner_then_the_addresses(
    tmp_path: Path, tmux: Tmux, reap_pids: list[int]
) -> None:
    home = tmp_path / "home"
    conf = tmp_path / "broker.conf"
    conf.write_text(BROKER_CONF, encoding="utf-8")
    variables = f"PYTHONPATH={shlex.quote(environment()['PYTHONPATH'])}"
    command = shlex.join(
        [
            *mqbox_command(),
            *("start", "--daemon", "--home", str(home), "--config", str(conf)),
            *("--namesrv-port", "0", "--broker-port", "0"),
        ]
    )
    try:
        tmux.type(f"env {variables} {command}; echo mqbox-exit=$?", "Enter")
        wait_until(lambda: STARTING[len("mqbox: ") :] in tmux.screen(), "the spinner", WAIT_S)
        wait_until(lambda: "mqbox-exit=0" in tmux.screen(), "the start to end", WAIT_S * 3)
        screen = tmux.screen()
        assert f"stop    mqbox stop --home {home}" in screen
        assert f"logs    {home}/logs/" in screen
    finally:
        reap_pids.extend(pid for _, pid, _ in recorded_processes(read_state(home) or {}))
        mqbox("stop", "--home", str(home), "--timeout-s", "60")

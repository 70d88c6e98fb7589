"""Drive the official C++ client (PyPI `rocketmq==0.4.4`) against a real appliance, for tests.

Owns: the real appliance of a test (`running_appliance`: the supervisor with the broker's real
topology and the real name server, both on 127.0.0.1 port 0, in a home of the test's own), the
child processes that run the wrapper (`cpp_child`: one client per child, a script written to the
child's directory, HOME pointed there for the client's logs, JSON lines on stdout, "stop" on
stdin, a bounded wait, SIGKILL by PID in `finally`), and the one comparable view of a message
(`MessageView`) that every check uses, whether the message was sent, read back raw, or received
by a C++ consumer. The raw-protocol read-back of what the broker stored lives in
tests/support/read_back.py and is re-exported here.

Never: broker behaviour of its own, fixed ports or names, or a client in the test's own process
(the wrapper starts native threads that a later fork would copy half-way, and its `__del__`
hooks may crash an interpreter at exit).

Why the bodies are text without NUL: the wrapper's `SetMessageBody` and `GetMessageBody` pass C
strings, so a body is cut at its first NUL byte on both sides. Unicode text is fine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from mqbox.client.remoting import RemotingClient
from mqbox.message import (
    BODY_SIZE_BYTES_MAX_DEFAULT,
    StoredMessage,
    decode_properties_str,
    decompress_body,
)
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import (
    ConsumerListBody,
)
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.read_back import REQUEST_TIMEOUT_MS as REQUEST_TIMEOUT_MS
from tests.support.read_back import create_topic as create_topic
from tests.support.read_back import decode_records as decode_records
from tests.support.read_back import read_back as read_back
from tests.support.read_back import read_back_until as read_back_until
from tests.support.read_back import read_queue_count as read_queue_count
from tests.support.read_back import wait_routed as wait_routed

log = logging.getLogger(__name__)
REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHILD_STOP_TIMEOUT_S: Final = 30.0  # a push consumer's shutdown persists offsets and unregisters
CPP_SHUTDOWN_ABORT: Final = (
    "terminate called after throwing an instance of 'boost::thread_interrupted'"
)

SEQ_PROPERTY: Final = "mqboxSeq"  # user property naming each test message uniquely
# Properties the client or the broker add; everything else in a stored record is the user's.
SYSTEM_PROPERTY_NAMES: Final = frozenset(
    {"UNIQ_KEY", "WAIT", "TAGS", "KEYS", "CLUSTER", "MSG_REGION", "TRACE_ON"}
)


# --- raw protocol (tests/support/read_back.py) ---------------------------------------------------


def committed_offset(appliance: Appliance, group: str, topic: str, queue_id: int) -> int:
    """QUERY_CONSUMER_OFFSET; -1 when the broker has none (code 22)."""
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id)}
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        response = broker.invoke(RequestCode.QUERY_CONSUMER_OFFSET, ext)
    if response.code != ResponseCode.SUCCESS:
        return -1
    return int(response.ext_fields["offset"])


def consumer_ids(appliance: Appliance, group: str) -> tuple[str, ...]:
    """GET_CONSUMER_LIST_BY_GROUP; () when the broker knows no consumer of the group."""
    with RemotingClient(appliance.broker_address, REQUEST_TIMEOUT_MS) as broker:
        response = broker.invoke(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if response.code != ResponseCode.SUCCESS:
        return ()
    return ConsumerListBody.from_json(response.body).consumer_id_list


# --- messages -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MessageView:
    """What must come back identical: body (by SHA-256 and size), tags, keys, user properties
    (the test's sequence property included). Absent tags or keys are ""."""

    seq: str
    body_sha256: str
    body_size_bytes: int
    tags: str
    keys: str
    properties: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class SentMessage:
    """One message a C++ producer sends; `seq` is unique within the test."""

    seq: str
    body: str
    tags: str = ""
    keys: str = ""
    properties: tuple[tuple[str, str], ...] = ()

    def user_properties(self) -> dict[str, str]:
        return {**dict(self.properties), SEQ_PROPERTY: self.seq}

    def view(self) -> MessageView:
        body = self.body.encode("utf-8")
        return MessageView(
            self.seq,
            hashlib.sha256(body).hexdigest(),
            len(body),
            self.tags,
            self.keys,
            tuple(sorted(self.user_properties().items())),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "body": self.body,
            "tags": self.tags,
            "keys": self.keys,
            "properties": self.user_properties(),
        }


def stored_view(record: StoredMessage) -> MessageView:
    """The view of a record read back raw: the body inflated when the sysflag says zlib."""
    body, _ = decompress_body(
        record.body, record.sysflag, size_bytes_max=BODY_SIZE_BYTES_MAX_DEFAULT
    )
    properties = decode_properties_str(record.properties)
    user = {name: value for name, value in properties.items() if name not in SYSTEM_PROPERTY_NAMES}
    return MessageView(
        properties.get(SEQ_PROPERTY, ""),
        hashlib.sha256(body).hexdigest(),
        len(body),
        properties.get("TAGS", ""),
        properties.get("KEYS", ""),
        tuple(sorted(user.items())),
    )


def received_view(event: Mapping[str, Any]) -> MessageView:
    """The view of a `message` event of a C++ consumer child."""
    properties: dict[str, str] = event["properties"]
    return MessageView(
        properties.get(SEQ_PROPERTY, ""),
        str(event["sha256"]),
        int(event["size"]),
        str(event["tags"]),
        str(event["keys"]),
        tuple(sorted(properties.items())),
    )


def property_names(messages: Iterable[SentMessage]) -> list[str]:
    """Every user property name of `messages`: what a consumer child asks each message for."""
    return sorted({name for message in messages for name in message.user_properties()})


def assert_exactly_once(
    views: Sequence[MessageView], expected: Iterable[SentMessage], what: str
) -> None:
    """`views` hold every expected message once, identical, and nothing else."""
    wanted = {message.seq: message.view() for message in expected}
    counts = Counter(view.seq for view in views)
    duplicated = sorted(seq for seq, count in counts.items() if count > 1)
    missing = sorted(set(wanted) - set(counts))
    unexpected = sorted(set(counts) - set(wanted))
    assert not missing, f"{what}: {len(missing)} of {len(wanted)} missing: {missing[:20]}"
    assert not unexpected, f"{what}: unexpected messages {unexpected[:20]}"
    assert not duplicated, f"{what}: duplicated {duplicated[:20]}"
    for view in views:
        assert view == wanted[view.seq], f"{what}: {view} differs from {wanted[view.seq]}"


# --- child processes ----------------------------------------------------------------------------

CHILD_SCRIPT: Final = r'''
"""One client of the official C++ wrapper, driven by the spec file named in argv[1]."""
import hashlib
import json
import os
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer, SendStatus

with open(sys.argv[1], encoding="utf-8") as spec_file:
    spec = json.load(spec_file)
_emit_lock = threading.Lock()


def emit(**event):
    line = json.dumps(event)
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def finish(code=0):
    with _emit_lock:
        sys.stdout.flush()
    os._exit(code)  # no wrapper __del__ at interpreter exit, after the orderly shutdown above


def text(value):
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def make_message(topic, item):
    message = Message(topic)
    if item["keys"]:
        message.set_keys(item["keys"])
    if item["tags"]:
        message.set_tags(item["tags"])
    message.set_body(item["body"].encode("utf-8"))
    for name, value in item["properties"].items():
        message.set_property(name, value)
    level = spec.get("delay_levels", {}).get(item["properties"]["mqboxSeq"])
    if level:
        message.set_delay_time_level(level)
    return message


def describe(message):
    body = message.body or b""
    properties = {}
    for name in spec["property_names"]:
        value = text(message.get_property(name))
        if value:
            properties[name] = value
    return dict(
        event="message",
        topic=text(message.topic),
        queue_id=message.queue_id,
        queue_offset=message.queue_offset,
        reconsume_times=message.reconsume_times,
        msg_id=text(message.id),
        tags=text(message.tags),
        keys=text(message.keys),
        sha256=hashlib.sha256(body).hexdigest(),
        size=len(body),
        properties=properties,
    )


def sign_with_credentials(client):
    """spec["credentials"] = [access key, secret key, channel]: the plain ACL's session."""
    if spec.get("credentials"):
        client.set_session_credentials(*spec["credentials"])


def status_name(status):
    return SendStatus(status).name


def send_sync(producer, topic, item):
    seq = item["properties"]["mqboxSeq"]
    try:
        result = producer.send_sync(make_message(topic, item))
    except Exception as error:
        emit(event="send_failed", seq=seq, error=f"{type(error).__name__}: {error}")
    else:
        emit(event="sent", seq=seq, status=status_name(result.status),
             msg_id=result.msg_id, offset=result.offset)


def produce():
    producer = Producer(spec["group"])
    producer.set_namesrv_addr(spec["namesrv"])
    producer.set_timeout(spec.get("timeout_ms", 3000))
    producer.set_max_message_size(spec.get("max_message_size", 4 * 1024 * 1024))
    sign_with_credentials(producer)
    producer.start()
    emit(event="started")
    topic = spec["topic"]
    items = spec["messages"]
    method = spec["method"]
    kept = []
    if method == "sync":
        for item in items:
            send_sync(producer, topic, item)
    elif method == "orderly":
        for item, arg in zip(items, spec["order_args"]):
            seq = item["properties"]["mqboxSeq"]
            try:
                result = producer.send_orderly(make_message(topic, item), arg)
            except Exception as error:
                emit(event="send_failed", seq=seq, error=f"{type(error).__name__}: {error}")
            else:
                emit(event="sent", seq=seq, status=status_name(result.status),
                     msg_id=result.msg_id, offset=result.offset, arg=arg)
    elif method == "oneway":
        for item in items:
            seq = item["properties"]["mqboxSeq"]
            try:
                producer.send_oneway(make_message(topic, item))
            except Exception as error:
                emit(event="send_failed", seq=seq, error=f"{type(error).__name__}: {error}")
            else:
                emit(event="sent_oneway", seq=seq)
    elif method == "async":
        done = threading.Condition()
        answered = []

        def callbacks(seq):
            def on_success(result):
                emit(event="sent", seq=seq, status=status_name(result.status),
                     msg_id=result.msg_id, offset=result.offset)
                with done:
                    answered.append(seq)
                    done.notify_all()

            def on_exception(error):
                emit(event="send_failed", seq=seq, error=f"{type(error).__name__}: {error}")
                with done:
                    answered.append(seq)
                    done.notify_all()

            return on_success, on_exception

        for item in items:
            seq = item["properties"]["mqboxSeq"]
            message = make_message(topic, item)
            kept.append(message)
            on_success, on_exception = callbacks(seq)
            try:
                producer.send_async(message, on_success, on_exception)
            except Exception as error:
                emit(event="send_failed", seq=seq, error=f"{type(error).__name__}: {error}")
                with done:
                    answered.append(seq)
        deadline = time.monotonic() + spec.get("callback_wait_s", 30)
        with done:
            while len(answered) < len(items) and time.monotonic() < deadline:
                done.wait(0.1)
        emit(event="callbacks", count=len(answered))
    elif method == "batch":
        for batch in spec["batches"]:
            seqs = [items[index]["properties"]["mqboxSeq"] for index in batch]
            messages = [make_message(topic, items[index]) for index in batch]
            try:
                result = producer.send_batch(messages)
            except Exception as error:
                emit(event="batch_failed", seqs=seqs, error=f"{type(error).__name__}: {error}")
            else:
                emit(event="batch_sent", seqs=seqs, status=status_name(result.status),
                     msg_id=result.msg_id, offset=result.offset)
    elif method == "until_stopped":
        # Numbered messages ("prefix-N", the seq also the key) one sync send after another,
        # `interval_s` apart, until a line (or end of file) on stdin.
        stop = threading.Event()

        def wait_for_stop():
            sys.stdin.readline()
            stop.set()

        threading.Thread(target=wait_for_stop, daemon=True).start()
        index = 0
        while not stop.is_set():
            seq = f"{spec['prefix']}-{index}"
            index += 1
            item = {"body": f"body {seq}", "tags": "", "keys": seq, "properties": {"mqboxSeq": seq}}
            send_sync(producer, topic, item)
            stop.wait(spec.get("interval_s", 0))
    else:
        raise SystemExit(f"unknown method {method}")
    producer.shutdown()
    emit(event="done")


def push():
    consumer = PushConsumer(spec["group"])
    consumer.set_namesrv_addr(spec["namesrv"])
    if spec.get("thread_count"):
        consumer.set_thread_count(spec["thread_count"])

    def on_message(message):
        emit(**describe(message))

    sign_with_credentials(consumer)
    consumer.subscribe(spec["topic"], on_message, spec.get("expression", "*"))
    # The client's timers (route polls 3 s after start, then every 30 s) start inside start().
    emit(event="starting", wall_time_s=time.time())
    consumer.start()
    emit(event="started", pid=os.getpid())
    sys.stdin.readline()  # "stop", or end of file when the test went away
    emit(event="stopping")
    consumer.shutdown()
    emit(event="done")


def pull():
    consumer = PullConsumer(spec["group"])
    consumer.set_namesrv_addr(spec["namesrv"])
    sign_with_credentials(consumer)
    consumer.start()
    emit(event="started", pid=os.getpid())
    for message in consumer.pull(spec["topic"], spec.get("expression", "*")):
        emit(**describe(message))
    consumer.shutdown()
    emit(event="done")


{"produce": produce, "push": push, "pull": pull}[spec["mode"]]()
finish()
'''


class CppChild:
    """One child process running CHILD_SCRIPT; a thread collects its JSON-lines events."""

    def __init__(self, process: subprocess.Popen[bytes], directory: Path) -> None:
        self.process = process
        self.directory = directory
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, name=f"cpp-child-{process.pid}")
        self._reader.daemon = True
        self._reader.start()

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        with contextlib.suppress(ValueError, OSError):  # the stream closed under a killed child
            for raw in stream:
                self._add(raw.decode("utf-8", "replace").rstrip("\n"))

    def _add(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            event = {"event": "text", "text": line}
        if not isinstance(event, dict):
            event = {"event": "text", "text": line}
        with self._lock:
            self._events.append(event)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self._events if kind is None or e.get("event") == kind]

    def messages(self) -> list[dict[str, Any]]:
        return self.events("message")

    def stderr(self) -> str:
        return (self.directory / "stderr.txt").read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        """Its state, for assertion messages."""
        kinds = Counter(str(e.get("event")) for e in self.events())
        return (
            f"child {self.process.pid} status {self.process.poll()} events {dict(kinds)}\n"
            + (self.stderr()[-4000:])
        )

    def wait_for(self, condition: Callable[[CppChild], bool], timeout_s: float, what: str) -> None:
        """Poll `condition` until it holds; AssertionError after `timeout_s` or if the child
        exited without it holding."""
        deadline = time.monotonic() + timeout_s
        while not condition(self):
            exited = self.process.poll() is not None
            if exited:
                self._reader.join(5)
                if condition(self):
                    return
            assert not exited, f"the child exited before {what}: {self.describe()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.describe()}"
            time.sleep(0.05)

    def wait_started(self, timeout_s: float = 30.0) -> None:
        self.wait_for(lambda child: bool(child.events("started")), timeout_s, "its start")

    def finish(self, timeout_s: float = CHILD_STOP_TIMEOUT_S) -> list[dict[str, Any]]:
        """Tell it to stop (a push consumer shuts down in order), wait for its exit within
        `timeout_s`, and return every event. AssertionError if it had to be killed, exited
        with a failure status, or never reported `done`."""
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                stdin.write(b"stop\n")
                stdin.flush()
            with contextlib.suppress(BrokenPipeError, OSError):
                stdin.close()
        try:
            status = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            message = f"the child did not end in {timeout_s} s: {self.describe()}"
            raise AssertionError(message) from None
        self._reader.join(10)
        if status == -signal.SIGABRT and self.events("stopping") and not self.events("done"):
            # librocketmq 0.4.4's PushConsumer.shutdown() sometimes aborts: a pool thread lets
            # boost::thread_interrupted escape (rocketmq-client-cpp issue 204, "sometimes
            # consumer.shutdown will coredump"). Everything it consumed was reported before
            # "stopping"; only an abort with exactly that signature is the client's own.
            assert CPP_SHUTDOWN_ABORT in self.stderr(), self.describe()
            log.warning(
                "the C++ consumer %d aborted in shutdown(): %s",
                self.process.pid,
                CPP_SHUTDOWN_ABORT,
            )
            return self.events()
        assert status == 0, self.describe()
        assert self.events("done"), self.describe()
        return self.events()

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._reader.join(10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError, OSError):
                    stream.close()


@contextlib.contextmanager
def cpp_child(
    directory: Path,
    spec: Mapping[str, Any],
    reap_pids: list[int],
    script_text: str = "",
    *,
    module: str = "",
) -> Iterator[CppChild]:
    """Run one C++ client in a child `python` with `spec` (see CHILD_SCRIPT; or a script of the
    caller's own, `script_text`, or a module of this repository, `module`, that reads the same
    spec file argument and writes the same JSON lines); SIGKILLed by PID on the way out if it is
    still running."""
    directory.mkdir(parents=True, exist_ok=True)
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    if module:
        command = [sys.executable, "-m", module, str(spec_path)]
    else:
        script = directory / "cpp_child.py"
        script.write_text(script_text or CHILD_SCRIPT, encoding="utf-8")
        command = [sys.executable, str(script), str(spec_path)]
    # rocketmq-cpp writes its logs under $HOME/logs; one child per directory.
    environment = {
        **os.environ,
        "HOME": str(directory),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    with (directory / "stderr.txt").open("wb") as stderr:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=directory,
            env=environment,
        )
    reap_pids.append(process.pid)
    child = CppChild(process, directory)
    try:
        yield child
    finally:
        child.kill()


def produce(
    directory: Path,
    appliance: Appliance | str,
    topic: str,
    messages: Sequence[SentMessage],
    reap_pids: list[int],
    *,
    method: str = "sync",
    timeout_s: float = 60.0,
    **extra: Any,
) -> list[dict[str, Any]]:
    """Send `messages` from one C++ producer child with `method` (sync, async, oneway, orderly
    with `order_args`, batch with `batches` of indexes; `delay_levels` maps a seq to its delay
    level); its events once it ended. `appliance` may be a name server address (a layout)."""
    spec = {
        "mode": "produce",
        "namesrv": appliance if isinstance(appliance, str) else appliance.namesrv_address,
        "group": unique_name("PG"),
        "topic": topic,
        "method": method,
        "messages": [message.to_json() for message in messages],
        **extra,
    }
    with cpp_child(directory, spec, reap_pids) as child:
        return child.finish(timeout_s)


def acknowledged(events: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `sent` events with status SEND_OK, by seq."""
    return {
        str(e["seq"]): dict(e)
        for e in events
        if e.get("event") == "sent" and e.get("status") == "OK"
    }


def push_spec(
    appliance: Appliance,
    group: str,
    topic: str,
    messages: Iterable[SentMessage],
    expression: str = "*",
) -> dict[str, Any]:
    return {
        "mode": "push",
        "namesrv": appliance.namesrv_address,
        "group": group,
        "topic": topic,
        "expression": expression,
        "property_names": property_names(messages),
    }


def received_seqs(child: CppChild) -> set[str]:
    return {received_view(e).seq for e in child.messages()}


def sample_messages(prefix: str, count: int, *, big_every: int = 0) -> list[SentMessage]:
    """`count` varied messages: tags TagA, TagB, TagC or none; keys or none; ASCII and Unicode
    bodies and properties; with `big_every` > 0, every that-many-th body is 6 KiB, over the 4 KiB
    at which the C++ producer compresses."""
    tags_cycle = ("TagA", "TagB", "TagC", "")
    messages: list[SentMessage] = []
    for index in range(count):
        seq = f"{prefix}-{index}"
        body = f"body {seq} héllo wörld ✓ 消息 🚀"
        if big_every and index % big_every == big_every - 1:
            body = (body + " ") * (6144 // len(body.encode("utf-8")) + 1)
        properties: tuple[tuple[str, str], ...] = (("color", ("red", "green", "blue")[index % 3]),)
        if index % 2:
            properties += (("名前", f"値 {index} ✓"), ("emoji", "🚀✨"))
        messages.append(
            SentMessage(
                seq,
                body,
                tags=tags_cycle[index % len(tags_cycle)],
                keys=f"key-{index} shared-key" if index % 5 else "",
                properties=properties,
            )
        )
    return messages

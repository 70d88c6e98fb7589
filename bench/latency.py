"""bench/latency.py: how long does one synchronous send take, end to end?

One send at a time, `--size-bytes` bodies (128 B), to a topic of 8 queues created up front, on an
ASYNC_FLUSH broker (acknowledged after the page-cache write), two ways:

- cpp: the official C++ client (PyPI rocketmq==0.4.4, the wrapper's `Producer.send_sync`,
  SEND_MESSAGE (10) with UNIQ_KEY and WAIT properties, queues round-robin). It runs in a child
  `python` of its own (the wrapper is not fork-safe; HOME points at a temporary directory for its
  logs), sends `--warmup` messages untimed, then times each of `--count` sends with
  time.perf_counter_ns around `send_sync` alone, and writes the samples to a file the parent
  reads. The child is SIGKILLed by PID if it outlives its deadline.
- raw: mqbox.client.remoting's RemotingClient in this process, one request in flight: the same
  SEND_MESSAGE header shape and properties (a fresh UNIQ_KEY each), each `invoke` timed the same
  way, after the same warm-up. The raw figure is the broker's part plus a small Python client.

Every answer must be SEND_OK (code 0); failed sends are counted and left out of the samples.
Reported: `cpp_p50_us`, `cpp_p99_us`, `cpp_p999_us`, `cpp_count`, `cpp_failures` and the same
`raw_*`; the shared `p50_us` / `p99_us` / `p999_us` keys repeat the cpp figures (the official
client is what the target is about); `msgs` and `secs` count the timed sends of both ways and
the time spent inside them; `*_broker_cpu_us_per_send` is the CPU time of every broker
process (supervisor and roles) during that part, per send, warm-up (and the C++ client's start
and route lookups) included; `*_role_cpu_us_per_send` is the same per role. Targets: official
client p50 <= 100 us, p99 <= 1,000 us.

Unless --namesrv is given, the script starts its own appliance in a temporary home on free ports
(_load.py's `appliance`) and stops it afterwards. `checksum` covers the body and how many sends
each way came back SEND_OK.

With --acl the appliance runs with `aclEnable=true` (one admin account, _load.py): the C++
producer signs with `set_session_credentials`, the raw client with the same account (its signing
is inside the timed `invoke`), and the broker's codec verifies every send (docs/acl.md).

Usage: python bench/latency.py [--size-bytes N] [--count N] [--warmup N] [--namesrv host:port]
                               [--acl] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from _common import emit, log, percentiles_us  # bench/ is sys.path[0]
from _load import (
    BENCH_CREDENTIALS,
    DEFAULT_TOPIC,
    DEFAULT_TOPIC_QUEUE_COUNT,
    Appliance,
    appliance,
    create_topic,
    message_body,
    role_cpu_secs,
    uniq_key,
)

from mqbox.client.remoting import RemotingClient, RemotingError
from mqbox.message import encode_properties_str
from mqbox.protocol.codes import RequestCode, ResponseCode
from mqbox.protocol.headers import SendMessageRequestHeader

BENCH: Final = "latency"
SEND_TIMEOUT_MS: Final = 3000
CHILD_START_ALLOWANCE_S: Final = 120.0  # the wrapper's start and its first route lookup
CHILD_SECS_PER_SEND_MAX: Final = 0.05
FAILURES_IN_A_ROW_MAX: Final = 20  # then the broker is down, not slow: stop and say so

CHILD_SCRIPT: Final = r'''
"""One official C++ producer (rocketmq 0.4.4): sync sends one at a time, each one timed."""
import json
import os
import sys
import time

from rocketmq.client import Message, Producer, SendStatus

with open(sys.argv[1], encoding="utf-8") as spec_file:
    spec = json.load(spec_file)
producer = Producer(spec["group"])
producer.set_namesrv_addr(spec["namesrv"])
producer.set_timeout(spec["timeout_ms"])
if spec.get("credentials"):
    producer.set_session_credentials(*spec["credentials"])
producer.start()
topic = spec["topic"]
body = spec["body"].encode("ascii")
warmup = spec["warmup"]
clock = time.perf_counter_ns
samples = []
failures = 0
failed_in_a_row = 0
errors = []
for number in range(warmup + spec["count"]):
    if failed_in_a_row >= spec["failures_in_a_row_max"]:
        break
    message = Message(topic)
    message.set_body(body)
    started = clock()
    try:
        result = producer.send_sync(message)
    except Exception as error:
        failures += 1
        failed_in_a_row += 1
        errors.append(f"{type(error).__name__}: {error}")
        continue
    elapsed = clock() - started
    if result.status != SendStatus.OK:
        failures += 1
        failed_in_a_row += 1
        errors.append(f"status {SendStatus(result.status).name}")
        continue
    failed_in_a_row = 0
    if number >= warmup:
        samples.append(elapsed)
with open(spec["output"], "w", encoding="utf-8") as output:
    gave_up = failed_in_a_row >= spec["failures_in_a_row_max"]
    json.dump(
        {"samples_ns": samples, "failures": failures, "errors": errors[:10], "gave_up": gave_up},
        output,
    )
producer.shutdown()
os._exit(0)  # no wrapper __del__ at interpreter exit
'''


@dataclasses.dataclass
class Part:
    """One way of sending: the latencies of the successful timed sends, and what it cost."""

    samples_ns: list[int]
    failures: int
    secs: float
    broker_cpu_secs: float  # over the whole part: warm-up (and the C++ client's start) included
    sends: int  # warm-up included
    role_cpu_secs: dict[str, float]  # the same by role (and supervisor)


def cpp_part(
    app: Appliance, topic: str, body: bytes, count: int, warmup: int, acl: bool = False
) -> Part:
    """The C++ child of the module docstring; SystemExit if it fails or overstays."""
    with tempfile.TemporaryDirectory(prefix=f"mqbox-{BENCH}-cpp-") as directory_text:
        directory = Path(directory_text)
        script = directory / "cpp_latency.py"
        script.write_text(CHILD_SCRIPT, encoding="utf-8")
        output = directory / "samples.json"
        spec = {
            "namesrv": app.namesrv_address,
            "group": f"bench_latency_{os.getpid()}",
            "topic": topic,
            "body": body.decode("ascii"),
            "count": count,
            "warmup": warmup,
            "timeout_ms": SEND_TIMEOUT_MS,
            "failures_in_a_row_max": FAILURES_IN_A_ROW_MAX,
            "output": str(output),
            "credentials": (
                [BENCH_CREDENTIALS.access_key, BENCH_CREDENTIALS.secret_key, "ALIYUN"]
                if acl
                else None
            ),
        }
        spec_path = directory / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        deadline_s = CHILD_START_ALLOWANCE_S + (count + warmup) * CHILD_SECS_PER_SEND_MAX
        cpu_before = app.cpu_secs()
        roles_before = role_cpu_secs(app)
        started = time.perf_counter()
        with (directory / "stderr.txt").open("wb") as stderr:
            # The wrapper writes its logs under $HOME/logs.
            process = subprocess.Popen(
                [sys.executable, str(script), str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                cwd=directory,
                env={**os.environ, "HOME": str(directory)},
            )
        try:
            status = process.wait(deadline_s)
        except subprocess.TimeoutExpired:
            status = None
        finally:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        secs = time.perf_counter() - started
        cpu_secs = app.cpu_secs() - cpu_before
        roles = cpu_delta(roles_before, role_cpu_secs(app))
        if status != 0 or not output.exists():
            tail = (directory / "stderr.txt").read_text(encoding="utf-8", errors="replace")
            raise SystemExit(
                f"{BENCH}: the C++ producer child "
                + ("overstayed its deadline" if status is None else f"exited with {status}")
                + f": {tail[-2000:]}"
            )
        result = json.loads(output.read_text(encoding="utf-8"))
    for error in result["errors"]:
        log(f"{BENCH}: C++ send failed: {error}")
    if result["gave_up"]:
        raise SystemExit(f"{BENCH}: {FAILURES_IN_A_ROW_MAX} C++ sends failed in a row")
    samples = [int(sample) for sample in result["samples_ns"]]
    return Part(samples, result["failures"], secs, cpu_secs, warmup + count, roles)


def raw_send(client: RemotingClient, topic: str, body: bytes, number: int) -> int | None:
    """One SEND_MESSAGE (10) of the C++ client's header shape: the ns `invoke` took, or None
    when it failed (logged). The header is built before the clock starts."""
    stamp = f"raw{os.getpid():08d}{number:010d}".encode()
    properties = encode_properties_str({"UNIQ_KEY": uniq_key(stamp), "WAIT": "true"})
    ext = SendMessageRequestHeader(
        "bench_latency_raw",
        topic,
        DEFAULT_TOPIC,
        DEFAULT_TOPIC_QUEUE_COUNT,
        number % DEFAULT_TOPIC_QUEUE_COUNT,
        0,
        int(time.time() * 1000),
        0,
        properties.decode(),
    ).to_ext()
    sent_ns = time.perf_counter_ns()
    try:
        response = client.invoke(RequestCode.SEND_MESSAGE, ext, body)
    except RemotingError as error:
        log(f"{BENCH}: raw send failed: {error}")
        return None
    elapsed_ns = time.perf_counter_ns() - sent_ns
    if response.code != ResponseCode.SUCCESS:
        log(f"{BENCH}: raw send answered {response.code}: {response.remark}")
        return None
    return elapsed_ns


def raw_part(
    app: Appliance, topic: str, body: bytes, count: int, warmup: int, acl: bool = False
) -> Part:
    """RemotingClient, one SEND_MESSAGE (10) in flight, the C++ client's header shape."""
    samples: list[int] = []
    failures = 0
    failed_in_a_row = 0
    cpu_before = app.cpu_secs()
    roles_before = role_cpu_secs(app)
    started = time.perf_counter()
    credentials = BENCH_CREDENTIALS if acl else None
    with RemotingClient(app.broker_address, SEND_TIMEOUT_MS, credentials=credentials) as client:
        for number in range(warmup + count):
            elapsed_ns = raw_send(client, topic, body, number)
            if elapsed_ns is not None:
                failed_in_a_row = 0
                if number >= warmup:
                    samples.append(elapsed_ns)
                continue
            failures += 1
            failed_in_a_row += 1
            if failed_in_a_row >= FAILURES_IN_A_ROW_MAX:
                raise SystemExit(f"{BENCH}: {failed_in_a_row} raw sends failed in a row")
    secs = time.perf_counter() - started
    roles = cpu_delta(roles_before, role_cpu_secs(app))
    return Part(samples, failures, secs, app.cpu_secs() - cpu_before, warmup + count, roles)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {role: after[role] - before.get(role, 0.0) for role in after}


def figures(prefix: str, part: Part, with_cpu: bool) -> dict[str, Any]:
    found: dict[str, Any] = {
        f"{prefix}_{key}": value for key, value in percentiles_us(part.samples_ns).items()
    }
    found[f"{prefix}_count"] = len(part.samples_ns)
    found[f"{prefix}_failures"] = part.failures
    found[f"{prefix}_broker_cpu_us_per_send"] = (
        round(part.broker_cpu_secs / part.sends * 1e6, 1) if with_cpu and part.sends else None
    )
    found[f"{prefix}_role_cpu_us_per_send"] = {
        role: round(secs / part.sends * 1e6, 1) for role, secs in part.role_cpu_secs.items()
    }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--count", type=int, default=10_000, help="timed sends each way")
    parser.add_argument("--warmup", type=int, default=1_000, help="untimed sends first")
    parser.add_argument("--namesrv", help="use the appliance behind this name server")
    parser.add_argument("--acl", action="store_true", help="aclEnable=true; every request signed")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    size_bytes = arguments.size_bytes
    count = arguments.count
    warmup = arguments.warmup
    if arguments.smoke:
        count, warmup = 100, 20
    assert size_bytes > 0
    assert count > 0
    assert warmup >= 0
    body = message_body(b"mqbox latency ", size_bytes)
    topic = f"BenchLatency{os.getpid()}"
    extra_conf = "mapedFileSizeCommitLog=67108864\n" if arguments.smoke else ""
    acl = arguments.acl
    with appliance(BENCH, arguments.namesrv, extra_conf, acl=acl) as app:
        log(f"{BENCH}: broker {app.broker_address}, up in {app.startup_secs:.2f} s")
        create_topic(app, topic, credentials=BENCH_CREDENTIALS if acl else None)
        cpp = cpp_part(app, topic, body, count, warmup, acl)
        log(f"{BENCH}: cpp: {percentiles_us(cpp.samples_ns)}, {cpp.failures} failed")
        raw = raw_part(app, topic, body, count, warmup, acl)
        log(f"{BENCH}: raw: {percentiles_us(raw.samples_ns)}, {raw.failures} failed")
    digest = hashlib.blake2b(body, digest_size=8)
    digest.update(f"{len(cpp.samples_ns)} {len(raw.samples_ns)}".encode())
    with_cpu = bool(app.pids)
    extra: dict[str, Any] = {
        **percentiles_us(cpp.samples_ns),
        **figures("cpp", cpp, with_cpu),
        **figures("raw", raw, with_cpu),
        "startup_secs": round(app.startup_secs, 3),
        "checksum": digest.hexdigest(),
    }
    emit(
        BENCH,
        {
            "size_bytes": size_bytes,
            "count": count,
            "warmup": warmup,
            "inflight": 1,
            "queues": DEFAULT_TOPIC_QUEUE_COUNT,
            "flush_disk_type": "ASYNC_FLUSH" if arguments.namesrv is None else "the broker's",
            "acl": acl,
        },
        len(cpp.samples_ns) + len(raw.samples_ns),
        (sum(cpp.samples_ns) + sum(raw.samples_ns)) / 1e9,
        size_bytes,
        **extra,
    )


if __name__ == "__main__":
    main()

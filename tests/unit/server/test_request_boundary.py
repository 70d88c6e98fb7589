"""Goal (issue 9, part 1): a bug that one request reaches, in a processor, the codec or the
worker, is answered SYSTEM_ERROR with a remark and logged with its traceback, and the role serves
the next request as before; failed asserts count as such bugs (processors/__init__.py says why);
the tracebacks are rate limited, so a client repeating such a request cannot fill the disk.

Method: the front's roles as objects in this process (tests/support/front_in_process.py) over
real rings and a socket on 127.0.0.1 port 0. A bug is planted where each role's code calls into
the request: an admin handler that raises, the codec's decode_command and the worker's router
replaced for one test with functions that raise (pytest's monkeypatch, unit tests only). The
FailureLog is driven by a hand-moved clock and read through caplog.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NoReturn

import pytest

from mqbox import resources
from mqbox.protocol.codes import ResponseCode
from mqbox.server import codec as codec_module
from mqbox.server.processors import Request
from mqbox.server.processors.admin import MQBOX_NOOP
from tests.support.front_client import FrontClient
from tests.support.front_in_process import FrontInProcess

PLANTED_CODE = 10_077  # no role serves it, so only the planted handler answers it


@pytest.fixture
def client(front: FrontInProcess) -> Iterator[FrontClient]:
    connected = FrontClient("127.0.0.1", front.port, pump=front.pump)
    try:
        yield connected
    finally:
        connected.close()


def assert_failed_then_served(
    client: FrontClient,
    code: int,
    remark_part: str,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> None:
    """`code` is answered SYSTEM_ERROR with `remark_part` in its remark; then, with the planted
    bug gone (monkeypatch undone), the same connection is served as before."""
    failed = client.call(code)
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert failed.remark is not None
    assert remark_part in failed.remark
    if monkeypatch is not None:
        monkeypatch.undo()
    assert client.call(MQBOX_NOOP).code == ResponseCode.SUCCESS


def raise_value_error(request: Request) -> NoReturn:
    raise ValueError(f"planted bug reached by code {request.code}")


def fail_an_assert(request: Request) -> NoReturn:
    assert request.code < 0, "planted assert"
    raise AssertionError("unreachable")


@pytest.mark.parametrize("handler", [raise_value_error, fail_an_assert])
def test_processor_answers_a_bug_it_reached_and_serves_on(
    front: FrontInProcess, client: FrontClient, handler: object, caplog: pytest.LogCaptureFixture
) -> None:
    admin = front.admins[0]
    admin.handlers[PLANTED_CODE] = handler  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR):
        assert_failed_then_served(client, PLANTED_CODE, "admin.0 failed on this request")
    assert admin.statistics().unexpected_errors == 1
    (logged,) = [r for r in caplog.records if "unexpected" in r.getMessage()]
    assert logged.exc_info is not None
    assert f"serving request code {PLANTED_CODE}" in logged.getMessage()


def test_codec_answers_a_frame_whose_decoding_hit_a_bug_and_keeps_the_connection(
    front: FrontInProcess, client: FrontClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def decode_with_a_bug(*arguments: object) -> object:
        raise KeyError("planted bug in the codec")

    monkeypatch.setattr(codec_module, "decode_command", decode_with_a_bug)
    assert_failed_then_served(client, MQBOX_NOOP, "failed on this frame (KeyError)", monkeypatch)
    assert sum(codec.statistics().unexpected_errors for codec in front.codecs) == 1


def test_worker_answers_a_command_whose_routing_hit_a_bug(
    front: FrontInProcess, client: FrontClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = front.workers[0]

    def route_with_a_bug(*arguments: object) -> None:
        raise IndexError("planted bug in the worker")

    monkeypatch.setattr(worker, "_route", route_with_a_bug)
    remark = "worker.0 failed on this request (IndexError)"
    assert_failed_then_served(client, MQBOX_NOOP, remark, monkeypatch)
    assert worker.statistics().unexpected_errors == 1


def test_failure_log_keeps_a_few_tracebacks_a_minute_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now_ns = 0

    def clock_ns() -> int:
        return now_ns

    failures = resources.FailureLog(
        logging.getLogger("test.failures"), traceback_count_max=3, clock_ns=clock_ns
    )
    with caplog.at_level(logging.ERROR, logger="test.failures"):
        for number in range(10):
            failures.record("a test", ValueError(number))
        now_ns = resources.FAILURE_LOG_INTERVAL_NS
        failures.record("a test", ValueError("next minute"))
    messages = [record.getMessage() for record in caplog.records]
    assert failures.failure_count == 11
    assert sum(record.exc_info is not None for record in caplog.records) == 4
    assert "7 more unexpected failures were not logged in the last minute" in messages

"""A PushConsumer in a process of its own, so a test can SIGKILL it: `python -m
tests.support.consumer_child <spec.json>`.

Owns: one mqbox.client PushConsumer made from the spec (namesrv, group, topic, orderly,
consume_batch_size, rebalance_interval_ms, handler_pause_s), and its report: JSON lines on
stdout, `{"event": "started"}`, then one `{"event": "message", "body", "queue_id",
"queue_offset", "t"}` per message handed to the handler (written and flushed before the handler
answers SUCCESS, so a message reported may still be uncommitted when the process dies), and
`{"event": "done"}` after an orderly shutdown, which "stop" on stdin (or its end) asks for.
Never: decisions of the test (which messages, when to kill).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from mqbox.client import ConsumeResult, PushConsumer, ReceivedMessage

_lock = threading.Lock()


def emit(**event: object) -> None:
    line = json.dumps(event)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    pause_s = float(spec.get("handler_pause_s", 0.0))

    def handle(messages: Sequence[ReceivedMessage]) -> ConsumeResult:
        for message in messages:
            emit(
                event="message",
                body=message.body.decode("utf-8"),
                queue_id=message.queue_id,
                queue_offset=message.queue_offset,
                t=time.time(),
            )
            if pause_s:
                time.sleep(pause_s)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(
        spec["group"],
        spec["namesrv"],
        orderly=bool(spec.get("orderly", False)),
        consume_batch_size=int(spec.get("consume_batch_size", 1)),
        rebalance_interval_ms=int(spec.get("rebalance_interval_ms", 20_000)),
        persist_interval_ms=int(spec.get("persist_interval_ms", 5_000)),
    )
    consumer.subscribe(spec["topic"], "*", handle)
    consumer.start()
    emit(event="started", client_id=consumer.client_id)
    sys.stdin.readline()
    consumer.shutdown()
    emit(event="done")


if __name__ == "__main__":
    main()

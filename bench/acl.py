"""bench/acl.py: what the plain ACL's check costs the broker per request and per message.

The codec role checks every request once (mqbox/acl/validator.py, docs/acl.md): it sorts and
joins the header values, runs HMAC-SHA1 over them and the body, and looks up what the code
needs. This bench times `AclValidator.check` in one process, in CPU time (process_time_ns, so a
busy machine's other processes do not count), on the requests bench/produce.py sends: a
SEND_BATCH_MESSAGE (320) of `--batch` messages of `--size-bytes` (UNIQ_KEY each), and a single
SEND_MESSAGE_V2 (310). Reported: `batch_check_us` and `batch_check_ns_per_msg`, `single_check_us`,
the best of `--repeat` rounds; compare the per-message figure with produce.py's
broker_cpu_us_per_msg to see the share (docs/BENCHMARKS.md, "Issue 13").

Usage: python bench/acl.py [--size-bytes N] [--batch N] [--count N] [--repeat N] [--smoke]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import emit, log  # bench/ is sys.path[0]
from _load import BENCH_ACL_TEXT, BENCH_CREDENTIALS, batch_bodies, send_header

from mqbox.acl.signature import sign_request
from mqbox.acl.validator import AclValidator
from mqbox.protocol.codes import RequestCode

BENCH = "acl"
PEER = "127.0.0.1"


def best_cpu_us(check: Callable[[], str | None], count: int, repeat: int) -> float:
    """The fastest of `repeat` rounds of `count` checks, in CPU us per check."""
    best_ns = float("inf")
    for _ in range(repeat):
        started = time.process_time_ns()
        for _ in range(count):
            if check() is not None:
                raise SystemExit(f"{BENCH}: a signed request was refused")
        best_ns = min(best_ns, (time.process_time_ns() - started) / count)
    return best_ns / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-bytes", type=int, default=128, help="message body size")
    parser.add_argument("--batch", type=int, default=1000, help="messages per batch request")
    parser.add_argument("--count", type=int, default=2000, help="batch checks per round")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny parameters")
    arguments = parser.parse_args()
    batch, count, repeat = arguments.batch, arguments.count, arguments.repeat
    if arguments.smoke:
        batch, count, repeat = 50, 20, 1
    with tempfile.TemporaryDirectory(prefix=f"mqbox-{BENCH}-") as directory:
        path = Path(directory) / "plain_acl.yml"
        path.write_text(BENCH_ACL_TEXT, encoding="utf-8")
        run(AclValidator(path), arguments.size_bytes, batch, count, repeat)


def run(validator: AclValidator, size_bytes: int, batch: int, count: int, repeat: int) -> None:
    """Time the checks and print the JSON line (the module docstring)."""
    batch_body = batch_bodies(size_bytes, batch, 1)[0]
    batch_ext = sign_request(BENCH_CREDENTIALS, send_header("BenchAcl", 0, batch=True), batch_body)
    single_body = b"x" * size_bytes
    single_ext = sign_request(BENCH_CREDENTIALS, send_header("BenchAcl", 0), single_body)
    code_batch = RequestCode.SEND_BATCH_MESSAGE
    code_single = RequestCode.SEND_MESSAGE_V2
    batch_us = best_cpu_us(
        lambda: validator.check(code_batch, batch_ext, batch_body, PEER), count, repeat
    )
    single_us = best_cpu_us(
        lambda: validator.check(code_single, single_ext, single_body, PEER), count * 20, repeat
    )
    log(f"{BENCH}: batch of {batch}: {batch_us:.1f} us per check; single: {single_us:.2f} us")
    emit(
        BENCH,
        {"size_bytes": size_bytes, "batch": batch, "count": count, "repeat": repeat},
        count * batch,
        batch_us * count / 1e6,
        size_bytes,
        batch_check_us=round(batch_us, 2),
        batch_check_ns_per_msg=round(batch_us * 1000 / batch, 1),
        batch_body_bytes=len(batch_body),
        single_check_us=round(single_us, 3),
        checksum=hashlib.blake2b(batch_body + single_body, digest_size=8).hexdigest(),
    )


if __name__ == "__main__":
    main()

"""/metrics scraped by a real Prometheus server (Debian's `prometheus`, which bin/test installs):
the series it stored after sends carry the values the broker counted."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import admin_api
from mqbox.client.remoting import RemotingClient
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.send_requests import send_to_queue_header

PROMETHEUS = shutil.which("prometheus")
READY_WAIT_S = 60.0
SERIES_WAIT_S = 90.0

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the `prometheus` binary is not installed (bin/test installs Debian's prometheus)",
)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus(appliance: Appliance, tmp_path: Path, reap_pids: list[int]) -> Iterator[str]:
    """A Prometheus scraping the appliance's /metrics every second; yields its base URL."""
    assert PROMETHEUS is not None
    target = urllib.parse.urlsplit(appliance.http_url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: mqbox\n"
        "    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n",
        encoding="utf-8",
    )
    log_path = tmp_path / "prometheus.log"
    for _ in range(3):  # a free port may be taken between the probe and the bind: try another
        port = _free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        reap_pids.append(process.pid)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        if process.poll() is None:
            try:
                yield base
            finally:
                process.terminate()
                process.wait(30)
            return
    raise AssertionError(f"prometheus did not start:\n{log_path.read_text(errors='replace')}")


def _wait_value(base: str, query: str, expected: float) -> list[dict[str, Any]]:
    """Poll the query API until a series of `query` has `expected` as its value."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    deadline = time.monotonic() + SERIES_WAIT_S
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        document = _get_json(url)
        assert document["status"] == "success", document
        result = document["data"]["result"]
        if any(float(series["value"][1]) == expected for series in result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{query} never reached {expected}: last answer {result}")


def test_prometheus_scrapes_put_counts(appliance: Appliance, prometheus: str) -> None:
    topic = unique_name("Prom").replace("-", "_")
    with RemotingClient(appliance.broker_address) as client:
        for index in range(7):
            admin_api.send_message(client, send_to_queue_header(topic), b"body-%d" % index)
    put = _wait_value(prometheus, f'mqbox_topic_put_messages_total{{topic="{topic}"}}', 7)
    labels = put[0]["metric"]
    assert labels["job"] == "mqbox"
    assert labels["broker"] == "broker-a"
    assert labels["cluster"] == "DefaultCluster"
    _wait_value(prometheus, f'rocketmq_producer_offset{{topic="{topic}"}}', 7)
    _wait_value(prometheus, 'up{job="mqbox"}', 1)
    # The send latency histogram counted at least these sends (other tests may add more).
    histogram = _get_json(
        f"{prometheus}/api/v1/query?"
        + urllib.parse.urlencode({"query": 'mqbox_send_latency_seconds_count{job="mqbox"}'})
    )
    assert float(histogram["data"]["result"][0]["value"][1]) >= 7

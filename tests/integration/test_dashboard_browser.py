"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by playwright; bin/test
installs both): every page shows what the broker holds, and the charts move under load."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqbox.client import admin_api
from mqbox.client.remoting import RemotingClient
from mqbox.message import PROPERTY_KEYS
from mqbox.protocol.codes import RequestCode, ResponseCode
from tests.conftest import unique_name
from tests.support.appliance import Appliance
from tests.support.read_back import wait_dispatched
from tests.support.send_requests import send_to_queue_header

CHROMIUM = shutil.which("chromium")
try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - bin/test installs the dev extra
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's `chromium` is not installed (bin/test installs it with apt-get)",
    ),
    pytest.mark.skipif(
        sync_playwright is None,
        reason="playwright is not installed (the dev extra: pip install -e .[dev])",
    ),
]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGE_TIMEOUT_MS = 30_000
SEND_COUNT = 6
GROUP_COMMITTED = 2


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert sync_playwright is not None
    assert CHROMIUM is not None
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(PAGE_TIMEOUT_MS)
    try:
        yield opened
    finally:
        context.close()


@pytest.fixture(scope="module")
def data(appliance: Appliance) -> dict[str, Any]:
    """A topic with SEND_COUNT messages (the first with KEYS "k-1"), dispatched, and a group that
    committed GROUP_COMMITTED in its queue 0."""
    topic = unique_name("Dash").replace("-", "_")
    group = unique_name("DashGroup").replace("-", "_")
    with RemotingClient(appliance.broker_address) as client:
        ids = [
            admin_api.send_message(
                client,
                send_to_queue_header(
                    topic, properties={PROPERTY_KEYS: "k-1"} if index == 0 else None
                ),
                f"dashboard body {index}".encode(),
            ).msg_id
            for index in range(SEND_COUNT)
        ]
        ext = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": "0",
            "commitOffset": str(GROUP_COMMITTED),
        }
        committed = client.invoke(RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        assert committed.code == ResponseCode.SUCCESS, committed.remark
        # The pages show max offsets and look keys up once: both follow the answers a moment
        # later (the dispatcher).
        wait_dispatched(client)
    return {"topic": topic, "group": group, "ids": ids}


class Load:
    """Sends one message at a time to `topic` from a thread until stopped."""

    def __init__(self, appliance: Appliance, topic: str) -> None:
        self._address = appliance.broker_address
        self._topic = topic
        self._stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with RemotingClient(self._address) as client:
            while not self._stop.is_set():
                admin_api.send_message(client, send_to_queue_header(self._topic), b"load")
                self.sent += 1
                time.sleep(0.002)


def _chart_state(page: Page, selector: str) -> tuple[int, int, float]:
    chart = page.locator(selector)
    return (
        int(chart.get_attribute("data-point-count") or 0),
        int(chart.get_attribute("data-last-t") or 0),
        float(chart.get_attribute("data-last-put-tps") or 0),
    )


def test_cluster_page_and_its_chart_under_load(
    appliance: Appliance, data: dict[str, Any], page: Page, tmp_path: Path
) -> None:
    page.goto(appliance.http_url)
    page.wait_for_selector("#card-role")
    assert page.inner_text("#card-role .value") == "ASYNC_MASTER"
    assert "mqbox" in page.inner_text("#card-version .value")
    assert "broker-a" in page.inner_text("h1")
    assert "%" in page.inner_text("#card-disk .value")
    assert "putTps" in page.inner_text("#runtime-table")
    before = _chart_state(page, "#broker-chart")
    with Load(appliance, unique_name("Load").replace("-", "_")):
        # The page refreshes every 2 s; the sampler takes a point a second.
        page.wait_for_function(
            """([before]) => {
                const chart = document.querySelector('#broker-chart');
                return chart && Number(chart.dataset.lastT) > before
                    && Number(chart.dataset.lastPutTps) > 0;
            }""",
            arg=[before[1]],
        )
        moving = _chart_state(page, "#broker-chart")
        page.wait_for_function(
            "([last]) => Number(document.querySelector('#broker-chart').dataset.lastT) > last",
            arg=[moving[1]],
        )
        screenshot = tmp_path / "cluster.png"
        page.screenshot(path=str(screenshot), full_page=True)
    assert moving[2] > 0
    assert moving[0] >= before[0]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert float(page.inner_text("#card-put-tps .value").replace(",", "")) >= 0


def test_topics_page_and_a_topic_with_its_chart(
    appliance: Appliance, data: dict[str, Any], page: Page
) -> None:
    topic = data["topic"]
    page.goto(appliance.http_url + "#topics")
    link = page.get_by_role("link", name=topic, exact=True)
    link.wait_for()
    cells = link.locator("xpath=ancestor::tr").inner_text().split("\t")
    assert cells[0] == topic
    assert cells[3] == str(SEND_COUNT)  # max offsets (sum)
    link.click()
    page.wait_for_selector("#queues-table")
    assert page.url.endswith(f"#topic/{topic}")
    queue_row = page.locator("#queues-table tbody tr").first.inner_text().split("\t")
    assert queue_row[:3] == ["0", "0", str(SEND_COUNT)]
    page.wait_for_function(
        "() => Number(document.querySelector('#topic-chart')?.dataset.pointCount) > 0"
    )


def test_groups_page_and_lag_per_queue(
    appliance: Appliance, data: dict[str, Any], page: Page
) -> None:
    group = data["group"]
    page.goto(appliance.http_url + f"#group/{group}")
    page.wait_for_selector("#lag-table")
    cells = page.locator("#lag-table tbody tr").first.inner_text().split("\t")
    assert cells == [
        data["topic"],
        "0",
        str(SEND_COUNT),
        str(GROUP_COMMITTED),
        str(SEND_COUNT - GROUP_COMMITTED),
    ]
    assert page.inner_text("#card-lag .value") == str(SEND_COUNT - GROUP_COMMITTED)
    assert page.inner_text("#card-members .value") == "0"
    # The list reads admin.0's saved offsets (at most 5 s behind): wait for the group's row.
    page.goto(appliance.http_url + "#groups")
    link = page.get_by_role("link", name=group, exact=True)
    link.wait_for(timeout=60_000)
    cells = link.locator("xpath=ancestor::tr").inner_text().split("\t")
    assert cells[1] == str(SEND_COUNT - GROUP_COMMITTED)


def test_message_lookup_by_id_and_key(
    appliance: Appliance, data: dict[str, Any], page: Page
) -> None:
    page.goto(appliance.http_url + "#message")
    page.fill("#lookup-id", data["ids"][2])
    page.click("#lookup-button")
    body = page.locator("#message-result pre.body")
    body.wait_for()
    assert body.inner_text() == "dashboard body 2"
    assert body.get_attribute("data-format") == "text"
    page.fill("#lookup-id", "")
    page.fill("#lookup-key", "k-1")
    page.fill("#lookup-topic", data["topic"])
    page.click("#lookup-button")
    page.wait_for_function(
        "() => document.querySelector('#message-result pre.body')?.textContent"
        " === 'dashboard body 0'"
    )
    page.fill("#lookup-key", "no-such-key")
    page.click("#lookup-button")
    error = page.locator("#message-result .error")
    error.wait_for()
    assert "no-such-key" in error.inner_text()


def test_processes_page(appliance: Appliance, page: Page) -> None:
    page.goto(appliance.http_url + "#processes")
    page.wait_for_selector("#processes-table")
    row = page.locator("#processes-table tr", has_text="send.0").inner_text().split("\t")
    assert row[:4] == ["send.0", "send", str(appliance.roles["send.0"]), "up"]
    assert row[5].endswith("MiB")
    assert page.locator("#rings-table tbody tr").count() > 0

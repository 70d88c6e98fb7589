"""The HTTP endpoint: /metrics, the dashboard's static pages and its JSON API, read-only.

Owns: the listening socket (mqboxHttpHost:mqboxHttpPort, 127.0.0.1 by default; port 0 = any
free one), `<home>/run/http.json` (the bound address, for tests and `mqbox status`), the routes,
and the JSON views under /api/ (docs/dashboard.md lists them). Runs as threads of the services
role (services.py): one accept thread of a ThreadingHTTPServer, a thread per request, and the
sampler of sources.py. The accept thread sleeps in poll(2) on the listener and a stop pipe, with
no timeout: socketserver's serve_forever looks for a shutdown every 0.5 s, two wake-ups a second
of an idle broker (issue 15). Never: changes anything (only GET is served; no admin action exists
yet, the ACL issue owns that), serves a file outside static/ (the names are a fixed table), or
lets an exception reach the services role's loop (a failing view answers 500 with the reason).

Message lookups and the live group view go through the broker's own remoting port, as any
client would (VIEW_MESSAGE_BY_ID 33, QUERY_MESSAGE 12, GET_TOPIC_STATS_INFO 202,
GET_CONSUME_STATS 208, GET_CONSUMER_CONNECTION_LIST 203), over one blocking connection kept under
a lock.
"""

from __future__ import annotations

import http.server
import itertools
import json
import logging
import os
import select
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from mqbox.client import admin_api
from mqbox.client.errors import RemotingError, RemotingResponseError
from mqbox.client.remoting import RemotingClient
from mqbox.errors import MqboxError
from mqbox.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    StoredMessage,
    decode_offset_msg_id,
    decode_properties_str,
    encode_offset_msg_id,
    pack_host,
)
from mqbox.protocol.errors import RemoteProtocolError
from mqbox.protocol.headers import QueryMessageRequestHeader
from mqbox.run_files import write_json_atomically
from mqbox.server.home import HomeLayout
from mqbox.server.statistics_history import (
    GROUP_GET_NUMS,
    TOPIC_PUT_NUMS,
)
from mqbox.server.web import prometheus
from mqbox.server.web.sources import BrokerSources

log = logging.getLogger("mqbox.web")

STATIC_DIR: Final = Path(__file__).resolve().parent / "static"
STATIC_FILES: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
WIRE_TIMEOUT_MS: Final = 5_000
BODY_PREVIEW_SIZE_BYTES_MAX: Final = 4096
QUERY_MESSAGE_COUNT_MAX: Final = 32
INT64_MAX: Final = (1 << 63) - 1


class ViewError(Exception):
    """A request the API refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class WebEndpoint:
    """The server, its views and its connection to the broker's own port."""

    def __init__(self, sources: BrokerSources, host: str, port: int) -> None:
        self.sources = sources
        self._wire_lock = threading.Lock()
        self._wire: RemotingClient | None = None
        endpoint = self

        class Handler(_Handler):
            web = endpoint

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.server.timeout = 0  # handle_request takes what _serve's poll saw, or returns
        self._stop_read_fd, self._stop_write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        address = self.server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self.url = f"http://{self.host}:{self.port}/"
        self._thread: threading.Thread | None = None
        self.views: dict[str, Callable[[Mapping[str, str]], Any]] = {
            "/api/overview": self.overview,
            "/api/series": self.series,
            "/api/topics": self.topics,
            "/api/topic": self.topic,
            "/api/groups": self.groups,
            "/api/group": self.group,
            "/api/message": self.message,
            "/api/processes": self.processes,
        }

    def start(self, home: Path) -> None:
        self._thread = threading.Thread(target=self._serve, name="mqbox-http", daemon=True)
        self._thread.start()
        write_json_atomically(
            HomeLayout(home).http_path,
            {"host": self.host, "port": self.port, "url": self.url, "pid": os.getpid()},
        )

    def _serve(self) -> None:
        """Accept until stop(): one request thread per connection (ThreadingHTTPServer)."""
        poller = select.poll()
        poller.register(self.server.fileno(), select.POLLIN)
        poller.register(self._stop_read_fd, select.POLLIN)
        while True:
            events = poller.poll()
            if any(fd == self._stop_read_fd for fd, _mask in events):
                return
            self.server.handle_request()

    def stop(self) -> None:
        os.write(self._stop_write_fd, b"\0")
        if self._thread is not None:
            self._thread.join(5)
        self.server.server_close()
        os.close(self._stop_read_fd)
        os.close(self._stop_write_fd)
        with self._wire_lock:
            if self._wire is not None:
                self._wire.close()

    # -- the broker's own port --------------------------------------------------------------------

    def _ask(self, call: Callable[..., Any], *arguments: Any) -> Any:
        """One call of admin_api over the kept connection; ViewError 502 when the broker does
        not answer, 404 for an answer code that means "not there"."""
        with self._wire_lock:
            if self._wire is None:
                self._wire = RemotingClient(self.sources.ctx.broker_address, WIRE_TIMEOUT_MS)
            try:
                return call(self._wire, *arguments)
            except RemotingResponseError as error:
                raise ViewError(404, f"the broker answered {error.code}: {error.remark}") from None
            except (RemotingError, RemoteProtocolError, OSError) as error:
                self._wire.close()
                raise ViewError(502, f"the broker did not answer: {error}") from None

    # -- views ------------------------------------------------------------------------------------

    def overview(self, query: Mapping[str, str]) -> dict[str, Any]:
        sources = self.sources
        with sources.lock:
            history = sources.history
            runtime = history.runtime_info()
            cluster = history.cluster_name
            put_tps = history.rate("BROKER_PUT_NUMS", cluster, 10)
            get_tps = history.rate("BROKER_GET_NUMS", cluster, 10)
            totals = history.latest
        return {
            **sources.identity(),
            "uptime_ms": sources.uptime_ms(),
            "put_tps": put_tps,
            "get_tps": get_tps,
            "put_messages_total": totals.scalars["put_messages"] if totals else 0,
            "get_messages_total": totals.scalars["get_messages"] if totals else 0,
            "store": sources.store(),
            "runtime": runtime,
            "topic_count": len(sources.topics()),
            "group_count": len(sources.groups()),
        }

    def series(self, query: Mapping[str, str]) -> dict[str, Any]:
        """Per-second put and get TPS of the broker (or of `topic`'s puts) for the charts."""
        topic = query.get("topic")
        sources = self.sources
        with sources.lock:
            if topic is None:
                raw = [(ms, put, get) for ms, put, get in sources.broker_series]
            else:
                raw = [(ms, counts.get(topic, 0), 0) for ms, counts in sources.topic_series]
        points = []
        for (first_ms, first_put, first_get), (last_ms, last_put, last_get) in itertools.pairwise(
            raw
        ):
            span_s = max(1e-3, (last_ms - first_ms) / 1000)
            points.append(
                {
                    "t": last_ms,
                    "put_tps": (last_put - first_put) / span_s,
                    "get_tps": (last_get - first_get) / span_s,
                }
            )
        return {"topic": topic, "points": points}

    def topics(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        sources = self.sources
        found = []
        with sources.lock:
            history = sources.history
            totals = history.latest
            rates = {topic: history.rate(TOPIC_PUT_NUMS, topic) for topic in sources.topics()}
        for name, config in sorted(sources.topics().items()):
            maxes = sources.topic_queue_maxes(name, config)
            counts = totals.puts.get(name) if totals else None
            found.append(
                {
                    "topic": name,
                    "read_queue_nums": config.read_queue_nums,
                    "write_queue_nums": config.write_queue_nums,
                    "perm": config.perm,
                    "max_offset_total": sum(maxes),
                    "put_tps": rates.get(name, 0.0),
                    "put_messages_total": counts.messages if counts else 0,
                }
            )
        return found

    def topic(self, query: Mapping[str, str]) -> dict[str, Any]:
        name = _required(query, "name")
        config = self.sources.topics().get(name)
        if config is None:
            raise ViewError(404, f"no topic {name} on this broker")
        status = self._ask(admin_api.topic_status, name)
        return {
            "topic": name,
            "read_queue_nums": config.read_queue_nums,
            "write_queue_nums": config.write_queue_nums,
            "perm": config.perm,
            "queues": [
                {
                    "queue_id": queue.queue_id,
                    "min_offset": queue.queue_index_min,
                    "max_offset": queue.queue_index_max,
                    "last_update_ms": queue.last_update_timestamp_ms,
                }
                for queue in status.queues
            ],
            "series": self.series({"topic": name})["points"],
        }

    def groups(self, query: Mapping[str, str]) -> list[dict[str, Any]]:
        sources = self.sources
        lags: dict[str, dict[str, int]] = {}
        for group, topic, _, broker_max, committed in sources.lags():
            by_topic = lags.setdefault(group, {})
            by_topic[topic] = by_topic.get(topic, 0) + max(0, broker_max - committed)
        with sources.lock:
            history = sources.history
            totals = history.latest
            gets = dict(totals.gets) if totals else {}
            rates = {key: history.rate(GROUP_GET_NUMS, key) for key in gets}
        found = []
        for group in sorted(set(sources.groups()) | set(lags)):
            get_tps = sum(rate for key, rate in rates.items() if key.endswith(f"@{group}"))
            found.append(
                {
                    "group": group,
                    "lag_by_topic": lags.get(group, {}),
                    "lag_total": sum(lags.get(group, {}).values()),
                    "get_tps": get_tps,
                }
            )
        return found

    def group(self, query: Mapping[str, str]) -> dict[str, Any]:
        name = _required(query, "name")
        progress = self._ask(admin_api.consume_stats, name)
        members = self._ask(admin_api.consumer_connections, name)
        with self.sources.lock:
            history = self.sources.history
            topics = {queue.topic for queue in progress.queues}
            rates = {topic: history.rate(GROUP_GET_NUMS, f"{topic}@{name}") for topic in topics}
        return {
            "group": name,
            "members": [member.client_id for member in members],
            "lag_total": progress.total_lag,
            "get_tps_by_topic": rates,
            "queues": [
                {
                    "topic": queue.topic,
                    "queue_id": queue.queue_id,
                    "broker_offset": queue.broker_queue_index,
                    "consumer_offset": queue.consumer_queue_index,
                    "lag": queue.lag,
                }
                for queue in progress.queues
            ],
        }

    def message(self, query: Mapping[str, str]) -> dict[str, Any]:
        """By `id` (an offset msgId of this broker, or a UNIQ_KEY msgId with `topic`) or by
        `key` with `topic`."""
        msg_id = query.get("id", "").strip()
        key = query.get("key", "").strip()
        topic = query.get("topic", "").strip()
        if not msg_id and not key:
            raise ViewError(400, "give id=<msgId> or key=<key> (with topic=<topic>)")
        if msg_id and not topic:
            return {"messages": [self._message_view(self._by_offset_id(msg_id))]}
        if not topic:
            raise ViewError(400, "a key needs topic=<topic>")
        if msg_id:
            # A UNIQ_KEY and an offset msgId are both 32 hex characters: the UNIQ_KEY first.
            try:
                return self._query(topic, msg_id, unique_key=True)
            except ViewError as error:
                if error.status != 404:
                    raise
            return {"messages": [self._message_view(self._by_offset_id(msg_id))]}
        return self._query(topic, key, unique_key=False)

    def _by_offset_id(self, msg_id: str) -> StoredMessage:
        try:
            store_host, log_offset_bytes = decode_offset_msg_id(msg_id.upper())
        except MqboxError as error:
            raise ViewError(400, str(error)) from None
        broker = self.sources.broker
        if store_host != pack_host(broker.broker_ip1 or "127.0.0.1", broker.listen_port):
            raise ViewError(404, f"msgId {msg_id} names another broker's commit log")
        stored: StoredMessage = self._ask(admin_api.view_message, log_offset_bytes)
        return stored

    def _query(self, topic: str, key: str, *, unique_key: bool) -> dict[str, Any]:
        header = QueryMessageRequestHeader(
            topic, key, QUERY_MESSAGE_COUNT_MAX, 0, INT64_MAX, unique_key_query=unique_key
        )
        messages = self._ask(admin_api.query_message, header)
        views = [self._message_view(stored) for stored in messages]
        # The index matches hashes: keep what really carries the key.
        views = [
            view for view in views if key == view["msg_id"] or key in str(view["keys"]).split(" ")
        ]
        if not views:
            raise ViewError(404, f"no message of topic {topic} carries {key}")
        return {"messages": views}

    def _message_view(self, stored: StoredMessage) -> dict[str, Any]:
        properties = decode_properties_str(stored.properties)
        body = stored.body
        preview = body[:BODY_PREVIEW_SIZE_BYTES_MAX]
        text = _utf8_prefix(preview, cut=len(body) > len(preview))
        printable = text is not None and all(
            character.isprintable() or character in "\r\n\t" for character in text
        )
        return {
            "topic": stored.topic,
            "queue_id": stored.queue_id,
            "queue_offset": stored.queue_index,
            "msg_id": properties.get(PROPERTY_UNIQ_KEY, ""),
            "offset_msg_id": encode_offset_msg_id(stored.store_host, stored.log_offset_bytes),
            "tags": properties.get(PROPERTY_TAGS, ""),
            "keys": properties.get(PROPERTY_KEYS, ""),
            "born_timestamp_ms": stored.born_timestamp_ms,
            "store_timestamp_ms": stored.store_timestamp_ms,
            "reconsume_times": stored.reconsume_times,
            "body_size_bytes": len(body),
            "body_format": "text" if printable else "hex",
            "body_preview": text if printable and text is not None else preview.hex(" "),
            "body_truncated": len(body) > BODY_PREVIEW_SIZE_BYTES_MAX,
            "properties": properties,
        }

    def processes(self, query: Mapping[str, str]) -> dict[str, Any]:
        with self.sources.lock:
            processes = list(self.sources.processes)
        return {"processes": processes, "rings": self.sources.rings()}


def _utf8_prefix(data: bytes, *, cut: bool) -> str | None:
    """`data` as UTF-8 text, or None if it is not; when `cut` (a prefix of a longer body), a
    character split by the cut (up to 3 bytes) is left out."""
    for drop in range(4 if cut else 1):
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _required(query: Mapping[str, str], name: str) -> str:
    value = query.get(name, "").strip()
    if not value:
        raise ViewError(400, f"{name}=... is missing")
    return value


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request: a static file, /metrics, or a JSON view (module docstring)."""

    web: WebEndpoint
    server_version = "mqbox"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = parsed.path
        try:
            if path == "/metrics":
                self._send(
                    200, prometheus.CONTENT_TYPE, prometheus.render(self.web.sources).encode()
                )
                return
            static = STATIC_FILES.get(path)
            if static is not None:
                name, content_type = static
                self._send(200, content_type, (STATIC_DIR / name).read_bytes())
                return
            view = self.web.views.get(path)
            if view is None:
                raise ViewError(404, f"no page {path}")
            query = dict(urllib.parse.parse_qsl(parsed.query))
            self._json(200, view(query))
        except ViewError as error:
            self._json(error.status, {"error": error.reason})
        except Exception as error:  # the request boundary: never the services role's loop
            log.exception("GET %s failed", path)
            self._json(500, {"error": f"{type(error).__name__}: {error}"})

    def _json(self, status: int, document: Any) -> None:
        self._send(status, "application/json", json.dumps(document).encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

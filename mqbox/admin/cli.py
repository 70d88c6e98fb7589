"""The `mqbox` command line (typer): thin commands that parse, call admin/ops.py and print.

Owns: option parsing, human and `--json` output, exit codes. Never: business logic, sockets or
store access of its own. Every failure is one clear line on stderr and a non-zero exit.

The command tree: `start`, `stop`, `status` and `config` run the appliance (ops.py); `topic
create|update|delete|list|route|status`, `offset show|reset`, `cluster list`, `message
get|query`, `send` and `tail` talk to it over the wire through the name server
(broker_ops.py). Every wire command takes `--namesrv` and `--json`; `--json` prints one JSON
document (`tail`: one JSON object per message and line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from mqbox.admin import broker_ops, ops
from mqbox.errors import MqboxError

app = typer.Typer(
    name="mqbox",
    help="mqbox: Apache RocketMQ's architecture as a single-host appliance.",
    no_args_is_help=True,
    add_completion=False,
)

HomeOption = Annotated[
    Path | None, typer.Option("--home", help="Store, logs, pid file and runtime state (~/mqbox).")
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="A RocketMQ broker.conf (default: etc/broker.conf).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """One clear line on stderr, then exit non-zero."""
    print(f"mqbox: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _print_addresses(info: Mapping[str, Any]) -> None:
    print(f"mqbox running in {info.get('home')} (supervisor pid {info.get('pid')})")
    if info.get("namesrv"):
        print(f"namesrv {info['namesrv']}")
    print(f"broker  {info.get('broker_name')} {info.get('broker')}")
    sys.stdout.flush()


@app.command()
def start(
    *,
    home: HomeOption = None,
    config: ConfigOption = None,
    namesrv_port: Annotated[
        int | None, typer.Option("--namesrv-port", help="Name server port (0 = any free port).")
    ] = None,
    broker_port: Annotated[
        int | None, typer.Option("--broker-port", help="Broker port (0 = any free port).")
    ] = None,
    daemon: Annotated[
        bool, typer.Option("--daemon", help="Return once every role is ready.")
    ] = False,
    topology: Annotated[
        str | None,
        typer.Option(
            "--topology",
            hidden=True,
            help="module:function building the broker's process graph (tests only).",
        ),
    ] = None,
) -> None:
    """Start the name server and the broker; in the foreground unless --daemon (Ctrl-C stops)."""
    try:
        options = ops.start_options(
            home,
            config,
            namesrv_port=namesrv_port,
            broker_port=broker_port,
            topology=topology,
        )
        if daemon:
            _print_addresses(ops.start_daemon(options))
            return
        exit_status = ops.run_foreground(options, on_ready=_print_addresses)
    except MqboxError as error:
        fail(str(error))
    if exit_status != 0:
        fail(f"stopped with exit status {exit_status}; see {options.home}/logs/", exit_status)


@app.command()
def stop(
    *,
    home: HomeOption = None,
    timeout_s: Annotated[
        float,
        typer.Option("--timeout-s", help="Seconds to wait for the orderly stop before SIGKILL."),
    ] = ops.STOP_TIMEOUT_S_DEFAULT,
) -> None:
    """Stop the appliance running in --home (SIGTERM, then SIGKILL after --timeout-s)."""
    try:
        result = ops.stop(home, timeout_s=timeout_s)
    except MqboxError as error:
        fail(str(error))
    if result.killed:
        fail(
            f"{result.home}: did not stop within {timeout_s:g} s; killed "
            + ", ".join(result.killed)
        )
    print(f"mqbox stopped in {result.home} ({result.seconds:.1f} s)")


def _megabytes(size_bytes: int) -> str:
    return f"{size_bytes / (1 << 20):.1f}"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    if whole >= 86400:
        return f"{whole // 86400}d{whole % 86400 // 3600}h"
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60}s"
    return f"{whole}s"


@app.command()
def status(*, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Show every role with pid, CPU, memory, ports, store size and uptime."""
    report = ops.status(home)
    if as_json:
        print(json.dumps(report.as_dict(), sort_keys=True))
        if not report.running:
            raise typer.Exit(1)
        return
    if not report.running:
        stopped_by = f"; it stopped after a failure: {report.reason}" if report.reason else ""
        fail(f"not running in {report.home}{stopped_by}")
    print(f"mqbox {report.status} in {report.home}")
    if report.reason:
        print(f"broker restarts: {report.broker_restarts}, the last for: {report.reason}")
    print(f"namesrv {report.namesrv or '-'}   broker {report.broker_name} {report.broker}")
    print(
        f"store {report.store_root}: {_megabytes(report.store_size_bytes)} MB"
        f"   memory (PSS anon + shmem): {_megabytes(report.pss_bytes)} MB"
    )
    if report.replication:
        print(_replication_line(report.replication))
    header = f"{'ROLE':<16} {'PID':>8} {'STATE':<9} {'CPU%':>6} {'PSS MB':>8} {'RSS MB':>8}"
    print(f"{header} {'PORT':>6} {'UPTIME':>8}")
    for process in report.processes:
        pss_bytes = process.pss_anon_bytes + process.pss_shmem_bytes
        print(
            f"{process.name:<16} {process.pid or '-':>8} {process.state:<9} "
            f"{process.cpu_percent:>6.1f} {_megabytes(pss_bytes):>8} "
            f"{_megabytes(process.rss_bytes):>8} {process.port or '-':>6} "
            f"{_duration(process.uptime_s):>8}"
        )


def _replication_line(replication: dict[str, Any]) -> str:
    """One line of run/replication.json: a master's slaves, or a slave's state and master."""
    if replication.get("role") == "master":
        slaves = replication.get("slaves") or []
        acked = replication.get("acked_log_offset", 0)
        return f"replication: master, {len(slaves)} slave(s), acknowledged offset {acked}"
    line = (
        f"replication: slave {replication.get('state')} to {replication.get('master') or '-'}, "
        f"reported offset {replication.get('reported_log_offset', 0)}"
    )
    reason = replication.get("reason")
    return f"{line}; stopped: {reason}" if reason else line


@app.command("config")
def show_config(*, config: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Show the configuration `mqbox start` would use, with ignored keys."""
    try:
        namesrv, broker = ops.load_configs(config)
    except MqboxError as error:
        fail(str(error))
    document = {"namesrv": ops.config_as_dict(namesrv), "broker": ops.config_as_dict(broker)}
    if as_json:
        print(json.dumps(document, sort_keys=True))
        return
    for section, values in document.items():
        print(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, dict):  # pools, limits: one line per field
                for inner_key, inner_value in value.items():
                    print(f"  {key}.{inner_key} = {inner_value}")
            else:
                print(f"  {key} = {value}")


store_app = typer.Typer(
    help="Offline store maintenance (the broker stopped).", no_args_is_help=True
)
app.add_typer(store_app, name="store")


@store_app.command("repair")
def store_repair(
    *,
    home: HomeOption = None,
    config: ConfigOption = None,
    store_root: Annotated[
        Path | None,
        typer.Option(
            "--store-root", help="The store (default: storePathRootDir, else HOME/store/NAME)."
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Recover a store that `mqbox start` refuses: cut the commit log where flushed data is
    damaged, keeping a copy of every byte cut in STORE/repair/."""
    try:
        result = ops.repair_store(home, config, store_root)
    except MqboxError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(dataclasses.asdict(result), sort_keys=True))
        return
    if result.cut_at_log_offset_bytes is None:
        print(
            f"{result.store_root}: nothing to cut; the log ends at {result.write_log_offset_bytes}"
        )
        return
    print(
        f"{result.store_root}: cut at log offset {result.cut_at_log_offset_bytes} ({result.reason})"
        + (" inside flushed data" if result.flushed_damage else "")
    )
    if result.copy_directory is not None:
        print(f"{result.copied_bytes} bytes cut, copied to {result.copy_directory}")


# ---------------------------------------------------------------------------------------------
# Wire commands: topic, offset, cluster, message, send, tail (broker_ops.py does the work)

topic_app = typer.Typer(help="Create, change, delete and inspect topics.", no_args_is_help=True)
offset_app = typer.Typer(help="Show and reset consumer group offsets.", no_args_is_help=True)
cluster_app = typer.Typer(help="The brokers the name server knows.", no_args_is_help=True)
message_app = typer.Typer(help="Look messages up by msgId or key.", no_args_is_help=True)
app.add_typer(topic_app, name="topic")
app.add_typer(offset_app, name="offset")
app.add_typer(cluster_app, name="cluster")
app.add_typer(message_app, name="message")

NamesrvOption = Annotated[
    str | None,
    typer.Option(
        "--namesrv",
        help="Name server ip:port, ';'-separated for several "
        "(default: $MQBOX_NAMESRV, else namesrvAddr of etc/broker.conf).",
    ),
]
TopicArgument = Annotated[str, typer.Argument(help="Topic name.", show_default=False)]
TopicOption = Annotated[str, typer.Option("--topic", help="Topic name.", show_default=False)]
GroupArgument = Annotated[str, typer.Argument(help="Consumer group.", show_default=False)]
BodyBytesOption = Annotated[
    int, typer.Option("--body-bytes", help="Bytes of each body to show (text output).")
]
BODY_BYTES_DEFAULT = 200


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """Every operating error of the block as one line on stderr and exit status 1."""
    try:
        yield
    except MqboxError as error:
        fail(" ".join(str(error).split()))


def _print_json(document: Any) -> None:
    print(json.dumps(document, sort_keys=True))


def _time_text(timestamp_ms: int) -> str:
    """Local time to the ms; "-" for 0 (an empty queue)."""
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


def _preview(body: bytes, size_bytes_max: int) -> str:
    """The first bytes of a body as one line: UTF-8, unprintable characters escaped."""
    text = body[: max(size_bytes_max, 0)].decode("utf-8", "replace")
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    if len(body) > size_bytes_max:
        shown += f"... ({len(body)} bytes)"
    return shown


def _print_change(change: broker_ops.TopicChange) -> None:
    for config in change.brokers:
        print(
            f"{change.action} topic {change.topic} on {config.broker_name}: "
            f"read queues {config.read_queue_nums}, write queues {config.write_queue_nums}, "
            f"perm {broker_ops.perm_text(config.perm)} ({config.perm}), "
            f"order {str(config.order).lower()}"
        )


@topic_app.command("create")
def topic_create(
    *,
    topic: TopicArgument,
    read_queues: Annotated[int, typer.Option("--read-queues", help="Read queue count.")] = 8,
    write_queues: Annotated[int, typer.Option("--write-queues", help="Write queue count.")] = 8,
    perm: Annotated[
        str, typer.Option("--perm", help="rw, r, w, none, or the bits (2 write, 4 read).")
    ] = "rw",
    order: Annotated[bool, typer.Option("--order", help="Mark the topic ordered.")] = False,
    wait_s: Annotated[
        float,
        typer.Option("--wait-s", help="Seconds to wait for the route to show it (0: no wait)."),
    ] = broker_ops.ROUTE_WAIT_S_DEFAULT,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a topic on every master broker the name server knows."""
    with _one_line_errors():
        change = broker_ops.create_topic(
            namesrv,
            topic,
            read_queue_nums=read_queues,
            write_queue_nums=write_queues,
            perm=broker_ops.parse_perm(perm),
            order=order,
            wait_s=wait_s,
        )
    if as_json:
        _print_json(ops.config_as_dict(change))
        return
    _print_change(change)


@topic_app.command("update")
def topic_update(
    *,
    topic: TopicArgument,
    read_queues: Annotated[
        int | None, typer.Option("--read-queues", help="New read queue count.")
    ] = None,
    write_queues: Annotated[
        int | None, typer.Option("--write-queues", help="New write queue count.")
    ] = None,
    perm: Annotated[
        str | None, typer.Option("--perm", help="New permission: rw, r, w, none, or the bits.")
    ] = None,
    order: Annotated[
        bool | None, typer.Option("--order/--no-order", help="Mark the topic ordered or not.")
    ] = None,
    wait_s: Annotated[
        float,
        typer.Option("--wait-s", help="Seconds to wait for the route to show it (0: no wait)."),
    ] = broker_ops.ROUTE_WAIT_S_DEFAULT,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a topic on every master broker of its route; what is not given stays."""
    with _one_line_errors():
        change = broker_ops.update_topic(
            namesrv,
            topic,
            read_queue_nums=read_queues,
            write_queue_nums=write_queues,
            perm=None if perm is None else broker_ops.parse_perm(perm),
            order=order,
            wait_s=wait_s,
        )
    if as_json:
        _print_json(ops.config_as_dict(change))
        return
    _print_change(change)


@topic_app.command("delete")
def topic_delete(
    *, topic: TopicArgument, namesrv: NamesrvOption = None, as_json: JsonOption = False
) -> None:
    """Delete a topic from its brokers and the name server (stored messages stay)."""
    with _one_line_errors():
        deleted = broker_ops.delete_topic(namesrv, topic)
    if as_json:
        _print_json(ops.config_as_dict(deleted))
        return
    brokers = ", ".join(deleted.brokers) or "no broker (none held it)"
    print(
        f"deleted topic {deleted.topic} from {brokers}; route dropped at "
        + ", ".join(deleted.namesrvs)
    )


@topic_app.command("list")
def topic_list(*, namesrv: NamesrvOption = None, as_json: JsonOption = False) -> None:
    """Every topic the name server has a route for."""
    with _one_line_errors():
        topics = broker_ops.topic_list(namesrv)
    if as_json:
        _print_json({"topics": list(topics)})
        return
    for topic in topics:
        print(topic)


@topic_app.command("route")
def topic_route(
    *, topic: TopicArgument, namesrv: NamesrvOption = None, as_json: JsonOption = False
) -> None:
    """The name server's route of a topic: brokers, addresses, queue counts, permission."""
    with _one_line_errors():
        route = broker_ops.topic_route(namesrv, topic)
    if as_json:
        _print_json(ops.config_as_dict(route))
        return
    print(
        f"topic {route.topic}"
        + (f" (order {route.order_topic_conf})" if route.order_topic_conf else "")
    )
    print(f"{'BROKER':<16} {'CLUSTER':<16} {'READ':>5} {'WRITE':>5} {'PERM':<4} ADDRESSES")
    for broker in route.brokers:
        addresses = " ".join(
            f"{broker_id}={address}" for broker_id, address in broker.addresses.items()
        )
        print(
            f"{broker.broker_name:<16} {broker.cluster:<16} {broker.read_queue_nums:>5} "
            f"{broker.write_queue_nums:>5} {broker_ops.perm_text(broker.perm):<4} {addresses}"
        )


@topic_app.command("status")
def topic_status(
    *, topic: TopicArgument, namesrv: NamesrvOption = None, as_json: JsonOption = False
) -> None:
    """Per queue of a topic: first and next offset, messages stored, newest store time."""
    with _one_line_errors():
        status = broker_ops.topic_status(namesrv, topic)
    if as_json:
        _print_json(ops.config_as_dict(status))
        return
    print(f"topic {status.topic}: {status.message_count} messages")
    print(f"{'BROKER':<16} {'QUEUE':>5} {'MIN':>10} {'MAX':>10} {'MESSAGES':>10} LAST STORED")
    for row in status.queues:
        print(
            f"{row.broker_name:<16} {row.queue_id:>5} {row.queue_index_min:>10} "
            f"{row.queue_index_max:>10} {row.message_count:>10} "
            f"{_time_text(row.last_update_timestamp_ms)}"
        )


@offset_app.command("show")
def offset_show(
    *,
    group: GroupArgument,
    topic: Annotated[
        str | None, typer.Option("--topic", help="Only this topic (default: every topic).")
    ] = None,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per queue: the broker's offset, the group's committed offset, and the lag."""
    with _one_line_errors():
        shown = broker_ops.offset_show(namesrv, group, topic)
    if as_json:
        _print_json(ops.config_as_dict(shown))
        return
    consumers = ", ".join(shown.client_ids) or "none online"
    print(f"group {shown.group}: total lag {shown.total_lag}; consumers: {consumers}")
    print(
        f"{'TOPIC':<24} {'BROKER':<16} {'QUEUE':>5} {'BROKER OFFSET':>14} "
        f"{'CONSUMER OFFSET':>15} {'LAG':>10}"
    )
    for row in shown.queues:
        consumer = str(row.consumer_queue_index) if row.consumer_queue_index >= 0 else "-"
        print(
            f"{row.topic:<24} {row.broker_name:<16} {row.queue_id:>5} "
            f"{row.broker_queue_index:>14} {consumer:>15} {row.lag:>10}"
        )


@offset_app.command("reset")
def offset_reset(
    *,
    group: GroupArgument,
    topic: TopicOption,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="earliest, latest, or an ISO 8601 time (local time without a zone).",
            show_default=False,
        ),
    ],
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a group's offsets on every queue of a topic; running consumers are told to follow."""
    with _one_line_errors():
        reset = broker_ops.offset_reset(namesrv, group, topic, to)
    if as_json:
        _print_json(ops.config_as_dict(reset))
        return
    where = reset.to if reset.timestamp_ms is None else _time_text(reset.timestamp_ms)
    print(f"group {reset.group} on topic {reset.topic} reset to {where}")
    print(f"live consumers told to follow: {reset.clients_notified}")
    print(f"{'BROKER':<16} {'QUEUE':>5} {'PREVIOUS':>10} {'OFFSET':>10}")
    for row in reset.queues:
        previous = str(row.previous_queue_index) if row.previous_queue_index >= 0 else "-"
        print(f"{row.broker_name:<16} {row.queue_id:>5} {previous:>10} {row.queue_index:>10}")


@cluster_app.command("list")
def cluster_list(*, namesrv: NamesrvOption = None, as_json: JsonOption = False) -> None:
    """Every broker address the name server knows, by cluster."""
    with _one_line_errors():
        listed = broker_ops.cluster_list(namesrv)
    if as_json:
        _print_json(ops.config_as_dict(listed))
        return
    print(f"{'CLUSTER':<16} {'BROKER':<16} {'ID':>3} {'ROLE':<7} ADDRESS")
    for row in listed.brokers:
        role = "master" if row.broker_id == broker_ops.MASTER_ID else "slave"
        print(f"{row.cluster:<16} {row.broker_name:<16} {row.broker_id:>3} {role:<7} {row.address}")


def _print_message(view: broker_ops.MessageView, body_bytes: int) -> None:
    properties = " ".join(f"{name}={value!r}" for name, value in sorted(view.properties.items()))
    rows = [
        ("msgId", view.msg_id),
        ("topic", view.topic),
        ("broker", f"{view.broker_name} {view.broker_address}"),
        ("queue", str(view.queue_id)),
        ("queue offset", str(view.queue_index)),
        ("commit log offset", str(view.log_offset_bytes)),
        ("tags", view.tags or "-"),
        ("keys", view.keys or "-"),
        ("uniq key", view.uniq_key or "-"),
        ("born", f"{_time_text(view.born_timestamp_ms)} {view.born_host}"),
        ("stored", f"{_time_text(view.store_timestamp_ms)} {view.store_host}"),
        ("reconsume times", str(view.reconsume_times)),
        ("flag / sysflag", f"{view.flag} / {view.sysflag}"),
        ("size", f"{view.size_bytes} bytes stored, body {len(view.body)} bytes"),
        ("properties", properties or "-"),
        ("body", _preview(view.body, body_bytes)),
    ]
    for name, value in rows:
        print(f"{name + ':':<19}{value}")


@message_app.command("get")
def message_get(
    *,
    msg_id: Annotated[
        str, typer.Argument(metavar="MSGID", help="Offset msgId, as `mqbox send` prints it.")
    ],
    body_bytes: BodyBytesOption = BODY_BYTES_DEFAULT,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the message an offset msgId names: topic, queue, offset, tags, keys, body."""
    with _one_line_errors():
        view = broker_ops.message_get(namesrv, msg_id)
    if as_json:
        _print_json(view.as_dict())
        return
    _print_message(view, body_bytes)


def _message_line(view: broker_ops.MessageView, body_bytes: int) -> str:
    return (
        f"{view.msg_id} {view.topic} queue {view.queue_id} offset {view.queue_index} "
        f"{_time_text(view.store_timestamp_ms)} tags={view.tags or '-'} "
        f"keys={view.keys or '-'} {_preview(view.body, body_bytes)}"
    )


@message_app.command("query")
def message_query(
    *,
    topic: TopicOption,
    key: Annotated[
        str, typer.Option("--key", help="A key of KEYS, or a UNIQ_KEY.", show_default=False)
    ],
    max_count: Annotated[int, typer.Option("--max", help="Messages to show at most.")] = (
        broker_ops.QUERY_MESSAGE_COUNT_DEFAULT
    ),
    body_bytes: BodyBytesOption = BODY_BYTES_DEFAULT,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Messages of a topic that carry a key, oldest first, from its brokers' indexes."""
    with _one_line_errors():
        views = broker_ops.message_query(namesrv, topic, key, count_max=max_count)
    if as_json:
        _print_json({"messages": [view.as_dict() for view in views]})
        return
    for view in views:
        print(_message_line(view, body_bytes))


@app.command("send")
def send(
    *,
    body: Annotated[
        str, typer.Argument(help="Message body ('-' reads it from stdin).", show_default=False)
    ],
    topic: TopicOption,
    tags: Annotated[str | None, typer.Option("--tags", help="The message's tag.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Keys, space-separated, for `message query`.")
    ] = None,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send one message (SEND_MESSAGE) to a write queue of the topic; print its msgId."""
    data = sys.stdin.buffer.read() if body == "-" else body.encode("utf-8", "surrogateescape")
    with _one_line_errors():
        sent = broker_ops.send(namesrv, topic, data, tags=tags, keys=keys)
    if as_json:
        _print_json(ops.config_as_dict(sent))
        return
    print(
        f"msgId {sent.msg_id} topic {sent.topic} broker {sent.broker_name} queue "
        f"{sent.queue_id} offset {sent.queue_index} uniq key {sent.uniq_key}"
    )


@app.command("tail")
def tail(
    *,
    topic: TopicOption,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Start at this group's committed offsets (nothing is committed) "
            "where --from is not given.",
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", help="Stop after this many messages.")
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="earliest or latest (default: the group's offsets, else latest).",
            show_default=False,
        ),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s", help="Stop after this many seconds; fails if --count is not reached."
        ),
    ] = None,
    body_bytes: BodyBytesOption = BODY_BYTES_DEFAULT,
    namesrv: NamesrvOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a topic's messages from every queue as they arrive, until --count or Ctrl-C."""
    views = broker_ops.tail(
        namesrv, topic, group=group, start=start, count=count, timeout_s=timeout_s
    )
    # Ctrl-C is how a tail without --count ends: a normal stop, not an error.
    with contextlib.suppress(KeyboardInterrupt), contextlib.closing(views), _one_line_errors():
        for view in views:
            print(
                json.dumps(view.as_dict(), sort_keys=True)
                if as_json
                else _message_line(view, body_bytes)
            )
            sys.stdout.flush()


def main() -> None:
    """Entry point of the `mqbox` script."""
    app()

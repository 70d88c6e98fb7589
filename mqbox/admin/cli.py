"""The `mqbox` command line (typer): thin commands that parse, call admin/ops.py and print.

Owns: option parsing, human and `--json` output, exit codes. Never: business logic, sockets or
store access of its own. Every failure is one clear line on stderr and a non-zero exit.

The command tree: `start`, `stop`, `status` and `config` run the appliance (ops.py); `topic
create|update|delete|list|route|status`, `offset show|reset`, `cluster list`, `message
get|query`, `send` and `tail` talk to it over the wire through the name server
(broker_ops.py). Every wire command takes `--namesrv` and `--json`; `--json` prints one JSON
document (`tail`: one JSON object per message and line). With the plain ACL on, the wire commands
sign their requests with `mqbox --access-key AK --secret-key SK <command>` (or $MQBOX_ACCESS_KEY
and $MQBOX_SECRET_KEY); `acl show|validate` read the ACL file (docs/acl.md).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import enum
import functools
import json
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from mqbox.acl.signature import SessionCredentials
from mqbox.acl.validator import load_acl_file
from mqbox.admin import broker_ops, layout_ops, ops
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
LayoutOption = Annotated[
    Path | None,
    typer.Option(
        "--layout",
        help="A layout directory (its mqbox.conf) or file: a name server and several brokers "
        "(e.g. etc/examples/2m-2s); each broker runs in HOME/brokers/NAME.",
    ),
]
BrokerOption = Annotated[
    str | None,
    typer.Option(
        "--broker",
        help="One broker of the layout running in --home: brokerName for the master "
        "(brokerId 0), brokerName-s for brokerId 1, brokerName-sN for brokerId N.",
    ),
]


def _version(value: bool) -> None:
    if value:
        print(ops.version_text())
        raise typer.Exit()


@app.callback()
def credentials(
    *,
    access_key: Annotated[
        str | None,
        typer.Option(
            "--access-key",
            envvar="MQBOX_ACCESS_KEY",
            help="Sign the wire commands' requests with this ACL account (docs/acl.md).",
        ),
    ] = None,
    secret_key: Annotated[
        str | None,
        typer.Option(
            "--secret-key",
            envvar="MQBOX_SECRET_KEY",
            help="The account's secret key (better given by $MQBOX_SECRET_KEY).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """mqbox: Apache RocketMQ's architecture as a single-host appliance."""
    if not access_key and not secret_key:
        return
    if not access_key or not secret_key:
        fail("--access-key and --secret-key go together")
    broker_ops.use_credentials(SessionCredentials(access_key, secret_key))


def fail(message: str, code: int = 1) -> NoReturn:
    """One clear line on stderr, then exit non-zero."""
    print(f"mqbox: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _print_addresses(info: Mapping[str, Any], *, foreground: bool) -> None:
    """The ready report: where it runs, its ports, its logs, and how to stop it."""
    home = info.get("home")
    print(f"mqbox running in {home} (supervisor pid {info.get('pid')})")
    if info.get("namesrv"):
        print(f"namesrv {info['namesrv']}")
    print(f"broker  {info.get('broker_name')} {info.get('broker')}")
    print(f"logs    {home}/logs/")
    stop_hint = "Ctrl-C, or " if foreground else ""
    print(f"stop    {stop_hint}mqbox stop --home {home}")
    sys.stdout.flush()


@contextlib.contextmanager
def _starting_notice(home: Path, *, spinner: bool) -> Iterator[None]:
    """Say what the silent seconds of a start do. On a terminal: a spinner on stderr while the
    block runs (`spinner`; never in the foreground, whose supervisor forks and must have no
    thread then), else one line. Elsewhere (scripts, logs), one line on stderr only when the
    kernels must be compiled, the slow case; a warm start adds nothing to the output."""
    compiling = ops.kernels_need_compiling()
    message = f"starting mqbox in {home}: {ops.warm_up_text(compiling=compiling)}"
    terminal = sys.stderr.isatty()
    if terminal and spinner:
        from rich.console import Console

        with Console(stderr=True).status(message):
            yield
        return
    if terminal or compiling:
        print(f"mqbox: {message}", file=sys.stderr, flush=True)
    yield


def _print_layout_started(started: layout_ops.LayoutStarted) -> None:
    print(f"mqbox layout {started.layout_path} running in {started.home}")
    print(f"namesrv {started.namesrv} (pid {started.namesrv_pid})")
    for broker in started.brokers:
        _print_broker_started(broker)
    sys.stdout.flush()


def _print_broker_started(broker: layout_ops.StartedBroker) -> None:
    print(
        f"broker  {broker.name} {broker.address} {broker.role} brokerId {broker.broker_id} "
        f"(supervisor pid {broker.pid}, home {broker.home})"
    )


def _start_layout(
    home: Path | None,
    layout: Path | None,
    broker: str | None,
    *,
    namesrv_port: int | None,
    broker_port: int | None,
    daemon: bool,
) -> None:
    """`start --layout` (every broker, in the foreground unless --daemon) or `start --broker`
    (one broker of the running layout, in the background)."""
    if broker is not None:
        _print_broker_started(layout_ops.start_broker(home, broker))
        return
    assert layout is not None
    started = layout_ops.start_layout(
        home, layout, namesrv_port=namesrv_port, broker_port=broker_port
    )
    for line in started.warnings:
        print(f"mqbox: warning: {line}", file=sys.stderr)
    _print_layout_started(started)
    if daemon:
        return
    layout_ops.wait_for_stop_signal(lambda: layout_ops.is_layout_home(started.home))
    if layout_ops.is_layout_home(started.home):
        stopped = layout_ops.stop_layout(started.home)
        print(f"mqbox layout stopped in {stopped.home} ({stopped.seconds:.1f} s)")


@app.command()
def start(
    *,
    home: HomeOption = None,
    config: ConfigOption = None,
    layout: LayoutOption = None,
    broker: BrokerOption = None,
    namesrv_port: Annotated[
        int | None, typer.Option("--namesrv-port", help="Name server port (0 = any free port).")
    ] = None,
    broker_port: Annotated[
        int | None,
        typer.Option(
            "--broker-port", help="Broker port (0 = any free port, for the HTTP endpoint too)."
        ),
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
    """Start the name server and the broker; in the foreground unless --daemon (Ctrl-C stops).
    Warns on stderr when a listener binds a non-loopback address with aclEnable=false.
    The first start on a machine compiles the kernels (about 20 s on 2 cores); later starts
    load them from numba's cache.
    With --layout: the layout's name server and every broker of it; with --broker NAME: that
    broker of the layout running in --home, alone."""
    if layout is not None or broker is not None:
        if config is not None:
            fail("--config and --layout/--broker do not go together (a layout names its files)")
        try:
            _start_layout(
                home,
                layout,
                broker,
                namesrv_port=namesrv_port,
                broker_port=broker_port,
                daemon=daemon,
            )
        except MqboxError as error:
            fail(str(error))
        return
    if layout_ops.is_layout_home(home):
        fail(f"{ops.home_dir(home)} holds a layout: `start --layout DIR` or `start --broker NAME`")
    try:
        for line in ops.ignored_key_warnings(config):
            print(f"mqbox: warning: {line}", file=sys.stderr)
        options = ops.start_options(
            home,
            config,
            namesrv_port=namesrv_port,
            broker_port=broker_port,
            topology=topology,
        )
        warning = ops.exposure_warning(*ops.load_configs(config))
        if warning is not None:
            print(f"mqbox: {warning}", file=sys.stderr, flush=True)
        if daemon:
            with _starting_notice(options.home, spinner=True):
                info = ops.start_daemon(options)
            _print_addresses(info, foreground=False)
            return
        with _starting_notice(options.home, spinner=False):
            exit_status = ops.run_foreground(
                options, on_ready=functools.partial(_print_addresses, foreground=True)
            )
    except MqboxError as error:
        fail(str(error))
    if exit_status != 0:
        fail(f"stopped with exit status {exit_status}; see {options.home}/logs/", exit_status)


@app.command()
def stop(
    *,
    home: HomeOption = None,
    broker: BrokerOption = None,
    timeout_s: Annotated[
        float,
        typer.Option("--timeout-s", help="Seconds to wait for the orderly stop before SIGKILL."),
    ] = ops.STOP_TIMEOUT_S_DEFAULT,
) -> None:
    """Stop the appliance running in --home (SIGTERM, then SIGKILL after --timeout-s): every
    broker of a layout and its name server, or with --broker NAME that broker alone. Exit
    status 1 when the stop was not clean (a process killed or failing while stopping)."""
    try:
        if broker is not None:
            result = layout_ops.stop_broker(home, broker, timeout_s=timeout_s)
        elif layout_ops.is_layout_home(home):
            stopped = layout_ops.stop_layout(home, timeout_s=timeout_s)
            if stopped.killed:
                fail(f"{stopped.home}: killed after {timeout_s:g} s: " + ", ".join(stopped.killed))
            print(f"mqbox layout stopped in {stopped.home} ({stopped.seconds:.1f} s)")
            return
        else:
            result = ops.stop(home, timeout_s=timeout_s)
    except MqboxError as error:
        fail(str(error))
    if result.unclean:
        fail(f"stopped in {result.home}, not cleanly: {result.unclean}")
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
def status(
    *, home: HomeOption = None, broker: BrokerOption = None, as_json: JsonOption = False
) -> None:
    """Show every role with pid, CPU, memory, ports, store size and uptime; for a layout, each
    broker (role, address, processes, memory, replication), or with --broker NAME its roles."""
    if layout_ops.is_layout_home(home) and broker is None:
        _print_layout_status(layout_ops.layout_status(home), as_json)
        return
    try:
        report = ops.status(layout_ops.broker_home(home, broker) if broker else home)
    except MqboxError as error:
        fail(str(error))
    if as_json:
        _print_status_json(report.as_dict(), report.running)
        return
    if not report.running:
        stopped_by = f"; it stopped after a failure: {report.reason}" if report.reason else ""
        fail(f"not running in {report.home}{stopped_by}")
    print(f"mqbox {report.status} in {report.home}")
    if report.reason:
        print(f"broker restarts: {report.broker_restarts}, the last for: {report.reason}")
    print(
        f"namesrv {report.namesrv or '-'}   broker {report.broker_name} {report.broker} "
        f"{report.broker_role} brokerId {report.broker_id}"
        f"   http {report.http or '-'}"
    )
    print(
        f"replication {report.ha_state}   slave lag {_count_or_na(report.slave_lag_bytes)} bytes, "
        f"{_count_or_na(report.slave_lag_messages)} messages"
    )
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


def _print_status_json(document: Mapping[str, Any], running: bool) -> None:
    """`status --json`: the document, and exit status 1 when nothing runs."""
    print(json.dumps(document, sort_keys=True))
    if not running:
        raise typer.Exit(1)


def _print_layout_status(report: layout_ops.LayoutStatus, as_json: bool) -> None:
    if as_json:
        _print_status_json(report.as_dict(), report.running)
        return
    if not report.running:
        fail(f"the layout's name server is not running in {report.home}")
    print(f"mqbox layout {report.layout_path} in {report.home}")
    print(f"namesrv {report.namesrv} (pid {report.namesrv_pid})")
    print(
        f"{'BROKER':<14} {'NAME':<12} {'ID':>3} {'ROLE':<12} {'STATE':<8} {'ADDRESS':<21} "
        f"{'HA PORT':>7} {'PROCS':>5} {'PSS MB':>7} {'STORE MB':>8} {'HA STATE':<9} "
        f"{'LAG BYTES':>9} {'LAG MSGS':>8}"
    )
    for broker in report.brokers:
        print(
            f"{broker.name:<14} {broker.broker_name:<12} {broker.broker_id:>3} {broker.role:<12} "
            f"{'running' if broker.running else 'stopped':<8} {broker.address or '-':<21} "
            f"{broker.ha_port or '-':>7} {broker.processes_up:>5} "
            f"{_megabytes(broker.pss_bytes):>7} {_megabytes(broker.store_size_bytes):>8} "
            f"{broker.ha_state:<9} {_count_or_na(broker.slave_lag_bytes):>9} "
            f"{_count_or_na(broker.slave_lag_messages):>8}"
        )
        if broker.reason:
            print(f"  {broker.name}: {broker.reason}")


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
def show_config(
    *,
    config: ConfigOption = None,
    home: Annotated[
        Path | None,
        typer.Option("--home", help="Show what the appliance running in this home uses instead."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show the configuration by RocketMQ key name: what `mqbox start` would use, or with
    --home what a running appliance uses; keys mqbox does not know are listed as ignored."""
    try:
        shown = ops.config_shown(config, home)
    except MqboxError as error:
        fail(str(error))
    if as_json:
        print(json.dumps(dataclasses.asdict(shown), sort_keys=True))
        return
    print(f"# {shown.source}")
    for section, values in (("broker", shown.broker), ("namesrv", shown.namesrv)):
        if values is None:
            continue
        print(f"[{section}]")
        for key, value in values.items():
            print(f"  {key} = {str(value).lower() if isinstance(value, bool) else value}")
        ignored = shown.ignored.get(section) or []
        if ignored:
            print(f"  # ignored (not known to mqbox): {', '.join(ignored)}")


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
        "(default: $MQBOX_NAMESRV, else the running appliance's, else namesrvAddr of "
        "etc/broker.conf).",
    ),
]
WireHomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="Without --namesrv: ask the name server of the appliance running in this home "
        "(default: $MQBOX_HOME, else ~/mqbox).",
    ),
]
TopicArgument = Annotated[str, typer.Argument(help="Topic name.", show_default=False)]
TopicOption = Annotated[str, typer.Option("--topic", help="Topic name.", show_default=False)]
GroupArgument = Annotated[str, typer.Argument(help="Consumer group.", show_default=False)]
BodyBytesOption = Annotated[
    int, typer.Option("--body-bytes", help="Bytes of each body to show (text output).")
]
BODY_BYTES_DEFAULT = 200
TOP_INTERVAL_S_DEFAULT = 1.0
TOP_PIPE_WIDTH = 160  # `top --once` into a pipe or file: wide enough for every column


def _namesrv(namesrv: str | None, home: Path | None) -> ops.NamesrvAddress:
    """The name server a wire command asks, and where its address came from."""
    return ops.resolve_namesrv(namesrv, home)


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
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a topic on every master broker the name server knows."""
    with _one_line_errors():
        change = broker_ops.create_topic(
            _namesrv(namesrv, home),
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
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Change a topic on every master broker of its route; what is not given stays."""
    with _one_line_errors():
        change = broker_ops.update_topic(
            _namesrv(namesrv, home),
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
    *,
    topic: TopicArgument,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a topic from its brokers and the name server (stored messages stay)."""
    with _one_line_errors():
        deleted = broker_ops.delete_topic(_namesrv(namesrv, home), topic)
    if as_json:
        _print_json(ops.config_as_dict(deleted))
        return
    brokers = ", ".join(deleted.brokers) or "no broker (none held it)"
    print(
        f"deleted topic {deleted.topic} from {brokers}; route dropped at "
        + ", ".join(deleted.namesrvs)
    )


@topic_app.command("list")
def topic_list(
    *, namesrv: NamesrvOption = None, home: WireHomeOption = None, as_json: JsonOption = False
) -> None:
    """Every topic the name server has a route for."""
    with _one_line_errors():
        topics = broker_ops.topic_list(_namesrv(namesrv, home))
    if as_json:
        _print_json({"topics": list(topics)})
        return
    for topic in topics:
        print(topic)


@topic_app.command("route")
def topic_route(
    *,
    topic: TopicArgument,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """The name server's route of a topic: brokers, addresses, queue counts, permission."""
    with _one_line_errors():
        route = broker_ops.topic_route(_namesrv(namesrv, home), topic)
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
    *,
    topic: TopicArgument,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per queue of a topic: first and next offset, messages stored, newest store time."""
    with _one_line_errors():
        status = broker_ops.topic_status(_namesrv(namesrv, home), topic)
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
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per queue: the broker's offset, the group's committed offset, and the lag."""
    with _one_line_errors():
        shown = broker_ops.offset_show(_namesrv(namesrv, home), group, topic)
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
        print(
            f"{row.topic:<24} {row.broker_name:<16} {row.queue_id:>5} "
            f"{row.broker_queue_index:>14} {row.consumer_queue_index:>15} {row.lag:>10}"
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
            help="earliest, latest, or an ISO 8601 time (local time without a zone): each "
            "queue moves to the message stored nearest that time, RocketMQ's rule, so it may "
            "be one stored just before it.",
            show_default=False,
        ),
    ],
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move a group's offsets on every queue of a topic; running consumers are told to follow."""
    with _one_line_errors():
        reset = broker_ops.offset_reset(_namesrv(namesrv, home), group, topic, to)
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
def cluster_list(
    *, namesrv: NamesrvOption = None, home: WireHomeOption = None, as_json: JsonOption = False
) -> None:
    """Every broker the name server knows, by cluster: role, address, version, replication."""
    with _one_line_errors():
        listed = broker_ops.cluster_list(_namesrv(namesrv, home))
    if as_json:
        _print_json(ops.config_as_dict(listed))
        return
    print(
        f"{'CLUSTER':<16} {'BROKER':<16} {'ID':>3} {'ROLE':<12} {'ADDRESS':<21} {'VERSION':<12} "
        f"{'HA STATE':<10} {'LAG BYTES':>10} {'LAG MSGS':>9}"
    )
    for row in listed.brokers:
        print(
            f"{row.cluster:<16} {row.broker_name:<16} {row.broker_id:>3} {row.role:<12} "
            f"{row.address:<21} {row.version:<12} {row.ha_state:<10} "
            f"{_count_or_na(row.slave_lag_bytes):>10} {_count_or_na(row.slave_lag_messages):>9}"
        )


def _count_or_na(count: int | None) -> str:
    return broker_ops.NOT_AVAILABLE if count is None else str(count)


class BodyFormat(enum.StrEnum):
    """How a body is shown: UTF-8 text (unprintable characters escaped), hex or base64."""

    TEXT = "text"
    HEX = "hex"
    BASE64 = "base64"


BodyFormatOption = Annotated[
    BodyFormat, typer.Option("--body-format", help="Show bodies as text, hex or base64.")
]


def _body_text(body: bytes, body_format: BodyFormat, size_bytes_max: int | None) -> str:
    """The body (its first `size_bytes_max` bytes; None: all of it) in `body_format`."""
    if body_format is BodyFormat.TEXT:
        return _preview(body, len(body) if size_bytes_max is None else size_bytes_max)
    shown = body if size_bytes_max is None else body[: max(size_bytes_max, 0)]
    text = shown.hex() if body_format is BodyFormat.HEX else base64.b64encode(shown).decode()
    if size_bytes_max is not None and len(body) > size_bytes_max:
        text += f"... ({len(body)} bytes)"
    return text


def _message_json(view: broker_ops.MessageView, body_format: BodyFormat) -> str:
    document = view.as_dict()
    if body_format is not BodyFormat.TEXT:
        document["body"] = _body_text(view.body, body_format, None)
    document["body_format"] = body_format.value
    return json.dumps(document, sort_keys=True)


def _print_message(
    view: broker_ops.MessageView, body_bytes: int, body_format: BodyFormat = BodyFormat.TEXT
) -> None:
    properties = " ".join(f"{name}={value!r}" for name, value in sorted(view.properties.items()))
    rows = [
        ("msgId", view.msg_id),
        ("offsetMsgId", view.offset_msg_id),
        ("topic", view.topic),
        ("broker", f"{view.broker_name} {view.broker_address}"),
        ("queue", str(view.queue_id)),
        ("queue offset", str(view.queue_index)),
        ("commit log offset", str(view.log_offset_bytes)),
        ("tags", view.tags or "-"),
        ("keys", view.keys or "-"),
        ("born", f"{_time_text(view.born_timestamp_ms)} {view.born_host}"),
        ("stored", f"{_time_text(view.store_timestamp_ms)} {view.store_host}"),
        ("reconsume times", str(view.reconsume_times)),
        ("flag / sysflag", f"{view.flag} / {view.sysflag}"),
        ("size", f"{view.size_bytes} bytes stored, body {len(view.body)} bytes"),
        ("properties", properties or "-"),
        ("body", _body_text(view.body, body_format, body_bytes)),
    ]
    for name, value in rows:
        print(f"{name + ':':<19}{value}")


@message_app.command("get")
def message_get(
    *,
    msg_id: Annotated[
        str,
        typer.Argument(
            metavar="MSGID",
            help="RocketMQ's msgId (the client's UNIQ_KEY) or offsetMsgId; `mqbox send` "
            "prints both.",
        ),
    ],
    topic: Annotated[
        str | None,
        typer.Option("--topic", help="The topic of a msgId (default: search every topic's index)."),
    ] = None,
    body_bytes: BodyBytesOption = BODY_BYTES_DEFAULT,
    body_format: BodyFormatOption = BodyFormat.TEXT,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show the message a msgId or offsetMsgId names: ids, topic, queue, offset, tags, keys,
    body. An offsetMsgId is read at its broker's commit log offset; a msgId is found in the
    index of --topic (or of every topic)."""
    with _one_line_errors():
        view = broker_ops.message_get(_namesrv(namesrv, home), msg_id, topic)
    if as_json:
        print(_message_json(view, body_format))
        return
    _print_message(view, body_bytes, body_format)


def _message_line(view: broker_ops.MessageView, body_bytes: int, body_format: BodyFormat) -> str:
    return (
        f"{view.msg_id} {view.topic} queue {view.queue_id} offset {view.queue_index} "
        f"{_time_text(view.store_timestamp_ms)} tags={view.tags or '-'} "
        f"keys={view.keys or '-'} {_body_text(view.body, body_format, body_bytes)}"
    )


@message_app.command("query")
def message_query(
    *,
    topic: TopicOption,
    key: Annotated[
        str, typer.Option("--key", help="A key of KEYS, or a msgId (UNIQ_KEY).", show_default=False)
    ],
    max_count: Annotated[int, typer.Option("--max", help="Messages to show at most.")] = (
        broker_ops.QUERY_MESSAGE_COUNT_DEFAULT
    ),
    begin: Annotated[
        str | None,
        typer.Option(
            "--begin", help="Stored at or after this ISO 8601 time (local without a zone)."
        ),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option(
            "--end", help="Stored at or before this ISO 8601 time (local without a zone)."
        ),
    ] = None,
    body_bytes: BodyBytesOption = BODY_BYTES_DEFAULT,
    body_format: BodyFormatOption = BodyFormat.TEXT,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Messages of a topic that carry a key, oldest first, from its brokers' indexes."""
    with _one_line_errors():
        views = broker_ops.message_query(
            _namesrv(namesrv, home), topic, key, count_max=max_count, begin=begin, end=end
        )
    if as_json:
        documents = [json.loads(_message_json(view, body_format)) for view in views]
        _print_json({"messages": documents})
        return
    for view in views:
        print(_message_line(view, body_bytes, body_format))


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
    properties: Annotated[
        list[str] | None,
        typer.Option(
            "--property",
            help="A user property NAME=VALUE; repeat it for several.",
            show_default=False,
        ),
    ] = None,
    delay_level: Annotated[
        int,
        typer.Option(
            "--delay-level",
            help="Deliver after the delay of this level of messageDelayLevel (1 = the first; "
            "0 = now).",
        ),
    ] = 0,
    queue: Annotated[
        int | None,
        typer.Option(
            "--queue", help="Send to this queue id (of the first broker by name that has it)."
        ),
    ] = None,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send one message (SEND_MESSAGE) to a write queue of the topic; print its msgId and
    offsetMsgId. A topic without a route is created from TBW102, as RocketMQ's clients do."""
    data = sys.stdin.buffer.read() if body == "-" else body.encode("utf-8", "surrogateescape")
    with _one_line_errors():
        sent = broker_ops.send(
            _namesrv(namesrv, home),
            topic,
            data,
            tags=tags,
            keys=keys,
            properties=broker_ops.parse_properties(properties or ()),
            delay_level=delay_level,
            queue_id=queue,
        )
    if as_json:
        _print_json(ops.config_as_dict(sent))
        return
    print(
        f"msgId {sent.msg_id} offsetMsgId {sent.offset_msg_id} topic {sent.topic} broker "
        f"{sent.broker_name} queue {sent.queue_id} offset {sent.queue_index}"
    )


class _WaitingIndicator:
    """`tail`'s "waiting" line on stderr while no message comes, erased by the next message;
    only when stderr is a terminal (a pipe or a file gets nothing)."""

    def __init__(self, topic: str) -> None:
        self._enabled = sys.stderr.isatty()
        self._topic = topic
        self._started = time.monotonic()
        self._shown = False

    def idle(self) -> None:
        if not self._enabled:
            return
        waited_s = time.monotonic() - self._started
        sys.stderr.write(
            f"\r\x1b[2Kwaiting for messages on {self._topic} ({waited_s:.0f} s; Ctrl-C stops)"
        )
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        """A message came (or the tail ends): erase the line, count the wait from now."""
        self._started = time.monotonic()
        if self._shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self._shown = False

    def __enter__(self) -> _WaitingIndicator:
        return self

    def __exit__(self, *_: object) -> None:
        self.clear()


@app.command("tail")
def tail(
    *,
    topic: TopicOption,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Start where this group's consumers would (its committed offsets; nothing "
            "is committed) where --from is not given.",
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", help="Stop after this many messages.")
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="earliest, latest, or an ISO 8601 time: the first message stored at or after "
            "it (default: the group's offsets, else latest).",
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
    body_format: BodyFormatOption = BodyFormat.TEXT,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print a topic's messages from every queue as they arrive, until --count or Ctrl-C. On a
    terminal, stderr says when it is waiting."""
    waiting = _WaitingIndicator(topic)
    # Ctrl-C is how a tail without --count ends: a normal stop, not an error. The waiting line
    # is erased before an error is printed.
    with contextlib.suppress(KeyboardInterrupt), _one_line_errors(), waiting:
        views = broker_ops.tail(
            _namesrv(namesrv, home),
            topic,
            group=group,
            start=start,
            count=count,
            timeout_s=timeout_s,
            on_idle=waiting.idle,
        )
        with contextlib.closing(views):
            for view in views:
                waiting.clear()
                print(
                    _message_json(view, body_format)
                    if as_json
                    else _message_line(view, body_bytes, body_format)
                )
                sys.stdout.flush()


@app.command("top")
def top(
    *,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame (rates over one interval) and exit.")
    ] = False,
    interval_s: Annotated[
        float, typer.Option("--interval-s", help="Seconds between refreshes.")
    ] = TOP_INTERVAL_S_DEFAULT,
    groups: Annotated[
        list[str] | None,
        typer.Option(
            "--group",
            help="Also show this consumer group (groups with a %RETRY% topic show anyway).",
            show_default=False,
        ),
    ] = None,
    all_topics: Annotated[
        bool, typer.Option("--all-topics", help="Show RocketMQ's system topics too.")
    ] = False,
    namesrv: NamesrvOption = None,
    home: WireHomeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="With --once: print JSON.")] = False,
) -> None:
    """A live view of the appliance, refreshed every --interval-s: put and get rates per topic
    and group, lag, CPU and memory per process, store positions. Ctrl-C stops."""
    from rich.console import Console
    from rich.live import Live

    from mqbox.admin import top_data, top_view

    if not interval_s > 0:
        fail(f"--interval-s {interval_s:g} is not a positive number of seconds")
    if as_json and not once:
        fail("--json needs --once")
    with _one_line_errors():
        source = top_data.TopSource(
            _namesrv(namesrv, home), ops.home_dir(home), groups=groups or (), all_topics=all_topics
        )
    with source, contextlib.suppress(KeyboardInterrupt):
        previous = source.sample()
        if once:
            time.sleep(interval_s)
            shown = top_data.frame(source.sample(), previous)
            if as_json:
                _print_json(shown.as_dict())
            else:
                width = None if sys.stdout.isatty() else TOP_PIPE_WIDTH
                Console(width=width).print(top_view.render(shown))
            return
        with Live(
            top_view.render(top_data.frame(previous)), auto_refresh=False, screen=False
        ) as live:
            while True:
                time.sleep(max(0.0, previous.taken_s + interval_s - time.monotonic()))
                current = source.sample()
                live.update(top_view.render(top_data.frame(current, previous)), refresh=True)
                previous = current


acl_app = typer.Typer(help="The plain ACL file (docs/acl.md).", no_args_is_help=True)
app.add_typer(acl_app, name="acl")


@acl_app.command("show")
def acl_show(
    *, home: HomeOption = None, config: ConfigOption = None, as_json: JsonOption = False
) -> None:
    """Show whether broker.conf turns the ACL on, its file, and its accounts (no secrets)."""
    with _one_line_errors():
        view = ops.acl_view(home, config)
    if as_json:
        _print_json(view)
        return
    print(f"aclEnable {str(view['acl_enable']).lower()}, file {view['file']}")
    print("global white list: " + (", ".join(view["global_white_remote_addresses"]) or "-"))
    for account in view["accounts"]:
        perms = [f"{name}={perm}" for name, perm in account["topic_perms"].items()]
        perms += [f"group {name}={perm}" for name, perm in account["group_perms"].items()]
        print(
            f"account {account['access_key']}: admin {str(account['admin']).lower()}, "
            f"default topic {account['default_topic_perm']}, "
            f"default group {account['default_group_perm']}, "
            f"white address {account['white_remote_address'] or '-'}"
            + (f", {', '.join(perms)}" if perms else "")
        )


@acl_app.command("validate")
def acl_validate(
    *,
    file: Annotated[Path, typer.Argument(help="A plain_acl.yml.", show_default=False)],
    as_json: JsonOption = False,
) -> None:
    """Check a plain_acl.yml as the broker would load it; exit 1 naming the first problem."""
    with _one_line_errors():
        rules = load_acl_file(file)
    admins = sum(1 for account in rules.accounts.values() if account.admin)
    if as_json:
        _print_json({"file": str(file), "valid": True, **ops.acl_rules_view(rules)})
        return
    print(f"{file}: valid, {len(rules.accounts)} accounts ({admins} admin)")


def main() -> None:
    """Entry point of the `mqbox` script."""
    app()

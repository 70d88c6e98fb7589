"""The `mqbox` command line (typer): thin commands that parse, call admin/ops.py and print.

Owns: option parsing, human and `--json` output, exit codes. Never: business logic, sockets or
store access of its own. Every failure is one clear line on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from mqbox.admin import ops
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
        fail(f"not running in {report.home}")
    print(f"mqbox {report.status} in {report.home}")
    print(f"namesrv {report.namesrv or '-'}   broker {report.broker_name} {report.broker}")
    print(
        f"store {report.store_root}: {_megabytes(report.store_size_bytes)} MB"
        f"   memory (PSS anon + shmem): {_megabytes(report.pss_bytes)} MB"
    )
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
            print(f"  {key} = {value}")


def main() -> None:
    """Entry point of the `mqbox` script."""
    app()

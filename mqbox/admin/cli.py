"""The `mqbox` command line (typer): thin commands that parse, call admin/ops.py and print.

Owns: option parsing, human and `--json` output, exit codes. Never: business logic, sockets or
store access of its own. Every failure is one clear line on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

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
) -> None:
    """Start the name server and the broker(s)."""
    try:
        ops.load_configs(config)
    except MqboxError as error:
        fail(str(error))
    fail(
        "the broker appliance is not built yet (issue 4); "
        "`mqbox config` shows the configuration it will run with",
        code=2,
    )


@app.command()
def stop(*, home: HomeOption = None) -> None:
    """Stop the appliance running in --home."""
    fail(f"nothing to stop in {ops.home_dir(home)}: the appliance is not built yet (issue 4)")


@app.command()
def status(*, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Show every role with pid, CPU, memory, ports, store size and uptime."""
    fail(f"no appliance in {ops.home_dir(home)}: the appliance is not built yet (issue 4)")


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

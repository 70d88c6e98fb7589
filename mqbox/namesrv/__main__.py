"""`python -m mqbox.namesrv`: the name server process (mqbox/namesrv/server.py).

Owns: the command line, which maps onto RocketMQ's namesrv keys so that a flag and a config file
line mean the same thing. Never: anything else; it loads the configuration and calls `main`.

    python -m mqbox.namesrv --listen-port 0 --ready-file /tmp/ns.ready [--config etc/namesrv.conf]
        [--host 127.0.0.1] [--scan-interval-ms 10000] [--expire-ms 120000] [--stats-file PATH]
        [--acl-file plain_acl.yml]

The ACL (docs/acl.md section 6) is on with --acl-file, or with aclEnable=true in the config file,
which then names the file with mqboxAclFile (relative to the working directory).

Flags override the file. Exit status: 0 after SIGTERM or SIGINT, 1 when it cannot start, 2 for a
bad command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mqbox.config import load_namesrv_config
from mqbox.errors import ConfigError
from mqbox.namesrv.server import main


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mqbox.namesrv", description=__doc__)
    parser.add_argument("--config", type=Path, help="namesrv.conf (RocketMQ key=value lines)")
    parser.add_argument("--listen-port", type=int, help="TCP port; 0 = any free port (listenPort)")
    parser.add_argument(
        "--host", help="IPv4 address to listen on (mqboxListenAddress, default 127.0.0.1)"
    )
    parser.add_argument(
        "--ready-file", type=Path, help='written atomically once listening: {"pid","port","host"}'
    )
    parser.add_argument(
        "--scan-interval-ms",
        type=int,
        help="ms between eviction scans (scanNotActiveBrokerInterval)",
    )
    parser.add_argument(
        "--expire-ms",
        type=int,
        help="ms of silence before a broker is evicted (brokerChannelExpiredTime)",
    )
    parser.add_argument(
        "--stats-file", type=Path, help="statistics JSON, after each scan and at exit"
    )
    parser.add_argument(
        "--acl-file", type=Path, help="plain_acl.yml: registrations and wipes need an admin"
    )
    return parser.parse_args(argv)


def run(argv: list[str]) -> None:
    arguments = parse_arguments(argv)
    overrides: dict[str, str] = {}
    if arguments.listen_port is not None:
        overrides["listenPort"] = str(arguments.listen_port)
    if arguments.host is not None:
        overrides["mqboxListenAddress"] = arguments.host
    if arguments.scan_interval_ms is not None:
        overrides["scanNotActiveBrokerInterval"] = str(arguments.scan_interval_ms)
    if arguments.expire_ms is not None:
        overrides["brokerChannelExpiredTime"] = str(arguments.expire_ms)
    try:
        config = load_namesrv_config(arguments.config, overrides)
    except ConfigError as error:
        sys.stderr.write(f"mqbox.namesrv: {error}\n")
        raise SystemExit(1) from None
    acl_file: Path | None = arguments.acl_file
    if acl_file is None and config.acl_enable:
        if not config.acl_file:
            sys.stderr.write("mqbox.namesrv: aclEnable=true needs mqboxAclFile or --acl-file\n")
            raise SystemExit(1)
        acl_file = Path(config.acl_file).expanduser()
    main(
        config,
        ready_file=arguments.ready_file,
        stats_file=arguments.stats_file,
        acl_file=acl_file,
    )


if __name__ == "__main__":
    run(sys.argv[1:])

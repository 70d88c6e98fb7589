"""Goal: the dependency directions of ARCHITECTURE.md hold in the code.

Method: parse every module of mqbox/ with `ast` (nothing is imported) and check each import
against the rules of its package. Moving a boundary means changing this test and ARCHITECTURE.md
in the same commit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "mqbox"

_DATA_PLANE_LEAF_FORBIDDEN = (
    "mqbox.store",
    "mqbox.client",
    "mqbox.protocol",
    "mqbox.server",
    "mqbox.ipc",
    "mqbox.config",
    "mqbox.namesrv",
    "mqbox.admin",
    "mqbox.spark",
    "socket",
    "selectors",
)
# package prefix -> module prefixes it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # message.py is a leaf: only the leaf errors module, so callers catch one set of classes.
    "mqbox.message": (
        "mqbox.store",
        "mqbox.protocol",
        "mqbox.server",
        "mqbox.ipc",
        "mqbox._jit",
        "mqbox.config",
        "mqbox.namesrv",
        "mqbox.client",
        "mqbox.admin",
        "numba",
        "socket",
        "selectors",
    ),
    "mqbox.errors": ("mqbox",),
    # message_kernels.py (and its twin) is the data plane's leaf under both store and client: the
    # byte layer and the record check. It stands on message.py and _jit.py alone.
    "mqbox.message_kernels": _DATA_PLANE_LEAF_FORBIDDEN,
    "mqbox.message_kernels_ref": _DATA_PLANE_LEAF_FORBIDDEN,
    # resources.py (descriptor limit, accept back-off) serves the broker and the name server.
    "mqbox.resources": ("mqbox",),
    # The one wall clock and the one run-file writer: leaves under store, server and namesrv.
    "mqbox.clock": ("mqbox",),
    "mqbox.run_files": ("mqbox",),
    "mqbox.protocol": (
        "socket",
        "selectors",
        "time",
        "os",
        "numba",
        "mqbox.store",
        "mqbox.server",
        "mqbox.ipc",
        "mqbox.namesrv",
        "mqbox.client",
        "mqbox.admin",
        "mqbox.spark",
    ),
    "mqbox.store": (
        "socket",
        "selectors",
        "mqbox.protocol",
        "mqbox.server",
        "mqbox.ipc",
        "mqbox.namesrv",
        "mqbox.client",
        "mqbox.admin",
        "mqbox.spark",
    ),
    "mqbox.ipc": (
        "mqbox.store",
        "mqbox.protocol",
        "mqbox.server",
        "mqbox.namesrv",
        "mqbox.client",
        "mqbox.admin",
        "mqbox.spark",
        "mqbox.message",
    ),
    "mqbox.namesrv": ("mqbox.store", "mqbox.server", "mqbox.client", "mqbox.admin", "mqbox.spark"),
    "mqbox.client": ("mqbox.store", "mqbox.server", "mqbox.ipc", "mqbox.admin", "mqbox.spark"),
    # server and admin see everything else (the broker registers through mqbox.client).
    "mqbox.server": ("mqbox.admin", "mqbox.spark"),
    # The control block is a leaf every role and the supervisor import; the process graph is
    # data that imports no role and no plumbing (no import circle through them).
    "mqbox.server.control_block": ("mqbox",),
    "mqbox.server.topology": ("mqbox.server",),
    # Plumbing stands under the roles (mqbox/server/roles/), never on one of them.
    **{
        f"mqbox.server.{plumbing}": ("mqbox.server.roles",)
        for plumbing in (
            "runtime",
            "topology",
            "routing",
            "home",
            "transport",
            "queue_counters",
        )
    },
    # The one starter of a supervisor child (CLI, tests, benches) knows only its command line.
    "mqbox.server.launch": ("mqbox.server.roles", "mqbox.server.supervisor", "mqbox.store"),
    # Ring parcel layouts are data: no transport, no role, no plumbing.
    "mqbox.server.parcels": ("mqbox.server", "mqbox.ipc", "mqbox.store"),
    # The ring transport moves records for every role and knows none of them.
    "mqbox.server.transport": (
        "mqbox.server.roles.processors",
        "mqbox.server.roles.reactor",
        "mqbox.server.roles.codec",
        "mqbox.server.roles.worker",
        "mqbox.server.roles.store_writer",
        "mqbox.server.roles.dispatcher",
        "mqbox.server.roles.schedule",
        "mqbox.server.roles.services",
        "mqbox.server.supervisor",
    ),
    # The routing table is data over the graph: no role, no plumbing but the topology.
    "mqbox.server.routing": (
        "mqbox.server.roles.processors",
        "mqbox.server.roles.worker",
        "mqbox.server.supervisor",
        "mqbox.server.runtime",
        "mqbox.store",
        "mqbox.ipc",
    ),
    # The admin processor's sections stand on its base alone, not on each other.
    **{
        f"mqbox.server.roles.processors.admin.{section}": tuple(
            f"mqbox.server.roles.processors.admin.{other}"
            for other in ("clients", "offsets", "queries", "topic_admin")
            if other != section
        )
        for section in ("clients", "offsets", "queries", "topic_admin")
    },
    # The request codes beyond RequestCode: the broker, the CLI and the client name them here.
    "mqbox.protocol.mqbox_codes": ("mqbox.protocol.command", "mqbox.protocol.connection"),
    # The connector is a client: it reaches brokers over the wire only (docs/spark.md).
    "mqbox.spark": ("mqbox.store", "mqbox.server", "mqbox.ipc", "mqbox.admin"),
    "mqbox.config": ("mqbox.store", "mqbox.server", "mqbox.protocol", "mqbox.ipc"),
    # The plain ACL is pure rules over protocol's codes and headers: the codec, the name server
    # and the clients call it; it reaches no socket, ring or process.
    "mqbox.acl": (
        "socket",
        "selectors",
        "mqbox.store",
        "mqbox.server",
        "mqbox.ipc",
        "mqbox.namesrv",
        "mqbox.client",
        "mqbox.admin",
        "mqbox.spark",
    ),
}
# The client's pure foundation (algorithms, tables, decoding): no sockets, threads or clocks, and
# none of the client's I/O modules. Callers pass `now_ms` in and do the I/O themselves.
PURE_CLIENT_MODULES = (
    "errors",
    "route_table",
    "outgoing",
    "batch_kernels",
    "allocate",
    "fault",
    "selector",
    "subscription",
    "process_queue",
    "offset_store",
    "pull_decode",
    "pull_kernels",
    "pull_kernels_ref",
    "batch_queue",
    "consume_rules",
    "messages",
)
PURE_CLIENT_FORBIDDEN = (
    "socket",
    "selectors",
    "threading",
    "time",
    "asyncio",
    "concurrent",
    "mqbox.client.remoting",
    "mqbox.client.namesrv_api",
    "mqbox.client.admin_api",
    "mqbox.client.registration",
    "mqbox.client.transport",
    "mqbox.client.scheduler",
    "mqbox.client.instance",
    "mqbox.client.producer",
    "mqbox.client.pull",
    "mqbox.client.consumer_offsets",
    "mqbox.client.consumer_core",
    "mqbox.client.push_consumer",
    "mqbox.client.pull_consumer",
)
FORBIDDEN.update({f"mqbox.client.{name}": PURE_CLIENT_FORBIDDEN for name in PURE_CLIENT_MODULES})
# Only mqbox/_jit.py imports numba; nothing outside mqbox/spark imports mqbox.spark.
NUMBA_OWNER = "mqbox._jit"


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> list[str]:
    """Absolute names of all that `path` (module `name`) imports; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.append(target)
            names.extend(f"{target}.{alias.name}" for alias in node.names)
    return names


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = sorted(PACKAGE_ROOT.rglob("*.py"))


def test_every_package_is_seen() -> None:
    seen = {module_name(path) for path in MODULES}
    for package in ("mqbox.protocol", "mqbox.store", "mqbox.ipc", "mqbox.server", "mqbox.admin"):
        assert package in seen


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_module_imports_follow_the_layering(path: Path) -> None:
    name = module_name(path)
    imported = imports_of(path, name)
    for rule_owner, forbidden in FORBIDDEN.items():
        if not matches(name, rule_owner):
            continue
        for target in imported:
            for prefix in forbidden:
                assert not matches(target, prefix), f"{name} must not import {target}"
    if name != NUMBA_OWNER:
        assert not any(matches(target, "numba") for target in imported), (
            f"{name} imports numba; only {NUMBA_OWNER} may"
        )
    if not matches(name, "mqbox.spark"):
        assert not any(matches(target, "mqbox.spark") for target in imported)


def test_layering_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    """The checker itself must see an import, or every test above passes vacuously."""
    fake = tmp_path / "probe.py"
    fake.write_text("import socket\nfrom mqbox.store import layout\nfrom ..ipc import ring\n")
    found = imports_of(fake, "mqbox.protocol.probe")
    assert "socket" in found
    assert "mqbox.store.layout" in found
    assert "mqbox.ipc.ring" in found

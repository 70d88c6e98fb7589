"""Trivial roles for the supervisor's own tests: the broker's process graph with stand-in mains.

Owns: topology factories (`module:function` values for the supervisor's `--topology`) that keep
the broker's roles, kinds, order and rings (`broker_topology`) but run the mains below, plus
one extra pair of rings per role to and from a test "client" (`client.0`), so a test can talk to
any role. Never: broker behaviour; these are doubles for testing process management only.

The mains: `echo_main` attaches its rings, reports ready, then answers every parcel from the
client with a JSON line naming its role id, pid and generation, and writes events (start,
ready, control changes, stop) to `<home>/events.log` with a CLOCK_MONOTONIC timestamp, so a
test can check start order and the control channel. The others misbehave on purpose: never
ready, fail before ready, ignore SIGTERM, keep dying. `topology_real_services` runs the real
services role (name-server registration) among the stand-ins.

The module imports the store and message kernels and warms them (`warm_up`), as the real roles
do, so the memory a test measures includes numba and the compiled kernels.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Final, NoReturn

import mqbox.message_kernels  # noqa: F401  (loaded for its kernels, as the real roles load it)
from mqbox.config import BrokerConfig
from mqbox.ipc import names
from mqbox.ipc.ring import ParcelBatch, Ring
from mqbox.server import control_block, runtime
from mqbox.server.runtime import RoleContext
from mqbox.server.topology import RingSpec, Topology, broker_topology
from mqbox.store import message_store

CLIENT_ROLE_ID: Final = "client.0"
CLIENT_SHM_ROLE: Final = "client-0"
CLIENT_RING_CAPACITY_BYTES: Final = 1 << 16
EVENTS_FILE_NAME: Final = "events.log"
REPLY_TYPE: Final = 1
REQUEST_TYPE: Final = 1
_MODULE: Final = "tests.support.roles"


def warm_up() -> None:
    """Called by the supervisor before it forks: compile the store kernels once, in the zygote."""
    message_store.warm_up_kernels()


# ---------------------------------------------------------------------------------------------
# Topologies
# ---------------------------------------------------------------------------------------------


def client_ring_names(instance: str, role_id: str, topology: Topology) -> tuple[str, str]:
    """(client -> role, role -> client) ring names of `role_id` in a test topology."""
    return (
        topology.ring(CLIENT_ROLE_ID, role_id).name,
        topology.ring(role_id, CLIENT_ROLE_ID).name,
    )


def _with_mains(
    instance: str, config: BrokerConfig, mains: dict[str, str] | None = None
) -> Topology:
    """broker_topology with `echo_main` everywhere (or `mains[role_id]`), plus client rings."""
    base = broker_topology(instance, config)
    overrides = mains or {}
    roles = tuple(
        dataclasses.replace(role, main=overrides.get(role.role_id, f"{_MODULE}:echo_main"))
        for role in base.roles
    )
    client_rings: list[RingSpec] = []
    for count, role in enumerate(roles):
        client_rings.append(
            RingSpec(
                names.shm_name(instance, CLIENT_SHM_ROLE, count),
                CLIENT_ROLE_ID,
                role.role_id,
                CLIENT_RING_CAPACITY_BYTES,
            )
        )
        back_name = names.shm_name(instance, f"{role.role_id.replace('.', '-')}-client", 0)
        client_rings.append(
            RingSpec(back_name, role.role_id, CLIENT_ROLE_ID, CLIENT_RING_CAPACITY_BYTES)
        )
    return Topology(roles, base.rings + tuple(client_rings))


def topology(instance: str, config: BrokerConfig) -> Topology:
    """Every role of the broker (pools from `config`) runs echo_main."""
    return _with_mains(instance, config)


def topology_send_never_ready(instance: str, config: BrokerConfig) -> Topology:
    return _with_mains(instance, config, {"send.0": f"{_MODULE}:never_ready_main"})


def topology_send_fails(instance: str, config: BrokerConfig) -> Topology:
    return _with_mains(instance, config, {"send.0": f"{_MODULE}:failing_main"})


def topology_services_ignores_sigterm(instance: str, config: BrokerConfig) -> Topology:
    return _with_mains(instance, config, {"services.0": f"{_MODULE}:stubborn_main"})


def topology_real_services(instance: str, config: BrokerConfig) -> Topology:
    """The real services role (name-server registration) among echo roles."""
    return _with_mains(instance, config, {"services.0": "mqbox.server.roles.services:main"})


def topology_send_keeps_dying(instance: str, config: BrokerConfig) -> Topology:
    return _with_mains(instance, config, {"send.0": f"{_MODULE}:dies_after_ready_main"})


def topology_dispatcher_keeps_dying(instance: str, config: BrokerConfig) -> Topology:
    """A critical role in a crash loop: every broker restart ends in another."""
    return _with_mains(instance, config, {"dispatcher.0": f"{_MODULE}:dies_after_ready_main"})


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    monotonic_ns: int
    role_id: str
    pid: int
    what: str


def record_event(ctx: RoleContext, what: str) -> None:
    """Append one line to <home>/events.log (one write, O_APPEND: lines never interleave)."""
    line = f"{time.monotonic_ns()} {ctx.role.role_id} {os.getpid()} {what}\n"
    fd = os.open(ctx.home / EVENTS_FILE_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_events(home: Path) -> list[Event]:
    try:
        text = (home / EVENTS_FILE_NAME).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        stamp, role_id, pid, what = line.split(" ", 3)
        events.append(Event(int(stamp), role_id, int(pid), what))
    return events


# ---------------------------------------------------------------------------------------------
# Mains
# ---------------------------------------------------------------------------------------------


def echo_main(ctx: RoleContext) -> NoReturn:
    """Answer the client; drain (and drop) everything else; log control changes."""
    record_event(ctx, "start")
    rings = runtime.attach_rings(ctx)
    role_id = ctx.role.role_id
    client_out = rings.outbound.get(CLIENT_ROLE_ID)
    control = ctx.control
    assert control is not None

    def on_batch(producer: str, ring: Ring, batch: ParcelBatch) -> None:
        if producer != CLIENT_ROLE_ID or client_out is None:
            return
        for index in range(batch.count):
            reply = {
                "role_id": role_id,
                "pid": os.getpid(),
                "generation": control.generation(role_id),
                "payload": batch.payload(index).tobytes().decode(),
            }
            written = client_out.try_write_nowait(REPLY_TYPE, json.dumps(reply).encode())
            assert written, "the client ring is full"

    def on_control(changed: tuple[str, ...]) -> None:
        states = " ".join(f"{other}={control.generation(other)}" for other in changed)
        record_event(ctx, f"control {states}")

    record_event(ctx, "ready")  # before the report, so the next kind's start comes after it
    ctx.report_ready({"kind": ctx.role.kind.value, "generation": control.generation(role_id)})
    loop = runtime.RoleLoop(
        ctx,
        rings,
        on_batch,
        tick_interval_ms=200,
        on_control=on_control,
        on_stop=lambda: record_event(ctx, "stop"),
    )
    loop.run()
    raise AssertionError("unreachable")


def never_ready_main(ctx: RoleContext) -> NoReturn:
    record_event(ctx, "start")
    while not runtime.stop_requested():
        time.sleep(0.05)
    runtime.exit_stopped()


def failing_main(ctx: RoleContext) -> NoReturn:
    record_event(ctx, "start")
    raise RuntimeError("failing_main fails on purpose before it is ready")


def stubborn_main(ctx: RoleContext) -> NoReturn:
    """Ready, then ignores SIGTERM: the supervisor must SIGKILL it after the stop timeout."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record_event(ctx, "ready")
    ctx.report_ready({})
    while True:
        time.sleep(0.05)
    raise AssertionError("unreachable")


def dies_after_ready_main(ctx: RoleContext) -> NoReturn:
    """Ready, then exits with status 3 a moment after the broker runs: a crash loop. (A death
    while the broker is still starting would fail the start instead.)"""
    ctx.report_ready({})
    assert ctx.control is not None
    while ctx.control.broker_state() != control_block.BROKER_RUNNING:
        time.sleep(0.01)
    time.sleep(0.05)
    os._exit(3)


# ---------------------------------------------------------------------------------------------
# A test's side of the client rings
# ---------------------------------------------------------------------------------------------


class RoleClient:
    """The test process's end of one role's client rings: ask, and wait for the JSON answer."""

    def __init__(self, request_ring_name: str, reply_ring_name: str) -> None:
        self._requests = Ring.attach(request_ring_name)
        self._replies = Ring.attach(reply_ring_name)

    def ask(self, payload: str, timeout_s: float) -> dict[str, Any]:
        """Send `payload`, return the answer to it. Answers to earlier payloads are skipped: a
        role killed after answering but before releasing the request answers it again once it
        is re-forked (the ring delivers unreleased parcels again)."""
        assert self._requests.try_write_nowait(REQUEST_TYPE, payload.encode())
        deadline = time.monotonic() + timeout_s
        while True:
            parcel = self._replies.read_nowait()
            if parcel is not None:
                document: dict[str, Any] = json.loads(parcel[1])
                if document["payload"] == payload:
                    return document
                continue
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise TimeoutError(f"no answer to {payload!r} within {timeout_s} s")
            self._replies.wait_readable(min(remaining_ms, 100))

    def close(self) -> None:
        self._requests.close()
        self._replies.close()

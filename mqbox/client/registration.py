"""BrokerRegistrar: keeps one broker registered with every name server of its namesrvAddr.

Owns: one thread and one RemotingClient per name server address, each registering every
`period_ms` (RocketMQ's registerNameServerPeriod, 30 s) and when `register_now()` asks. Never:
the broker's topic table; `source()` builds the request afresh for each registration, so a topic
created a moment ago goes out with its new dataVersion.

Rules:

1. Name servers are independent: each has its own thread and connection, so one that hangs or
   refuses delays nobody else. A failed registration is retried after `retry_ms` rather than a
   whole period, so a name server that restarts routes the broker again quickly.
2. A thread keeps its connection open between registrations. The name server drops a broker's
   routes when the connection that registered it closes (routes.py), so a registrar that
   reconnected for every registration would flap the routes.
3. `stop()` unregisters (104) from every name server that had the broker, unless told not to,
   then closes the connections and joins the threads.
4. `source` is the broker's own code. If it raises anything but an operating error (MqboxError),
   that is a bug: the thread records it, stops, and `stop()` raises it again in the caller.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mqbox.acl.signature import SessionCredentials
from mqbox.client.namesrv_api import (
    RegisterBrokerOutcome,
    register_broker,
    split_namesrv_addr,
    unregister_broker,
)
from mqbox.client.remoting import RemotingClient
from mqbox.errors import MqboxError
from mqbox.protocol.headers import (
    RegisterBrokerBody,
    RegisterBrokerRequestHeader,
    UnregisterBrokerRequestHeader,
)

log = logging.getLogger("mqbox.client.registration")

PERIOD_MS_DEFAULT: Final = 30_000
RETRY_MS_DEFAULT: Final = 3_000
TIMEOUT_MS_DEFAULT: Final = 6_000  # the Java broker's registerBrokerTimeoutMills

RegistrationSource = Callable[[], tuple[RegisterBrokerRequestHeader, RegisterBrokerBody]]
RegisteredCallback = Callable[[str, RegisterBrokerOutcome], None]


@dataclass(frozen=True, slots=True)
class NamesrvRegistrationStatistics:
    """How registration with one name server has gone."""

    address: str
    success_count: int
    failure_count: int
    last_success_ms: int | None  # monotonic ms of the last success
    last_error: str | None  # the last failure's message, cleared by a success


class _Target:
    """One name server's thread state. Counters are written by its thread only."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.wake = threading.Event()
        self.registered = threading.Event()  # at least one success
        self.statistics = NamesrvRegistrationStatistics(address, 0, 0, None, None)
        self.thread: threading.Thread | None = None


class BrokerRegistrar:
    """Registers a broker with each name server of `namesrv_addr`; see the module docstring."""

    def __init__(
        self,
        namesrv_addr: str,
        source: RegistrationSource,
        *,
        period_ms: int = PERIOD_MS_DEFAULT,
        retry_ms: int = RETRY_MS_DEFAULT,
        timeout_ms: int = TIMEOUT_MS_DEFAULT,
        unregister_on_stop: bool = True,
        on_registered: RegisteredCallback | None = None,
        credentials: SessionCredentials | None = None,
    ) -> None:
        """`credentials`: registrations are signed with them (an admin account of the name
        server's ACL, docs/acl.md section 6)."""
        assert period_ms > 0
        assert retry_ms > 0
        assert timeout_ms > 0
        self.addresses: Final = split_namesrv_addr(namesrv_addr)
        self._source = source
        self.period_ms = period_ms
        self.retry_ms = retry_ms
        self.timeout_ms = timeout_ms
        self.unregister_on_stop = unregister_on_stop
        self._on_registered = on_registered
        self.credentials = credentials
        self._targets = tuple(_Target(address) for address in self.addresses)
        self._stopping = threading.Event()
        self._started = False
        self._bug: BaseException | None = None

    def start(self) -> None:
        """Start one thread per name server; each registers at once."""
        assert not self._started
        self._started = True
        for target in self._targets:
            target.thread = threading.Thread(
                target=self._run,
                args=(target,),
                name=f"mqbox-register-{target.address}",
                daemon=True,
            )
            target.thread.start()

    def register_now(self) -> None:
        """Register with every name server now (after a topic change), not at the next period."""
        for target in self._targets:
            target.wake.set()

    def wait_registered(self, timeout_ms: int) -> bool:
        """True once every name server has accepted at least one registration."""
        deadline_ns = time.monotonic_ns() + timeout_ms * 1_000_000
        for target in self._targets:
            remaining_s = max(0, deadline_ns - time.monotonic_ns()) / 1e9
            if not target.registered.wait(remaining_s):
                return False
        return True

    def statistics(self) -> tuple[NamesrvRegistrationStatistics, ...]:
        return tuple(target.statistics for target in self._targets)

    def stop(self, timeout_ms: int | None = None) -> None:
        """Unregister (rule 3), close and join; re-raise a bug a thread met (rule 4)."""
        self._stopping.set()
        for target in self._targets:
            target.wake.set()
        join_s = (timeout_ms if timeout_ms is not None else 2 * self.timeout_ms) / 1000
        for target in self._targets:
            if target.thread is not None:
                target.thread.join(join_s)
        if self._bug is not None:
            raise self._bug

    # -- one thread per name server --------------------------------------------------------------

    def _run(self, target: _Target) -> None:
        client = RemotingClient(target.address, self.timeout_ms, credentials=self.credentials)
        last_header: RegisterBrokerRequestHeader | None = None
        try:
            while not self._stopping.is_set():
                wait_ms = self.period_ms
                try:
                    header, body = self._source()
                    last_header = header
                    outcome = register_broker(client, header, body)
                except MqboxError as error:
                    self._record(target, error=error)
                    client.close()
                    wait_ms = min(self.period_ms, self.retry_ms)
                else:
                    self._record(target)
                    if self._on_registered is not None:
                        self._on_registered(target.address, outcome)
                target.wake.wait(wait_ms / 1000)
                target.wake.clear()
            if self.unregister_on_stop and last_header is not None and target.registered.is_set():
                self._unregister(client, target, last_header)
        except BaseException as bug:
            self._bug = bug
            log.exception("registration with %s stopped by a bug", target.address)
        finally:
            client.close()

    def _unregister(
        self, client: RemotingClient, target: _Target, header: RegisterBrokerRequestHeader
    ) -> None:
        request = UnregisterBrokerRequestHeader(
            header.broker_name, header.broker_addr, header.cluster_name, header.broker_id
        )
        try:
            unregister_broker(client, request)
        except MqboxError as error:
            log.warning("unregistering from %s failed: %s", target.address, error)

    def _record(self, target: _Target, *, error: MqboxError | None = None) -> None:
        previous = target.statistics
        if error is None:
            target.statistics = dataclasses.replace(
                previous,
                success_count=previous.success_count + 1,
                last_success_ms=time.monotonic_ns() // 1_000_000,
                last_error=None,
            )
            target.registered.set()
            return
        # One line when a name server starts failing, not one per retry.
        if previous.last_error is None:
            log.warning("registering with %s failed: %s", target.address, error)
        target.statistics = dataclasses.replace(
            previous, failure_count=previous.failure_count + 1, last_error=str(error)
        )

"""Who may change the name server's broker tables: the broker white-list.

Owns: `BrokerWhiteList`, the rule the request handler (server.py) applies to the codes only
brokers and operators send: 103 REGISTER_BROKER, 104 UNREGISTER_BROKER and 205
WIPE_WRITE_PERM_OF_BROKER. Clients never send them (the C++ and Java clients ask for routes and
KV entries only), so refusing them to everyone else costs a client nothing, while any peer that
may send them can put a fake broker into real topics' routes or stop every producer of a broker.
RocketMQ 4.9.x's name server checks nothing (docs/security.md); the ACL's signed admin account
(issue 13's ACL part) is the other way in, and does not go through here.

The key is `mqboxNamesrvBrokerWhiteList` in namesrv.conf: a comma-separated list of
- `local` (the default): loopback (127.0.0.0/8, ::1) and every address of this host's
  interfaces, which is where a broker of the same machine connects from, whichever of them
  namesrvAddr names;
- `*`: anyone (RocketMQ's behaviour);
- an IPv4 or IPv6 address, or a network in CIDR form (`10.0.0.0/8`).
config.parse_broker_white_list checks the entries at load. It is checked against the
connection's peer address, never against a header's brokerAddr (which
the sender writes). A refusal is answered 16 NO_PERMISSION with a remark that names the key.

Never: sockets or the route table. Host addresses are read with psutil when a `local` list
misses, at most every LOCAL_ADDRESSES_REFRESH_NS, so a new interface address is seen without
asking the kernel for every request.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from typing import Final, TypeAlias

import psutil

from mqbox.config import WHITE_LIST_ANYONE, WHITE_LIST_LOCAL

WHITE_LIST_KEY: Final = "mqboxNamesrvBrokerWhiteList"
LOCAL: Final = WHITE_LIST_LOCAL
ANYONE: Final = WHITE_LIST_ANYONE
WHITE_LIST_DEFAULT: Final = (LOCAL,)
LOCAL_ADDRESSES_REFRESH_NS: Final = 10_000_000_000
_LOOPBACK: Final = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_addresses() -> frozenset[str]:
    """Every IPv4 and IPv6 address of this host's interfaces, as text."""
    found: set[str] = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                found.add(address.address.split("%", 1)[0])  # drop an IPv6 zone
    return frozenset(found)


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


class BrokerWhiteList:
    """The peers that may send 103, 104 and 205 (module docstring)."""

    def __init__(
        self,
        entries: Iterable[str] = WHITE_LIST_DEFAULT,
        *,
        local_addresses: Callable[[], frozenset[str]] = host_addresses,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.entries = tuple(entries)
        assert self.entries
        self.anyone = ANYONE in self.entries
        self.local = LOCAL in self.entries
        self._networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(entry, strict=False)
            for entry in self.entries
            if entry not in (LOCAL, ANYONE)
        )
        self._local_addresses = local_addresses
        self._clock_ns = clock_ns
        self._host: frozenset[Address] = frozenset()
        self._host_read_ns: int | None = None

    def admits(self, peer_host: str) -> bool:
        """True if a peer connected from `peer_host` may change the broker tables."""
        if self.anyone:
            return True
        address = _address(peer_host)
        if address is None:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if any(address in network for network in self._networks):
            return True
        if not self.local:
            return False
        if any(address in network for network in _LOOPBACK):
            return True
        return address in self._host_addresses()

    def _host_addresses(self) -> frozenset[Address]:
        now_ns = self._clock_ns()
        if self._host_read_ns is None or now_ns - self._host_read_ns >= LOCAL_ADDRESSES_REFRESH_NS:
            self._host_read_ns = now_ns
            parsed = (_address(text) for text in self._local_addresses())
            self._host = frozenset(address for address in parsed if address is not None)
        return self._host

    def describe(self) -> str:
        return ",".join(self.entries)

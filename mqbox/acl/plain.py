"""plain_acl.yml: its format, its validation, and the rules it states (permissions, addresses).

Owns: Java's Permission bits and their words, RocketMQ's remote-address patterns, the `Account`
and `AclConfig` records and `parse_acl_text`. Never: I/O (validator.py reads the file), or
request codes (requests.py).

The file (docs/acl.md section 2; Java's PlainPermissionManager and AclConstants):

    globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]   # no key or signature needed
    accounts:
      - accessKey: RocketMQ            # longer than 6 characters, unique
        secretKey: 12345678            # longer than 6 characters
        whiteRemoteAddress: ""         # a pattern: from there, no signature needed
        admin: false                   # admin codes (requests.ADMIN_CODES) need true
        defaultTopicPerm: DENY         # for topics not in topicPerms (missing = DENY)
        defaultGroupPerm: SUB          # for groups not in groupPerms (missing = DENY)
        topicPerms: ["topicA=DENY", "topicB=PUB|SUB"]
        groupPerms: ["groupA=DENY", "groupB=PUB|SUB"]

Where Java turns an unknown permission word into DENY quietly (for the defaults), mqbox refuses
the file with the account and key named: a typo must not lock everyone out, or in. Unknown keys
are refused the same way; `dataVersion`, which Java's file carries, is accepted and ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from mqbox.errors import ConfigError

# Java's Permission bits.
DENY: Final = 1
ANY: Final = 2
PUB: Final = 4
SUB: Final = 8
_PERM_WORDS: Final = {
    "DENY": DENY,
    "PUB": PUB,
    "SUB": SUB,
    "PUB|SUB": PUB | SUB,
    "SUB|PUB": PUB | SUB,
}
RETRY_GROUP_TOPIC_PREFIX: Final = "%RETRY%"  # group resources are kept as their retry topic
ACCESS_KEY_SIZE_MIN: Final = 7  # Java: "cannot be less than 6 characters" means more than 6
_TOP_KEYS: Final = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_ACCOUNT_KEYS: Final = frozenset(
    {
        "accessKey",
        "secretKey",
        "whiteRemoteAddress",
        "admin",
        "defaultTopicPerm",
        "defaultGroupPerm",
        "topicPerms",
        "groupPerms",
    }
)


class AclConfigError(ConfigError):
    """plain_acl.yml is not valid; the message names the file, the account and the key."""


def perm_text(perm: int) -> str:
    """The word of a permission value, as the file spells it."""
    if perm & DENY:
        return "DENY"
    words = [word for word, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit]
    return "|".join(words) or "DENY"


def parse_perm(text: object, where: str) -> int:
    """A permission word (DENY, PUB, SUB, PUB|SUB, SUB|PUB); AclConfigError for anything else."""
    if not isinstance(text, str) or text.strip() not in _PERM_WORDS:
        raise AclConfigError(f"{where}: {text!r} is not DENY, PUB, SUB or PUB|SUB")
    return _PERM_WORDS[text.strip()]


def check_permission(needed: int, owned: int) -> bool:
    """Java's Permission.checkPermission: DENY owns nothing; ANY needs PUB or SUB; else a bit
    in common."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def is_group_resource(resource: str) -> bool:
    return resource.startswith(RETRY_GROUP_TOPIC_PREFIX)


# -- remote address patterns ---------------------------------------------------------------------


_ANY_ADDRESS: Final = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One of RocketMQ's address patterns (RemoteAddressStrategyFactory), matched against the
    peer's address without its port:

    - blank: matches nothing;  `*`, `*.*.*.*`, `*:*:*:*:*:*:*:*`: everything;
    - `192.168.1.{1,2,3}` or `192.168.1.1,192.168.1.2`: a set of addresses;
    - `192.168.1.*`, `192.168.*.*`, `192.168.1.1-200`, `192.168.1-9.*`: a range: the parts
      before the first `*` or `a-b` part are exact, and every part after it is `*`;
      IPv6 the same with 8 hexadecimal groups spelled out;
    - anything else: one exact address.
    """

    text: str
    match_all: bool = False
    addresses: frozenset[str] = frozenset()
    # a range: per part, (low, high) inclusive; IPv4 parts are decimal, IPv6 groups hexadecimal
    ranges: tuple[tuple[int, int], ...] = ()
    ipv6: bool = False

    def matches(self, host: str) -> bool:
        if self.match_all:
            return True
        if self.addresses:
            return _canonical(host) in self.addresses
        if not self.ranges:
            return False
        parts = _address_parts(host, self.ipv6)
        if parts is None:
            return False
        return all(
            low <= part <= high for part, (low, high) in zip(parts, self.ranges, strict=True)
        )


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host.strip()))
    except ValueError:
        return host.strip()


def _address_parts(host: str, ipv6: bool) -> tuple[int, ...] | None:
    try:
        address = ipaddress.ip_address(host.strip())
    except ValueError:
        return None
    if ipv6:
        if address.version != 6:
            return None
        packed = address.packed
        return tuple(int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2))
    if address.version != 4:
        return None
    return tuple(address.packed)


def parse_address_pattern(text: object, where: str) -> AddressPattern:
    """AddressPattern of `text`; AclConfigError naming `where` when it is not one."""
    if text is None:
        return AddressPattern("")
    if not isinstance(text, str):
        raise AclConfigError(f"{where}: {text!r} is not an address pattern (a string)")
    pattern = text.strip()
    if not pattern:
        return AddressPattern("")
    if pattern in _ANY_ADDRESS:
        return AddressPattern(pattern, match_all=True)
    if pattern.endswith("}"):
        head, brace, tail = pattern.partition("{")
        if not brace or not head or head[-1] not in ".:":
            raise AclConfigError(f"{where}: {pattern!r}: a set is written like 10.0.0.{{1,2}}")
        items = [head + item.strip() for item in tail[:-1].split(",")]
        return AddressPattern(pattern, addresses=_exact_set(items, pattern, where))
    if "," in pattern:
        return AddressPattern(pattern, addresses=_exact_set(pattern.split(","), pattern, where))
    if "*" in pattern or "-" in pattern:
        return _range_pattern(pattern, where)
    return AddressPattern(pattern, addresses=_exact_set([pattern], pattern, where))


def _exact_set(items: list[str], pattern: str, where: str) -> frozenset[str]:
    addresses = set()
    for item in items:
        try:
            addresses.add(str(ipaddress.ip_address(item.strip())))
        except ValueError:
            raise AclConfigError(
                f"{where}: {pattern!r}: {item.strip()!r} is not an IP address"
            ) from None
    return frozenset(addresses)


def _range_pattern(pattern: str, where: str) -> AddressPattern:
    ipv6 = ":" in pattern
    parts = pattern.split(":" if ipv6 else ".")
    base, part_max = (16, 0xFFFF) if ipv6 else (10, 255)
    if len(parts) != (8 if ipv6 else 4):
        raise AclConfigError(
            f"{where}: {pattern!r}: a range spells all {8 if ipv6 else 4} parts of the address"
        )
    ranges: list[tuple[int, int]] = []
    wildcard_seen = False
    try:
        for index, part in enumerate(part.strip() for part in parts):
            if part == "*":
                ranges.append((0, part_max))
                wildcard_seen = True
                continue
            if wildcard_seen:
                raise ValueError("every part after a '*' or a range is '*'")
            if "-" in part:
                if index == 0:
                    raise ValueError("the first part is exact")
                low_text, _, high_text = part.partition("-")
                low, high = int(low_text, base), int(high_text, base)
                if not 0 <= low <= high <= part_max:
                    raise ValueError(f"{part} is not a range within 0-{part_max}")
                ranges.append((low, high))
                wildcard_seen = True
                continue
            value = int(part, base)
            if not 0 <= value <= part_max:
                raise ValueError(f"{part} is out of range")
            ranges.append((value, value))
    except ValueError as error:
        raise AclConfigError(f"{where}: {pattern!r}: {error}") from None
    return AddressPattern(pattern, ranges=tuple(ranges), ipv6=ipv6)


# -- accounts --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Account:
    """One entry of `accounts`. `resource_perms` holds topics by name and groups as their retry
    topic (`%RETRY%<group>`), as Java keeps them."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    resource_perms: Mapping[str, int]

    def owned_perm(self, resource: str) -> int:
        perm = self.resource_perms.get(resource)
        if perm is not None:
            return perm
        return self.default_group_perm if is_group_resource(resource) else self.default_topic_perm


@dataclass(frozen=True, slots=True)
class AclConfig:
    """A whole plain_acl.yml."""

    global_white_remote_addresses: tuple[AddressPattern, ...]
    accounts: Mapping[str, Account]  # by access key

    def admin_account(self) -> Account | None:
        """The first admin account of the file, or None."""
        return next((account for account in self.accounts.values() if account.admin), None)


def parse_acl_text(text: str, source: str) -> AclConfig:
    """The ACL of a plain_acl.yml text; AclConfigError with `source` and the place otherwise."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise AclConfigError(f"{source}: not YAML: {' '.join(str(error).split())}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise AclConfigError(
            f"{source}: the top level is a mapping (globalWhiteRemoteAddresses, accounts)"
        )
    unknown = sorted(str(key) for key in document if key not in _TOP_KEYS)
    if unknown:
        raise AclConfigError(f"{source}: unknown keys {', '.join(unknown)}")
    white = [
        parse_address_pattern(item, f"{source}: globalWhiteRemoteAddresses[{index}]")
        for index, item in enumerate(
            _list(document.get("globalWhiteRemoteAddresses"), source, "globalWhiteRemoteAddresses")
        )
    ]
    accounts: dict[str, Account] = {}
    for index, entry in enumerate(_list(document.get("accounts"), source, "accounts")):
        account = _parse_account(entry, f"{source}: accounts[{index}]")
        if account.access_key in accounts:
            raise AclConfigError(
                f"{source}: accounts[{index}]: accessKey {account.access_key!r} is given twice"
            )
        accounts[account.access_key] = account
    return AclConfig(tuple(white), accounts)


def _list(value: object, source: str, key: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise AclConfigError(f"{source}: {key} is a list")
    return value


def _key_text(entry: Mapping[str, object], key: str, where: str) -> str:
    value = entry.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)  # YAML reads secretKey: 12345678 as a number; Java reads a String
    if not isinstance(value, str) or len(value.strip()) < ACCESS_KEY_SIZE_MIN:
        raise AclConfigError(
            f"{where}: {key} is missing or shorter than {ACCESS_KEY_SIZE_MIN} characters"
        )
    return value.strip()


def _parse_account(entry: object, where: str) -> Account:
    if not isinstance(entry, dict):
        raise AclConfigError(f"{where}: an account is a mapping of accessKey, secretKey, ...")
    unknown = sorted(str(key) for key in entry if key not in _ACCOUNT_KEYS)
    if unknown:
        raise AclConfigError(f"{where}: unknown keys {', '.join(unknown)}")
    access_key = _key_text(entry, "accessKey", where)
    where = f"{where} ({access_key})"
    secret_key = _key_text(entry, "secretKey", where)
    admin = entry.get("admin", False)
    if isinstance(admin, str) and admin.strip().lower() in ("true", "false"):
        admin = admin.strip().lower() == "true"
    if not isinstance(admin, bool):
        raise AclConfigError(f"{where}: admin is true or false, not {admin!r}")
    perms: dict[str, int] = {}
    for key, as_group in (("topicPerms", False), ("groupPerms", True)):
        for item in _list(entry.get(key), where, key):
            name, perm = _parse_resource_perm(item, f"{where}: {key}")
            perms[retry_topic(name) if as_group else name] = perm
    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_remote_address=parse_address_pattern(
            entry.get("whiteRemoteAddress"), f"{where}: whiteRemoteAddress"
        ),
        admin=admin,
        default_topic_perm=_default_perm(entry, "defaultTopicPerm", where),
        default_group_perm=_default_perm(entry, "defaultGroupPerm", where),
        resource_perms=perms,
    )


def _default_perm(entry: Mapping[str, object], key: str, where: str) -> int:
    value = entry.get(key)
    return DENY if value is None else parse_perm(value, f"{where}: {key}")


def _parse_resource_perm(item: object, where: str) -> tuple[str, int]:
    """`name=PERM` (Java's resource format) as (name, permission)."""
    if not isinstance(item, str) or item.count("=") != 1:
        raise AclConfigError(f"{where}: {item!r} is not name=PERM, e.g. topicA=PUB|SUB")
    name, _, perm = item.partition("=")
    if not name.strip():
        raise AclConfigError(f"{where}: {item!r} has no name")
    return name.strip(), parse_perm(perm, f"{where}: {item!r}")

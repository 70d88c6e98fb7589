"""The plain ACL check of one process: the file's current rules, and one verdict per request.

Owns: the loaded plain_acl.yml of this process and when it is read again, the order of Java's
checks (PlainPermissionManager.validate), the remarks of refusals, and the counters. Never:
sockets or replies; the caller (the broker's codec, the name server) answers the refusal.

Reload: a request looks at the clock; at most every RELOAD_CHECK_INTERVAL_NS it also stats the
file, and reads it again when its inode, size or mtime changed. The cost per request is thus one
monotonic clock read. A file that no longer parses (or is gone) leaves the last good rules in
force, with a rate-limited warning: an edit in progress must not open or close the broker.

The checks, in Java's order; the first that decides ends them:
1. the peer matches a global white-list pattern: allowed, nothing else is looked at;
2. no AccessKey: "No accessKey is configured"; an unknown one: "No acl config for <ak>";
3. the peer matches the account's whiteRemoteAddress: allowed;
4. the signature differs: "Check signature failed for accessKey=<ak>";
5. the code needs an admin account (requests.needs_admin) and the account is not one;
6. every resource the request needs (requests.needed_resources) against the account's
   permission for it, or its default: "No default permission for <resource>".
A refusal is answered with SYSTEM_ERROR (1) and the remark Java's AclException gives
(REMARK_PREFIX + the message), as a 4.9 broker does.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from mqbox.acl.plain import (
    PUB,
    AclConfig,
    AclConfigError,
    check_permission,
    is_group_resource,
    parse_acl_text,
)
from mqbox.acl.requests import TRACE_TOPIC, ResourceError, needed_resources, needs_admin
from mqbox.acl.signature import ACCESS_KEY, SIGNATURE, server_signature
from mqbox.protocol.command import Buffer
from mqbox.resources import RateLimitedLog

ACL_FILE_DEFAULT: Final = Path("conf") / "plain_acl.yml"  # under the home, as under ROCKETMQ_HOME
RELOAD_CHECK_INTERVAL_NS: Final = 1_000_000_000
REMARK_PREFIX: Final = "org.apache.rocketmq.acl.common.AclException: "
ACL_FILE_SIZE_BYTES_MAX: Final = 16 * 1024 * 1024

log = logging.getLogger(__name__)


def acl_file_path(configured: str, home: Path) -> Path:
    """The ACL file a process uses: `configured` (mqboxAclFile; relative to the home), or
    <home>/conf/plain_acl.yml when it is empty."""
    if not configured.strip():
        return home / ACL_FILE_DEFAULT
    path = Path(configured.strip()).expanduser()
    return path if path.is_absolute() else home / path


def load_acl_file(path: Path) -> AclConfig:
    """The rules of the file at `path`; AclConfigError naming it when it cannot be read or is
    not valid."""
    try:
        with path.open("rb") as file:
            data = file.read(ACL_FILE_SIZE_BYTES_MAX + 1)
    except OSError as error:
        raise AclConfigError(f"{path}: cannot read: {error.strerror}") from None
    if len(data) > ACL_FILE_SIZE_BYTES_MAX:
        raise AclConfigError(f"{path}: larger than {ACL_FILE_SIZE_BYTES_MAX} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise AclConfigError(f"{path}: not UTF-8 ({error.reason} at byte {error.start})") from None
    return parse_acl_text(text, str(path))


@dataclass(frozen=True, slots=True)
class AclStatistics:
    checked_count: int
    allowed_white_count: int  # allowed by an address, without a signature check
    denied_count: int
    reload_count: int
    reload_failed_count: int


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns)


class AclValidator:
    """The ACL of one process (module docstring); not thread-safe, one loop owns it."""

    def __init__(
        self,
        path: Path,
        *,
        reload_check_interval_ns: int = RELOAD_CHECK_INTERVAL_NS,
        logger: logging.Logger = log,
        fail_closed: bool = False,
    ) -> None:
        """Raises AclConfigError for a file that is not valid; with `fail_closed`, logs it and
        starts with no account and no white-list instead (every request refused until a valid
        file appears): a role forked after `mqbox start` checked the file."""
        self.path: Final = path
        self._identity = _file_identity(path)
        try:
            self.config = load_acl_file(path)
        except AclConfigError as error:
            if not fail_closed:
                raise
            logger.error("acl: refusing every request until the file is valid: %s", error)
            self.config = AclConfig((), {})
        self.reload_check_interval_ns: Final = reload_check_interval_ns
        self._next_check_ns = time.monotonic_ns() + reload_check_interval_ns
        self._denied_log = RateLimitedLog(logger)
        self._reload_log = RateLimitedLog(logger)
        self._logger = logger
        self._checked_count = 0
        self._allowed_white_count = 0
        self._denied_count = 0
        self._reload_count = 0
        self._reload_failed_count = 0

    def reload_if_changed(self) -> bool:
        """Read the file again if it changed since it was read; True if new rules are in force."""
        identity = _file_identity(self.path)
        if identity == self._identity:
            return False
        self._identity = identity
        try:
            config = load_acl_file(self.path)
        except AclConfigError as error:
            self._reload_failed_count += 1
            self._reload_log.warning("acl: keeping the previous rules: %s", error)
            return False
        self.config = config
        self._reload_count += 1
        self._logger.info("acl: %s reloaded (%d accounts)", self.path, len(config.accounts))
        return True

    def check(self, code: int, ext: Mapping[str, str], body: Buffer, peer_host: str) -> str | None:
        """None if the request may pass; else the remark to refuse it with (counted, logged)."""
        now_ns = time.monotonic_ns()
        if now_ns >= self._next_check_ns:
            self._next_check_ns = now_ns + self.reload_check_interval_ns
            self.reload_if_changed()
        self._checked_count += 1
        message = self._verdict(code, ext, body, peer_host)
        if message is None:
            return None
        self._denied_count += 1
        self._denied_log.warning("acl: refused code %d from %s: %s", code, peer_host, message)
        return REMARK_PREFIX + message

    def _verdict(
        self, code: int, ext: Mapping[str, str], body: Buffer, peer_host: str
    ) -> str | None:
        config = self.config
        for pattern in config.global_white_remote_addresses:
            if pattern.matches(peer_host):
                self._allowed_white_count += 1
                return None
        access_key = ext.get(ACCESS_KEY)
        if access_key is None:
            return "No accessKey is configured"
        account = config.accounts.get(access_key)
        if account is None:
            return f"No acl config for {access_key}"
        if account.white_remote_address.matches(peer_host):
            self._allowed_white_count += 1
            return None
        expected = server_signature(account.secret_key, ext, body)
        if not hmac.compare_digest(expected, ext.get(SIGNATURE, "")):
            return f"Check signature failed for accessKey={access_key}"
        if needs_admin(code) and not account.admin:
            return (
                f"Need admin permission for request code={code}, but accessKey={access_key} is not"
            )
        try:
            needed = needed_resources(code, ext, body)
        except ResourceError as error:
            return str(error)
        if needed.get(TRACE_TOPIC) == PUB:
            return None
        for resource, perm in needed.items():
            if not check_permission(perm, account.owned_perm(resource)):
                kind = "group" if is_group_resource(resource) else "topic"
                name = resource.removeprefix("%RETRY%") if kind == "group" else resource
                return f"No default permission for {kind} {name}"
        return None

    def statistics(self) -> AclStatistics:
        return AclStatistics(
            self._checked_count,
            self._allowed_white_count,
            self._denied_count,
            self._reload_count,
            self._reload_failed_count,
        )

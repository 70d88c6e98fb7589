"""The request signature of RocketMQ's plain ACL, computed the same way by clients and servers.

Owns: the names of the ACL's extFields (AccessKey, Signature, SecurityToken, OnsChannel), the
signed content, and `SessionCredentials`. Never: I/O, or which key is valid (validator.py).

The content (docs/acl.md section 3; Java's AclClientRPCHook and PlainAccessValidator.parse, the
C++ client's spas_sign) is the UTF-8 of every extFields value but Signature's, in the order of the
keys as Java's TreeMap sorts them (UTF-16 code units), followed by the body; the signature is
HMAC-SHA1 of it keyed with the secret key's UTF-8, in standard base64 with padding. The server
leaves `_UNIQUE_KEY_QUERY` out of the content as well (Java does). Keys are not signed, only
values, so the set of keys is what the client sent, and each value is a string as
command.RemotingCommand.ext_fields makes it (the C++ client's JSON numbers become their decimal
text, which is what that client signed).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mqbox.message import java_utf8_encode
from mqbox.protocol.command import Buffer

ACCESS_KEY: Final = "AccessKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"
ONS_CHANNEL: Final = "OnsChannel"  # the C++ client's channel, signed like any other field
UNIQUE_KEY_QUERY: Final = "_UNIQUE_KEY_QUERY"  # Java's MixAll.UNIQUE_MSG_QUERY_FLAG
_NOT_SIGNED_BY_SERVER: Final = frozenset({SIGNATURE, UNIQUE_KEY_QUERY})
_NOT_SIGNED_BY_CLIENT: Final = frozenset({SIGNATURE})


@dataclass(frozen=True, slots=True)
class SessionCredentials:
    """A client's account (Java's SessionCredentials): access and secret key, and the optional
    security token and channel the request carries and signs (the C++ client always sends a
    channel, "ALIYUN" by default; Java none)."""

    access_key: str
    secret_key: str
    security_token: str | None = None
    channel: str | None = None

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need a non-empty access key and secret key")

    def __repr__(self) -> str:  # the secret never reaches a log line
        return f"SessionCredentials(access_key={self.access_key!r}, secret_key=<hidden>)"


def _java_key_order(key: str) -> bytes:
    """Java's String.compareTo order: UTF-16 code units, which big-endian UTF-16 bytes keep."""
    return key.encode("utf-16-be", "surrogatepass")


def signed_text(ext: Mapping[str, str], skipped: frozenset[str]) -> bytes:
    """The UTF-8 of the values of `ext` in Java's key order, without the keys in `skipped`.
    Once per request in the codec, hence the fast paths: code point order is UTF-16 order for
    keys below U+10000 (all of RocketMQ's), and plain UTF-8 is Java's for text without a lone
    surrogate."""
    keys = sorted(ext)
    if not "".join(keys).isascii():
        keys.sort(key=_java_key_order)
    text = "".join([ext[key] for key in keys if key not in skipped])
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: '?' as Java writes it
        return java_utf8_encode(text)


_SHA1_BLOCK_SIZE_BYTES: Final = 64


@functools.lru_cache(maxsize=1024)
def _hmac_pads(secret_key: str) -> tuple[Any, Any]:
    """SHA-1 states with HMAC's inner and outer key pads absorbed (RFC 2104): each request then
    costs two state copies instead of the key schedule of hmac.new. One entry per secret."""
    key = java_utf8_encode(secret_key)
    if len(key) > _SHA1_BLOCK_SIZE_BYTES:
        key = hashlib.sha1(key).digest()
    key = key.ljust(_SHA1_BLOCK_SIZE_BYTES, b"\0")
    inner = hashlib.sha1(bytes(byte ^ 0x36 for byte in key))
    outer = hashlib.sha1(bytes(byte ^ 0x5C for byte in key))
    return inner, outer


def compute_signature(secret_key: str, text: bytes, body: Buffer) -> str:
    """Base64 of HMAC-SHA1(secret, text + body)."""
    inner_pad, outer_pad = _hmac_pads(secret_key)
    inner = inner_pad.copy()
    inner.update(text)
    if len(body):
        inner.update(body)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return base64.b64encode(outer.digest()).decode("ascii")


def server_signature(secret_key: str, ext: Mapping[str, str], body: Buffer) -> str:
    """The signature the server expects for a request with these extFields and body."""
    return compute_signature(secret_key, signed_text(ext, _NOT_SIGNED_BY_SERVER), body)


def sign_request(
    credentials: SessionCredentials, ext: Mapping[str, str] | None, body: Buffer
) -> dict[str, str]:
    """A copy of `ext` with AccessKey, the token and channel if any, and Signature added: what a
    client sends (Java's AclClientRPCHook.doBeforeRequest)."""
    signed = dict(ext or {})
    signed[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        signed[SECURITY_TOKEN] = credentials.security_token
    if credentials.channel is not None:
        signed[ONS_CHANNEL] = credentials.channel
    signed.pop(SIGNATURE, None)
    text = signed_text(signed, _NOT_SIGNED_BY_CLIENT)
    signed[SIGNATURE] = compute_signature(credentials.secret_key, text, body)
    return signed

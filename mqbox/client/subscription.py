"""Subscription expressions: what a consumer asks for, what it tells brokers, what it keeps.

Owns: Java's FilterAPI.buildSubscriptionData (docs/client.md B.11, docs/protocol.md
section 4.3), the SubscriptionData a heartbeat carries in Java's JSON form, and the client-side
exact tag check of PullAPIWrapper.processPullResult (B.7 step 3).

Never: sockets or clocks (the caller passes `sub_version_ms`), and no SQL92: expression type TAG
only.

Rules, as Java 4.9.7 has them:

1. `*` exactly, or the empty string, subscribes to everything: no tags, subString `*`.
   Anything else is split on `||`; each part is trimmed as Java's String.trim() trims (every
   character up to U+0020, no other whitespace), and the non-empty parts are the tags, their
   codes being String.hashCode. So " * " means the tag `*`, and "A ||" the tag A. An expression
   made only of `||` separators raises SubscriptionExpressionError ("subString split error").
2. The client keeps a pulled message only when there are no tags, or its TAGS property is one of
   them, compared exactly; a message without TAGS is dropped when tags are given. The broker
   filtered by hash code first; this check removes its collisions.
3. Tags and codes are sets in Java (HashSet); here they are tuples in first-seen order without
   repeats, so the JSON is the same on every run.

The C++ 1.2.3 client's heartbeat entry differs (docs/protocol.md section 4.3): it sends
`{"subString", "subVersion" (a string), "topic"}`, plus `tagsSet` and `codeSet` only when there
are tags, and its codeSet holds `atoi(tag)` (zeros for non-numeric tags), never the hash; it has
no classFilterMode or expressionType. Brokers must therefore not trust codeSet; mqbox's broker
recomputes it, but a Java broker filters a Java-style consumer by the heartbeat's codeSet, which
is why to_json_value() always sends the real hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from mqbox.errors import MqboxError
from mqbox.message import java_string_hash, java_utf8_decode

SUB_ALL: Final = "*"
EXPRESSION_TYPE_TAG: Final = "TAG"
TAGS_SEPARATOR: Final = "||"

# String.trim() removes every leading and trailing char <= U+0020.
_JAVA_TRIMMED: Final = "".join(chr(code) for code in range(0x21))


class SubscriptionExpressionError(MqboxError):
    """A subscription expression Java's FilterAPI refuses (rule 1)."""


def java_trim(text: str) -> str:
    """Java's String.trim(): strip characters U+0000..U+0020 from both ends, nothing else."""
    return text.strip(_JAVA_TRIMMED)


def parse_tags(expression: str) -> tuple[str, ...]:
    """The tags of `expression` by rule 1; () for `*` and the empty string (everything)."""
    if expression in ("", SUB_ALL):
        return ()
    parts = expression.split(TAGS_SEPARATOR)
    if not any(parts):  # Java's split drops trailing empties: nothing left is an error
        raise SubscriptionExpressionError(f"subscription {expression!r}: subString split error")
    tags: dict[str, None] = {}
    for part in parts:
        tag = java_trim(part)
        if tag:
            tags[tag] = None
    return tuple(tags)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic's subscription: Java's SubscriptionData, built by build_subscription()."""

    topic: str
    sub_string: str  # subString: `*` when everything, else the expression as given
    tags: tuple[str, ...]  # tagsSet; () means every message
    codes: tuple[int, ...]  # codeSet: String.hashCode of each tag, without repeats
    sub_version_ms: int  # subVersion: when it was built (ms since the epoch)
    expression_type: str = EXPRESSION_TYPE_TAG
    class_filter_mode: bool = False  # classFilterMode: never set by mqbox
    _tag_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _tag_set_utf8: frozenset[bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tag_set", frozenset(self.tags))
        object.__setattr__(self, "_tag_set_utf8", frozenset(_utf8_encodable(self.tags)))

    @property
    def filters_tags(self) -> bool:
        """True when pulled messages must pass the tag check (rule 2)."""
        return bool(self.tags) and not self.class_filter_mode

    def accepts(self, tags: str | None) -> bool:
        """Rule 2 for one message whose TAGS property is `tags` (None when it has none)."""
        if not self.filters_tags:
            return True
        return tags is not None and tags in self._tag_set

    def accepts_utf8(self, tags: bytes) -> bool:
        """accepts() for TAGS still as stored bytes (pull_decode's fast path).

        Equal bytes mean equal strings. Bytes that differ from every tag are decoded as Java
        would decode them (replacement characters for malformed UTF-8) and checked as a str,
        so a tag holding U+FFFD matches what Java matches.
        """
        if not self.filters_tags:
            return True
        if tags in self._tag_set_utf8:
            return True
        try:
            tags.decode("utf-8")
        except UnicodeDecodeError:  # rare: malformed stored TAGS
            return java_utf8_decode(tags) in self._tag_set
        return False

    def to_json_value(self) -> dict[str, Any]:
        """The heartbeat's subscriptionDataSet entry, as Java's fastjson writes it (sorted keys)."""
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": list(self.codes),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version_ms,
            "tagsSet": list(self.tags),
            "topic": self.topic,
        }


def _utf8_encodable(tags: tuple[str, ...]) -> list[bytes]:
    """The strict UTF-8 bytes of each tag that has them. A tag holding a lone surrogate has none,
    and can match no stored TAGS: Java's decoder never makes a lone surrogate."""
    encoded: list[bytes] = []
    for tag in tags:
        try:
            encoded.append(tag.encode("utf-8"))
        except UnicodeEncodeError:
            continue
    return encoded


def build_subscription(topic: str, expression: str, sub_version_ms: int) -> Subscription:
    """FilterAPI.buildSubscriptionData(topic, expression) at time `sub_version_ms`.

    Raises SubscriptionExpressionError for an expression made only of `||` (rule 1).
    """
    assert topic
    tags = parse_tags(expression)
    sub_string = SUB_ALL if expression in ("", SUB_ALL) else expression
    codes = tuple(dict.fromkeys(java_string_hash(tag) for tag in tags))
    return Subscription(topic, sub_string, tags, codes, sub_version_ms)

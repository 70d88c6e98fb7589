"""PULL_MESSAGE headers the tests send: one queue, every tag ("*"), the subscription in the
request (the group needs no heartbeat), no commit and no hold worth waiting for.

Owns: `pull_everything_header`. Never: sockets (callers send it their own way).
"""

from __future__ import annotations

from mqbox.protocol.codes import PULL_FLAG_SUBSCRIPTION
from mqbox.protocol.headers import PullMessageRequestHeader


def pull_everything_header(
    topic: str, queue_index: int, *, queue_id: int = 0, group: str = "CG", count_max: int = 32
) -> PullMessageRequestHeader:
    """Pull up to `count_max` messages of `topic`'s queue `queue_id` from `queue_index`."""
    return PullMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        queue_index=queue_index,
        message_count_max=count_max,
        sys_flag=PULL_FLAG_SUBSCRIPTION,
        commit_queue_index=0,
        suspend_timeout_ms=15_000,
        sub_version=0,
        subscription="*",
    )

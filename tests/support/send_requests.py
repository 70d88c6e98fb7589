"""SEND_MESSAGE headers the wire tests send: one place for the fields they all fill the same way."""

from __future__ import annotations

import time

from mqbox.message import encode_properties_str
from mqbox.protocol.headers import SendMessageRequestHeader


def send_to_queue_header(
    topic: str, *, queue_id: int = 0, properties: dict[str, str] | None = None
) -> SendMessageRequestHeader:
    """A producer's send of one message to `topic`'s queue `queue_id`, born now, auto-created
    from TBW102 with one queue if the topic is new."""
    return SendMessageRequestHeader(
        producer_group="PG",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=1,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp_ms=int(time.time() * 1000),
        flag=0,
        properties=encode_properties_str(properties or {}).decode(),
    )

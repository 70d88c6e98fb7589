"""The request codes and bodies beyond codes.RequestCode: mqbox's own codes, Java's
INVOKE_BROKER_TO_RESET_OFFSET (222), and the two offset-reset bodies.

Owns: mqbox's private request codes (10000-10099, docs/protocol.md section 4.5; each one's ext
and body are documented beside its handler in server/roles/processors/admin/ or pull.py), the words
of a reset's `to` field, the number 222 (codes.RequestCode mirrors docs/protocol.md section 3.1
exactly, and 222 is not in it), and the bodies of RESET_CONSUMER_CLIENT_OFFSET (220, broker ->
client) and of 222's answer, which are not JSON in Java's form. Never: which process serves a
code (server/routing.py), or behaviour. The broker, the CLI and the client all name these from
here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from mqbox.message import java_utf8_encode

# A private range far above RocketMQ's codes, whose largest are in the 300s.
MQBOX_CODE_FIRST: Final = 10_000
MQBOX_NOOP: Final = 10_000
# 10001 and 10002 are unused: the CLI's topic status and consumer progress use RocketMQ's 202 and
# 208 (docs/protocol.md section 4.7).
MQBOX_RESET_CONSUMER_OFFSET: Final = 10_003
MQBOX_PULL_STATUS: Final = 10_004
# The broker's identity and replication: role, id, version and the HA state of run/replication.json
# (server/home.HaState); `mqbox cluster list` asks every broker for it.
MQBOX_BROKER_STATUS: Final = 10_010
MQBOX_CODE_LAST: Final = 10_099

# MQBOX_RESET_CONSUMER_OFFSET's `to`
RESET_TO_EARLIEST: Final = "earliest"
RESET_TO_LATEST: Final = "latest"
RESET_TO_TIMESTAMP: Final = "timestamp"

# Java's admin request that resets a group's offsets and tells its live clients (220).
INVOKE_BROKER_TO_RESET_OFFSET: Final = 222
RESET_TIMESTAMP_LATEST: Final = -1  # 220/222 `timestamp` meaning "the max offset" (Java)


# Offset-reset bodies. Java's ResetOffsetBody is fastjson's rendering of a Map<MessageQueue, Long>:
# an object whose keys are objects, which is not JSON,
#
#     {"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:17,...}}
#
# The C++ client cannot parse that (docs/protocol.md section 4.4); it reads Java's
# ResetOffsetBodyForC, a list, which the Java broker sends to C++ clients instead:
#
#     {"offsetTable":[{"brokerName":"broker-a","offset":17,"queueId":0,"topic":"T"},...]}
#
# Keys are in fastjson's order (alphabetical); strings are JSON-escaped.


def encode_reset_offset_body_java(
    broker_name: str, topic: str, offsets: Mapping[int, int]
) -> bytes:
    """ResetOffsetBody as the Java broker writes it: for Java clients (220) and as the answer to
    222. `offsets` maps queue id -> queue index."""
    broker = json.dumps(broker_name, ensure_ascii=False)
    topic_text = json.dumps(topic, ensure_ascii=False)
    entries = ",".join(
        f'{{"brokerName":{broker},"queueId":{queue_id},"topic":{topic_text}}}:{queue_index}'
        for queue_id, queue_index in sorted(offsets.items())
    )
    return java_utf8_encode(f'{{"offsetTable":{{{entries}}}}}')


def encode_reset_offset_body_cpp(broker_name: str, topic: str, offsets: Mapping[int, int]) -> bytes:
    """ResetOffsetBodyForC: the same table as a JSON list, for C++ clients (220)."""
    document = {
        "offsetTable": [
            {"brokerName": broker_name, "offset": queue_index, "queueId": queue_id, "topic": topic}
            for queue_id, queue_index in sorted(offsets.items())
        ]
    }
    return java_utf8_encode(json.dumps(document, ensure_ascii=False, separators=(",", ":")))

"""Operating errors: expected failures that callers handle (docs/style.md section 3).

Owns: the exception classes for disk, configuration and input trouble. Never: programmer errors,
which are `assert`s that stop the process. Wire-level failures map these to RocketMQ response codes
in the processors; the CLI maps them to one clear line and a non-zero exit.
"""

from __future__ import annotations


class MqboxError(Exception):
    """Base class of every operating error mqbox raises on purpose."""


class ConfigError(MqboxError):
    """A configuration file or option is missing, malformed or out of range."""


class MessageIllegalError(MqboxError):
    """A message from outside breaks a format or size rule (RocketMQ's MESSAGE_ILLEGAL, 13)."""


class StoreError(MqboxError):
    """The store cannot do what was asked (a disk problem, a closed store)."""


class DiskFullError(StoreError):
    """Writes are refused because the disk is nearly full (RocketMQ's SERVICE_NOT_AVAILABLE, 14)."""


class AutoCreateLimitError(MqboxError):
    """A topic or a consumer group was not created automatically: its table holds the configured
    maximum (mqboxAutoCreateTopicCountMax, mqboxAutoCreateGroupCountMax). Answered 17
    TOPIC_NOT_EXIST or 26 SUBSCRIPTION_GROUP_NOT_EXIST with the message as the remark."""


class MessageTooLargeError(MessageIllegalError):
    """A record is larger than maxMessageSize."""

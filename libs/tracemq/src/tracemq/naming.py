"""RocketMQ naming rules and the mapping of RocketMQ queues onto Kafka topics.

A RocketMQ queue ``(broker, topic, queue_id)`` is partition ``queue_id`` of the Kafka topic
``<broker>.<escaped topic>`` on the Kafka cluster that broker owns.

RocketMQ names use ``[%|a-zA-Z0-9_-]``; Kafka names use ``[a-zA-Z0-9._-]``. Only ``%`` and ``|``
are illegal in Kafka, and ``.`` never appears in a RocketMQ name, so ``.`` is a free escape
character: ``%`` → ``.p``, ``|`` → ``.i``. Broker names may not contain ``.``, so the first
``.`` of a Kafka name separates the broker from the topic. The mapping is injective and
reversible, and leaves ordinary names readable (``broker-a.TopicTest``).
"""

from __future__ import annotations

import functools
import re

from tracemq.errors import InvalidNameError

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
RETRY_GROUP_PREFIX = "%RETRY%"
DLQ_GROUP_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"

#: Topics only brokers may create; an admin request or a client may not create them.
SYSTEM_TOPICS = frozenset(
    {
        TRACE_TOPIC,
        SCHEDULE_TOPIC,
        HALF_TOPIC,
        OP_HALF_TOPIC,
        "TBW102",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "SELF_TEST_TOPIC",
        "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC",
    }
)
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
KAFKA_TOPIC_MAX_LENGTH = 249
MAX_QUEUES = 1024

_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_BROKER_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ESCAPE = {"%": ".p", "|": ".i"}
_UNESCAPE = {"p": "%", "i": "|"}
#: names :func:`validate_topic` accepted (with system names allowed): a Message is built per
#: send, and its topic is nearly always one seen before. Bounded; cleared when full.
_VALID_TOPICS: set[str] = set()


def validate_topic(topic: object, *, allow_system: bool = True) -> str:
    """Return ``topic`` if it is a valid RocketMQ topic name, else raise :class:`InvalidNameError`.

    ``allow_system=False`` also rejects reserved system names (what an admin or a client may
    not create).
    """
    if type(topic) is str and allow_system and topic in _VALID_TOPICS:
        return topic
    if not isinstance(topic, str):
        raise InvalidNameError(f"topic must be a string, got {type(topic).__name__}: {topic!r}")
    if not topic or not topic.strip():
        raise InvalidNameError("topic is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise InvalidNameError(
            f"topic {topic[:40]!r}... is {len(topic)} characters long; "
            f"the limit is {TOPIC_MAX_LENGTH}"
        )
    if not _NAME_RE.match(topic):
        bad = sorted({c for c in topic if not _NAME_RE.match(c)})
        raise InvalidNameError(
            f"topic {topic!r} contains illegal characters {''.join(bad)!r}; "
            "allowed: letters, digits, '%', '|', '_', '-'"
        )
    if not allow_system and is_system_topic(topic):
        raise InvalidNameError(f"topic {topic!r} is a reserved system topic")
    if type(topic) is str:
        if len(_VALID_TOPICS) >= 4096:
            _VALID_TOPICS.clear()
        _VALID_TOPICS.add(topic)
    return topic


def is_system_topic(topic: str) -> bool:
    """True for names reserved to brokers (trace, schedule, transaction topics and ``rmq_sys_*``)."""
    return topic in SYSTEM_TOPICS or topic.lower().startswith(SYSTEM_TOPIC_PREFIX)


def validate_group(group: object) -> str:
    """Return ``group`` if it is a valid consumer/producer group name."""
    if not isinstance(group, str):
        raise InvalidNameError(f"group must be a string, got {type(group).__name__}: {group!r}")
    if not group:
        raise InvalidNameError("group is empty")
    if len(group) > GROUP_MAX_LENGTH:
        raise InvalidNameError(f"group {group[:40]!r}... is longer than {GROUP_MAX_LENGTH}")
    if not _NAME_RE.match(group):
        raise InvalidNameError(
            f"group {group!r} contains illegal characters; "
            "allowed: letters, digits, '%', '|', '_', '-'"
        )
    return group


def validate_broker_name(name: object) -> str:
    """Return ``name`` if it is a valid broker name (``[a-zA-Z0-9_-]``, 1..64, no dots)."""
    if not isinstance(name, str) or not _BROKER_RE.match(name):
        raise InvalidNameError(
            f"broker name {name!r} is invalid: use 1 to 64 of letters, digits, '_', '-'"
        )
    return name


def validate_queue_count(value: object, what: str = "queue count") -> int:
    """Return a queue count in 1..1024, else raise naming ``what`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidNameError(f"{what} must be an integer, got {value!r}")
    if not 1 <= value <= MAX_QUEUES:
        raise InvalidNameError(f"{what} must be between 1 and {MAX_QUEUES}, got {value}")
    return value


def escape_topic(topic: str) -> str:
    """Escape a RocketMQ topic into the Kafka character set (see module docstring)."""
    return "".join(_ESCAPE.get(c, c) for c in topic)


def unescape_topic(escaped: str) -> str:
    """Invert :func:`escape_topic`; raise :class:`InvalidNameError` on a malformed escape."""
    out: list[str] = []
    it = iter(range(len(escaped)))
    for i in it:
        c = escaped[i]
        if c != ".":
            out.append(c)
            continue
        nxt = escaped[i + 1] if i + 1 < len(escaped) else ""
        if nxt not in _UNESCAPE:
            raise InvalidNameError(f"bad escape in Kafka topic name {escaped!r} at {i}")
        out.append(_UNESCAPE[nxt])
        next(it, None)
    return "".join(out)


@functools.lru_cache(maxsize=65536)
def kafka_topic(broker: str, topic: str) -> str:
    """The Kafka topic holding RocketMQ ``topic`` on ``broker``."""
    name = f"{broker}.{escape_topic(topic)}"
    if len(name) > KAFKA_TOPIC_MAX_LENGTH:
        raise InvalidNameError(
            f"topic {topic!r} on broker {broker!r} maps to a Kafka name of {len(name)} characters; "
            f"Kafka allows {KAFKA_TOPIC_MAX_LENGTH}"
        )
    return name


@functools.lru_cache(maxsize=65536)
def split_kafka_topic(name: str) -> tuple[str, str]:
    """Invert :func:`kafka_topic`: ``(broker, topic)``. Remembered per name, as
    :func:`kafka_topic` is: a consumer splits the topic of every record it is handed, and
    unescaping character by character cost ~1 us each time."""
    broker, sep, rest = name.partition(".")
    if not sep or not broker or not rest:
        raise InvalidNameError(f"Kafka topic {name!r} is not of the form <broker>.<topic>")
    return broker, unescape_topic(rest)


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group (``%RETRY%group``)."""
    return RETRY_GROUP_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group (``%DLQ%group``)."""
    return DLQ_GROUP_PREFIX + group

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tracemq.errors import InvalidNameError
from tracemq.naming import (
    dlq_topic,
    escape_topic,
    kafka_topic,
    retry_topic,
    split_kafka_topic,
    unescape_topic,
    validate_broker_name,
    validate_queue_count,
    validate_topic,
)

rocketmq_names = st.text(alphabet="%|abcXYZ019_-", min_size=1, max_size=127)
kafka_legal = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@given(rocketmq_names)
def test_escape_is_reversible_and_kafka_legal(name: str) -> None:
    escaped = escape_topic(name)
    assert set(escaped) <= kafka_legal
    assert unescape_topic(escaped) == name


@given(rocketmq_names, rocketmq_names)
def test_escape_is_injective(a: str, b: str) -> None:
    if a != b:
        assert escape_topic(a) != escape_topic(b)


def test_retry_and_dlq_topics_map_and_split() -> None:
    for topic in (retry_topic("g1"), dlq_topic("g1"), "A|B", "plain"):
        name = kafka_topic("broker-a", topic)
        assert split_kafka_topic(name) == ("broker-a", topic)
    assert kafka_topic("broker-a", "%RETRY%g1") == "broker-a..pRETRY.pg1"


@pytest.mark.parametrize("bad", ["", " ", "a b", "a/b", "a.b", "ü", "x" * 128])
def test_invalid_topics(bad: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_topic(bad)


def test_topic_type_and_system_names() -> None:
    with pytest.raises(InvalidNameError, match="must be a string"):
        validate_topic(42)
    assert validate_topic("RMQ_SYS_TRACE_TOPIC") == "RMQ_SYS_TRACE_TOPIC"
    with pytest.raises(InvalidNameError, match="reserved"):
        validate_topic("RMQ_SYS_TRACE_TOPIC", allow_system=False)
    with pytest.raises(InvalidNameError, match="reserved"):
        validate_topic("rmq_sys_custom", allow_system=False)


def test_queue_counts_and_broker_names() -> None:
    assert validate_queue_count(1) == 1 and validate_queue_count(1024) == 1024
    for bad in (0, -1, 1025, True, "4", 2.0):
        with pytest.raises(InvalidNameError):
            validate_queue_count(bad)
    assert validate_broker_name("broker-a") == "broker-a"
    for bad in ("", "a.b", "a b", "x" * 65):
        with pytest.raises(InvalidNameError):
            validate_broker_name(bad)


def test_malformed_escapes_and_kafka_names() -> None:
    with pytest.raises(InvalidNameError):
        unescape_topic("a.x")
    with pytest.raises(InvalidNameError):
        split_kafka_topic("nodot")
    with pytest.raises(InvalidNameError, match="Kafka allows 249"):
        kafka_topic("b" * 64, "%" * 100)

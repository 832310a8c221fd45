"""tracemq: message track trace for RocketMQ-style messaging on a Kafka-compatible transport.

The client API::

    from tracemq import Message, Producer, PushConsumer, ConsumeConcurrentlyStatus
    from tracemq import TransactionProducer, LocalTransactionState

Public modules: :mod:`tracemq.trace` (RocketMQ-compatible trace model, codec, dispatcher),
:mod:`tracemq.message_id`, :mod:`tracemq.hooks`, :mod:`tracemq.routing`, :mod:`tracemq.admin`,
:mod:`tracemq.naming`, :mod:`tracemq.errors` (the one exception tree), :mod:`tracemq.settings`,
:mod:`tracemq.collector_client` (the collector's query API), :mod:`tracemq.tasks` (owned
background tasks), :mod:`tracemq.clock`, :mod:`tracemq.cli.plugin` (for command plugins);
:mod:`tracemq.cli` (the ``tracemq`` command, with the ``cli`` extra: typer, rich).

A client install (``pip install tracemq``) needs only aiokafka, redis, msgpack, structlog,
pydantic(-settings), prometheus-client and aiohttp. The embedded stack, ``tracemq dev`` and
``tracemq demo`` live in the separate dev kit (``tracemq-devkit``, :mod:`tracemq_devkit`).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracemq._client import ClientSettings
    from tracemq.consumer import (
        ConsumeConcurrentlyStatus,
        ConsumeContext,
        ConsumeFromWhere,
        ConsumeOrderlyStatus,
        LitePullConsumer,
        MessageModel,
        PushConsumer,
    )
    from tracemq.errors import (
        BatchSendError,
        RecallError,
        RecallHandleError,
        RecallTimeoutError,
        SendError,
        TracemqError,
    )
    from tracemq.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
    from tracemq.producer import (
        LocalTransactionState,
        Producer,
        TransactionListener,
        TransactionProducer,
        TransactionSendResult,
    )
    from tracemq.producer.recall import RecallResult, RecallStatus

#: where each public name lives: imported on first use, so that ``tracemq.cli`` (which
#: imports this package) does not pay a second for the client it may never use
_LAZY = {
    "ClientSettings": "tracemq._client",
    **dict.fromkeys(
        (
            "ConsumeConcurrentlyStatus",
            "ConsumeContext",
            "ConsumeFromWhere",
            "ConsumeOrderlyStatus",
            "LitePullConsumer",
            "MessageModel",
            "PushConsumer",
        ),
        "tracemq.consumer",
    ),
    **dict.fromkeys(
        ("Message", "MessageExt", "MessageQueue", "SendResult", "SendStatus"), "tracemq.message"
    ),
    **dict.fromkeys(
        (
            "LocalTransactionState",
            "Producer",
            "TransactionListener",
            "TransactionProducer",
            "TransactionSendResult",
        ),
        "tracemq.producer",
    ),
    **dict.fromkeys(("RecallResult", "RecallStatus"), "tracemq.producer.recall"),
    **dict.fromkeys(
        (
            "BatchSendError",
            "RecallError",
            "RecallHandleError",
            "RecallTimeoutError",
            "SendError",
            "TracemqError",
        ),
        "tracemq.errors",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracemq' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "BatchSendError",
    "ClientSettings",
    "ConsumeConcurrentlyStatus",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "LitePullConsumer",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "Producer",
    "PushConsumer",
    "RecallError",
    "RecallHandleError",
    "RecallResult",
    "RecallStatus",
    "RecallTimeoutError",
    "SendError",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "TracemqError",
]

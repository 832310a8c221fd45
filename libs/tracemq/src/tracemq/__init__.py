"""tracemq: message track trace for RocketMQ-style messaging on a Kafka-compatible transport.

The client API::

    from tracemq import Message, Producer, PushConsumer, ConsumeConcurrentlyStatus
    from tracemq import TransactionProducer, LocalTransactionState

Public modules: :mod:`tracemq.trace` (RocketMQ-compatible trace model, codec, dispatcher),
:mod:`tracemq.message_id`, :mod:`tracemq.hooks`, :mod:`tracemq.routing`, :mod:`tracemq.admin`,
:mod:`tracemq.naming`, :mod:`tracemq.errors`, :mod:`tracemq.devstack` (the embedded stack).
"""

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
from tracemq.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from tracemq.producer import (
    BatchSendError,
    LocalTransactionState,
    Producer,
    SendError,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

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
    "SendError",
    "SendResult",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

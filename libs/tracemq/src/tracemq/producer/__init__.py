"""Producers: :class:`Producer` and :class:`TransactionProducer`."""

from tracemq.producer.producer import MessageQueueSelector, Producer, SendError
from tracemq.producer.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

__all__ = [
    "LocalTransactionState",
    "MessageQueueSelector",
    "Producer",
    "SendError",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

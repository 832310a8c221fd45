"""Producers: :class:`Producer` and :class:`TransactionProducer`."""

from tracemq.producer.producer import BatchSendError, MessageQueueSelector, Producer, SendError
from tracemq.producer.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)

__all__ = [
    "BatchSendError",
    "LocalTransactionState",
    "MessageQueueSelector",
    "Producer",
    "SendError",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

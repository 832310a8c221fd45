"""Producers: :class:`Producer` (and, with the transaction service, TransactionProducer)."""

from tracemq.producer.producer import MessageQueueSelector, Producer, SendError

__all__ = ["MessageQueueSelector", "Producer", "SendError"]

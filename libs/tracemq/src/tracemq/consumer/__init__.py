"""Consumers: :class:`PushConsumer` and :class:`LitePullConsumer`."""

from tracemq.consumer.listener import (
    ConsumeConcurrentlyStatus,
    ConsumeContext,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    MessageModel,
)
from tracemq.consumer.lite_pull import LitePullConsumer
from tracemq.consumer.push import PushConsumer

__all__ = [
    "ConsumeConcurrentlyStatus",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "LitePullConsumer",
    "MessageModel",
    "PushConsumer",
]

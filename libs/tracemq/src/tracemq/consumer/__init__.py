"""Consumers: :class:`PushConsumer` and :class:`LitePullConsumer`."""

from tracemq.consumer._fetch import FETCH_MAX_WAIT_MS
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
    "FETCH_MAX_WAIT_MS",
    "ConsumeConcurrentlyStatus",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "LitePullConsumer",
    "MessageModel",
    "PushConsumer",
]

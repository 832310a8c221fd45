"""Listener types and consumer options (RocketMQ's names)."""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tracemq.message import MessageExt, MessageQueue


class MessageModel(enum.StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.StrEnum):
    LAST_OFFSET = "LAST_OFFSET"
    FIRST_OFFSET = "FIRST_OFFSET"
    TIMESTAMP = "TIMESTAMP"


class ConsumeConcurrentlyStatus(enum.StrEnum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.StrEnum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


@dataclass(slots=True)
class ConsumeContext:
    """Passed to listeners. ``mark_done(msg)`` records when one message of a batch finished, so
    its SubAfter cost is its own, not the batch's."""

    queue: MessageQueue
    delay_level_when_next_consume: int = 0
    suspend_current_queue_time_ms: int = 1000
    end_times: dict[str, int] = field(default_factory=dict)

    def mark_done(self, msg: MessageExt) -> None:
        self.end_times[msg.msg_id] = int(time.time() * 1000)


ConcurrentlyListener = Callable[[list[MessageExt], ConsumeContext], Awaitable[Any] | Any]
OrderlyListener = ConcurrentlyListener

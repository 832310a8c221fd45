"""Record headers the broker adds when it forwards a message to its real topic and queue.

The schedule service (delay levels, consumer retries) and the transaction service (commits)
forward a stored record to ``<broker>.<REAL_TOPIC>`` partition ``REAL_QID``. The forwarded copy
carries the coordinates of its source, which is how a restarted broker tells whether a forward
it was doing when it died reached the target (exactly-once across restarts, see
``tracemq_broker.forward``):

- ``SCHEDULE_OFFSET`` = ``<level>:<offset in SCHEDULE_TOPIC_XXXX partition level-1>``
- ``TRAN_HALF_OFFSET`` = ``<offset in RMQ_SYS_TRANS_HALF_TOPIC partition 0>``

A consumer that sends a message back for a retry drops them (and the other routing
properties), so a new forward never carries a stale source.
"""

from __future__ import annotations

from tracemq.message import MessageConst

SCHEDULE_OFFSET = "SCHEDULE_OFFSET"
TRAN_HALF_OFFSET = "TRAN_HALF_OFFSET"

#: Properties that describe one trip through the broker; never copied into a new trip.
ROUTING_PROPERTIES = frozenset(
    {
        MessageConst.DELAY,
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QID,
        MessageConst.TRAN_MSG,
        SCHEDULE_OFFSET,
        TRAN_HALF_OFFSET,
    }
)

"""tracemq: message track trace for RocketMQ-style messaging on a Kafka-compatible transport.

Public modules: :mod:`tracemq.trace` (RocketMQ-compatible trace model and codec),
:mod:`tracemq.message_id`, :mod:`tracemq.routing`, :mod:`tracemq.admin`, :mod:`tracemq.naming`,
:mod:`tracemq.errors`, :mod:`tracemq.devstack` (the embedded stack).
"""

__version__ = "0.1.0"

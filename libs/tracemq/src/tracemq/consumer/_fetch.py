"""How the consumers fetch from Kafka: settings shared by PushConsumer and LitePullConsumer."""

from __future__ import annotations

#: Longest wait of an empty fetch (aiokafka's default is 500 ms). Tansu, the embedded broker,
#: holds a fetch for its whole wait even when data arrives, so this bounds how long a new
#: message waits before the consumer sees it. ``bench/latency.py``, side by side: from send to
#: listener p50 129 ms / p99 256 ms with 500 ms, p50 32 ms / p99 58 ms with 100 ms; the price
#: is at most 10 idle fetch requests a second per data cluster (the collector and the broker's
#: schedule service use 100 ms too).
FETCH_MAX_WAIT_MS = 100

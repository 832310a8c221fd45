"""Kafka consumption shared by tracemq's parts: :mod:`tracemq.kafka.fleet`, the route-following
group consumer (one Kafka consumer per data cluster) behind :class:`~tracemq.consumer.PushConsumer`
and the collector's trace ingest. (The shared producers stay in :mod:`tracemq._kafka`.)"""

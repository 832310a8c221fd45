"""tracemq broker: owns topics on its Kafka cluster (role=business) or the trace topic (role=trace)."""

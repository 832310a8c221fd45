"""Wire schemas of tracemq's own Kafka topics (control and admin), msgpack-encoded, versioned."""

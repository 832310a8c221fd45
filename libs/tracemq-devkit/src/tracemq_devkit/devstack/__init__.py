"""The embedded development stack (Tansu ×2, Redis, nameserver, brokers) on loopback."""

from tracemq_devkit.devstack.stack import EmbeddedStack, StackConfig, free_port, run_coro

__all__ = ["EmbeddedStack", "StackConfig", "free_port", "run_coro"]

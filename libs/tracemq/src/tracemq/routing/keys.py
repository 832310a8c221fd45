"""The Redis key schema of the routing database — the one place it is written down.

Only the nameserver writes these keys (the collectors write ``collectors`` and
``offset-resets``); clients, brokers' CLIs and the collector read them.
``P`` is the configured prefix (``TRACEMQ_REDIS_PREFIX``, default ``tmq:``). Times are epoch ms.

=================================  ======  ==========================================================
key                                type    content
=================================  ======  ==========================================================
``P brokers``                      zset    broker name → last heartbeat time (sender clock)
``P broker:<name>``                hash    ``info`` (JSON BrokerInfo without topics), ``last_seen``,
                                           ``last_msg_ts`` (newest control record applied)
``P broker:<name>:topics``         set     topics the broker hosts
``P broker-gone:<name>``           string  time of the broker's graceful unregister (tombstone, TTL)
``P clusters``                     set     cluster names
``P cluster:<cluster>``            set     broker names of the cluster
``P topics``                       set     every topic with at least one route
``P route:<topic>``                hash    broker name → JSON QueueRoute (queues, perm, bootstrap…)
``P clients``                      zset    client id → last heartbeat time
``P client:<client id>``           hash    ``info`` (JSON ClientHeartbeat), ``last_seen``
``P group:<group>:clients``        set     live client ids of the group
``P subs:<group>``                 hash    topic → JSON {expression, message_model, updated}
``P subhistory``                   hash    JSON [group, topic, expression, model] →
                                           JSON {first_seen, last_seen}  (kept after expiry)
``P collectors``                   zset    collector id → last heartbeat (collector issue)
``P collector-signatures``         hash    collector URL → ``<ms>:<HMAC-SHA256 hex>`` proof of its
                                           registration (``tracemq_collector.queries``)
``P offset-resets:<group>``        hash    ``<kafka topic>:<partition>`` → JSON {count, last reset}:
                                           the collectors' offset resets (``trace lag`` shows them)
``P seen:<key id>:<sig hex>``      string  where a signed control record was first read
                                           (``topic/partition/offset``), TTL: its remaining
                                           age — the nameservers' shared replay guard
``P route-changes``                pubsub  JSON {"topics": [...], "brokers": [...]} on any change
=================================  ======  ==========================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: the key prefix when ``TRACEMQ_REDIS_PREFIX`` is not set
DEFAULT_PREFIX = "tmq:"


@dataclass(frozen=True, slots=True)
class RedisKeys:
    """Builds the keys above for one prefix."""

    prefix: str = DEFAULT_PREFIX

    def offset_resets(self, group: str) -> str:
        return f"{self.prefix}offset-resets:{group}"

    @property
    def brokers(self) -> str:
        return f"{self.prefix}brokers"

    def broker(self, name: str) -> str:
        return f"{self.prefix}broker:{name}"

    def broker_topics(self, name: str) -> str:
        return f"{self.prefix}broker:{name}:topics"

    def broker_gone(self, name: str) -> str:
        return f"{self.prefix}broker-gone:{name}"

    @property
    def clusters(self) -> str:
        return f"{self.prefix}clusters"

    def cluster(self, name: str) -> str:
        return f"{self.prefix}cluster:{name}"

    @property
    def topics(self) -> str:
        return f"{self.prefix}topics"

    def route(self, topic: str) -> str:
        return f"{self.prefix}route:{topic}"

    @property
    def clients(self) -> str:
        return f"{self.prefix}clients"

    def client(self, client_id: str) -> str:
        return f"{self.prefix}client:{client_id}"

    def group_clients(self, group: str) -> str:
        return f"{self.prefix}group:{group}:clients"

    def subs(self, group: str) -> str:
        return f"{self.prefix}subs:{group}"

    @property
    def subhistory(self) -> str:
        return f"{self.prefix}subhistory"

    @property
    def collectors(self) -> str:
        return f"{self.prefix}collectors"

    @property
    def collector_signatures(self) -> str:
        return f"{self.prefix}collector-signatures"

    @property
    def route_changes(self) -> str:
        return f"{self.prefix}route-changes"

    @staticmethod
    def subhistory_field(group: str, topic: str, expression: str, model: str) -> str:
        return json.dumps([group, topic, expression, model], separators=(",", ":"))

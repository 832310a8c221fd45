"""Redis (the routing database) down for 60 s.

Running clients serve their cached routes: sends and consumption go on. A client that starts
meanwhile has nothing cached, and its error names Redis (not "no live broker hosts it", which
sent operators to the brokers). Once Redis is back, new clients work and nothing sent during the
outage is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from tracemq import ConsumeConcurrentlyStatus, Message, Producer, PushConsumer
from tracemq.admin import AdminClient
from tracemq.errors import NoRouteError, RoutingUnavailableError
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.waiting import eventually

OUTAGE_S = 60.0


@pytest.mark.timeout(240)
async def test_redis_down_cached_routes_serve_new_clients_name_redis(
    fault_stack: EmbeddedStack, unique: str
) -> None:
    s = fault_stack
    topic = f"RedisDown_{unique}"
    env = {"redis_url": s.redis_url, "control_bootstrap": s.business_bootstrap}
    async with AdminClient(s.business_bootstrap, s.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    r = connect(s.redis_url)
    try:
        reader = RegistryReader(r)

        async def routed() -> bool:
            return bool((await reader.topic_route(topic)).queues)

        await eventually(routed, what="route")
    finally:
        await r.aclose()

    seen: Counter[str] = Counter()

    async def listener(msgs: list, _ctx: object) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            seen[m.body.decode()] += 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(f"CG_{unique}", **env)
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    producer = Producer(f"PG_{unique}", **env)
    await consumer.start()
    await producer.start()
    sent: list[str] = []
    try:
        assert await consumer.wait_assigned(30)
        for i in range(5):
            body = f"before-{i}"
            await producer.send(Message(topic, body.encode()))
            sent.append(body)

        s.stop_redis()
        outage_end = time.monotonic() + OUTAGE_S
        try:
            # A new producer has no cached route: its send fails naming Redis.
            newcomer = Producer(f"PG2_{unique}", **env)
            await newcomer.start()
            try:
                with pytest.raises(RoutingUnavailableError, match="Redis") as err:
                    await newcomer.send(Message(topic, b"newcomer"))
                assert isinstance(err.value, NoRouteError)  # still a (retriable) route error
                assert "no live broker" not in str(err.value)
            finally:
                await newcomer.shutdown()
            # A new consumer cannot learn its queues either: the error names Redis too.
            late = PushConsumer(f"CG2_{unique}", **env)
            late.subscribe(topic)
            late.register_message_listener(listener)
            with pytest.raises(RoutingUnavailableError, match="Redis"):
                await late.start()
            await late.shutdown()

            # The running clients keep going on their cached routes for the whole outage.
            i = 0
            while time.monotonic() < outage_end:
                body = f"during-{i}"
                await producer.send(Message(topic, body.encode()))
                sent.append(body)
                i += 1
                await asyncio.sleep(0.5)  # pacing of the load, not synchronisation
        finally:
            s.restart_redis()

        # Redis is back: a new client works again (the brokers re-register on their heartbeat
        # if the nameserver expired them while it could not hear them).
        async def newcomer_sends() -> bool:
            p2 = Producer(f"PG3_{unique}", **env)
            await p2.start()
            try:
                await p2.send(Message(topic, b"after-newcomer"))
                return True
            finally:
                await p2.shutdown()

        await eventually(newcomer_sends, timeout=30, interval=1.0, what="new client after Redis")
        sent.append("after-newcomer")
        for i in range(5):
            body = f"after-{i}"
            await producer.send(Message(topic, body.encode()))
            sent.append(body)

        async def all_consumed() -> bool:
            return all(seen[b] >= 1 for b in sent)

        await eventually(all_consumed, timeout=30, what="every message consumed")
        assert len(sent) > 60, len(sent)
        assert not [b for b in sent if seen[b] > 1], "duplicate consumption"
    finally:
        await producer.shutdown()
        await consumer.shutdown()

"""Consumer groups in known states for the group-health tests (issue 15, points 13 and 14), and
the one place the group-health tests reach the collector API (with the session's token) or
point the CLI at it.

:func:`flaky_and_stopped` leaves, on a fast broker's topic:

* a **stopped** group: it consumed the first messages, then stopped; later messages wait, so
  its lag in time grows;
* a **flaky** group: it fails every message whose body starts with ``bad`` (RECONSUME_LATER,
  then the dead-letter queue after ``max_reconsume_times=1``), consumes the others, and is still
  running.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tracemq import (
    ClientSettings,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import eventually

from tests.support.collector_api import headers


def collector_base(collector: ManagedProcess) -> str:
    return f"http://127.0.0.1:{collector.env['TRACEMQ_HTTP_PORT']}"


def collector_get(collector: ManagedProcess, path: str, **params: Any) -> tuple[int, Any]:
    """GET ``path`` of the collector API: (status, JSON body or None)."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    req = urllib.request.Request(  # noqa: S310 - a local test URL
        collector_base(collector) + path + (f"?{query}" if query else ""),
        headers=headers(),  # the session's collector token
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, None


def cli_env(stack: EmbeddedStack, collector: ManagedProcess) -> dict[str, str]:
    """The environment a `tracemq` command needs to reach ``stack`` and its collector."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    env.update(stack.client_env())
    env["TRACEMQ_DEV_HOME"] = str(stack.workdir / "no-dev-home")
    env["TRACEMQ_COLLECTOR_URL"] = collector_base(collector)
    return env


@dataclass
class Scenario:
    topic: str
    stopped: str
    flaky: str
    flaky_consumer: PushConsumer
    #: body → msgId
    ids: dict[bytes, str] = field(default_factory=dict)
    #: (group, body) → attempts
    attempts: Counter[tuple[str, bytes]] = field(default_factory=Counter)
    late: list[bytes] = field(default_factory=list)
    #: epoch ms between the first messages and the late ones (a time-range boundary)
    late_from_ms: int = 0


FIRST = [b"ok-1", b"ok-2", b"bad-1", b"bad-2"]
LATE = [b"late-1", b"late-2", b"late-3"]


async def flaky_and_stopped(stack: EmbeddedStack, broker: str, unique: str) -> Scenario:
    """Set the scenario up (see the module docstring); the caller shuts the flaky consumer
    down (``await scenario.flaky_consumer.shutdown()``)."""
    topic = f"Health_{unique}"
    env = {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as admin:
        await admin.create_topic(broker, topic, read_queues=2, write_queues=2)
    sc = Scenario(topic, f"stopped_{unique}", f"flaky_{unique}", flaky_consumer=None)  # type: ignore[arg-type]

    def listener_of(group: str) -> Any:
        async def listener(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
            body = msgs[0].body
            sc.attempts[(group, body)] += 1
            if group == sc.flaky and body.startswith(b"bad"):
                return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return listener

    consumers = {}
    for group in (sc.stopped, sc.flaky):
        c = PushConsumer(
            group,
            consume_from=ConsumeFromWhere.FIRST_OFFSET,
            max_reconsume_times=1,
            enable_msg_trace=True,
            # the test stack expires clients after 8 s: the running group stays live
            settings=ClientSettings.from_overrides(**env).model_copy(
                update={"client_heartbeat_interval_ms": 1000}
            ),
        )
        c.subscribe(topic)
        c.register_message_listener(listener_of(group))
        await c.start()
        consumers[group] = c
    sc.flaky_consumer = consumers[sc.flaky]
    try:
        async with Producer(f"PG_{unique}", enable_msg_trace=True, **env) as p:
            for body in FIRST:
                sent = await p.send(Message(topic, body, tags="T", keys=[f"k-{unique}"]))
                sc.ids[body] = sent.msg_id

            def first_done() -> bool:
                return all(sc.attempts[(sc.stopped, b)] >= 1 for b in FIRST) and all(
                    sc.attempts[(sc.flaky, b)] >= (2 if b.startswith(b"bad") else 1) for b in FIRST
                )

            await eventually(_async(first_done), timeout=40, what="both groups consumed")
            await consumers[sc.stopped].shutdown()
            sc.late_from_ms = int(time.time() * 1000)
            for body in LATE:
                sent = await p.send(Message(topic, body, tags="T", keys=[f"k-{unique}"]))
                sc.ids[body] = sent.msg_id
            sc.late = list(LATE)
            await eventually(
                _async(lambda: all(sc.attempts[(sc.flaky, b)] >= 1 for b in LATE)),
                timeout=30,
                what="the flaky group consumed the late messages",
            )
            await p.trace_dispatcher.flush(10)
        await sc.flaky_consumer.trace_dispatcher.flush(10)  # type: ignore[union-attr]
    except BaseException:
        await asyncio.gather(*(c.shutdown() for c in consumers.values()), return_exceptions=True)
        raise
    return sc


def _async(fn: Any) -> Any:
    async def probe() -> Any:
        return fn()

    return probe

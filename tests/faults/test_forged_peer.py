"""A forged peer in the collectors' registry (finding 6 of issue 20).

Anyone who can write Redis can add a URL to ``P collectors``. A collector with a token fans out
only to registrations signed with that token: a forged one (unsigned or wrongly signed) gets
no request at all, so never the token, and its items never appear; the answer names it in
``peers_failed`` and ``tracemq_collector_peer_failures_total`` counts it. A proven peer whose
answer is malformed or slow costs its part of the answer, never a 500 or a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from tracemq.message_id import new_msg_id
from tracemq.naming import TRACE_TOPIC, kafka_topic
from tracemq.routing.keys import RedisKeys
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.waiting import eventually

from tests.support import rocketmq_format as rf

FANOUT_TIMEOUT_MS = 1000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"


class FakePeer:
    """An HTTP server in the test that records every request it gets."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakePeer:
        async def any_path(req: web.Request) -> web.StreamResponse:
            self.requests.append((req.path_qs, dict(req.headers)))
            return await self.handler(req)

        app = web.Application()
        app.router.add_get("/{tail:.*}", any_path)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def peers() -> AsyncIterator[Callable[[Handler], Awaitable[FakePeer]]]:
    started: list[FakePeer] = []

    async def start(handler: Handler) -> FakePeer:
        started.append(await FakePeer(handler).start())
        return started[-1]

    yield start
    for p in started:
        await p.stop()


def forged_answer(msg_id: str) -> Handler:
    """What a forger would answer: its own listing item and a trace event of ``msg_id``."""

    async def answer(req: web.Request) -> web.Response:
        if req.path.startswith("/api/v1/traces/"):
            event = {"trace_type": "Pub", "msg_id": msg_id, "timestamp": 1, "topic": "FORGED"}
            return web.json_response({"events": [event]})
        item = {"msg_id": "FORGED0001", "topic": req.query.get("topic"), "timestamp": 2**62}
        return web.json_response({"items": [item], "next_cursor": None})

    return answer


async def get(url: str, token: str | None, **params: str) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as s:
        async with s.get(url, params=params, headers=headers) as resp:
            text = await resp.text()
    try:
        return resp.status, json.loads(text)
    except ValueError:  # the old collector's 500 page
        return resp.status, text


async def failures(base: str, token: str, reason: str) -> float:
    """``tracemq_collector_peer_failures_total{reason}`` of the collector at ``base``."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as s:
        async with s.get(f"{base}/metrics", headers=headers) as resp:
            text = await resp.text()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if (
                sample.name == "tracemq_collector_peer_failures_total"
                and sample.labels.get("reason") == reason
            ):
                return sample.value
    return 0.0


@pytest.mark.timeout(240)
async def test_forged_peers_get_nothing_and_broken_or_slow_peers_cost_only_their_part(
    fault_stack: EmbeddedStack,
    peers: Callable[[Handler], Awaitable[FakePeer]],
    unique: str,
) -> None:
    stack = fault_stack
    token = f"s3cret-{unique}"
    # Only collectors with this token here: the stack's own has another (its registration
    # would be unproven).
    stack.processes["collector"].stop()
    env = {
        "TRACEMQ_COLLECTOR_API_TOKEN": token,
        "TRACEMQ_COLLECTOR_FANOUT_TIMEOUT_MS": str(FANOUT_TIMEOUT_MS),
    }
    c2 = stack.start_collector("collector-2", **env)
    c3 = stack.start_collector("collector-3", **env)
    mid = new_msg_id()
    producer = AIOKafkaProducer(bootstrap_servers=stack.trace_bootstrap)
    await producer.start()
    try:
        now = int(time.time() * 1000)
        await producer.send_and_wait(
            kafka_topic("trace-broker", TRACE_TOPIC), rf.pub(now, "PG", "Orders", mid).encode()
        )
    finally:
        await producer.stop()

    async def both_see_it() -> bool:
        for c in (c2, c3):
            status, view = await get(f"{api(c)}/api/v1/traces/{mid}", token)
            if status != 200 or view["producer"] is None:
                return False
        return True

    await eventually(both_see_it, timeout=90, what="the trace via either collector (fan-out)")

    async def registry_read(c: ManagedProcess, *urls: str) -> None:
        """Wait until ``c``'s look-ups use a registry read with ``urls`` in it (a collector
        reads it at most once per ``PEERS_CACHE_S``): each is then named in the answers."""

        async def named() -> bool:
            _, listing = await get(f"{api(c)}/api/v1/messages", token, topic="Orders")
            return set(urls) <= {f["peer"] for f in listing["peers_failed"]}

        await eventually(named, timeout=30, what=f"the registry read by {c.name} with {urls}")

    local = [(await get(f"{api(c)}/api/v1/traces/{mid}", token, local="1"))[0] for c in (c2, c3)]
    assert sorted(local) == [200, 404]  # one stores it: the other answered by asking its peer

    keys = RedisKeys("tmq:")
    signatures = "tmq:collector-signatures"  # keys.collector_signatures, as documented
    redis = aioredis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        unsigned = await peers(forged_answer(mid))
        wrong = await peers(forged_answer(mid))
        replayed = await peers(forged_answer(mid))

        at = int(time.time() * 1000)
        await redis.zadd(keys.collectors, {unsigned.url: at, wrong.url: at})
        await redis.hset(signatures, wrong.url, f"{at}:{'0' * 64}")
        await registry_read(c2, unsigned.url, wrong.url)
        status, listing = await get(f"{api(c2)}/api/v1/messages", token, topic="Orders")
        status_v, view = await get(f"{api(c2)}/api/v1/traces/{mid}", token)
        for forger in (unsigned, wrong):
            # not asked at all, so the token never left (the old collector sent it to both)
            assert [(path, h.get("Authorization")) for path, h in forger.requests] == []
        assert status == 200, listing
        assert [i["msg_id"] for i in listing["items"]] == [mid]
        reasons = {f["peer"]: f["reason"] for f in listing["peers_failed"]}
        assert reasons == {unsigned.url: "unsigned", wrong.url: "bad_signature"}
        assert status_v == 200 and view["topic"] == "Orders"
        assert all(e["topic"] != "FORGED" for e in view["events"])

        # A real collector's proof copied to another URL proves nothing.
        real = await redis.hget(signatures, api(c3))
        assert real is not None
        await redis.zadd(keys.collectors, {replayed.url: int(time.time() * 1000)})
        await redis.hset(signatures, replayed.url, real)
        await registry_read(c2, replayed.url)
        status, listing = await get(f"{api(c2)}/api/v1/messages", token, topic="Orders")
        assert status == 200 and [i["msg_id"] for i in listing["items"]] == [mid]
        assert {f["peer"]: f["reason"] for f in listing["peers_failed"]}[replayed.url] == (
            "bad_signature"
        )
        assert replayed.requests == []
        assert await failures(api(c2), token, "unsigned") >= 2

        # A proven peer (it has the secret) that answers garbage, and one that never answers.
        async def malformed(req: web.Request) -> web.Response:
            if req.path.startswith("/api/v1/traces/"):
                return web.json_response({"events": [{"trace_type": "Pub", "msg_id": mid}]})
            return web.json_response({"items": "not a list"})

        release = asyncio.Event()

        async def slow(_req: web.Request) -> web.Response:
            await release.wait()
            return web.json_response({"items": [], "next_cursor": None})

        from tracemq_collector.queries import sign_registration

        broken = await peers(malformed)
        stuck = await peers(slow)
        at = int(time.time() * 1000)
        await redis.zadd(keys.collectors, {broken.url: at, stuck.url: at})
        for p in (broken, stuck):
            await redis.hset(signatures, p.url, sign_registration(token, p.url, at))
        try:
            for c in (c2, c3):
                await registry_read(c, broken.url, stuck.url)
            for c in (c2, c3):
                t0 = time.monotonic()
                status, view = await get(f"{api(c)}/api/v1/traces/{mid}", token)
                took = time.monotonic() - t0
                assert status == 200, view  # the old collector answered 500 (KeyError)
                assert view["producer"]["group"] == "PG"
                reasons = {f["peer"]: f["reason"] for f in view["peers_failed"]}
                assert reasons[broken.url] == "invalid_items"
                assert reasons[stuck.url] == "timeout"
                assert took < FANOUT_TIMEOUT_MS / 1000 + 3
                status, listing = await get(f"{api(c)}/api/v1/messages", token, topic="Orders")
                assert status == 200 and [i["msg_id"] for i in listing["items"]] == [mid]
                reasons = {f["peer"]: f["reason"] for f in listing["peers_failed"]}
                assert (reasons[broken.url], reasons[stuck.url]) == ("malformed", "timeout")
        finally:
            release.set()
        # the proven peers were asked with the token; the real ones still answer each other
        assert broken.requests and broken.requests[0][1]["Authorization"] == f"Bearer {token}"
        for reason in ("malformed", "invalid_items", "timeout", "bad_signature"):
            assert await failures(api(c2), token, reason) >= 1, reason
    finally:
        await redis.aclose()

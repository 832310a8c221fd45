"""The collector API's parameter parser, registration proof and peer-answer validation: the
real aiohttp app over a real SQLite store in tmp_path; peers are aiohttp servers in the test
(the list of peers is the only stand-in: :class:`Peers` skips Redis)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import REGISTRY
from tracemq.message_id import encode_offset_msg_id
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType
from tracemq_collector.api import add_routes
from tracemq_collector.queries import (
    PEER_TTL_MS,
    Queries,
    check_registration,
    sign_registration,
)
from tracemq_collector.store import TraceStore
from yarl import URL

from tests.unit.test_collector_store import T0, Feed, consume_ctxs, msg_id, pub_ctx

SELF = "http://self.invalid"


def failures(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("tracemq_collector_peer_failures_total", {"reason": reason})
        or 0.0
    )


class Peers(Queries):
    """Queries whose peers are given, not read from Redis."""

    peer_urls: list[str] = []

    async def peers(self) -> tuple[list[str], list[dict[str, str]]]:
        return list(self.peer_urls), []


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[TraceStore]:
    with TraceStore(tmp_path / "traces.db") as s:
        rows, quarantine, progress = Feed().batch([pub_ctx(1, T0)], consume_ctxs(1, T0 + 5))
        s.write_batch(rows, quarantine, progress)
        yield s


@pytest.fixture
async def make_client(
    store: TraceStore,
) -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[TestClient[Any, Any], Queries]] = []

    async def make(peers: list[str] = [], token: str | None = None) -> TestClient[Any, Any]:  # noqa: B006
        q = Peers(store, redis=None, prefix="t:", self_url=SELF, token=token, fanout_timeout_s=0.5)
        q.peer_urls = peers
        app = web.Application()
        add_routes(app, q, token)
        client = TestClient(TestServer(app))
        await client.start_server()
        opened.append((client, q))
        return client

    yield make
    for client, q in opened:
        await client.close()
        await q.close()


BAD_PARAMETERS = [
    ("/api/v1/messages?topic=T&begin=9223372036854775808", "begin"),
    ("/api/v1/messages?topic=T&begin=99999999999999999999", "begin"),
    ("/api/v1/messages?topic=T&end=" + "9" * 5000, "end"),
    ("/api/v1/messages?topic=T&begin=-1", "begin"),
    ("/api/v1/messages?topic=T&begin=%D9%A1%D9%A2", "begin"),  # Arabic-Indic digits
    ("/api/v1/messages?topic=T&begin=0001-01-01T00:00:00%2B14:00", "begin"),
    ("/api/v1/messages?topic=T&limit=%EF%BC%95", "limit"),  # fullwidth 5
    ("/api/v1/messages?topic=T&limit=1_0", "limit"),
    ("/api/v1/messages?topic=T&limit=%2010", "limit"),
    ("/api/v1/messages?topic=T&limit=" + "1" * 5000, "limit"),
    ("/api/v1/quarantine?limit=-5", "limit"),
    ("/api/v1/quarantine?limit=99999999999999999999", "limit"),
    ("/api/v1/traces/ABC%0A", "msg_id"),
    ("/api/v1/traces/%FF%FE", "msg_id"),
    ("/api/v1/traces/" + "A" * 129, "msg_id"),
    ("/api/v1/traces/ABC", "msg_id"),  # not hex, or not 32/56 characters: 400, not 404
    ("/api/v1/traces/ZZ000001006400000000000000000001", "msg_id"),
    ("/api/v1/traces/" + "A" * 33, "msg_id"),
    ("/api/v1/traces/0A00000100640000000A000000000001?local=yes", "local"),
    ("/api/v1/traces?key=a%00b", "key"),
    ("/api/v1/traces?key=%FF", "key"),
    ("/api/v1/traces?key=" + "k" * 257, "key"),
    ("/api/v1/traces?key=k&topic=%C2%85", "topic"),
    ("/api/v1/messages?topic=T&cursor=garbage!", "cursor"),
    ("/api/v1/messages?topic=T&cursor=mZm9v", "cursor"),  # "foo": not JSON
    ("/api/v1/messages?topic=T&cursor=m" + base64.urlsafe_b64encode(b"[1]").decode(), "cursor"),
    ("/api/v1/messages?topic=T&cursor=" + "A" * 7000, "cursor"),
    ("/api/v1/messages?topic=T&local=1&cursor=AAAA", "cursor"),
]


@pytest.mark.parametrize(("path", "parameter"), BAD_PARAMETERS)
async def test_a_bad_parameter_is_a_400_naming_it(
    make_client: Callable[..., Any], path: str, parameter: str
) -> None:
    client = await make_client()
    resp = await client.get(URL(path, encoded=True))
    body = await resp.json()
    assert (resp.status, body.get("parameter")) == (400, parameter), body
    assert len(body["error"]) < 300  # a 5 000-digit value is not echoed back


async def test_a_cursor_of_the_other_listing_or_naming_an_unknown_collector(
    make_client: Callable[..., Any],
) -> None:
    client = await make_client()
    key_cursor = base64.urlsafe_b64encode(struct.pack(">cqq", b"k", T0, 1)).decode()
    assert (
        await client.get("/api/v1/traces", params={"key": "k", "cursor": key_cursor, "local": "1"})
    ).status == 200
    # A cursor of key look-ups is not one of topic listings, alone or inside a fan-out cursor.
    for cursor in (
        key_cursor,
        "m" + base64.urlsafe_b64encode(json.dumps({SELF: key_cursor}).encode()).decode(),
    ):
        resp = await client.get(
            "/api/v1/messages",
            params={
                "topic": "orders",
                "cursor": cursor,
                "local": "1" if cursor == key_cursor else "0",
            },
        )
        assert (resp.status, (await resp.json())["parameter"]) == (400, "cursor")
    forged = (
        "m" + base64.urlsafe_b64encode(json.dumps({"http://evil.invalid": "x"}).encode()).decode()
    )
    resp = await client.get("/api/v1/messages", params={"topic": "orders", "cursor": forged})
    body = await resp.json()
    # The cursor is the client's: a collector it names that is not a proven peer is not asked.
    assert resp.status == 200 and body["items"] == []
    assert [f["reason"] for f in body["peers_failed"]] == ["unregistered"]


async def test_good_parameters_still_answer(make_client: Callable[..., Any]) -> None:
    client = await make_client()
    for path in (
        f"/api/v1/traces/{msg_id(1)}",
        "/api/v1/messages?topic=orders&begin=0&end=253402300799999&limit=1000&local=0",
        "/api/v1/messages?topic=orders&begin=2023-12-31T00:00:00Z&end=2024-01-02T00:00:00%2B01:00",
        "/api/v1/traces?key=shared&topic=orders&local=1",
        "/api/v1/quarantine?limit=1000",
    ):
        resp = await client.get(URL(path, encoded=True))
        assert resp.status == 200, (path, await resp.text())
    resp = await client.get(URL("/api/v1/messages?topic=orders", encoded=True))
    assert [i["msg_id"] for i in (await resp.json())["items"]] == [msg_id(1)]


def test_a_registration_is_proven_only_by_a_fresh_signature_with_the_shared_token() -> None:
    url, now = "http://10.0.0.7:8080", 1_800_000_000_000
    good = sign_registration("s3cret", url, now)
    assert check_registration("s3cret", url, good, now) is None
    assert check_registration("s3cret", url, good, now + PEER_TTL_MS) is None
    assert check_registration("s3cret", url, None, now) == "unsigned"
    assert check_registration("s3cret", url, "", now) == "unsigned"
    assert check_registration("other", url, good, now) == "bad_signature"
    assert check_registration("s3cret", url + "1", good, now) == "bad_signature"
    at, _, sig = good.partition(":")
    assert check_registration("s3cret", url, f"{int(at) + 1}:{sig}", now) == "bad_signature"
    for junk in ("x", ":", "1:", "\u0661:ab", "9" * 40 + ":ab", "\udcff"):
        assert check_registration("s3cret", url, junk, now) == "bad_signature"
    assert check_registration("s3cret", url, good, now + PEER_TTL_MS + 1) == "stale"
    assert check_registration("s3cret", url, good, now - 10 * PEER_TTL_MS) == "stale"


def _event(mid: str, **over: Any) -> dict[str, Any]:
    from tracemq.lake import COLUMNS

    row: dict[str, Any] = {}
    for name, typ, nullable, _ in COLUMNS:
        kind = str(typ)
        row[name] = None if nullable else (False if kind == "bool" else 0 if "int" in kind else "x")
    row.update(trace_type="Pub", msg_id=mid, timestamp=T0 + 1, topic="orders", success=True)
    row.update(trace_topic="peer-topic", trace_offset=7, group_name="peer-pg")
    row.update(over)
    return row


@pytest.fixture
async def fake_peer() -> AsyncIterator[Callable[..., Any]]:
    servers: list[TestServer] = []

    async def start(handler: Callable[[web.Request], Any]) -> tuple[str, list[web.Request]]:
        seen: list[web.Request] = []

        async def any_path(req: web.Request) -> web.StreamResponse:
            seen.append(req)
            return await handler(req)  # type: ignore[no-any-return]

        app = web.Application()
        app.router.add_get("/{tail:.*}", any_path)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/"), seen

    yield start
    for s in servers:
        await s.close()


async def test_peer_answers_are_validated_and_a_bad_or_slow_peer_is_reported_not_a_500(
    make_client: Callable[..., Any], fake_peer: Callable[..., Any]
) -> None:
    mid = msg_id(1)
    release = asyncio.Event()

    async def broken(req: web.Request) -> web.Response:
        if req.path.startswith("/api/v1/traces/"):
            bad = _event(mid)
            del bad["region_id"]  # the KeyError that made every trace look-up a 500
            return web.json_response({"events": [bad, _event(mid, trace_offset=8)]})
        items = [
            {"msg_id": "PEERGOOD", "timestamp": T0 + 10, "topic": "orders"},
            {"msg_id": "bad id\n", "timestamp": T0 + 11},
            {"msg_id": "PEERNOTS", "timestamp": "yesterday"},
            "not an object",
        ]
        return web.json_response({"items": items, "next_cursor": None})

    async def garbage(_req: web.Request) -> web.Response:
        return web.Response(text="[" * 100_000, content_type="application/json")

    async def slow(_req: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"events": []})

    broken_url, _ = await fake_peer(broken)
    garbage_url, _ = await fake_peer(garbage)
    slow_url, _ = await fake_peer(slow)
    client = await make_client([broken_url, garbage_url, slow_url])
    before = {r: failures(r) for r in ("invalid_items", "malformed", "timeout")}

    resp = await client.get(f"/api/v1/traces/{mid}")
    view = await resp.json()
    release.set()
    assert resp.status == 200, view
    reasons = {f["peer"]: f["reason"] for f in view["peers_failed"]}
    assert reasons == {broken_url: "invalid_items", garbage_url: "malformed", slow_url: "timeout"}
    offsets = {(e["trace_topic"], e["trace_offset"]) for e in view["events"]}
    assert ("peer-topic", 8) in offsets and ("peer-topic", 7) not in offsets
    for r in before:
        assert failures(r) > before[r]

    resp = await client.get("/api/v1/messages", params={"topic": "orders"})
    body = await resp.json()
    assert resp.status == 200, body
    assert [i["msg_id"] for i in body["items"]] == ["PEERGOOD", mid]
    assert {f["peer"]: f["reason"] for f in body["peers_failed"]}[broken_url] == "invalid_items"


async def test_without_a_token_peers_get_no_credentials_and_with_one_no_redirect(
    make_client: Callable[..., Any], fake_peer: Callable[..., Any]
) -> None:
    async def echo(req: web.Request) -> web.Response:
        return web.json_response({"items": [], "next_cursor": None})

    url, seen = await fake_peer(echo)
    client = await make_client([url])
    assert (await client.get("/api/v1/traces", params={"key": "k"})).status == 200
    assert seen and "Authorization" not in seen[0].headers

    async def redirect(req: web.Request) -> web.Response:
        raise web.HTTPFound(str(req.url.with_path("/elsewhere")))

    url2, seen2 = await fake_peer(redirect)
    client = await make_client([url2], token="s3cret")
    resp = await client.get(
        "/api/v1/traces", params={"key": "k"}, headers={"Authorization": "Bearer s3cret"}
    )
    body = await resp.json()
    assert resp.status == 200 and body["peers_failed"][0]["reason"] == "status"
    assert [r.path for r in seen2] == ["/api/v1/traces"]  # the redirect was not followed


class FakeRegistry:
    """The two Redis calls :meth:`Queries.peers` makes, over dicts."""

    def __init__(self, beats: dict[str, float], sigs: dict[str, str]) -> None:
        self.beats, self.sigs = beats, sigs

    async def zrevrangebyscore(
        self, _key: str, hi: float, lo: float, start: int, num: int
    ) -> list[str]:
        live = [u for u, at in self.beats.items() if lo <= at <= hi]
        return sorted(live, key=lambda u: -self.beats[u])[start : start + num]

    async def hmget(self, _key: str, urls: list[str]) -> list[str | None]:
        return [self.sigs.get(u) for u in urls]


async def test_peers_are_only_fresh_proven_registrations_and_at_most_max_peers(
    store: TraceStore,
) -> None:
    import time

    from tracemq_collector.queries import MAX_PEERS

    now = int(time.time() * 1000)
    good = [f"http://10.0.0.{i}:8080" for i in range(MAX_PEERS + 3)]
    beats: dict[str, float] = {u: now - i for i, u in enumerate(good)}
    sigs = {u: sign_registration("s3cret", u, now - i) for i, u in enumerate(good)}
    beats |= {
        SELF: now,
        "http://forged:1": float("inf"),  # a score ahead of every clock does not lead
        "http://unsigned:1": now,
        "http://wrong:1": now,
        "http://old:1": now,
        "not a url": now,
    }
    sigs |= {
        "http://wrong:1": sign_registration("other", "http://wrong:1", now),
        "http://old:1": sign_registration("s3cret", "http://old:1", now - PEER_TTL_MS - 1),
        "not a url": sign_registration("s3cret", "not a url", now),
    }
    q = Queries(
        store,
        redis=FakeRegistry(beats, sigs),  # type: ignore[arg-type]
        prefix="t:",
        self_url=SELF,
        token="s3cret",
        fanout_timeout_s=1,
    )
    try:
        trusted, skipped = await q.peers()
        assert trusted == good[:MAX_PEERS]
        assert {s["peer"]: s["reason"] for s in skipped} == {
            "http://unsigned:1": "unsigned",
            "http://wrong:1": "bad_signature",
            "http://old:1": "stale",
            "not a url": "bad_url",
            **{u: "too_many_peers" for u in good[MAX_PEERS:]},
        }
    finally:
        await q.close()
    # Without a token nothing can be proven: every live well-formed URL is asked, and
    # without credentials.
    q = Queries(
        store,
        redis=FakeRegistry(beats, sigs),  # type: ignore[arg-type]
        prefix="t:",
        self_url=SELF,
        token=None,
        fanout_timeout_s=1,
    )
    try:
        trusted, skipped = await q.peers()
        assert len(trusted) == MAX_PEERS and "http://forged:1" not in trusted
        assert {"http://unsigned:1", "http://wrong:1", "http://old:1"} <= set(trusted)
        assert {s["reason"] for s in skipped} == {"bad_url", "too_many_peers"}
    finally:
        await q.close()


class CountingRegistry(FakeRegistry):
    """A registry that counts its reads and can be down (Redis's error)."""

    def __init__(self, beats: dict[str, float], sigs: dict[str, str]) -> None:
        super().__init__(beats, sigs)
        self.reads = 0
        self.down = False

    async def zrevrangebyscore(
        self, _key: str, hi: float, lo: float, start: int, num: int
    ) -> list[str]:
        self.reads += 1
        await asyncio.sleep(0)  # a real read yields: the other look-ups come in meanwhile
        if self.down:
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("down")
        return await super().zrevrangebyscore(_key, hi, lo, start, num)


async def test_the_registry_is_read_once_per_cache_period_and_skips_are_reported_each_time(
    store: TraceStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from tracemq_collector import queries

    clock = [1000.0]
    monkeypatch.setattr(queries, "_monotonic", lambda: clock[0])
    now = int(time.time() * 1000)
    a, b = "http://10.0.0.1:8080", "http://10.0.0.2:8080"
    reg = CountingRegistry(
        {a: now, "http://unsigned:1": now}, {a: sign_registration("s3cret", a, now)}
    )
    q = Queries(
        store,
        redis=reg,  # type: ignore[arg-type]
        prefix="t:",
        self_url=SELF,
        token="s3cret",
        fanout_timeout_s=1,
    )
    before = (
        REGISTRY.get_sample_value("tracemq_collector_peer_failures_total", {"reason": "unsigned"})
        or 0.0
    )
    try:
        # 20 look-ups at once: one read, and each look-up reports the unproven registration
        answers = await asyncio.gather(*(q.peers() for _ in range(20)))
        assert reg.reads == 1
        assert all(t == [a] for t, _ in answers)
        assert all([f["reason"] for f in sk] == ["unsigned"] for _, sk in answers)
        assert (
            REGISTRY.get_sample_value(
                "tracemq_collector_peer_failures_total", {"reason": "unsigned"}
            )
            == before + 20
        )
        trusted, _ = await q.peers()
        trusted.append("http://mutated:1")  # a caller's copy: the cache is not changed
        # a new registration is seen once the period is over, not before
        reg.beats[b] = now
        reg.sigs[b] = sign_registration("s3cret", b, now)
        clock[0] += queries.PEERS_CACHE_S * 0.9
        assert (await q.peers())[0] == [a] and reg.reads == 1
        clock[0] += queries.PEERS_CACHE_S * 0.2
        assert sorted((await q.peers())[0]) == [a, b] and reg.reads == 2
        # Redis down: local answers only, and Redis is not asked again within the period
        reg.down = True
        clock[0] += queries.PEERS_CACHE_S
        assert await q.peers() == ([], [])
        assert await q.peers() == ([], []) and reg.reads == 3
        reg.down = False
        clock[0] += queries.PEERS_CACHE_S
        assert sorted((await q.peers())[0]) == [a, b] and reg.reads == 4
    finally:
        await q.close()


async def test_a_trace_is_found_by_a_lower_case_msg_id_and_by_its_offset_msg_id(
    make_client: Callable[..., Any], store: TraceStore
) -> None:
    # IPv6 store host: a 56-character offsetMsgId; queue 3, Kafka offset 41.
    where = encode_offset_msg_id("[fd00::9]:10911", 3, 41)
    bean = TraceBean(topic="orders", msg_id=msg_id(2), store_host="[fd00::9]:10911",
                     msg_type=MessageType.Normal_Msg, offset_msg_id=where.lower())  # fmt: skip
    pub = TraceContext(TraceType.Pub, timestamp=T0, group_name="pg", cost_time=3,
                       trace_beans=[bean])  # fmt: skip
    feed = Feed()
    feed.offset = 100  # after the fixture's trace messages
    store.write_batch(*feed.batch([pub], consume_ctxs(2, T0 + 5)))
    client = await make_client()

    resp = await client.get(f"/api/v1/traces/{msg_id(2).lower()}")
    view = await resp.json()
    assert (resp.status, view["msg_id"], view["found_by"]) == (200, msg_id(2), "msg_id"), view

    for asked in (where, where.lower()):
        resp = await client.get(f"/api/v1/traces/{asked}")
        view = await resp.json()
        assert resp.status == 200, view
        assert (view["msg_id"], view["found_by"]) == (msg_id(2), "offset_msg_id")
        assert view["offset_msg_id_query"] == {
            "offset_msg_id": where, "store_host": "[fd00::9]:10911", "queue_id": 3,
            "kafka_offset": 41,
        }  # fmt: skip
        assert len(view["consumers"]) == 1
    # The same host and queue at another offset is another message: not found.
    other = encode_offset_msg_id("[fd00::9]:10911", 3, 42)
    assert (await client.get(f"/api/v1/traces/{other}")).status == 404


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("Bearer s3cret", 200),
        ("bearer s3cret", 200),  # RFC 6750: the scheme is case-insensitive
        ("BEARER s3cret", 200),
        ("  BeArEr   s3cret  ", 200),
        ("Bearer S3CRET", 401),  # the token is not
        ("Bearer s3cret2", 401),
        ("Bearers3cret", 401),
        ("Basic s3cret", 401),
        ("Bearer", 401),
        ("s3cret", 401),
    ],
)
async def test_the_token_guard(
    make_client: Callable[..., Any], header: str | None, status: int
) -> None:
    client = await make_client(token="s3cret")
    headers = {"Authorization": header} if header is not None else {}
    for path in ("/api/v1/traces?key=k", "/api/v1/quarantine", "/api/v1/openapi.json"):
        resp = await client.get(path, headers=headers)
        assert resp.status == status, (path, header)
        if status == 401:
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert "token" in (await resp.json())["error"]
    # liveness and the page shell stay open
    assert (await client.get("/healthz")).status != 401  # (served by the service, not here)
    assert (await client.get("/")).status == 200


@pytest.mark.parametrize("token", ["", "   ", " padded"])
def test_an_empty_or_padded_token_is_a_config_error(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracemq.errors import ConfigError
    from tracemq.settings import load_settings
    from tracemq_collector.settings import CollectorSettings

    monkeypatch.setenv("TRACEMQ_COLLECTOR_API_TOKEN", token)
    with pytest.raises(ConfigError, match="TRACEMQ_COLLECTOR_API_TOKEN='\\*\\*\\*'"):
        load_settings(CollectorSettings)

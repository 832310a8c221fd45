"""Look-ups over the local trace store and, unless ``local`` is asked for, every other live
collector registered in Redis (each collector stores the partitions it was assigned)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from tracemq.log import get_logger
from tracemq.routing.keys import RedisKeys

from tracemq_collector.store import TraceStore

log = get_logger("collector.queries")

PEER_TTL_MS = 30_000


class Queries:
    def __init__(
        self,
        store: TraceStore,
        *,
        redis: aioredis.Redis | None,
        prefix: str,
        self_url: str,
        token: str | None,
        fanout_timeout_s: float,
        readers: int = 4,
    ) -> None:
        self.store = store
        self.redis = redis
        self.keys = RedisKeys(prefix)
        self.self_url = self_url
        self.token = token
        self.fanout_timeout_s = fanout_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="store-read")
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _local(self, fn: Any, *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    async def peers(self) -> list[str]:
        if self.redis is None:
            return []
        try:
            cutoff = int(time.time() * 1000) - PEER_TTL_MS
            urls = await self.redis.zrangebyscore(self.keys.collectors, cutoff, "+inf")
        except Exception as exc:  # Redis down: answer from the local store only
            log.warning("peer list unavailable", error=repr(exc))
            return []
        return [u for u in urls if u != self.self_url]

    async def _peer_get(self, url: str, path: str, params: dict[str, str]) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.fanout_timeout_s)
            )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with self._session.get(
                url + path, params={**params, "local": "1"}, headers=headers
            ) as resp:
                if resp.status == 404:
                    return None
                resp.raise_for_status()
                return await resp.json()
        except Exception as exc:
            log.warning("peer query failed", peer=url, error=repr(exc))
            return None

    async def trace_events(self, msg_id: str, *, local: bool) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = await self._local(self.store.by_msg_id, msg_id)
        if not local:
            answers = await asyncio.gather(
                *(self._peer_get(p, f"/api/v1/traces/{msg_id}", {}) for p in await self.peers())
            )
            for a in answers:
                if a:
                    events.extend(a.get("events", []))
        return events

    async def listing(
        self, kind: str, params: dict[str, Any], *, limit: int, cursor: str | None, local: bool
    ) -> tuple[list[dict[str, Any]], str | None]:
        """``kind`` is ``key`` or ``messages``. With peers, the cursor maps collector → cursor."""
        fn = self.store.by_key if kind == "key" else self.store.messages
        path = "/api/v1/traces" if kind == "key" else "/api/v1/messages"
        first = params.pop("first")
        if local:
            return await self._local(fn, first, limit=limit, cursor=cursor, **params)  # type: ignore[no-any-return]
        cursors = _decode_multi(cursor) if cursor else None
        peers = await self.peers()
        targets = [self.self_url, *peers] if cursors is None else list(cursors)
        results: list[dict[str, Any]] = []
        next_cursors: dict[str, str] = {}

        async def one(target: str) -> None:
            sub = cursors.get(target) if cursors else None
            if target == self.self_url:
                items, nxt = await self._local(fn, first, limit=limit, cursor=sub, **params)
            else:
                q = {k: str(v) for k, v in params.items() if v is not None}
                q["limit"] = str(limit)
                q["key" if kind == "key" else "topic"] = first
                if sub:
                    q["cursor"] = sub
                ans = await self._peer_get(target, path, q)
                items, nxt = (ans or {}).get("items", []), (ans or {}).get("next_cursor")
            results.extend(items)
            if nxt:
                next_cursors[target] = nxt

        await asyncio.gather(*(one(t) for t in targets))
        seen: set[str] = set()
        merged = []
        for item in sorted(results, key=lambda r: r["timestamp"], reverse=True):
            if item["msg_id"] not in seen:
                seen.add(item["msg_id"])
                merged.append(item)
        return merged, (_encode_multi(next_cursors) if next_cursors else None)


def _encode_multi(cursors: dict[str, str]) -> str:
    return "m" + base64.urlsafe_b64encode(json.dumps(cursors).encode()).decode()


def _decode_multi(cursor: str) -> dict[str, str]:
    if not cursor.startswith("m"):
        raise ValueError("invalid cursor")
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor[1:].encode()))
    except ValueError:
        raise ValueError("invalid cursor") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError("invalid cursor")
    return data

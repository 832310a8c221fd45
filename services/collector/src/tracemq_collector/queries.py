"""Look-ups over the local trace store and, unless ``local`` is asked for, every other live
collector registered in Redis (each collector stores the partitions it was assigned).

The registry is input anyone with Redis access can write, and a peer's answer is input from
the network, so neither is trusted:

* **Registration proof.** A collector with an API token (``TRACEMQ_COLLECTOR_API_TOKEN``, the
  secret every collector of a deployment shares) signs its registration: next to its heartbeat
  in ``P collectors`` it writes ``<ms>:<HMAC-SHA256(token, url, ms)>`` to
  ``P collector-signatures``. A collector with a token fans out only to registrations whose
  signature verifies and is fresh (at most :data:`PEER_TTL_MS` old); any other is skipped,
  never sent the token, and reported as a failed peer. Without a token there is no secret to
  leak or to prove anything with: such a collector fans out to every live registration
  without credentials, and still validates what comes back.
* **Answer validation.** A peer's answer is read with a size cap and a time-out and checked
  against the shape a collector answers with (:class:`PeerList`, :class:`PeerEvent`); an
  item that fails is dropped, an answer that fails as a whole counts as that peer failing.

The registry is read from Redis at most once a second (:data:`PEERS_CACHE_S`) and shared by
the look-ups of that second: a look-up pays no Redis round trip, and a collector that
registers (or stops) is asked (or no longer asked) at most that much later than before.

Every skipped registration and failed or partly dropped answer is named in the answer's
``peers_failed`` (``{"peer", "reason", "error"}``), counted in
``tracemq_collector_peer_failures_total{reason}`` and logged; the local part is always answered.

**The lake fallback.** A look-up the live stores miss (a client's, never a peer's ``local``
one) is answered from the lake when the collector has one (:mod:`tracemq_collector.lake_lookup`):
a msgId none of them knows (:meth:`Queries.lake_trace`), and a first listing page they cannot
fill (no further page, fewer items than asked), which the lake's items complete (merged by
msgId, the live stores' item first). Lake reads run in a pool of their own, at most
``lake_readers`` at once (the others wait on the event loop, never in it); an unreadable lake
is logged and counted and answers nothing. Every look-up is counted by where its answer came
from (``tracemq_collector_lookups_total{kind,source}``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any
from urllib.parse import urlsplit

import aiohttp
import pyarrow as pa
import redis.asyncio as aioredis
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from redis.exceptions import RedisError
from tracemq.lake import COLUMNS
from tracemq.log import get_logger
from tracemq.routing.keys import RedisKeys

from tracemq_collector import metrics
from tracemq_collector.errors import BadCursor, PeerFailure
from tracemq_collector.events import MAX_FIELD_CHARS
from tracemq_collector.lake_lookup import LakeLookup, LookupStats
from tracemq_collector.store import TraceStore

log = get_logger("collector.queries")

#: A registration (heartbeat and signature) older than this is not a live collector.
PEER_TTL_MS = 30_000
#: A signature dated this far ahead of our clock is refused too (clock skew allowance).
PEER_SKEW_MS = 30_000
#: Peers asked per query: the fan-out stays bounded whatever the registry holds.
MAX_PEERS = 32
#: Registrations read (and checked) per query.
MAX_REGISTRATIONS = 4 * MAX_PEERS
#: How long the registry read from Redis (and its signature checks) serves look-ups: a look-up
#: does not pay a Redis round trip (bench/query.py), and a new or ended registration is seen at
#: most this late (collectors heartbeat every 10 s; a registration lives PEER_TTL_MS).
PEERS_CACHE_S = 1.0
_monotonic = time.monotonic  # the cache's clock (a test turns it)
#: Largest peer answer read; a longer one is the peer failing (``too_large``).
MAX_PEER_ANSWER_BYTES = 32 << 20
#: A collector's own page cursor is 24 base64 characters; a peer's longer one is not a cursor.
MAX_PEER_CURSOR_CHARS = 256
MSG_ID_PATTERN = r"^[0-9A-Za-z_.:-]{1,128}$"
_CURSOR_PATTERN = r"^[0-9A-Za-z_=-]+$"
_SIGNED = b"tracemq-collector-registration\n"


# -- registration proof ----------------------------------------------------------------------
def sign_registration(secret: str, url: str, at_ms: int) -> str:
    """The ``P collector-signatures`` value proving ``url`` registered at ``at_ms``."""
    mac = hmac.new(secret.encode(), _SIGNED + f"{url}\n{at_ms}".encode(), hashlib.sha256)
    return f"{at_ms}:{mac.hexdigest()}"


def check_registration(secret: str, url: str, value: str | None, now_ms: int) -> str | None:
    """Why ``value`` does not prove ``url``'s registration now (a failure reason), or None."""
    if not value:
        return "unsigned"
    at, _, sig = value.partition(":")
    if not at.isascii() or not at.isdigit() or len(at) > 16:
        return "bad_signature"
    expected = sign_registration(secret, url, int(at))
    if not hmac.compare_digest(expected.encode(), value.encode("utf-8", "replace")):
        return "bad_signature"
    if not -PEER_SKEW_MS <= now_ms - int(at) <= PEER_TTL_MS:
        return "stale"
    return None


def _url_ok(url: str) -> bool:
    if len(url) > 2048 or not url.isascii() or any(c.isspace() for c in url):
        return False
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query


# -- answer validation -----------------------------------------------------------------------
_Text = Annotated[str, Field(max_length=MAX_FIELD_CHARS)]
_Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
_MsgId = Annotated[str, Field(pattern=MSG_ID_PATTERN)]
_Cursor = Annotated[str, Field(max_length=MAX_PEER_CURSOR_CHARS, pattern=_CURSOR_PATTERN)]
_STRICT = ConfigDict(strict=True, extra="ignore")


class PeerList(BaseModel):
    """A peer's listing answer; ``items`` are checked one by one (:class:`PeerItem`)."""

    model_config = _STRICT
    items: list[Any] = Field(max_length=10_000)
    next_cursor: _Cursor | None = None


class PeerItem(BaseModel):
    """A listing item as the store makes it (the summary of a message's Pub)."""

    model_config = _STRICT
    msg_id: _MsgId
    timestamp: _Int64
    topic: _Text | None = None
    tags: _Text | None = None
    keys: _Text | None = None
    group_name: _Text | None = None
    success: bool | None = None
    store_host: _Text | None = None
    offset_msg_id: _Text | None = None
    cost_time: _Int64 | None = None
    msg_type: _Int64 | None = None
    region_id: _Text | None = None


class PeerTrace(BaseModel):
    model_config = _STRICT
    events: list[Any] = Field(max_length=100_000)


def _column_type(typ: str) -> Any:
    if typ == "bool":
        return bool
    if typ.startswith("int"):
        return _Int64
    return _Text


#: A trace event as ``TraceStore.by_msg_id`` gives it: every lake column, typed as the lake.
PeerEvent: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "PeerEvent",
    __config__=_STRICT,
    **{
        name: ((_column_type(typ) | None) if nullable else _column_type(typ), ...)
        for name, typ, nullable, _ in COLUMNS
    },
)


def _failed(peer: str, reason: str, error: str) -> dict[str, str]:
    metrics.PEER_FAILURES.labels(reason=reason).inc()
    log.warning("peer skipped or failed", peer=peer, reason=reason, error=error)
    return {"peer": peer, "reason": reason, "error": error}


def _valid_items(
    model: type[BaseModel], raw: list[Any], keep: Any = None
) -> tuple[list[dict[str, Any]], int]:
    """The items of ``raw`` that pass ``model`` (and ``keep``), and how many were dropped."""
    out = []
    for item in raw:
        try:
            row = model.model_validate(item).model_dump()
        except ValidationError:
            continue
        if keep is None or keep(row):
            out.append(row)
    return out, len(raw) - len(out)


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
        lake: LakeLookup | None = None,
        lake_readers: int = 4,
    ) -> None:
        self.store = store
        self.redis = redis
        self.keys = RedisKeys(prefix)
        self.self_url = self_url
        self.token = token
        self.fanout_timeout_s = fanout_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="store-read")
        self._session: aiohttp.ClientSession | None = None
        self.lake = lake
        self._lake_pool = ThreadPoolExecutor(
            max_workers=lake_readers, thread_name_prefix="lake-read"
        )
        self._lake_slots = asyncio.Semaphore(lake_readers)
        #: (monotonic time read, trusted URLs, skipped registrations): see peers()
        self._peers_cache: tuple[float, list[str], list[tuple[str, str, str]]] | None = None
        self._peers_lock = asyncio.Lock()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lake_pool.shutdown(wait=False, cancel_futures=True)

    async def _in_lake(
        self, kind: str, fn: Any, *args: Any, **kw: Any
    ) -> list[dict[str, Any]] | None:
        """``fn``'s items (a :class:`LakeLookup` method), or None when the lake could not be
        read (logged, counted as ``lake_error``)."""
        loop = asyncio.get_running_loop()
        async with self._lake_slots:
            started = time.perf_counter()
            try:
                items, stats = await loop.run_in_executor(self._lake_pool, lambda: fn(*args, **kw))
            except (OSError, ValueError, pa.ArrowException) as exc:
                metrics.LOOKUPS.labels(kind=kind, source="lake_error").inc()
                log.warning("lake look-up failed", kind=kind, error=repr(exc)[:300])
                return None
            finally:
                metrics.LAKE_LOOKUP_SECONDS.labels(kind=kind).observe(time.perf_counter() - started)
        _count_read(stats)
        log.debug(
            "lake look-up",
            kind=kind,
            found=len(items),
            hours=stats.hours,
            files_listed=stats.files_listed,
            files_read=stats.files_read,
            bytes_read=stats.bytes_read,
            ms=round(stats.elapsed_ms, 1),
        )
        return items  # type: ignore[no-any-return]

    async def lake_trace(self, msg_id: str) -> list[dict[str, Any]]:
        """The events of ``msg_id`` in the lake (call after the live stores missed it); counts
        the look-up (``lake`` or ``miss``)."""
        if self.lake is None:
            metrics.LOOKUPS.labels(kind="msg_id", source="miss").inc()
            return []
        events = await self._in_lake("msg_id", self.lake.by_msg_id, msg_id)
        if events is None:
            return []
        metrics.LOOKUPS.labels(kind="msg_id", source="lake" if events else "miss").inc()
        return events

    async def _local(self, fn: Any, *args: Any, **kw: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    async def peers(self) -> tuple[list[str], list[dict[str, str]]]:
        """The live peers this collector trusts, and the registrations it skipped (failures).

        The registry is read at most once per :data:`PEERS_CACHE_S` (one read at a time; the
        look-ups meanwhile wait for it); every skipped registration is still counted, logged
        and reported by each look-up it is skipped for."""
        if self.redis is None:
            return [], []
        cached = self._peers_cache
        if cached is None or _monotonic() - cached[0] >= PEERS_CACHE_S:
            async with self._peers_lock:
                cached = self._peers_cache
                if cached is None or _monotonic() - cached[0] >= PEERS_CACHE_S:
                    trusted, skipped = await self._read_peers()
                    cached = self._peers_cache = (_monotonic(), trusted, skipped)
        _, trusted, skipped = cached
        return list(trusted), [_failed(*why) for why in skipped]

    async def _read_peers(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        """The registry's trusted URLs and the skipped ones (URL, reason, error), from Redis;
        nothing when Redis cannot be read (the look-ups answer from the local store)."""
        assert self.redis is not None
        now = int(time.time() * 1000)
        try:
            # Newest first, none dated ahead of the skew (forged "+inf" scores do not lead).
            found = await self.redis.zrevrangebyscore(
                self.keys.collectors,
                now + PEER_SKEW_MS,
                now - PEER_TTL_MS,
                start=0,
                num=MAX_REGISTRATIONS,
            )
            urls = [str(u) for u in found if u != self.self_url]
            sigs = [
                None if v is None else str(v)
                for v in (
                    await self.redis.hmget(self.keys.collector_signatures, urls)
                    if self.token and urls
                    else [None] * len(urls)
                )
            ]
        except (RedisError, OSError) as exc:  # Redis down: answer from the local store only
            log.warning("peer list unavailable", error=repr(exc))
            return [], []
        trusted: list[str] = []
        skipped: list[tuple[str, str, str]] = []
        for url, sig in zip(urls, sigs, strict=True):
            if not _url_ok(url):
                skipped.append((url[:200], "bad_url", "not an http(s) URL"))
                continue
            why = check_registration(self.token, url, sig, now) if self.token else None
            if why is not None:
                skipped.append((url, why, "registration not proven with the shared token"))
                continue
            trusted.append(url)
        if len(trusted) > MAX_PEERS:
            log.warning("more live collectors than the fan-out takes", limit=MAX_PEERS)
            skipped += [(u, "too_many_peers", f"over {MAX_PEERS}") for u in trusted[MAX_PEERS:]]
            trusted = trusted[:MAX_PEERS]
        return trusted, skipped

    async def _peer_get(self, url: str, path: str, params: dict[str, str]) -> Any:
        """The JSON a peer answers (None for a 404); raises :class:`PeerFailure`."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.fanout_timeout_s)
            )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with asyncio.timeout(self.fanout_timeout_s):
                async with self._session.get(
                    url + path,
                    params={**params, "local": "1"},
                    headers=headers,
                    allow_redirects=False,  # the token goes to the proven URL and nowhere else
                ) as resp:
                    if resp.status == 404:
                        return None
                    if resp.status != 200:
                        raise PeerFailure("status", f"HTTP {resp.status}")
                    body = bytearray()
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        body += chunk
                        if len(body) > MAX_PEER_ANSWER_BYTES:
                            raise PeerFailure("too_large", f"over {MAX_PEER_ANSWER_BYTES} bytes")
        except TimeoutError:
            raise PeerFailure("timeout", f"no answer within {self.fanout_timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PeerFailure("unreachable", repr(exc)[:200]) from None
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise PeerFailure("malformed", "answer is not JSON") from None

    async def trace_events(
        self, msg_id: str, *, local: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """The events of ``msg_id`` here and at every trusted peer, and the peers that failed."""
        events: list[dict[str, Any]] = await self._local(self.store.by_msg_id, msg_id)
        if local:
            return events, []
        peers, failed = await self.peers()

        async def one(peer: str) -> None:
            try:
                ans = await self._peer_get(peer, f"/api/v1/traces/{msg_id}", {})
                if ans is None:
                    return
                raw = PeerTrace.model_validate(ans).events
            except PeerFailure as exc:
                failed.append(_failed(peer, exc.reason, exc.error))
                return
            except ValidationError as exc:
                failed.append(_failed(peer, "malformed", _first_error(exc)))
                return
            good, dropped = _valid_items(PeerEvent, raw, lambda e: e["msg_id"] == msg_id)
            events.extend(good)
            if dropped:
                failed.append(_failed(peer, "invalid_items", f"{dropped} events dropped"))

        await asyncio.gather(*(one(p) for p in peers))
        return events, failed

    async def listing(
        self, kind: str, params: dict[str, Any], *, limit: int, cursor: str | None, local: bool
    ) -> tuple[list[dict[str, Any]], str | None, list[dict[str, str]]]:
        """``kind`` is ``key`` or ``messages``. With peers, the cursor maps collector → cursor.

        Raises :class:`BadCursor` for a cursor this collector did not hand out."""
        fn = self.store.by_key if kind == "key" else self.store.messages
        path = "/api/v1/traces" if kind == "key" else "/api/v1/messages"
        first = params.pop("first")

        async def mine(sub: str | None) -> tuple[list[dict[str, Any]], str | None]:
            try:
                return await self._local(fn, first, limit=limit, cursor=sub, **params)  # type: ignore[no-any-return]
            except ValueError as exc:
                if "cursor" in str(exc):
                    raise BadCursor("cursor is invalid") from None
                raise

        if local:
            items, nxt = await mine(cursor)
            return items, nxt, []
        cursors = _decode_multi(cursor) if cursor else None
        peers, failed = await self.peers()
        if cursors is None:
            targets = [self.self_url, *peers]
        else:
            # The cursor is the client's: it names collectors, but only proven ones are asked.
            known = {self.self_url, *peers}
            targets = [t for t in cursors if t in known]
            failed += [
                _failed(t[:200], "unregistered", "not a live proven collector")
                for t in cursors
                if t not in known
            ]
        results: list[dict[str, Any]] = []
        next_cursors: dict[str, str] = {}

        async def one(target: str) -> None:
            sub = cursors.get(target) if cursors else None
            if target == self.self_url:
                items, nxt = await mine(sub)
            else:
                q = {k: str(v) for k, v in params.items() if v is not None}
                q["limit"] = str(limit)
                q["key" if kind == "key" else "topic"] = first
                if sub:
                    q["cursor"] = sub
                try:
                    ans = PeerList.model_validate(await self._peer_get(target, path, q) or {})
                except PeerFailure as exc:
                    failed.append(_failed(target, exc.reason, exc.error))
                    return
                except ValidationError as exc:
                    failed.append(_failed(target, "malformed", _first_error(exc)))
                    return
                items, dropped = _valid_items(PeerItem, ans.items[:limit])
                nxt = ans.next_cursor
                if dropped or len(ans.items) > limit:
                    failed.append(_failed(target, "invalid_items", f"{dropped} items dropped"))
            results.extend(items)
            if nxt:
                next_cursors[target] = nxt

        await asyncio.gather(*(one(t) for t in targets))
        merged = _by_msg_id(results)
        kind_name = "key" if kind == "key" else "messages"
        if cursor is None and not next_cursors and len(merged) < limit and self.lake is not None:
            # The live stores cannot fill the first page: what the lake holds completes it
            # (a lost collector's messages, ones older than retention).
            lake_fn = self.lake.by_key if kind == "key" else self.lake.messages
            found = await self._in_lake(kind_name, lake_fn, first, limit=limit, **params)
            known = {item["msg_id"] for item in merged}
            extra = [
                {**item, "source": "lake"} for item in found or [] if item["msg_id"] not in known
            ]
            if found is not None:
                metrics.LOOKUPS.labels(
                    kind=kind_name, source="lake" if extra else "store" if merged else "miss"
                ).inc()
            merged = _by_msg_id(merged + extra)[:limit]
        else:
            metrics.LOOKUPS.labels(kind=kind_name, source="store" if merged else "miss").inc()
        return merged, (_encode_multi(next_cursors) if next_cursors else None), failed


def _by_msg_id(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` newest first, each msgId once (the first of equal timestamps kept)."""
    seen: set[str] = set()
    merged = []
    for item in sorted(items, key=lambda r: r["timestamp"], reverse=True):
        if item["msg_id"] not in seen:
            seen.add(item["msg_id"])
            merged.append(item)
    return merged


def _count_read(stats: LookupStats) -> None:
    metrics.LAKE_LOOKUP_FILES.inc(stats.files_read)
    metrics.LAKE_LOOKUP_BYTES.inc(stats.bytes_read)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid answer"
    where = ".".join(str(p) for p in errors[0]["loc"]) or "answer"
    return f"{where}: {errors[0]['msg']}"[:200]


def _encode_multi(cursors: dict[str, str]) -> str:
    return "m" + base64.urlsafe_b64encode(json.dumps(cursors).encode()).decode()


def _decode_multi(cursor: str) -> dict[str, str]:
    if not cursor.startswith("m"):
        raise BadCursor("invalid cursor")
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor[1:].encode("ascii")))
    except (ValueError, TypeError):
        raise BadCursor("invalid cursor") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise BadCursor("invalid cursor")
    return data

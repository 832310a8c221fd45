"""The reconciliation job's two small input files, parsed on the driver (stage "inputs" of
:mod:`tracemq_spark.job`): the subscription history and the committed-offsets snapshot with its
retry/dead-letter copies (written by :mod:`tracemq_spark.inputs`). :func:`last_deliveries`
places each retried message's last delivery. Pure Python; bad input raises
:class:`~tracemq_spark.params.ReconcileError` naming the file and the row.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from tracemq_spark.params import _DLQ_PREFIX, _RETRY_PREFIX, ReconcileError


@dataclass(frozen=True)
class SubRow:
    group: str
    topic: str
    tag: str | None  # None: every tag ("*")
    first_seen: int
    last_seen: int
    broadcasting: bool


def _doc_rows(doc: Any, key: str, what: str) -> list[dict[str, Any]]:
    rows = doc.get(key) if isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ReconcileError(f"{what}: expected a JSON list of objects (or {{{key!r}: [...]}})")
    return rows


def parse_subscriptions(text: str, source: str = "subscriptions") -> list[SubRow]:
    """The subscription history (``RegistryReader.subscription_history()`` rows) as rows with
    one tag each; retry and dead-letter topics are dropped."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ReconcileError(f"{source}: not valid JSON: {exc}") from None
    out: list[SubRow] = []
    for i, r in enumerate(_doc_rows(doc, "subscriptions", source)):
        try:
            group, topic = str(r["group"]), str(r["topic"])
            expression = r.get("expression")
            model = str(r.get("message_model") or "CLUSTERING").upper()
            first, last = int(r["first_seen"]), int(r["last_seen"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ReconcileError(f"{source}: row {i} is malformed ({exc!r}): {r}") from None
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        expr = (expression or "").strip() if isinstance(expression, str) else ""
        tags: list[str | None] = (
            [None] if expr in ("", "*") else [t.strip() for t in expr.split("||") if t.strip()]
        )
        out.extend(SubRow(group, topic, tag, first, last, model == "BROADCASTING") for tag in tags)
    return out


@dataclass(frozen=True)
class OffsetRow:
    group: str
    topic: str
    store_addr: str
    queue_id: int
    client: str  # "" for clustering groups
    committed: int


def load_json(text: str, source: str) -> Any:
    """The JSON document of an input file; ReconcileError naming it when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ReconcileError(f"{source}: not valid JSON: {exc}") from None


def parse_offsets(text: str | Any, source: str = "offsets") -> list[OffsetRow]:
    """The committed-offsets snapshot: one row per (group, topic, store_addr, queue[, client]);
    rows without a committed offset are dropped, duplicates keep the highest offset. ``text``:
    the file's text, or its document already parsed (:func:`load_json`)."""
    doc = load_json(text, source) if isinstance(text, str) else text
    return best_offsets(_iter_offsets(doc, source))


def best_offsets(rows: Iterable[tuple[str, str, str, int, str, int]]) -> list[OffsetRow]:
    """(group, topic, store_addr, queue_id, client, committed) rows: the highest committed
    offset of each key, sorted."""
    best: dict[tuple[str, str, str, int, str], int] = {}
    for group, topic, store_addr, queue_id, client, committed in rows:
        key = (group, topic, store_addr, queue_id, client)
        best[key] = max(committed, best.get(key, committed))
    return [OffsetRow(*k, v) for k, v in sorted(best.items())]


def _iter_offsets(doc: Any, source: str) -> Iterator[tuple[str, str, str, int, str, int]]:
    for i, r in enumerate(_doc_rows(doc, "offsets", source)):
        try:
            committed = r.get("committed")
            if committed is None:
                continue
            key = (
                str(r["group"]),
                str(r["topic"]),
                str(r["store_addr"]),
                int(r["queue_id"]),
                str(r.get("client_host") or ""),
            )
            committed = int(committed)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReconcileError(f"{source}: row {i} is malformed ({exc!r}): {r}") from None
        yield (*key, committed)


class CopyRow(NamedTuple):
    """A consumer's copy of a message in ``%RETRY%<group>`` or ``%DLQ%<group>``, read from the
    queue itself when the snapshot was taken (so no trace loss can hide it). (A tuple: millions
    of them are read on a bad day.)"""

    group: str
    topic: str
    store_addr: str
    queue_id: int
    queue_offset: int
    msg_id: str
    reconsume_times: int


def parse_copies(text: str | Any, source: str = "offsets") -> list[CopyRow]:
    """The ``copies`` list of the committed-offsets snapshot (absent: none known, e.g. a
    snapshot of a RocketMQ cluster); rows without a msgId are dropped, a copy read twice is
    one. ``text``: as for :func:`parse_offsets`."""
    doc = load_json(text, source) if isinstance(text, str) else text
    return list(set(_iter_copies(doc, source)))


def _iter_copies(doc: Any, source: str) -> Iterator[CopyRow]:
    if not isinstance(doc, dict) or doc.get("copies") is None:
        return
    retry, dlq = _RETRY_PREFIX, _DLQ_PREFIX
    for i, r in enumerate(_doc_rows(doc, "copies", f"{source} (copies)")):
        try:
            topic = str(r["topic"])
            if topic.startswith(retry):
                prefix = retry
            elif topic.startswith(dlq):
                prefix = dlq
            else:
                raise ValueError(f"topic {topic!r} is not a %RETRY% or %DLQ% topic")
            msg_id = r.get("msg_id")
            if not msg_id:
                continue
            row = CopyRow(
                str(r.get("group") or topic[len(prefix) :]),
                topic,
                str(r["store_addr"]),
                int(r["queue_id"]),
                int(r["queue_offset"]),
                str(msg_id),
                int(r.get("reconsume_times") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReconcileError(f"{source}: copies row {i} is malformed ({exc!r}): {r}") from None
        yield row


@contextmanager
def gc_paused() -> Iterator[None]:
    """CPython's cyclic collector paused: parsing the offsets snapshot of 10M messages makes
    tens of millions of dicts and tuples, none of them garbage, and the collections it kept
    triggering (each walking every object made so far) were half the parse's time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DeliveryRow(NamedTuple):
    """Per (msgId, group): the last retry copy (highest reconsume count) with its queue's
    committed offset, and the dead-letter copy, if any."""

    msg_id: str
    group: str
    retry_reconsume: int | None
    retry_queue_offset: int | None
    retry_committed: int | None
    dlq_queue_offset: int | None


def last_deliveries(copies: list[CopyRow], offsets: list[OffsetRow]) -> list[DeliveryRow]:
    """The retry chain of every (msgId, group) reduced to what decides it: a message sent back
    k times was delivered k + 1 times, and only the last delivery's queue says whether the
    group is done with it; a dead-letter copy ends the chain."""
    committed = {
        (o.group, o.topic, o.store_addr, o.queue_id): o.committed for o in offsets if not o.client
    }
    last: dict[tuple[str, str], CopyRow] = {}
    dlq: dict[tuple[str, str], int] = {}
    for c in copies:
        # (positional fields: millions of rows on a bad day) 0 group, 1 topic, 4 queue
        # offset, 5 msgId, 6 reconsume count
        key = (c[5], c[0])
        if c[1].startswith(_DLQ_PREFIX):
            old = dlq.get(key)
            if old is None or c[4] < old:
                dlq[key] = c[4]
            continue
        prev = last.get(key)
        if prev is None or (c[6], c[4]) > (prev[6], prev[4]):
            last[key] = c
    out = []
    for key in last.keys() | dlq.keys():
        c = last.get(key)
        out.append(
            DeliveryRow(
                key[0],
                key[1],
                None if c is None else c.reconsume_times,
                None if c is None else c.queue_offset,
                None if c is None else committed.get((c.group, c.topic, c.store_addr, c.queue_id)),
                dlq.get(key),
            )
        )
    return out

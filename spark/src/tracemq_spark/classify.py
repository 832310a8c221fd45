"""Stage "classification" of the reconciliation job (:mod:`tracemq_spark.job`): every
(message, group[, client]) of the run gets its outcome (the rules: :mod:`tracemq_spark.job`'s
docstring, DESIGN §6).

The steps are pure ``DataFrame -> DataFrame`` functions, composed by
``job._Context.classified_frame`` and tested one by one on small frames
(``tests/spark/test_stages.py``):

1. :func:`pubs` — the producer side, one row per msgId;
2. :func:`expected_deliveries` — the (message, group[, client]) rows the subscriptions expect;
3. :func:`attempts` — consume events paired by requestId; :func:`consumed` — per (message,
   group, client);
4. :func:`meet` — expected ⟗ consumed, the offsets' word (:func:`with_deliveries`), the outcome.

Their small inputs come from the driver's parsed files (:func:`subs_frame`,
:func:`offsets_frame`, :func:`clients_frame`, :func:`deliveries_frame`). Strings the hot path
joins on are xxhash64-hashed (:func:`_h`) and decoded again by :mod:`tracemq_spark.outputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tracemq_spark.input_files import DeliveryRow, OffsetRow, SubRow
from tracemq_spark.params import (
    _DLQ_PREFIX,
    _MSG_DELAY,
    _MSG_HALF,
    _TX_COMMIT,
    _TX_ROLLBACK,
    DAY_MS,
    METRICS,
    Params,
)

# ---- the classification's small inputs ---------------------------------------------------


def _client_h(client: Column) -> Column:
    """A client host's hash; 0 for none (clustering groups)."""
    return F.coalesce(_h(F.when(client != "", client)), F.lit(0)).cast("long")


def subs_frame(spark: SparkSession, subs: list[SubRow], grace_ms: int) -> DataFrame:
    """The subscription segments (:func:`subscription_segments`), hashed: ``s_group_h``,
    ``s_topic_h``, ``s_tag_h`` (null: every tag), ``s_start``, ``s_end``, ``s_bcast``."""
    schema = "group string, topic string, s_start bigint, s_end bigint, tag string, s_bcast boolean"
    rows = subscription_segments(subs, grace_ms)
    return spark.createDataFrame(rows, schema).select(
        _h(F.col("group")).alias("s_group_h"),
        _h(F.col("topic")).alias("s_topic_h"),
        _h(F.col("tag")).alias("s_tag_h"),
        "s_start",
        "s_end",
        "s_bcast",
    )


def offsets_frame(spark: SparkSession, offsets: list[OffsetRow]) -> DataFrame:
    """The committed offsets, hashed (``o_*`` columns; ``o_client_h`` 0: not broadcasting)."""
    schema = (
        "group string, topic string, store_addr string, o_queue_id int, client string, "
        "o_committed bigint"
    )
    rows = [(o.group, o.topic, o.store_addr, o.queue_id, o.client, o.committed) for o in offsets]
    c = F.col
    return spark.createDataFrame(rows, schema).select(
        _h(c("group")).alias("o_group_h"),
        _h(c("topic")).alias("o_topic_h"),
        _h(c("store_addr")).alias("o_store_h"),
        "o_queue_id",
        _client_h(c("client")).alias("o_client_h"),
        "o_committed",
    )


def clients_frame(spark: SparkSession, clients: list[tuple[str, str, str]]) -> DataFrame:
    """Consuming clients of broadcasting groups: (group, topic, client host), hashed."""
    schema = "group string, topic string, client string"
    c = F.col
    return spark.createDataFrame(clients, schema).select(
        _h(c("group")).alias("c_group_h"),
        _h(c("topic")).alias("c_topic_h"),
        _client_h(c("client")).alias("c_client_h"),
    )


def deliveries_frame(
    spark: SparkSession, fs: Any, path: str, deliveries: list[DeliveryRow]
) -> DataFrame | None:
    """The last deliveries (:func:`~tracemq_spark.input_files.last_deliveries`) as a frame
    (``d_pkey``, ``d_group_h``, retry/dead-letter columns), staged as a Parquet file under
    ``path``; None when there are none."""
    names = ["retry_reconsume", "retry_queue_offset", "retry_committed", "dlq_queue_offset"]
    if not deliveries:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    # through a Parquet file, not createDataFrame: a million rows cross py4j in a second
    # that way, instead of minutes
    cols = list(zip(*deliveries, strict=True))
    table = pa.table(
        {
            "d_pkey": pa.array(cols[0], pa.string()),
            "group": pa.array(cols[1], pa.string()),
            "retry_reconsume": pa.array(cols[2], pa.int32()),
            **{n: pa.array(cols[i + 3], pa.int64()) for i, n in enumerate(names[1:])},
        }
    )
    # in msgId order, in small row groups: a read of one msgId range (cogroup.split) skips
    # the rest
    table = table.sort_by([("d_pkey", "ascending"), ("group", "ascending")])
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, row_group_size=16_384)
    target = path  # (a file named "_…" Spark would skip)
    fs.write_bytes(f"{target}/{DELIVERIES_FILE}", buf.getvalue().to_pybytes())
    return deliveries_read(spark, target)


#: the last deliveries' file in the directory :func:`deliveries_frame` is given
DELIVERIES_FILE = "deliveries.parquet"


def deliveries_read(spark: SparkSession, path: str) -> DataFrame:
    """The frame of the last deliveries' file written under ``path`` (by
    :func:`deliveries_frame`, or by the JVM's snapshot reader: :mod:`tracemq_spark.snapshot`)."""
    names = ["retry_reconsume", "retry_queue_offset", "retry_committed", "dlq_queue_offset"]
    return spark.read.parquet(path).select("d_pkey", _h(F.col("group")).alias("d_group_h"), *names)


def _zone_month_start(ts_ms: Column, zone: str) -> Column:
    """Epoch ms of local midnight on the 1st of the month (in ``zone``) containing ``ts_ms``.

    Independent of the session time zone: from_utc_timestamp gives the zone's wall clock as
    if it were UTC, the month is truncated on that, and to_utc_timestamp turns the wall clock
    back into an instant. A midnight skipped by a DST gap gets the offset before the change
    and a repeated one its first occurrence (java.time's rule), as ``zoneinfo`` with fold=0
    and Java's lenient Calendar."""
    wall = F.unix_millis(F.from_utc_timestamp(F.timestamp_millis(ts_ms), zone))
    first = F.trunc(F.date_from_unix_date(F.floor(wall / DAY_MS).cast("int")), "month")
    first_wall = F.timestamp_millis(F.unix_date(first).cast("long") * DAY_MS)
    return F.unix_millis(F.to_utc_timestamp(first_wall, zone))


def _msg_id_created(msg_id: Column, ref_ts: Column, zone: str = "UTC") -> Column:
    """Epoch ms a RocketMQ msgId was created at, read at ``ref_ts`` with the producer's
    ``zone``; null if it is not 32 or 56 hex digits (56: an IPv6 client address).

    The same rule as ``tracemq.message_id.msg_id_created_ms`` (the tests compare the two): the
    id's time field is ms since the start of a month in ``zone``; the month is the one of
    ``ref_ts``, or the one before if that would put the creation more than a day after
    ``ref_ts`` (a day of clock skew allowed)."""
    valid = msg_id.rlike("^([0-9A-Fa-f]{32}|[0-9A-Fa-f]{56})$")
    # the time field is the 8 hex digits before the 4-digit counter, whatever the address size
    offset = F.conv(F.substring(msg_id, -12, 8), 16, 10).cast("long")
    month = _zone_month_start(ref_ts, zone)
    prev = _zone_month_start(month - 1, zone)
    created = F.when(month + offset > ref_ts + DAY_MS, prev + offset).otherwise(month + offset)
    return F.when(valid, created)


def _h(c: Column) -> Column:
    """xxhash64 of a string column; null stays null."""
    return F.when(c.isNotNull(), F.xxhash64(c))


def subscription_segments(
    subs: list[SubRow], grace_ms: int
) -> list[tuple[str, str, int, int, str | None, bool]]:
    """Subscription rows as disjoint time segments per (group, topic):
    (group, topic, start, end, tag or None for every tag, broadcasting), end exclusive.

    A row covers ``[first_seen, last_seen + grace]``. Where rows of one (group, topic)
    overlap, the segment accepts the union of their tags (every tag if one is ``*``), so a
    message matches a group through at most one segment row.
    """
    by_key: dict[tuple[str, str], list[SubRow]] = {}
    for s in subs:
        by_key.setdefault((s.group, s.topic), []).append(s)
    out: list[tuple[str, str, int, int, str | None, bool]] = []
    for (group, topic), rows in sorted(by_key.items()):
        bcast = any(r.broadcasting for r in rows)
        spans = [(r.first_seen, r.last_seen + grace_ms + 1, r.tag) for r in rows]
        cuts = sorted({x for a, b, _ in spans for x in (a, b)})
        segments: list[tuple[int, int, frozenset[str] | None]] = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            cover = [t for a, b, t in spans if a <= lo and b >= hi]
            if not cover:
                continue
            tags = (
                None
                if any(t is None for t in cover)
                else frozenset(t for t in cover if t is not None)
            )
            if segments and segments[-1][1] == lo and segments[-1][2] == tags:
                segments[-1] = (segments[-1][0], hi, tags)
            else:
                segments.append((lo, hi, tags))
        for lo, hi, tags in segments:
            if tags is None:
                out.append((group, topic, lo, hi, None, bcast))
            else:
                out.extend((group, topic, lo, hi, t, bcast) for t in sorted(tags))
    return out


# ---- the classification's steps: pure DataFrame -> DataFrame functions ----------------------

#: the producer's strings the anomalies show (of the least Pub by ``o`` then these strings,
#: nulls first: one answer however the Pubs are ordered), under their output names: the lake
#: column of each
PUB_STRINGS = {
    "tags": "tags",
    "keys": "keys",
    "store_addr": "store_addr",
    "producer_group": "group_name",
}

#: the Pub facts each (message, group[, client]) row carries (``e_*`` from the expected side,
#: ``a_*`` from the consumed side)
PUB_COLS = [
    "pub_ts",
    "pub_ok",
    "topic_h",
    "tags_h",
    "send_cost",
    "store_time",
    "msg_type",
    "store_h",
    "queue_id",
    "queue_offset",
    "tx_commit",
    "tx_rollback",
    "recalled",
    *PUB_STRINGS,
    "in_window",
]


def _dlq_move() -> Column:
    """A consumer's move of a message to %DLQ%<group> is traced as a Pub of the group: it
    belongs to the consume side, not to the message's send."""
    tt = F.col("trace_type")
    return (tt == "Pub") & F.col("topic").startswith(_DLQ_PREFIX)


def _producer_side(base: int) -> tuple[Column, dict[str, Column]]:
    """The producer side's rows of the lake (Pub, EndTransaction and Recall events but the
    consumers' DLQ moves): their condition and columns (:func:`pubs`, :func:`cogroup_input`)."""
    col = F.col
    tt = col("trace_type")
    is_pub = tt == "Pub"
    order = F.when(
        is_pub,
        F.shiftleft(F.when(col("success"), 0).otherwise(1).cast("long"), 62)
        + (col("timestamp") - base),
    )
    cond = (
        tt.isin("Pub", "EndTransaction", "Recall")
        & ~F.coalesce(_dlq_move(), F.lit(False))
        & col("msg_id").isNotNull()
        & (col("msg_id") != "")
    )
    cols = {
        "pkey": col("msg_id"),
        "o": order,
        **{c: col(c) for c in _PUB_RAW},
        **{h: _h(col(name)) for h, name in _PUB_HASHED.items()},
        **{name: col(c) for name, c in PUB_STRINGS.items()},
        "is_commit": ((tt == "EndTransaction") & (col("transaction_state") == _TX_COMMIT)).cast(
            "int"
        ),
        "is_rollback": ((tt == "EndTransaction") & (col("transaction_state") == _TX_ROLLBACK)).cast(
            "int"
        ),
        "is_recall": ((tt == "Recall") & col("success")).cast("int"),
    }
    return cond, cols


#: the Pub's columns :func:`pubs` takes from the first successful Pub, as read and hashed
_PUB_RAW = ["timestamp", "cost_time", "store_time", "msg_type", "queue_id", "queue_offset"]
_PUB_HASHED = {"topic_h": "topic", "tags_h": "tags", "store_h": "store_addr"}


def pubs(ev: DataFrame, *, f_ms: int, t_ms: int, base: int, n_parts: int) -> DataFrame:
    """Producer side: one row per msgId (``pkey``) from its Pub, EndTransaction and Recall
    events; the first successful Pub wins (``pub_ok`` false: only failed Pubs). Adds
    ``in_window`` (Pub in ``[f_ms, t_ms)``) and ``expected_anywhere`` (sent, not recalled, not
    a half message without COMMIT). ``base`` is at most every timestamp of ``ev``."""
    col = F.col
    cond, cols = _producer_side(base)
    raw, hashed = _PUB_RAW, _PUB_HASHED
    prod = (
        ev.where(cond)
        .select(*[c.alias(name) for name, c in cols.items()])
        .repartition(n_parts, "pkey")
    )
    # the first successful Pub's (min_by o)
    firsts = [*raw, *hashed]
    # PUB_COLS but in_window (added below), some under their lake names
    renamed = {
        "pub_ts": col("timestamp"),
        "pub_ok": F.shiftright(col("o"), 62) == 0,
        "send_cost": col("cost_time"),
    }
    pubs = (
        prod.groupBy("pkey")
        .agg(
            F.min("o").alias("o"),
            *[F.min_by(c, "o").alias(c) for c in firsts],
            F.max("is_commit").alias("tx_commit"),
            F.max("is_rollback").alias("tx_rollback"),
            F.max("is_recall").alias("recalled"),
            # (a min of structs: nulls first in each field, as the JVM code's)
            F.min(F.when(col("o").isNotNull(), F.struct("o", *PUB_STRINGS))).alias("detail"),
        )
        .where(col("o").isNotNull())
        .select(
            "pkey",
            *[
                renamed.get(c, col(f"detail.{c}") if c in PUB_STRINGS else col(c)).alias(c)
                for c in PUB_COLS[:-1]
            ],
        )
    )
    pubs = pubs.withColumn(
        "in_window", (col("pub_ts") >= f_ms) & (col("pub_ts") < t_ms)
    ).withColumn(
        "expected_anywhere",
        col("pub_ok")
        & (col("recalled") == 0)
        & ((F.coalesce(col("msg_type"), F.lit(0)) != _MSG_HALF) | (col("tx_commit") == 1)),
    )
    return pubs


def expected_deliveries(pubs: DataFrame, subs: DataFrame, clients: DataFrame) -> DataFrame:
    """The expected (message, group[, client]) rows of the in-window messages (``pubs``):
    one per subscription segment (``subs``, :func:`subs_frame`) the message matches, one per
    consuming client (``clients``, :func:`clients_frame`) for broadcasting groups (``ck``: the
    client's hash, else 0). A message no group expects keeps one row with a null group."""
    col = F.col
    # subscription segments are disjoint per (group, topic): a message matches a group
    # through at most one row, so no deduplication is needed
    s = F.broadcast(subs)
    cond = (
        (col("topic_h") == col("s_topic_h"))
        & (col("s_tag_h").isNull() | (col("s_tag_h") == col("tags_h")))
        & (col("s_start") <= col("pub_ts"))
        & (col("pub_ts") < col("s_end"))
        & col("expected_anywhere")
    )
    return (
        pubs.where(col("in_window"))
        .join(s, cond, "left")
        .join(
            F.broadcast(clients),
            (col("s_group_h") == col("c_group_h")) & (col("topic_h") == col("c_topic_h")),
            "left",
        )
        .select(
            "pkey",
            col("s_group_h").alias("group_h"),
            F.when(
                F.coalesce(col("s_bcast"), F.lit(False)),
                F.coalesce(col("c_client_h"), F.lit(0)),
            )
            .otherwise(F.lit(0))
            .cast("long")
            .alias("ck"),
            F.lit(True).alias("expected"),
            *[col(c).alias(f"e_{c}") for c in PUB_COLS],
        )
    )


def _consume_side() -> tuple[Column, dict[str, Column]]:
    """The consume side's rows of the lake (SubBefore, SubAfter, the consumers' traced DLQ
    moves): their condition and columns (:func:`attempts`, :func:`cogroup_input`)."""
    col = F.col
    tt = col("trace_type")
    mid = F.when(col("msg_id") == "", F.lit(None)).otherwise(col("msg_id"))
    rid = F.coalesce(
        col("request_id"), F.concat(F.lit("\u0001"), F.coalesce(col("group_name"), F.lit("")))
    )
    before = tt == "SubBefore"
    moved = F.coalesce(_dlq_move() & col("success"), F.lit(False))
    cols = {
        "pkey": F.coalesce(mid, F.concat(F.lit("\u0000"), rid)),
        # a DLQ move is an "attempt" of its own (its rid), counted apart below
        "rid": F.xxhash64(
            F.when(
                moved,
                F.concat(F.lit("\u0002dlq"), F.coalesce(col("group_name"), F.lit(""))),
            ).otherwise(rid)
        ),
        "b": before,
        "d": moved,
        "gh": _h(col("group_name")),
        "ch": _h(F.when(col("client_host") != "", col("client_host"))),
        "th": F.when(before, _h(col("topic"))),
        "timestamp": col("timestamp"),
        "cost_time": col("cost_time"),
        "success": col("success"),
        "retry_times": col("retry_times"),
    }
    return tt.isin("SubBefore", "SubAfter") | moved, cols


def attempts(ev: DataFrame, *, bh: list[int], n_parts: int) -> DataFrame:
    """Consume side: SubBefore/SubAfter events (and DLQ moves) paired by requestId into one
    row per attempt (``pkey``, ``rid``), with its group (``group_h``), client and ``ck`` (the
    client's hash for the broadcasting groups ``bh``, else 0). A consume without a msgId gets
    a ``pkey`` of its own (``\\u0000`` + requestId)."""
    col = F.col
    cond, cols = _consume_side()
    cons = (
        ev.where(cond)
        .select(*[c.alias(name) for name, c in cols.items()])
        .repartition(n_parts, "pkey")
    )
    b, a = col("b"), ~col("b") & ~col("d")
    ok_ts = F.when(a & col("success"), col("timestamp"))
    att = (
        cons.groupBy("pkey", "rid")
        .agg(
            F.max(F.when(b, col("gh"))).alias("gb"),
            F.max(F.when(~b, col("gh"))).alias("ga"),
            F.max(F.when(b, col("ch"))).alias("cb"),
            F.max(F.when(~b, col("ch"))).alias("ca"),
            F.max("th").alias("th"),
            F.max(b.cast("int")).alias("has_before"),
            F.max(a.cast("int")).alias("has_after"),
            F.min(F.when(b, col("timestamp"))).alias("before_ts"),
            F.max(F.when(b, col("retry_times"))).alias("retry"),
            F.max((a & col("success")).cast("int")).alias("ok"),
            F.max(col("d").cast("int")).alias("dlq"),
            F.min(ok_ts).alias("succ_ts"),
            F.min_by("cost_time", ok_ts).alias("succ_cost"),
            F.min(F.when(a, col("timestamp"))).alias("after_ts"),
            F.count(F.lit(1)).alias("n"),
        )
        .select(
            "*",
            F.coalesce(col("gb"), col("ga")).alias("group_h"),
            F.coalesce(col("cb"), col("ca")).alias("client_h"),
        )
    )
    is_bc = col("group_h").isin(bh) if bh else F.lit(False)
    return att.withColumn(
        "ck",
        F.when(is_bc, F.coalesce(col("client_h"), F.lit(0))).otherwise(F.lit(0)).cast("long"),
    )


def consumed(att: DataFrame, pubs: DataFrame, deliveries: DataFrame | None = None) -> DataFrame:
    """The attempts aggregated per (message, group, client): attempts, successes, failures,
    in-flight attempts, retry counts, first consume and success times; with the message's
    Pub facts (``a_*`` columns, null without a Pub) for consumes nobody expected. With
    ``deliveries`` (:func:`deliveries_frame`), also the last deliveries (``a_retry_*``,
    ``a_dlq_queue_offset``), joined while the rows are narrow (else :func:`meet` joins them)."""
    col = F.col
    done_ok = col("ok") == 1
    first_ok = F.when(done_ok, col("succ_ts"))
    agg = att.groupBy("pkey", "group_h", "ck").agg(
        F.sum(1 - col("dlq")).alias("attempts"),
        F.max("dlq").alias("dead_lettered"),
        F.sum("ok").alias("successes"),
        F.sum(((col("has_after") == 1) & ~done_ok).cast("int")).alias("failed_attempts"),
        F.sum(((col("has_before") == 1) & (col("has_after") == 0)).cast("int")).alias(
            "in_flight_attempts"
        ),
        F.max("retry").alias("max_retry_times"),
        # the highest delivery a traced failure belongs to (a SubAfter whose SubBefore was
        # lost: the first one)
        F.max(F.when((col("has_after") == 1) & ~done_ok, F.coalesce(col("retry"), F.lit(0)))).alias(
            "max_failed_retry"
        ),
        F.min("before_ts").alias("first_before_ts"),
        F.min(F.least(col("before_ts"), col("after_ts"))).alias("first_consume_ts"),
        F.min(first_ok).alias("success_ts"),
        F.min_by("succ_cost", first_ok).alias("success_cost"),
        F.min_by(F.coalesce(col("retry"), F.lit(0)), first_ok).alias("success_retry"),
        F.max("th").alias("c_topic_h"),
        F.sum("n").alias("consume_events"),
    )
    if deliveries is not None:
        agg = _prefixed(with_deliveries(agg, deliveries), DELIVERY_COLS, "a_")
    # pub facts for consumes nobody expected (UNEXPECTED_GROUP / ORPHAN_CONSUME)
    return agg.join(
        pubs.select("pkey", *[col(c).alias(f"a_{c}") for c in PUB_COLS]).hint("shuffle_hash"),
        "pkey",
        "left",
    )


#: the classified columns the tally reads: the only ones a CONSUMED row keeps without
#: ``--keep-classified`` (:func:`meet`; the JVM path gets the list too)
TALLIED_COLS = ("outcome", "window_start_ms", "topic_h", "group_h", *METRICS)

#: the last deliveries' columns (:func:`with_deliveries`)
DELIVERY_COLS = ["retry_reconsume", "retry_queue_offset", "retry_committed", "dlq_queue_offset"]


def _prefixed(df: DataFrame, names: list[str], prefix: str) -> DataFrame:
    return df.withColumnsRenamed({n: f"{prefix}{n}" for n in names})


def with_deliveries(j: DataFrame, d: DataFrame | None) -> DataFrame:
    """``j`` with the last retry copy and dead-letter copy of each (message, group) from
    ``d`` (:func:`deliveries_frame`; broadcast: retried messages are few); null columns when
    none is known."""
    names = DELIVERY_COLS
    if d is None:
        return j.select(
            "*",
            F.lit(None).cast("int").alias("retry_reconsume"),
            *[F.lit(None).cast("long").alias(n) for n in names[1:]],
        )
    c = F.col
    return j.join(
        F.broadcast(d),
        (c("pkey") == c("d_pkey")) & (c("group_h") == c("d_group_h")),
        "left",
    ).drop("d_pkey", "d_group_h")


def meet(
    exp: DataFrame,
    agg: DataFrame,
    offsets: DataFrame,
    deliveries: DataFrame | None,
    p: Params,
    *,
    f_ms: int,
    t_ms: int,
    read_lo: int,
    cutoff: int,
) -> DataFrame:
    """Expected ⟗ consumed (co-partitioned by msgId: no shuffle), the expected side joined
    with the committed offsets (:func:`offsets_frame`) and both sides with the last deliveries
    first (``agg`` may have them already: :func:`consumed` with ``deliveries``): one row per
    (message, group[, client]) with its outcome and evidence (strings still hashed). Without
    ``p.keep_classified`` the CONSUMED rows keep only what the tally needs."""
    col = F.col
    # The committed offsets and the last deliveries are joined to each side before the full
    # outer join, not after it: its output (~50 columns) is too wide for whole-stage code, so
    # every broadcast join above it copied whole rows, while each side's rows are narrow
    # enough for the joins to run inside generated code. (Only expected rows have offsets:
    # the join uses the expected side's Pub facts.)
    exp = exp.join(
        F.broadcast(offsets),
        (col("group_h") == col("o_group_h"))
        & (col("e_topic_h") == col("o_topic_h"))
        & (col("e_store_h") == col("o_store_h"))
        & (col("e_queue_id") == col("o_queue_id"))
        & (col("ck") == col("o_client_h")),
        "left",
    ).select(*exp.columns, "o_committed")
    exp = _prefixed(with_deliveries(exp, deliveries), DELIVERY_COLS, "e_")
    if f"a_{DELIVERY_COLS[0]}" not in agg.columns:
        agg = _prefixed(with_deliveries(agg, deliveries), DELIVERY_COLS, "a_")
    j = exp.hint("shuffle_hash").join(agg, ["pkey", "group_h", "ck"], "full_outer")

    def pub(c: str) -> Column:
        return F.coalesce(col(f"e_{c}"), col(f"a_{c}"))

    expected = F.coalesce(col("expected"), F.lit(False)) & col("group_h").isNotNull()
    msg_level = F.coalesce(col("expected"), F.lit(False)) & col("group_h").isNull()
    has_consume = col("attempts").isNotNull()
    pub_ts = pub("pub_ts")
    msg_type = F.coalesce(pub("msg_type"), F.lit(0))
    due = pub_ts + F.when(
        msg_type == _MSG_DELAY, F.lit(max(p.max_delay_ms, p.horizon_ms))
    ).otherwise(p.horizon_ms)

    def delivery(c: str) -> Column:
        # one (message, group)'s last deliveries, on either side: the same row
        return F.coalesce(col(f"e_{c}"), col(f"a_{c}"))

    committed = col("o_committed")
    offset_applicable = ~msg_type.isin(_MSG_HALF, _MSG_DELAY)
    passed = offset_applicable & committed.isNotNull() & (committed > pub("queue_offset"))
    # The offsets' word on the message: its last delivery (the last retry copy, else the
    # original queue) is behind the group's committed offset — the listener returned and
    # nothing was sent back after it — and no dead-letter copy exists. Traces can be lost
    # in part (a SubAfter, a retry's records); offsets cannot, so they overrule a trace
    # that says FAILED or IN_FLIGHT. A traced failure of that last delivery (or a later
    # one) keeps the message unconsumed: it went back once more.
    has_copy = delivery("retry_reconsume").isNotNull()
    in_dlq = delivery("dlq_queue_offset").isNotNull()
    last_passed = F.when(
        has_copy,
        F.coalesce(delivery("retry_committed") > delivery("retry_queue_offset"), F.lit(False)),
    ).otherwise(passed)
    offsets_consumed = last_passed & ~in_dlq
    failed_last = F.coalesce(
        col("max_failed_retry") >= F.coalesce(delivery("retry_reconsume"), F.lit(0)), F.lit(False)
    )
    dead_traced = (col("dead_lettered") == 1) | (col("max_retry_times") >= p.max_reconsume_times)
    after_retry = (col("attempts") > 1) | (col("success_retry") > 0)
    first_ts = col("first_consume_ts")
    real_id = ~col("pkey").startswith("\u0000")
    created = _msg_id_created(col("pkey"), first_ts, p.msgid_timezone)
    orphan_ok = (
        (first_ts >= f_ms)
        & (first_ts < t_ms)
        & (~real_id | created.isNull() | (created >= read_lo))
    )
    is_half = msg_type == _MSG_HALF
    outcome = (
        F.when(msg_level & ~pub("pub_ok"), F.lit("PUB_FAILED"))
        .when(msg_level & (pub("recalled") == 1), F.lit("RECALLED"))
        .when(
            msg_level & is_half & (pub("tx_rollback") == 1) & (pub("tx_commit") == 0),
            F.lit("ROLLED_BACK"),
        )
        .when(msg_level & is_half & (pub("tx_commit") == 0), F.lit("TX_UNRESOLVED"))
        .when(msg_level, F.lit("NO_EXPECTED_GROUP"))
        .when(expected & has_consume & (col("successes") > 1), F.lit("DUPLICATE"))
        .when(
            expected & has_consume & (col("successes") == 1) & after_retry,
            F.lit("CONSUMED_AFTER_RETRY"),
        )
        .when(expected & has_consume & (col("successes") == 1), F.lit("CONSUMED"))
        .when(expected & in_dlq, F.lit("DEAD_LETTERED"))
        .when(
            expected
            & has_consume
            & offsets_consumed
            & ~F.coalesce(dead_traced, F.lit(False))
            & ~failed_last,
            F.lit("TRACE_INCOMPLETE"),
        )
        .when(expected & has_consume & (col("in_flight_attempts") > 0), F.lit("IN_FLIGHT"))
        .when(expected & has_consume & dead_traced, F.lit("DEAD_LETTERED"))
        .when(expected & has_consume, F.lit("FAILED"))
        # consumed by the offsets, no trace (so far): even inside the horizon it is not
        # "pending" — the trace is what is missing
        .when(expected & offsets_consumed, F.lit("TRACE_LOST"))
        .when(expected & (due > cutoff), F.lit("PENDING"))
        .when(expected, F.lit("NOT_CONSUMED"))
        # consumes nobody expected
        .when(
            col("a_pub_ts").isNotNull(),
            F.when(col("a_pub_ok") & col("a_in_window"), F.lit("UNEXPECTED_GROUP")),
        )
        .when(orphan_ok, F.lit("ORPHAN_CONSUME"))
    )
    # the rows that get an outcome (the same as "outcome is not null", but cheap: the
    # optimizer would otherwise evaluate the whole CASE twice)
    keep = (
        F.coalesce(col("expected"), F.lit(False))
        | (col("a_pub_ts").isNotNull() & col("a_pub_ok") & col("a_in_window"))
        | (col("a_pub_ts").isNull() & orphan_ok)
    )
    store_ref = F.when(pub("store_time") > 0, pub("store_time")).otherwise(
        pub_ts + pub("send_cost")
    )
    event_ts = F.when(pub_ts.isNotNull(), pub_ts).otherwise(first_ts)
    window_start = F.floor(event_ts / p.window_ms).cast("long") * p.window_ms
    keep_id = F.lit(True) if p.keep_classified else col("outcome") != "CONSUMED"
    df = (
        j.where(keep)
        .select(
            outcome.alias("outcome"),
            "pkey",
            real_id.alias("real_id"),
            window_start.alias("window_start_ms"),
            F.coalesce(pub("topic_h"), col("c_topic_h")).alias("topic_h"),
            "group_h",
            F.when(col("ck") != 0, col("ck")).alias("client_h"),
            pub_ts.alias("pub_ts"),
            pub("msg_type").alias("msg_type"),
            # (kept so that both uses of the Pub shuffle read the same columns: reused)
            pub("tags_h").alias("tags_h"),
            pub("store_h").alias("store_h"),
            pub("queue_id").alias("queue_id"),
            pub("queue_offset").alias("queue_offset"),
            committed.alias("committed_offset"),
            *[delivery(c).alias(c) for c in DELIVERY_COLS],
            due.alias("due_ts"),
            F.coalesce(col("attempts"), F.lit(0)).alias("attempts"),
            F.coalesce(col("successes"), F.lit(0)).alias("successes"),
            F.coalesce(col("failed_attempts"), F.lit(0)).alias("failed_attempts"),
            F.coalesce(col("in_flight_attempts"), F.lit(0)).alias("in_flight_attempts"),
            "max_retry_times",
            "max_failed_retry",
            F.coalesce(col("consume_events"), F.lit(0)).alias("consume_events"),
            first_ts.alias("first_consume_ts"),
            "success_ts",
            pub("send_cost").alias("send_cost_ms"),
            (col("first_before_ts") - store_ref).alias("store_to_consume_ms"),
            col("success_cost").alias("consume_cost_ms"),
            (col("success_ts") - pub_ts).alias("end_to_end_ms"),
            *[pub(c).alias(c) for c in PUB_STRINGS],
        )
        .withColumn("msg_id", F.when(col("real_id") & keep_id, col("pkey")))
        .drop("pkey", "real_id")
    )
    if p.keep_classified:
        return df
    # CONSUMED rows (most of them) only feed the tally: their evidence columns are left
    # null, which Parquet stores for next to nothing
    tallied = set(TALLIED_COLS)
    return df.select(
        *[col(c) if c in tallied else F.when(keep_id, col(c)).alias(c) for c in df.columns]
    )


# ---- the co-group by msgId (the JVM path: tracemq_spark.cogroup) ---------------------------

#: :func:`meet`'s columns (the classified rows), in order; the counts are not null with
#: ``--keep-classified`` (coalesced; without it CONSUMED rows leave them null)
CLASSIFIED_COLS = {
    "outcome": "string",
    "window_start_ms": "bigint",
    "topic_h": "bigint",
    "group_h": "bigint",
    "client_h": "bigint",
    "pub_ts": "bigint",
    "msg_type": "int",
    "tags_h": "bigint",
    "store_h": "bigint",
    "queue_id": "int",
    "queue_offset": "bigint",
    "committed_offset": "bigint",
    "retry_reconsume": "int",
    "retry_queue_offset": "bigint",
    "retry_committed": "bigint",
    "dlq_queue_offset": "bigint",
    "due_ts": "bigint",
    "attempts": "bigint",
    "successes": "bigint",
    "failed_attempts": "bigint",
    "in_flight_attempts": "bigint",
    "max_retry_times": "int",
    "max_failed_retry": "int",
    "consume_events": "bigint",
    "first_consume_ts": "bigint",
    "success_ts": "bigint",
    "send_cost_ms": "bigint",
    "store_to_consume_ms": "bigint",
    "consume_cost_ms": "bigint",
    "end_to_end_ms": "bigint",
    **{c: "string" for c in PUB_STRINGS},
    "msg_id": "string",
}
_COUNTS = {"attempts", "successes", "failed_attempts", "in_flight_attempts", "consume_events"}


def classified_schema(keep_classified: bool) -> T.StructType:
    """:func:`meet`'s schema, without planning it (``tests/spark/test_cogroup.py`` holds the
    two equal): the JVM path's rows have it."""
    types = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType()}
    return T.StructType(
        [
            T.StructField(name, types[typ], nullable=not (keep_classified and name in _COUNTS))
            for name, typ in CLASSIFIED_COLS.items()
        ]
    )


#: the co-group's input columns and their types, in the order the JVM code reads them
#: (spark/jvm/src/main/java/io/tracemq/spark/Task.java): the msgId, its hash, the side (0
#: producer, 1 consume, 2 last delivery), the event's time and cost, then slots each side
#: fills with its own columns (:data:`COGROUP_SLOTS`) — a row is as narrow as the widest side
COGROUP_COLS = {
    "pkey": "string",
    "k": "bigint",
    "side": "int",
    "timestamp": "bigint",
    "cost_time": "bigint",
    "l1": "bigint",
    "l2": "bigint",
    "l3": "bigint",
    "l4": "bigint",
    "l5": "bigint",
    "l6": "bigint",
    "i1": "int",
    "i2": "int",
    "flags": "int",
    "s1": "string",
    "s2": "string",
    "s3": "string",
    "s4": "string",
}


def cogroup_schema() -> T.StructType:
    """The co-group's input rows (:data:`COGROUP_COLS`) as a Spark schema."""
    types = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType()}
    return T.StructType([T.StructField(n, types[t]) for n, t in COGROUP_COLS.items()])


#: what each side puts in the slots: producer (_producer_side), consume (_consume_side), last
#: delivery (deliveries_frame); ``flags`` packs three nullable 0/1 values, two bits each
#: (0 false, 1 true, 2 null)
COGROUP_SLOTS = {
    "l1": ("o", "rid", "d_group_h"),
    "l2": ("store_time", "gh", "retry_queue_offset"),
    "l3": ("queue_offset", "ch", "retry_committed"),
    "l4": ("topic_h", "th", "dlq_queue_offset"),
    "l5": ("tags_h", None, None),
    "l6": ("store_h", None, None),
    "i1": ("msg_type", "retry_times", "retry_reconsume"),
    "i2": ("queue_id", None, None),
    "flags": (("is_commit", "is_rollback", "is_recall"), ("b", "d", "success"), None),
    **{f"s{i}": (name, None, None) for i, name in enumerate(PUB_STRINGS, 1)},
}


def _flags(values: list[Column]) -> Column:
    """Nullable 0/1 (or boolean) values packed two bits each: 0 false, 1 true, 2 null."""
    out: Column = F.lit(0)
    for i, v in enumerate(values):
        code = F.when(v.isNull(), F.lit(2)).when(v.cast("int") == 1, F.lit(1)).otherwise(F.lit(0))
        out = out + code * (1 << (2 * i))
    return out


def cogroup_input(
    ev: DataFrame,
    deliveries: DataFrame | None,
    *,
    base: int,
    n_parts: int,
    sort_key: Callable[[Column, Column], Column] | None = None,
) -> DataFrame:
    """Every row the classification reads, one lake scan for both sides, plus the last
    deliveries (:func:`deliveries_frame`), in :data:`COGROUP_COLS`: hash-partitioned by ``k``
    — the msgId's xxhash64, or ``sort_key(pkey, hash)``, any function of the msgId
    (:func:`tracemq_spark.cogroup.sort_key`: roughly its creation time). The JVM code
    (:mod:`tracemq_spark.cogroup`) sorts each partition by ``k`` or a function of the msgId
    and ``k`` (``by_creation``; Spark's sorter, called directly), so that one msgId's rows
    are one run of a task's input (a run can hold two msgIds of one key: it splits it), and
    classifies each run in one pass."""
    return _cogroup_rows(ev, deliveries, base=base, sort_key=sort_key).repartition(n_parts, "k")


def cogroup_sides(ev: DataFrame, deliveries: DataFrame | None, *, base: int) -> list[DataFrame]:
    """:func:`cogroup_input`'s rows, not partitioned, as one frame per side — the lake's
    events (:func:`event_side`), then the last deliveries if any (:func:`delivery_side`)."""
    d = None if deliveries is None else delivery_side(deliveries)
    return [event_side(ev, base=base), *([d] if d is not None else [])]


def event_side(ev: DataFrame, *, base: int) -> DataFrame:
    """The lake's events of :func:`cogroup_input`, not partitioned, in :data:`COGROUP_COLS`
    and :data:`RANGE_KEY`, the msgId as read (the lake's ``msg_id``): what
    :func:`tracemq_spark.cogroup.split` splits by msgId range instead of a shuffle by hash.
    A side of its own so that the job plans it while the last deliveries' file is still
    being written (:mod:`tracemq_spark.job`)."""
    return _keyed(_event_rows(ev, base, range_key=True), range_key=True)


def delivery_side(deliveries: DataFrame) -> DataFrame:
    """The last deliveries of :func:`cogroup_input`, as :func:`event_side` (:data:`RANGE_KEY`:
    their ``d_pkey``)."""
    rows = _delivery_rows(deliveries, range_key=True)
    assert rows is not None
    return _keyed(rows, range_key=True)


#: :func:`cogroup_sides`' column of the msgId a row's range is decided by
RANGE_KEY = "_range_key"


def _cogroup_rows(
    ev: DataFrame,
    deliveries: DataFrame | None,
    *,
    base: int,
    sort_key: Callable[[Column, Column], Column] | None = None,
) -> DataFrame:
    """The rows of :func:`cogroup_input`, in :data:`COGROUP_COLS`, not yet partitioned."""
    rows = _event_rows(ev, base)
    d = _delivery_rows(deliveries)
    if d is not None:
        rows = rows.unionByName(d)
    return _keyed(rows, sort_key=sort_key)


def _event_rows(ev: DataFrame, base: int, range_key: bool = False) -> DataFrame:
    """The lake's side: each event of the producer or the consume side as a row of
    :data:`COGROUP_COLS` but ``k`` (:func:`_keyed` adds it)."""
    col = F.col
    p_cond, p_cols = _producer_side(base)
    c_cond, c_cols = _consume_side()
    # the side once per row (a projection would inline a condition used in every slot)
    rows = ev.where(F.coalesce(p_cond, F.lit(False)) | F.coalesce(c_cond, F.lit(False))).select(
        F.when(F.coalesce(p_cond, F.lit(False)), F.lit(0)).otherwise(F.lit(1)).alias("side"),
        *ev.columns,
    )
    is_p = col("side") == 0

    def slot(name: str, of_p: Any, of_c: Any) -> Column:
        def pick(cols: dict[str, Column], what: Any) -> Column:
            if what is None:
                return F.lit(None)
            if isinstance(what, tuple):
                return _flags([cols[w] for w in what])
            return cols[what]

        return (
            F.when(is_p, pick(p_cols, of_p))
            .otherwise(pick(c_cols, of_c))
            .cast(COGROUP_COLS[name])
            .alias(name)
        )

    return rows.select(
        F.when(is_p, p_cols["pkey"]).otherwise(c_cols["pkey"]).alias("pkey"),
        col("side"),
        col("timestamp"),
        col("cost_time"),
        *[slot(name, of_p, of_c) for name, (of_p, of_c, _) in COGROUP_SLOTS.items()],
        *([col("msg_id").alias(RANGE_KEY)] if range_key else []),
    )


def _delivery_rows(deliveries: DataFrame | None, range_key: bool = False) -> DataFrame | None:
    """The last deliveries' side (None without any), as :func:`_event_rows`."""
    if deliveries is None:
        return None
    col = F.col
    # (a delivery without msgId meets nothing: the joins' null keys)
    return deliveries.where(col("d_pkey").isNotNull()).select(
        col("d_pkey").alias("pkey"),
        F.lit(2).alias("side"),
        F.lit(None).cast("bigint").alias("timestamp"),
        F.lit(None).cast("bigint").alias("cost_time"),
        *[
            (F.lit(None) if of_d is None else col(of_d)).cast(COGROUP_COLS[name]).alias(name)
            for name, (_, _, of_d) in COGROUP_SLOTS.items()
        ],
        *([col("d_pkey").alias(RANGE_KEY)] if range_key else []),
    )


def _keyed(
    rows: DataFrame,
    *,
    sort_key: Callable[[Column, Column], Column] | None = None,
    range_key: bool = False,
) -> DataFrame:
    """``rows`` with ``k`` (the msgId's xxhash64, or ``sort_key`` of it), in
    :data:`COGROUP_COLS` (and :data:`RANGE_KEY` with ``range_key``)."""
    col = F.col
    h = F.xxhash64(col("pkey"))
    # (the columns in COGROUP_COLS' order before the exchange: no projection above it, so
    # the JVM code reads the shuffle's rows as they come and sorts them itself)
    return rows.select(
        col("pkey"),
        (h if sort_key is None else sort_key(col("pkey"), h)).alias("k"),
        *[c for c in rows.columns[1:] if c != RANGE_KEY],
        *([col(RANGE_KEY)] if range_key else []),
    ).select(*COGROUP_COLS, *([RANGE_KEY] if range_key else []))

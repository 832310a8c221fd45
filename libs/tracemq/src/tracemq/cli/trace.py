"""``tracemq trace show MSG_ID`` and ``tracemq trace find --key K``: look-ups through the
collector API (``--url``, ``TRACEMQ_COLLECTOR_URL`` or the running ``tracemq dev up`` stack)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer

from tracemq import collector_client
from tracemq.cli._console import console, fit
from tracemq.cli._errors import Unreachable, UsageError
from tracemq.cli._time import TIME_HELP, parse_time

if TYPE_CHECKING:
    from rich.table import Table

app = typer.Typer(help="Look up message traces through the collector.", no_args_is_help=True)


def _ts(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def trace_table(view: dict[str, Any]) -> Table:
    """RocketMQ's queryMsgTraceById layout, one block per consumer group."""
    from rich.table import Table

    table = Table(title=f"trace of {view['msg_id']} (topic {view['topic']})")
    # "client": the client id (host@instance) where the trace names it, else the host
    for col in ("type", "group", "client", "time (UTC)", "cost ms", "retry", "status"):
        table.add_column(col)
    p = view.get("producer")
    if p:
        table.add_row(
            "Pub",
            p["group"] or "-",
            p.get("client_id") or p.get("client_host") or "-",
            _ts(p["timestamp"]),
            str(p["cost_time"]),
            "-",
            "success" if p["success"] else "failed",
        )
    for t in view.get("transactions", []):
        table.add_row(
            "EndTransaction",
            t["group"] or "-",
            "-",
            _ts(t["timestamp"]),
            "-",
            "-",
            t["transaction_state"] or "-",
        )
    for r in view.get("recalls", []):
        table.add_row(
            "Recall",
            r["group"] or "-",
            "-",
            _ts(r["timestamp"]),
            "-",
            "-",
            "recalled" if r["success"] else "not recalled",
        )
    for c in view.get("consumers", []):
        table.add_section()
        for a in c["attempts"]:
            table.add_row(
                "Sub",
                c["group"] or "-",
                a.get("client_id") or a.get("client_host") or "-",
                _ts(a["begin"]),
                "-" if a["cost_time"] is None else str(a["cost_time"]),
                "-" if a["retry_times"] is None else str(a["retry_times"]),
                a["status"]
                + (
                    f" ({a['context_code_name']})"
                    if a["status"] == "failed" and a.get("context_code_name")
                    else ""
                ),
            )
    return fit(table)


@app.command("show")
def show(
    msg_id: str,
    as_json: bool = typer.Option(False, "--json", help="Print the JSON view."),
    url: str | None = typer.Option(None, help="Collector API URL."),
) -> None:
    """The trace of one message: producer, transactions, every consumer group's attempts."""
    view = collector_client.locate(url).trace(msg_id)
    if as_json:
        typer.echo(json.dumps(view, indent=2))
    else:
        console().print(trace_table(view))


@app.command("find")
def find(
    key: str = typer.Option(..., "--key", "-k", help="Business key."),
    topic: str | None = typer.Option(None, help="Only this topic."),
    begin: str | None = typer.Option(None, help=f"From ({TIME_HELP})."),
    end: str | None = typer.Option(None, help=f"To ({TIME_HELP})."),
    limit: int = typer.Option(50, min=1, help="At most this many (per collector)."),
    as_json: bool = typer.Option(False, "--json"),
    url: str | None = typer.Option(None, help="Collector API URL."),
) -> None:
    """Messages carrying a business key, newest first (exit 1 when none)."""
    from tracemq.naming import validate_topic

    if topic is not None:
        try:
            validate_topic(topic)
        except ValueError as exc:
            raise UsageError(f"--topic: {exc}") from None
    begin_ms = parse_time(begin, "--begin") if begin else None
    end_ms = parse_time(end, "--end") if end else None
    res = collector_client.locate(url).find(
        key, topic=topic, begin_ms=begin_ms, end_ms=end_ms, limit=limit
    )
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"messages with key {key!r}")
    for col in ("msg id", "topic", "time (UTC)", "tags", "keys"):
        table.add_column(col)
    for it in res["items"]:
        table.add_row(
            it["msg_id"],
            it["topic"] or "-",
            _ts(it["timestamp"]),
            it.get("tags") or "-",
            it.get("keys") or "-",
        )
    if not res["items"]:
        typer.echo(
            f"no message with key {key!r}" + (f" in topic {topic}" if topic else ""), err=True
        )
        raise typer.Exit(1)
    console().print(fit(table, keep=("msg id",)))


@app.command("lag")
def lag(
    wait: float = typer.Option(
        0,
        min=0,
        help="Wait up to this many seconds until the collectors have caught up (exit 1 if not).",
    ),
    group: str = typer.Option("tracemq-collector", help="The collectors' consumer group."),
    trace_topic: list[str] | None = typer.Option(  # noqa: B008 - typer reads it, never mutated
        None, help="Trace topics (default RMQ_SYS_TRACE_TOPIC; repeat for several)."
    ),
    redis_url: str | None = typer.Option(None, help="Routing Redis (default: TRACEMQ_REDIS_URL)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """How many trace messages the collectors have not yet made durable in store and lake."""
    import asyncio

    from aiokafka.errors import KafkaError

    from tracemq.cli._connection import resolve
    from tracemq.cli._errors import reaching
    from tracemq.collector_lag import collector_lag, wait_caught_up
    from tracemq.naming import TRACE_TOPIC

    conn = resolve(redis_url)
    kw: dict[str, Any] = {
        "group": group,
        "trace_topics": tuple(trace_topic or [TRACE_TOPIC]),
        "redis_prefix": conn.redis_prefix,
    }
    try:
        with reaching("Redis", conn.redis_url, "check `tracemq dev status` or --redis-url"):
            if wait > 0:
                parts = asyncio.run(wait_caught_up(conn.redis_url, timeout_s=wait, **kw))
            else:
                parts = asyncio.run(collector_lag(conn.redis_url, **kw))
    except TimeoutError as exc:
        console().print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    except (OSError, KafkaError) as exc:
        raise Unreachable(f"cannot read the trace topics' offsets: {exc!r}") from None
    if not parts:
        typer.echo(f"no route for trace topic(s) {', '.join(kw['trace_topics'])}", err=True)
        raise typer.Exit(1)
    total = sum(p.lag for p in parts)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "lag": total,
                    "resets": sum(p.resets for p in parts),
                    "partitions": [p.to_dict() for p in parts],
                }
            )
        )
    else:
        from rich.table import Table

        table = Table(title=f"trace collector lag (group {group})")
        for col in ("trace topic", "broker", "queue", "end", "committed", "lag", "offset"):
            table.add_column(col)
        for p in parts:
            table.add_row(
                p.trace_topic,
                p.broker,
                str(p.queue_id),
                str(p.end),
                str(p.committed),
                str(p.lag),
                _offset_state(p),
            )
        console().print(table)


def _offset_state(p: Any) -> str:
    """``ok``, a committed offset outside the log (reset due), and the resets made so far."""
    if p.state == "end_unconfirmed":
        text = (
            f"[yellow]end unconfirmed: the log's last batch could not be read (end >= {p.end})[/]"
        )
    elif p.state != "ok":
        text = f"[red]{p.state}: committed outside [{p.log_start}, {p.end}], reset due[/]"
    else:
        text = "ok"
    if p.resets:
        last = p.last_reset or {}
        text += (
            f"; [yellow]reset {p.resets}x[/] (last {last.get('from')} → {last.get('to')}, "
            f"{last.get('reason')}, {_ts(last.get('at_ms'))})"
        )
    return text

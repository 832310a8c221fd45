"""``tracemq trace show MSG_ID`` and ``tracemq trace find --key K``: look-ups through the
collector API (``--url``, ``TRACEMQ_COLLECTOR_URL`` or the running ``tracemq dev up`` stack)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import typer

from tracemq.cli._connection import dev_state
from tracemq.cli._console import console, fit
from tracemq.cli._errors import CliError, Unreachable, UsageError
from tracemq.cli._time import TIME_HELP, parse_time

if TYPE_CHECKING:
    from rich.table import Table

app = typer.Typer(help="Look up message traces through the collector.", no_args_is_help=True)


class LookupError_(CliError):
    """The collector answered with an error (a missing trace, a refused query)."""


def collector_url(url: str | None) -> str:
    found = (
        url or os.environ.get("TRACEMQ_COLLECTOR_URL") or (dev_state() or {}).get("collector_api")
    )
    if not found:
        raise Unreachable(
            "no collector: pass --url, set TRACEMQ_COLLECTOR_URL, or run "
            "`tracemq dev up --collector`"
        )
    found = str(found).rstrip("/")
    parts = urllib.parse.urlsplit(found)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        where = (
            "--url"
            if url
            else "TRACEMQ_COLLECTOR_URL"
            if os.environ.get("TRACEMQ_COLLECTOR_URL")
            else "the running stack's collector URL"
        )
        raise UsageError(f"{where}: {found!r} is not a collector URL (like http://127.0.0.1:8080)")
    return found


def collector_token(url: str) -> str | None:
    """``TRACEMQ_COLLECTOR_API_TOKEN``, else the running stack's when ``url`` is its collector
    (``tracemq dev up`` generates one and keeps it in its 0600 state file; it is never sent to
    another URL), else none."""
    env = os.environ.get("TRACEMQ_COLLECTOR_API_TOKEN")
    if env:
        return env
    try:
        state = dev_state() or {}
    except UsageError:  # several stacks and none picked: no token to guess
        return None
    if str(state.get("collector_api") or "").rstrip("/") == url:
        return str(state.get("collector_api_token") or "") or None
    return None


def get_json(url: str, path: str, params: dict[str, Any] | None = None) -> Any:
    """The one place the CLI builds a request to the collector API (its bearer token too)."""
    query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
    req = urllib.request.Request(f"{url}{path}" + (f"?{query}" if query else ""))  # noqa: S310
    token = collector_token(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error")
        except ValueError:
            detail = exc.reason
        if exc.code == 401:
            raise LookupError_(
                f"the collector at {url} refused the token ({detail}); set "
                "TRACEMQ_COLLECTOR_API_TOKEN (`tracemq dev status` shows the dev stack's)"
            ) from None
        raise LookupError_(f"the collector at {url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(
            f"the collector at {url} did not answer ({reason}); check `tracemq dev status`, "
            "--url or TRACEMQ_COLLECTOR_URL"
        ) from None
    except ValueError as exc:  # not JSON: something else listens there (the viewer page?)
        raise LookupError_(f"{url}{path} did not answer JSON: {exc}") from None


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
    view = get_json(collector_url(url), f"/api/v1/traces/{urllib.parse.quote(msg_id)}")
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
    res = get_json(
        collector_url(url),
        "/api/v1/traces",
        {"key": key, "topic": topic, "begin": begin_ms, "end": end_ms, "limit": limit},
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
    if p.state != "ok":
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

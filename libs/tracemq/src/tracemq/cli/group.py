"""``tracemq group status [GROUP]``: consumer-group health through the collector API
(``/api/v1/groups``): per group and topic the lag in messages and in time (age of the oldest
unconsumed message), consume / failure / retry / dead-letter rates, the last consume.

Exit 0 with a table (or ``--json``); exit 1 for a group the routing database never saw.
"""

from __future__ import annotations

import json

import typer

from tracemq import collector_client
from tracemq.cli._console import console, fit
from tracemq.cli.trace import _ts

app = typer.Typer(help="Consumer-group health.", no_args_is_help=True)


def age(ms: int | None) -> str:
    """A duration for a table cell: ``850ms``, ``42s``, ``7m05s``, ``3h12m``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _rate(v: float) -> str:
    return "0" if not v else f"{v:g}"


@app.command("status")
def status(
    group: str | None = typer.Argument(None, help="One consumer group (default: every group)."),
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON."),
    url: str | None = typer.Option(None, help="Collector API URL."),
) -> None:
    """Lag (messages and age of the oldest unconsumed one), rates per minute over the last
    5 minutes, and the last consume, per consumer group and topic."""
    res = collector_client.locate(url).groups(group)
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    from rich.table import Table

    title = f"consumer group {group}" if group else "consumer groups"
    table = Table(title=f"{title} (rates per minute, last 5 min)")
    cols = (
        "group", "topic", "state", "lag", "lag age", "consume", "fail", "retry", "dlq",
        "last consume (UTC)",
    )  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right" if col in cols[3:9] else "left")
    for g in res["groups"]:
        table.add_section()
        for t in g["topics"]:
            r = t["rates_per_min"]
            table.add_row(
                g["group"],
                t["topic"],
                g["state"],
                "-" if t["lag"] is None else str(t["lag"]),
                age(t["lag_age_ms"]),
                _rate(r["consume"]),
                _rate(r["failure"]),
                _rate(r["retry"]),
                _rate(r["dead_letter"]),
                _ts(t["last_consume"]),
            )
        if not g["topics"]:
            table.add_row(g["group"], "-", g["state"], "-", "-", "-", "-", "-", "-", "-")
    out = console()
    out.print(fit(table, keep=("group", "topic")))
    notes = [f"{g['group']}: {g['offsets_note']}" for g in res["groups"] if g.get("offsets_note")]
    if res.get("activity_truncated"):
        notes.append("the last hour held more consume events than a collector reads: rates cut")
    notes += [
        f"collector {p.get('peer')} did not answer ({p.get('reason')})"
        for p in res.get("peers_failed") or []
    ]
    for n in notes:
        typer.echo(n, err=True)
    if not res["groups"]:
        typer.echo("no consumer group has subscribed yet", err=True)

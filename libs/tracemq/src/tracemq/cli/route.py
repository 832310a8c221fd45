"""``tracemq route show TOPIC``: which brokers host a topic, with how many queues."""

from __future__ import annotations

import asyncio
import json

import typer

from tracemq.cli._connection import resolve
from tracemq.cli._console import console, fit
from tracemq.cli._errors import UsageError, reaching

app = typer.Typer(help="Inspect routes.", no_args_is_help=True)


@app.command("show")
def show(
    topic: str = typer.Argument(..., help="RocketMQ topic name"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    redis_url: str | None = typer.Option(None, help="Routing database URL."),
) -> None:
    """Show the route of TOPIC (exit 1 when no broker hosts it)."""
    from rich.table import Table

    from tracemq.naming import validate_topic
    from tracemq.routing import RegistryReader, connect

    try:
        validate_topic(topic)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    conn = resolve(redis_url=redis_url)

    async def fetch() -> dict[str, object]:
        r = connect(conn.redis_url)
        try:
            return (await RegistryReader(r, conn.redis_prefix).topic_route(topic)).to_dict()
        finally:
            await r.aclose()

    with reaching("Redis", conn.redis_url, "check `tracemq dev status` or --redis-url"):
        route = asyncio.run(fetch())
    brokers = route["brokers"]
    assert isinstance(brokers, list)
    if not brokers:
        typer.echo(f"no route for topic {topic!r}: no live broker hosts it", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(route, indent=2))
        return
    table = Table(title=f"route of {topic}")
    for col in (
        "broker",
        "cluster",
        "read queues",
        "write queues",
        "perm",
        "data bootstrap",
        "region",
        "trace on",
    ):
        table.add_column(col)
    for b in brokers:
        table.add_row(
            b["broker"],
            b["cluster"],
            str(b["read_queues"]),
            str(b["write_queues"]),
            str(b["perm"]),
            b["data_bootstrap"],
            b["region_id"],
            str(b["trace_on"]).lower(),
        )
    console().print(fit(table))

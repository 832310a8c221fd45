"""``tracemq topic create|update|delete|list``: topic admin on a broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import typer

from tracemq.cli._connection import resolve
from tracemq.cli._console import console, fit
from tracemq.cli._errors import reaching
from tracemq.redis_url import redact

if TYPE_CHECKING:
    from tracemq.admin import AdminClient

app = typer.Typer(help="Create, update, delete and list topics on a broker.", no_args_is_help=True)

BrokerOpt = typer.Option(..., "--broker", "-b", help="Target broker name, e.g. broker-a.")
RedisOpt = typer.Option(None, "--redis-url", help="Routing database URL (default: the stack's).")
BootstrapOpt = typer.Option(
    None, "--bootstrap", help="Kafka bootstrap of the control topic (default: the stack's)."
)
JsonOpt = typer.Option(False, "--json", help="Print JSON.")

_HINT = "check `tracemq dev status`, --redis-url and --bootstrap"


def _call(
    call: Callable[[AdminClient], Awaitable[dict[str, Any]]],
    redis_url: str | None,
    bootstrap: str | None,
) -> dict[str, Any]:
    from tracemq.admin import AdminClient

    conn = resolve(redis_url, bootstrap)

    async def go() -> dict[str, Any]:
        admin = AdminClient(
            conn.control_bootstrap,
            conn.redis_url,
            redis_prefix=conn.redis_prefix,
            signer=conn.admin_signer,
        )
        try:  # close what start() opened even when it fails half-way
            await admin.start()
            return await call(admin)
        finally:
            await admin.close()

    where = f"{conn.control_bootstrap} (Redis {redact(conn.redis_url)})"
    with reaching("the control Kafka", where, _HINT):
        return asyncio.run(go())


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    from rich.table import Table

    table = Table(show_header=True)
    table.add_column("field")
    table.add_column("value")
    for k, v in sorted(result.items()):
        table.add_row(k, v if isinstance(v, str) else json.dumps(v))
    console().print(fit(table, keep=("value",)))


@app.command("create")
def create(
    topic: str,
    broker: str = BrokerOpt,
    read_queues: int = typer.Option(8, "--read-queues", "-r", min=1, max=1024, help="1..1024"),
    write_queues: int = typer.Option(8, "--write-queues", "-w", min=1, max=1024, help="1..1024"),
    perm: int = typer.Option(
        6, min=0, max=7, help="RocketMQ perm bits: 4 read, 2 write (6 = read+write)."
    ),
    redis_url: str | None = RedisOpt,
    bootstrap: str | None = BootstrapOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Create TOPIC on a broker."""
    res = _call(
        lambda a: a.create_topic(
            broker, topic, read_queues=read_queues, write_queues=write_queues, perm=perm
        ),
        redis_url,
        bootstrap,
    )
    _print(res, as_json)


@app.command("update")
def update(
    topic: str,
    broker: str = BrokerOpt,
    read_queues: int | None = typer.Option(None, "--read-queues", "-r", min=1, max=1024),
    write_queues: int | None = typer.Option(None, "--write-queues", "-w", min=1, max=1024),
    perm: int | None = typer.Option(None, min=0, max=7),
    redis_url: str | None = RedisOpt,
    bootstrap: str | None = BootstrapOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Change queue counts or perm of TOPIC on a broker."""
    res = _call(
        lambda a: a.update_topic(
            broker, topic, read_queues=read_queues, write_queues=write_queues, perm=perm
        ),
        redis_url,
        bootstrap,
    )
    _print(res, as_json)


@app.command("delete")
def delete(
    topic: str,
    broker: str = BrokerOpt,
    redis_url: str | None = RedisOpt,
    bootstrap: str | None = BootstrapOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Delete TOPIC from a broker (its Kafka topic and data go too)."""
    _print(_call(lambda a: a.delete_topic(broker, topic), redis_url, bootstrap), as_json)


@app.command("list")
def list_(
    broker: str = BrokerOpt,
    redis_url: str | None = RedisOpt,
    bootstrap: str | None = BootstrapOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List the topic table of a broker."""
    res = _call(lambda a: a.list_topics(broker), redis_url, bootstrap)
    if as_json:
        typer.echo(json.dumps(res, indent=2, sort_keys=True))
        return
    from rich.table import Table

    table = Table(title=f"topics of {broker}")
    for col in ("topic", "read queues", "write queues", "perm"):
        table.add_column(col)
    for name, cfg in sorted((res.get("topics") or {}).items()):
        table.add_row(
            name, str(cfg.get("read_queues")), str(cfg.get("write_queues")), str(cfg.get("perm"))
        )
    console().print(fit(table, keep=("topic",)))

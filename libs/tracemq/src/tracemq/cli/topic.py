"""``tracemq topic create|update|delete|list``: topic admin on a broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import typer

from tracemq.admin import AdminClient
from tracemq.cli._connection import resolve

app = typer.Typer(help="Create, update, delete and list topics on a broker.", no_args_is_help=True)

BrokerOpt = typer.Option(..., "--broker", "-b", help="Target broker name, e.g. broker-a.")


def _run(call: Callable[[AdminClient], Awaitable[dict[str, Any]]]) -> None:
    conn = resolve()

    async def go() -> dict[str, Any]:
        async with AdminClient(
            conn.control_bootstrap, conn.redis_url, redis_prefix=conn.redis_prefix
        ) as admin:
            return await call(admin)

    typer.echo(json.dumps(asyncio.run(go()), indent=2, sort_keys=True))


@app.command("create")
def create(
    topic: str,
    broker: str = BrokerOpt,
    read_queues: int = typer.Option(8, "--read-queues", "-r", help="1..1024"),
    write_queues: int = typer.Option(8, "--write-queues", "-w", help="1..1024"),
    perm: int = typer.Option(6, help="RocketMQ perm bits: 4 read, 2 write (6 = read+write)."),
) -> None:
    """Create TOPIC on a broker."""
    _run(
        lambda a: a.create_topic(
            broker, topic, read_queues=read_queues, write_queues=write_queues, perm=perm
        )
    )


@app.command("update")
def update(
    topic: str,
    broker: str = BrokerOpt,
    read_queues: int | None = typer.Option(None, "--read-queues", "-r"),
    write_queues: int | None = typer.Option(None, "--write-queues", "-w"),
    perm: int | None = typer.Option(None),
) -> None:
    """Change queue counts or perm of TOPIC on a broker."""
    _run(
        lambda a: a.update_topic(
            broker, topic, read_queues=read_queues, write_queues=write_queues, perm=perm
        )
    )


@app.command("delete")
def delete(topic: str, broker: str = BrokerOpt) -> None:
    """Delete TOPIC from a broker (its Kafka topic and data go too)."""
    _run(lambda a: a.delete_topic(broker, topic))


@app.command("list")
def list_(broker: str = BrokerOpt) -> None:
    """List the topic table of a broker."""
    _run(lambda a: a.list_topics(broker))

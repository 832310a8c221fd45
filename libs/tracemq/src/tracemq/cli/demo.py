"""``tracemq demo``: the main job on the embedded stack, end to end.

Today: start the stack, create the business topic, show its route and the trace topic's route.
Later issues add the traced workload, the trace look-up and the reconciliation summary.
"""

from __future__ import annotations

import asyncio
import signal
import time

import typer
from rich.table import Table

from tracemq.admin import AdminClient
from tracemq.cli._console import console
from tracemq.devstack import EmbeddedStack, StackConfig
from tracemq.routing import RegistryReader, TopicRoute, connect

DEMO_TOPIC = "TopicTest"


def _route_table(route: TopicRoute) -> Table:
    table = Table(title=f"route of {route.topic}")
    for col in ("broker", "cluster", "queues (r/w)", "perm", "data cluster"):
        table.add_column(col)
    for q in route.queues:
        table.add_row(
            q.broker, q.cluster, f"{q.read_queues}/{q.write_queues}", str(q.perm), q.data_bootstrap
        )
    return table


async def _setup_topic(stack: EmbeddedStack, queues: int) -> list[TopicRoute]:
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as admin:
        await admin.create_topic("broker-a", DEMO_TOPIC, read_queues=queues, write_queues=queues)
    r = connect(stack.redis_url)
    try:
        reader = RegistryReader(r)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            route = await reader.topic_route(DEMO_TOPIC)
            if route.queues:
                break
            await asyncio.sleep(0.1)
        return [
            await reader.topic_route(DEMO_TOPIC),
            await reader.topic_route("RMQ_SYS_TRACE_TOPIC"),
        ]
    finally:
        await r.aclose()


def demo(
    keep_running: bool = typer.Option(
        False, "--keep-running", help="Keep the stack up until Ctrl-C."
    ),
    queues: int = typer.Option(4, help="Queues of the demo topic."),
) -> None:
    """Run the demo on the embedded stack."""
    out = console()

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stack = EmbeddedStack(StackConfig())
    try:
        with out.status(
            "starting the embedded stack (2 Kafka clusters, Redis, nameserver, "
            "broker-a, trace-broker)…"
        ):
            stack.start()
        out.print(
            f"[green]stack up[/] — business Kafka {stack.business_bootstrap}, "
            f"trace Kafka {stack.trace_bootstrap}, Redis {stack.redis_url}"
        )
        routes = asyncio.run(_setup_topic(stack, queues))
        for route in routes:
            out.print(_route_table(route))
        if not routes[0].queues or not routes[1].queues:
            out.print("[red]a route is missing[/]")
            raise typer.Exit(1)
        if keep_running:
            out.print("stack and routes are up; Ctrl-C stops everything")
            while all(p.alive() for p in stack.processes.values()):
                time.sleep(1)
            out.print("[red]a process died[/]")
            raise typer.Exit(1)
    except KeyboardInterrupt:
        out.print("interrupted; stopping")
    finally:
        with out.status("stopping the stack…"):
            stack.stop()
        out.print("stack stopped; no process left behind")

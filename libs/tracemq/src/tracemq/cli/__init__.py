"""The ``tracemq`` command. Services plug their own sub-commands in through the
``tracemq.commands`` entry-point group, so the library never imports a service."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import typer

from tracemq.cli import dev, route, topic, trace
from tracemq.cli.demo import demo
from tracemq.cli.health import health
from tracemq.errors import TracemqError

app = typer.Typer(
    name="tracemq",
    help="tracemq: message track trace for RocketMQ-style messaging on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(dev.app, name="dev")
app.add_typer(topic.app, name="topic")
app.add_typer(route.app, name="route")
app.add_typer(trace.app, name="trace")
app.command("health")(health)
app.command("demo")(demo)

for _ep in entry_points(group="tracemq.commands"):
    try:
        app.add_typer(_ep.load(), name=_ep.name)
    except Exception as _exc:  # a broken plug-in must not take the whole CLI down
        print(f"warning: command {_ep.name!r} unavailable: {_exc!r}", file=sys.stderr)


def main() -> None:
    """Console entry point: library errors become one clear line and exit code 2."""
    try:
        app()
    except TracemqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

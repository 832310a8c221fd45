"""``tracemq collector``: run the trace collector (configuration from ``TRACEMQ_*``)."""

from __future__ import annotations

import typer
from tracemq.service import run_service
from tracemq.settings import load_settings

app = typer.Typer(
    help="Run the trace collector.", invoke_without_command=True, add_completion=False
)


@app.callback()
def run() -> None:
    """Run the collector until SIGTERM or SIGINT."""
    from tracemq_collector.app import Collector
    from tracemq_collector.settings import CollectorSettings

    def factory() -> tuple[Collector, CollectorSettings]:
        settings = load_settings(CollectorSettings)
        return Collector(settings), settings

    raise typer.Exit(run_service(factory))

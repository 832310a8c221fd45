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
    from tracemq_collector.lake import use_memory_pool
    from tracemq_collector.settings import CollectorSettings
    from tracemq_collector.store import tune_gc

    def factory() -> tuple[Collector, CollectorSettings]:
        settings = load_settings(CollectorSettings)
        # process-wide, so here and not in Collector (in-process users such as tests keep theirs)
        use_memory_pool(settings.collector_arrow_memory_pool)
        collector = Collector(settings)
        tune_gc()  # this process ingests: see tune_gc (not in-process users such as tests)
        return collector, settings

    raise typer.Exit(run_service(factory))

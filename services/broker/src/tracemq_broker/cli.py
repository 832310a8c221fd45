"""``tracemq broker``: run a broker (configuration from ``TRACEMQ_*`` variables)."""

from __future__ import annotations

import typer
from tracemq.service import run_service
from tracemq.settings import load_settings

app = typer.Typer(
    help="Run a broker (role business or trace).", invoke_without_command=True, add_completion=False
)


@app.callback()
def run() -> None:
    """Run the broker until SIGTERM or SIGINT."""
    from tracemq_broker.app import Broker
    from tracemq_broker.settings import BrokerSettings

    def factory() -> tuple[Broker, BrokerSettings]:
        settings = load_settings(BrokerSettings)
        return Broker(settings), settings

    raise typer.Exit(run_service(factory))

"""``tracemq nameserver``: run the nameserver (configuration from ``TRACEMQ_*`` variables)."""

from __future__ import annotations

import typer
from tracemq.service import run_service
from tracemq.settings import load_settings

app = typer.Typer(help="Run the nameserver.", invoke_without_command=True, add_completion=False)


@app.callback()
def run() -> None:
    """Run the nameserver until SIGTERM or SIGINT."""
    from tracemq_nameserver.app import NameServer
    from tracemq_nameserver.settings import NamesrvSettings

    def factory() -> tuple[NameServer, NamesrvSettings]:
        settings = load_settings(NamesrvSettings)
        return NameServer(settings), settings

    raise typer.Exit(run_service(factory))

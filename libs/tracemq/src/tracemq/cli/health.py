"""``tracemq health URL``: exit 0 when the URL answers 200 (a compose healthcheck)."""

from __future__ import annotations

import urllib.error
import urllib.request

import typer


def health(
    url: str = typer.Argument(..., help="e.g. http://localhost:8080/healthz"),
    timeout: float = typer.Option(3.0, help="Seconds to wait for the answer."),
) -> None:
    """Check a service's /healthz; exit 0 if healthy, 1 if not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            ok = resp.status == 200
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"unhealthy: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo("healthy" if ok else "unhealthy")
    raise typer.Exit(0 if ok else 1)

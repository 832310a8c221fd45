"""``tracemq health URL``: exit 0 when the URL is a tracemq /healthz that says ok (a compose
healthcheck)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import typer


def health(
    url: str = typer.Argument(..., help="e.g. http://localhost:8080/healthz"),
    timeout: float = typer.Option(3.0, min=0.1, help="Seconds to wait for the answer."),
) -> None:
    """Check a service's /healthz; exit 0 if healthy, 1 if not."""
    if not url.startswith(("http://", "https://")):
        typer.echo(f"error: {url!r} is not an http(s) URL", err=True)
        raise typer.Exit(2)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
            body = resp.read(65536)
    except urllib.error.HTTPError as exc:  # 503: the service says why
        typer.echo(f"unhealthy: {url} answered {exc.code}", err=True)
        raise typer.Exit(1) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        typer.echo(f"unhealthy: {url} did not answer ({getattr(exc, 'reason', exc)})", err=True)
        raise typer.Exit(1) from None
    # a 200 alone proves little (the viewer page answers 200 too): /healthz answers {"ok": ...}
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or "ok" not in doc:
        typer.echo(f"unhealthy: {url} is not a tracemq /healthz (no JSON with 'ok')", err=True)
        raise typer.Exit(1)
    if doc["ok"] is not True:
        typer.echo(f"unhealthy: {json.dumps(doc)}", err=True)
        raise typer.Exit(1)
    typer.echo("healthy")

"""The rich console of the CLI: wide enough off a TTY that tables are never cut to 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console


def console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=200)

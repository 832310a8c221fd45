"""The rich console of the CLI and how its tables fit it.

On a terminal (or with ``COLUMNS`` set) tables take the terminal's width and each row stays
one line: cells that do not fit end in "…" rather than wrapping into 2–5-line cells. Off a
terminal (a pipe, a log) the width is 200 so that nothing is cut."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


def console() -> Console:
    from rich.console import Console  # on use: rich costs start-up time `--help` need not pay

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=200)


def fit(table: Table, keep: Iterable[str] = ()) -> Table:
    """One line per row: every column but those in ``keep`` (ids a user copies) is cut with
    an ellipsis instead of wrapping."""
    whole = set(keep)
    for col in table.columns:
        if str(col.header) in whole:
            col.no_wrap = True
            col.overflow = "fold"
        else:
            col.no_wrap = True
            col.overflow = "ellipsis"
    return table

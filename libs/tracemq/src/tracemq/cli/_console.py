"""The rich console of the CLI: wide enough off a TTY that tables are never cut to 80 columns."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def console() -> Console:
    from rich.console import Console  # on use: rich costs start-up time `--help` need not pay

    return Console() if sys.stdout.isatty() else Console(width=200)

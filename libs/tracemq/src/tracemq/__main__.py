"""The ``tracemq`` console script and ``python -m tracemq``.

The command needs the ``cli`` extra (typer, rich); a client-only install (``pip install
tracemq``) has neither, and the command then says so in one line and exits 1 instead of
showing an import traceback.
"""

from __future__ import annotations

import sys

#: what the command's own imports need; another missing module is a real bug and stays loud
_CLI_MODULES = ("typer", "rich", "click")


def main() -> None:
    try:
        from tracemq.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in _CLI_MODULES:
            raise
        print(
            f"error: the tracemq command needs its CLI dependencies ({exc.name} is missing): "
            "pip install 'tracemq[cli]'",
            file=sys.stderr,
        )
        sys.exit(1)
    cli_main()


if __name__ == "__main__":
    main()

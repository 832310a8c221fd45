"""What a command plugin may use: the public face of the command line for commands that
plug in through the ``tracemq.commands`` entry-point group (``tracemq reconcile``, the dev
kit's commands), so that none reaches into the CLI's private modules.

- How a command fails (one line, an exit code; see :mod:`tracemq.cli._errors`):
  :class:`CliError`, :class:`UsageError` (exit 2), :class:`Unreachable` (exit 1), and
  :func:`reaching`, which turns a dependency's transport error into :class:`Unreachable`.
- Where the stack is: :func:`resolve` (options, ``TRACEMQ_*`` variables, the running stack,
  the connection model's defaults) giving a :class:`Connection`, and :func:`dev_state` (the
  running dev stack's state: endpoints, lake, keys).
- How times are read: :func:`parse_time`, :func:`parse_duration`, :data:`TIME_HELP`.
- How output looks: :data:`console` (the shared rich console), :func:`fit` (a table cut to the
  terminal's width).
- The registry of running stacks (for commands that start one): :func:`dev_home`,
  :func:`home_state`, :func:`register_stack`, :func:`unregister_stack`, :func:`pid_alive`.

Names here stay stable; the modules behind them may change.
"""

from __future__ import annotations

from tracemq.cli._connection import Connection, dev_home, dev_state, home_state, resolve
from tracemq.cli._console import console, fit
from tracemq.cli._errors import CliError, Unreachable, UsageError, reaching
from tracemq.cli._registry import pid_alive, register_stack, unregister_stack
from tracemq.cli._time import TIME_HELP, parse_duration, parse_time

__all__ = [
    "TIME_HELP",
    "CliError",
    "Connection",
    "Unreachable",
    "UsageError",
    "console",
    "dev_home",
    "dev_state",
    "fit",
    "home_state",
    "parse_duration",
    "parse_time",
    "pid_alive",
    "reaching",
    "register_stack",
    "resolve",
    "unregister_stack",
]

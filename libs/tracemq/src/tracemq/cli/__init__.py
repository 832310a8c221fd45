"""The ``tracemq`` command (needs the ``cli`` extra: typer, rich). Services and the dev kit
(``tracemq dev``, ``tracemq demo`` from ``tracemq-devkit``) plug their own sub-commands in
through the ``tracemq.commands`` entry-point group, so the library never imports either.

Every sub-command is imported only when it runs (or its own ``--help`` is asked for): the
client, Redis, aiokafka and Spark take seconds to import, and ``tracemq --help`` must not pay
for them. Failures are one line on stderr (see :mod:`tracemq.cli._errors`); ``--debug``
anywhere on the command line, or ``TRACEMQ_DEBUG=1``, shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from typing import Any

import typer
from typer import _click as click  # typer ships its own click; its commands are built on it
from typer.core import TyperGroup

#: name → (where its typer app or function lives, one-line help shown by ``tracemq --help``)
BUILTIN: dict[str, tuple[str, str]] = {
    "topic": ("tracemq.cli.topic:app", "Create, update, delete and list topics on a broker."),
    "route": ("tracemq.cli.route:app", "Inspect routes."),
    "trace": ("tracemq.cli.trace:app", "Look up message traces through the collector."),
    "group": ("tracemq.cli.group:app", "Consumer-group health (lag, rates) via the collector."),
    "health": ("tracemq.cli.health:health", "Check a service's /healthz; exit 0 if healthy."),
}
PLUGIN_GROUP = "tracemq.commands"


def _plugins() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def _to_click(obj: Any, name: str) -> click.Command:
    import typer.main

    if not isinstance(obj, typer.Typer):
        single = typer.Typer(add_completion=False, rich_markup_mode=None)
        single.command(name)(obj)
        obj = single
    cmds = obj.registered_commands
    if (
        len(cmds) == 1
        and cmds[0].name in (None, name)
        and not obj.registered_callback
        and not obj.registered_groups
    ):  # `tracemq health URL`, `tracemq reconcile --from …`: the command itself
        cmd: Any = typer.main.get_command(obj)
    else:  # a group even with one sub-command: `tracemq route show TOPIC`
        cmd = typer.main.get_group(obj)
    cmd.name = name
    _plain_help(cmd)
    return cmd


def _plain_help(cmd: Any) -> None:
    # typer's rich help costs 0.3 s of imports and prints ``<bool>`` for flags; click's plain
    # help says the same in less
    if hasattr(cmd, "rich_markup_mode"):
        cmd.rich_markup_mode = None
    for sub in getattr(cmd, "commands", {}).values():
        _plain_help(sub)


class LazyGroup(TyperGroup):
    """A click group that imports a sub-command only when it is looked up to run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*BUILTIN, *_plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in BUILTIN:
            module, attr = BUILTIN[cmd_name][0].split(":")
            return _to_click(getattr(import_module(module), attr), cmd_name)
        ep = _plugins().get(cmd_name)
        if ep is None:
            return None
        try:
            return _to_click(ep.load(), cmd_name)
        except Exception as exc:  # a broken plug-in must not take the whole CLI down
            raise click.ClickException(f"command {cmd_name!r} unavailable: {exc!r}") from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, BUILTIN[n][1]) for n in sorted(BUILTIN)]
        rows += [
            (n, f"(from {ep.value.split(':')[0].split('.')[0]}; tracemq {n} --help)")
            for n, ep in sorted(_plugins().items())
            if n not in BUILTIN
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = LazyGroup(
    name="tracemq",
    help="tracemq: message track trace for RocketMQ-style messaging on Kafka.\n\n"
    "Add --debug anywhere (or set TRACEMQ_DEBUG=1) to see the traceback of a failure.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every failure becomes one clear line and an exit code
    (2 bad usage, 1 a dependency down or any other failure)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("TRACEMQ_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    if not debug:
        _quiet_libraries()
    try:
        code = app.main(args=args, prog_name="tracemq", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:  # bad usage: click's own one-liner with the usage
        exc.show()
        code = exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        code = 130
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        if debug:
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        code = _exit_code(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _quiet_libraries() -> None:
    # aiokafka logs every refused connect ("Unable connect to ...") before raising; the
    # command says it once, in its own words
    import logging

    for name in ("aiokafka", "kafka", "py4j"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _one_line(exc: BaseException) -> str:
    from tracemq.cli._errors import is_transport_error, short
    from tracemq.errors import TracemqError

    if isinstance(exc, TracemqError):  # ours, written for the operator (a log tail may follow)
        return str(exc).strip() or type(exc).__name__
    if is_transport_error(exc):
        return f"a dependency did not answer ({short(exc)}); check `tracemq dev status`"
    return f"{short(exc)} (unexpected; rerun with --debug for the traceback)"


def _exit_code(exc: BaseException) -> int:
    from tracemq.cli._errors import CliError
    from tracemq.errors import CollectorError, InvalidNameError, StackError, TracemqError

    if isinstance(exc, CliError):
        return exc.exit_code
    if isinstance(exc, CollectorError):  # a dependency that refused: the user checks the stack
        return 1
    if isinstance(exc, (InvalidNameError, StackError)):
        return 2
    if isinstance(exc, TracemqError):
        return 2 if not exc.retriable else 1
    return 1

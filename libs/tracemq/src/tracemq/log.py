"""structlog set-up shared by every tracemq process: JSON off a TTY, console on a TTY."""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger once per process.

    ``level`` defaults to ``TRACEMQ_LOG_LEVEL`` (INFO); ``json`` defaults to "stderr is not a TTY".
    """
    global _configured
    level_name = (level or os.environ.get("TRACEMQ_LOG_LEVEL") or "INFO").upper()
    lvl = logging.getLevelName(level_name)
    if not isinstance(lvl, int):
        lvl = logging.INFO
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    if not _configured:
        logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr)
        # aiokafka logs every transient connection error at ERROR; keep it at WARNING+.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL if lvl > logging.DEBUG else lvl)
    _configured = True


def get_logger(name: str, **bind: object) -> structlog.stdlib.BoundLogger:
    """A structlog logger bound to ``component=name`` and any extra context."""
    return structlog.get_logger(component=name, **bind)  # type: ignore[no-any-return]

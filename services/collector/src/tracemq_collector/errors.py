"""Exceptions of the trace collector: one root, :class:`CollectorError`, a
:class:`~tracemq.errors.TracemqError` (see :mod:`tracemq.errors` for how the trees relate).

Tree::

    TracemqError
    └── CollectorError
        ├── TraceStoreError      the trace store cannot serve the call (not open, unusable file)
        │   └── StoreSchemaError ... its file has a schema this collector does not know
        ├── BadCursor            a page cursor this collector did not hand out (also ValueError)
        ├── BadParameter         a query parameter of the API is invalid (names it)
        ├── UnknownGroup         no subscription of the group was ever seen (also LookupError)
        └── PeerFailure          a peer collector failed a fanned-out query (``reason``)

A class that used to be a builtin error keeps that base, so a handler written for it still
catches it; each is importable from the module that raises it too.
"""

from __future__ import annotations

from tracemq.errors import TracemqError


class CollectorError(TracemqError):
    """Root of every exception the collector raises on purpose."""


class TraceStoreError(CollectorError):
    """The trace store cannot serve the call: it is not open, or its file is unusable."""


class StoreSchemaError(TraceStoreError):
    """The store file has a schema version or layout this collector does not know."""


class BadCursor(CollectorError, ValueError):
    """The client's page cursor is not one this collector handed out."""


class BadParameter(CollectorError):
    """A query parameter is invalid; ``parameter`` names it (the API answers 400)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class UnknownGroup(CollectorError, LookupError):
    """No subscription of this group was ever seen."""


class PeerFailure(CollectorError):
    """A peer collector failed a fanned-out query; ``reason`` is the metric label."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(f"{reason}: {error}")
        self.reason = reason
        self.error = error

"""Exceptions of the nameserver: one root, :class:`NameserverError`, a
:class:`~tracemq.errors.TracemqError` (see :mod:`tracemq.errors` for how the trees relate).

The nameserver raises none of its own today: a record it cannot use is counted and skipped
(``tracemq_namesrv_control_rejected_total``), never raised. A future exception derives from this
root (``tests/unit/test_error_tree.py`` checks it).
"""

from __future__ import annotations

from tracemq.errors import TracemqError


class NameserverError(TracemqError):
    """Root of every exception the nameserver raises on purpose."""

"""Exceptions of the broker: one root, :class:`BrokerError`, a
:class:`~tracemq.errors.TracemqError` (see :mod:`tracemq.errors` for how the trees relate).

Tree::

    TracemqError
    └── BrokerError
        └── AdminRejected        an admin request is invalid; the reply carries the message
"""

from __future__ import annotations

from tracemq.errors import TracemqError


class BrokerError(TracemqError):
    """Root of every exception the broker raises on purpose."""


class AdminRejected(BrokerError):
    """The request is invalid; the reply carries this message."""

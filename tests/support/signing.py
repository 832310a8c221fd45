"""Sealing raw control and admin records in tests, with the keys of the session's stacks."""

from __future__ import annotations

from typing import Any

from tracemq.protocol.signing import Purpose, seal
from tracemq_devkit.devstack.secrets import StackSecrets


def sealed(
    body: bytes,
    role: str = "broker",
    purpose: Purpose = "control",
    secrets: StackSecrets | None = None,
    **kw: Any,
) -> bytes:
    """``body`` (a plain record's bytes) sealed with ``role``'s generated key of ``secrets``
    (default: the session's); ``kw`` overrides ``ts`` or ``nonce``."""
    if secrets is None:
        from tests.conftest import SESSION_SECRETS

        secrets = SESSION_SECRETS
    kid, secret = secrets.signing[role]
    return seal(purpose, kid, secret, body, **kw)

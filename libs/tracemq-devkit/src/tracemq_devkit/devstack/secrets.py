"""Secrets the dev stack generates for itself, so no password, token or key is ever typed.

One :class:`StackSecrets` per stack (``tracemq dev up``, ``make demo``, the test session), made
fresh with :func:`secrets.token_urlsafe` unless the caller passes one (the test session shares one
set between its stacks so a client built from the environment reaches any of them). They are
written to the stack's state file (mode 0600) so ``tracemq dev status`` and the CLI can find them;
nothing here is ever committed or logged.

Who uses which field:

* ``redis_password`` — ``requirepass`` of the stack's Redis; every ``TRACEMQ_REDIS_URL`` carries it.
* ``collector_api_token`` — ``TRACEMQ_COLLECTOR_API_TOKEN`` of every collector; the CLI and the
  viewer send it as ``Authorization: Bearer``.
* ``signing`` — one HMAC key per role (``broker``, ``client``, ``admin``): ``(access key id,
  secret)``; the nameserver and brokers verify against them, each process signs with its own.
* ``kafka_users`` — SASL user and password per Kafka cluster (``business``, ``trace``), used by
  ``tracemq dev up --secure``.
"""

from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("broker", "client", "admin")
CLUSTERS = ("business", "trace")


def _secret() -> str:
    return secrets.token_urlsafe(24)


def _key_pair(role: str) -> tuple[str, str]:
    return (f"dev-{role}-{secrets.token_hex(4)}", _secret())


@dataclass(frozen=True)
class StackSecrets:
    """Generated credentials of one dev stack (see the module docstring)."""

    redis_password: str = field(default_factory=_secret)
    collector_api_token: str = field(default_factory=_secret)
    signing: dict[str, tuple[str, str]] = field(
        default_factory=lambda: {role: _key_pair(role) for role in ROLES}
    )
    kafka_users: dict[str, tuple[str, str]] = field(
        default_factory=lambda: {c: (f"tracemq-{c}", _secret()) for c in CLUSTERS}
    )

    @classmethod
    def generate(cls) -> StackSecrets:
        return cls()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackSecrets:
        return cls(
            redis_password=str(data["redis_password"]),
            collector_api_token=str(data["collector_api_token"]),
            signing={k: (str(v[0]), str(v[1])) for k, v in data["signing"].items()},
            kafka_users={k: (str(v[0]), str(v[1])) for k, v in data["kafka_users"].items()},
        )

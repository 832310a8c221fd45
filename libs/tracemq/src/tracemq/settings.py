"""Typed settings read from the environment, shared by every tracemq process.

Every setting is an environment variable ``TRACEMQ_<NAME>``; each service adds its own block
(see the services' ``settings.py``). :func:`load_settings` turns a validation failure into a
:class:`~tracemq.errors.ConfigError` naming the variable and the bad value.

Where the stack is — the routing database, its key prefix, the control cluster — is
:class:`ConnectionSettings`, the one connection model: the services' :class:`CommonSettings`
and the clients' ``ClientSettings`` extend it, and the command line's look-up
(``tracemq.cli.plugin.resolve``) falls back on its defaults.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from tracemq.errors import ConfigError
from tracemq.redis_url import redact, split
from tracemq.routing.keys import DEFAULT_PREFIX

ENV_PREFIX = "TRACEMQ_"

#: settings whose values never go into an error message (URLs lose only their password)
_SECRET_WORDS = ("password", "token", "secret", "key")


def check_redis_url(cls: type, v: str) -> str:
    """Validator: a Redis URL tracemq can connect with (see :mod:`tracemq.redis_url`)."""
    split(v)  # ValueError names the problem
    return v


def shown_value(field: str, value: object) -> object:
    """``value`` as an error message may show it: secrets hidden, URLs without their password."""
    if any(w in field.lower() for w in _SECRET_WORDS):
        return "***"
    if isinstance(value, str) and "://" in value:
        return redact(value)
    return value


#: where a process looks for the stack when nothing says otherwise (the embedded dev stack)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_CONTROL_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_CONTROL_TOPIC = "tracemq.namesrv"


class ConnectionSettings(BaseSettings):
    """Where the stack is: what every service, client and command connects to."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    redis_url: str = Field(DEFAULT_REDIS_URL, description="Routing database (Redis 6+).")
    redis_prefix: str = Field(
        DEFAULT_PREFIX, description="Prefix of every Redis key tracemq writes."
    )
    control_bootstrap: str = Field(
        DEFAULT_CONTROL_BOOTSTRAP,
        description="Kafka bootstrap of the control cluster (nameserver topic, admin topics).",
    )
    control_topic: str = Field(DEFAULT_CONTROL_TOPIC, description="Nameserver control topic.")

    _redis = field_validator("redis_url")(check_redis_url)


class CommonSettings(ConnectionSettings):
    """Settings every service reads."""

    http_host: str = Field("127.0.0.1", description="Bind address of /healthz and /metrics.")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of /healthz and /metrics.")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    shutdown_timeout_ms: int = Field(
        10_000, ge=0, description="How long a graceful stop may take before tasks are cancelled."
    )


S = TypeVar("S", bound=BaseSettings)


def _is_secret(cls: type[BaseSettings], name: str) -> bool:
    info = cls.model_fields.get(name)
    return info is not None and "SecretStr" in str(info.annotation)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build ``cls`` from the environment; raise :class:`ConfigError` naming the variable."""
    try:
        return cls(**overrides)
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc} ({exc.__cause__})") from None
    except ValidationError as exc:
        prefix = (cls.model_config.get("env_prefix") or "").upper()
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "?"
            value = shown_value(field, err.get("input"))
            if _is_secret(cls, str(err["loc"][0]) if err["loc"] else ""):
                value = "<redacted>"  # a key or password never reaches an error or a log
            problems.append(f"{prefix}{field.upper()}={value!r}: {err['msg']}")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None

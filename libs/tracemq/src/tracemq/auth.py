"""Settings of signed control and admin records (the format: :mod:`tracemq.protocol.signing`).

Verifiers (the nameserver, the brokers) take keys per role, each ``id:secret[,id:secret]``:
``TRACEMQ_AUTH_BROKER_KEYS``, ``TRACEMQ_AUTH_CLIENT_KEYS``, ``TRACEMQ_AUTH_ADMIN_KEYS``. Two keys
of one role are valid at once, for rotation. ``TRACEMQ_AUTH_MAX_AGE_MS`` is how far a signed
timestamp may be from the verifier's clock, and how long a signature is remembered against
replays. Secure by default: a verifier without keys for a role it needs refuses to start,
unless ``TRACEMQ_AUTH_DISABLED=true`` (logged as a warning at start; for a closed lab only).

Signers (brokers, clients, the admin CLI) take ``TRACEMQ_ACCESS_KEY_ID`` and
``TRACEMQ_SECRET_KEY``; a process that also sends admin requests (the CLI) signs those with
``TRACEMQ_ADMIN_ACCESS_KEY_ID`` / ``TRACEMQ_ADMIN_SECRET_KEY`` when they are set, else with its
own key. Secrets never appear in a log line or an error message.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tracemq.errors import ConfigError
from tracemq.log import get_logger
from tracemq.protocol.signing import KEY_ID_RE, SECRET_MIN, Signer, Verifier, parse_keys
from tracemq.settings import ENV_PREFIX

log = get_logger("auth")


def _check_key_id(v: str | None) -> str | None:
    if v is not None and not KEY_ID_RE.match(v):
        raise ValueError("must be 1-64 characters [A-Za-z0-9._-]")
    return v


def _check_secret(v: SecretStr | None) -> SecretStr | None:
    if v is not None and len(v.get_secret_value()) < SECRET_MIN:
        raise ValueError(f"must be at least {SECRET_MIN} characters")
    return v


class SignerSettings(BaseSettings):
    """The key a process signs its control and admin records with."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    access_key_id: str | None = Field(
        default=None, description="Access key id this process signs control records with."
    )
    secret_key: SecretStr | None = Field(
        default=None, validate_default=True, description="Secret of TRACEMQ_ACCESS_KEY_ID."
    )
    admin_access_key_id: str | None = Field(
        default=None,
        description="Access key id for admin requests (default: TRACEMQ_ACCESS_KEY_ID).",
    )
    admin_secret_key: SecretStr | None = Field(
        default=None, validate_default=True, description="Secret of TRACEMQ_ADMIN_ACCESS_KEY_ID."
    )

    _key_ids = field_validator("access_key_id", "admin_access_key_id")(_check_key_id)

    @field_validator("secret_key", "admin_secret_key")
    @classmethod
    def _secret(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        prefix = "admin_" if info.field_name == "admin_secret_key" else ""
        kid = info.data.get(f"{prefix}access_key_id")
        if (v is None) != (kid is None) and f"{prefix}access_key_id" in info.data:
            raise ValueError(
                f"TRACEMQ_{prefix.upper()}ACCESS_KEY_ID and TRACEMQ_{prefix.upper()}SECRET_KEY "
                "must be set together"
            )
        return _check_secret(v)

    def signer(self) -> Signer | None:
        """This process's signer, or None when no key is set."""
        if self.access_key_id is None or self.secret_key is None:
            return None
        return Signer(self.access_key_id, self.secret_key.get_secret_value())

    def admin_signer(self) -> Signer | None:
        """The signer of admin requests: the admin key if set, else :meth:`signer`."""
        if self.admin_access_key_id is not None and self.admin_secret_key is not None:
            return Signer(self.admin_access_key_id, self.admin_secret_key.get_secret_value())
        return self.signer()


class VerifierSettings(BaseSettings):
    """Keys a verifier (nameserver, broker) accepts, per role."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    auth_broker_keys: SecretStr | None = Field(
        default=None,
        description="Keys brokers sign registrations and heartbeats with: id:secret[,...]",
    )
    auth_client_keys: SecretStr | None = Field(
        default=None,
        description="Keys clients sign heartbeats (and retry.ensure) with: id:secret[,...]",
    )
    auth_admin_keys: SecretStr | None = Field(
        default=None,
        description="Keys admin requests (topic create/update/delete/list) are signed "
        "with: id:secret[,...]",
    )
    auth_max_age_ms: int = Field(
        300_000,
        ge=1000,
        description="A signed record stamped further than this from the verifier's clock is "
        "refused (expired); signatures are remembered this long against replays.",
    )
    auth_disabled: bool = Field(
        False,
        description="Accept unsigned control and admin records (a closed lab only; logged "
        "as a warning at start).",
    )

    @field_validator("auth_broker_keys", "auth_client_keys", "auth_admin_keys")
    @classmethod
    def _keys(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            parse_keys(v.get_secret_value())
        return v

    def keyrings(self) -> dict[str, dict[str, str]]:
        return {
            role: parse_keys(value.get_secret_value() if value is not None else None)
            for role, value in (
                ("broker", self.auth_broker_keys),
                ("client", self.auth_client_keys),
                ("admin", self.auth_admin_keys),
            )
        }

    def verifier(self, service: str, required: tuple[str, ...]) -> Verifier:
        """The verifier of ``service``; ConfigError when a role in ``required`` has no key and
        verification is not explicitly disabled (secure by default)."""
        rings = self.keyrings()
        if self.auth_disabled:
            log.warning(
                "SIGNATURES NOT CHECKED: TRACEMQ_AUTH_DISABLED=true; anyone who can write to the "
                "control cluster can change routes and topics",
                service=service,
            )
            return Verifier(rings, max_age_ms=self.auth_max_age_ms, disabled=True)
        missing = [r for r in required if not rings[r]]
        if missing:
            names = ", ".join(f"TRACEMQ_AUTH_{r.upper()}_KEYS" for r in missing)
            raise ConfigError(
                f"the {service} verifies signed records and has no keys in {names}; set them "
                "(id:secret[,id:secret]), or TRACEMQ_AUTH_DISABLED=true to accept unsigned "
                "records (a closed lab only)"
            )
        try:
            verifier = Verifier(rings, max_age_ms=self.auth_max_age_ms)
        except ValueError as exc:
            raise ConfigError(f"TRACEMQ_AUTH_*_KEYS: {exc}") from None
        log.info(
            "signature verification on",
            service=service,
            **{f"{role}_keys": sorted(ring) for role, ring in rings.items()},
        )
        return verifier

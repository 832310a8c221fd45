"""How every tracemq Kafka connection is secured: TLS, SASL, per cluster.

Every Kafka client tracemq makes (producers, consumers, admin clients of the library, the
services, the collector, the CLI and the Spark job's offset snapshot) takes its security
from :func:`client_kwargs` (keyword arguments for ``AIOKafkaProducer``/``Consumer``/
``AdminClient``) and starts through :func:`start`; nothing else builds security options.

Settings (environment, ``TRACEMQ_KAFKA_*``):

* ``SECURITY_PROTOCOL`` — ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``;
* ``SASL_MECHANISM`` — ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` (default);
* ``SASL_USERNAME``, ``SASL_PASSWORD`` — required with a ``SASL_*`` protocol;
* ``SSL_CAFILE`` — PEM of the CA(s) to trust (default: the system's), ``SSL_CERTFILE`` and
  ``SSL_KEYFILE`` — client certificate and key (mutual TLS), ``SSL_CHECK_HOSTNAME`` (true).

Those are the default of every cluster. Clusters that differ (the business and trace
clusters may) are overridden by name with the same fields under
``TRACEMQ_KAFKA_CLUSTERS__<NAME>__<FIELD>`` (or one JSON object in ``TRACEMQ_KAFKA_CLUSTERS``),
and each override names its ``BOOTSTRAP`` (comma-separated ``host:port``); unset fields inherit
the default.

Why keyed by bootstrap: a client learns the data cluster of a topic at run time, from its route,
and the one thing a route carries is the cluster's bootstrap address. Matching on any
``host:port`` of it needs no change to the routing schema nor to the brokers that publish
routes, and the name of the matching override is what errors print ("Kafka cluster 'trace'
at ..."); a bootstrap no override names is the ``default`` cluster.

Guarantees: settings are validated at load (a :class:`~tracemq.errors.ConfigError` naming the
variable: a SASL protocol without a user or password, an unknown mechanism, a CA, certificate
or key file that does not exist); one ``ssl.SSLContext`` per distinct TLS configuration, built
once; a client that cannot connect at start raises :class:`KafkaConnectError`, one line naming
the cluster, its bootstrap, the cause and what to check.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from tracemq.errors import ConfigError, KafkaConnectError
from tracemq.settings import load_settings

ENV_PREFIX = "TRACEMQ_KAFKA_"
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
DEFAULT_CLUSTER = "default"


class ClusterOverride(BaseModel):
    """Fields of one named cluster that differ from the default (``None``: inherit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap: str
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool | None = None


class KafkaSecuritySettings(BaseSettings):
    """``TRACEMQ_KAFKA_*``: the default security of every cluster, and the overrides."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore", frozen=True
    )

    security_protocol: SecurityProtocol = Field("PLAINTEXT", description="Kafka security protocol.")
    sasl_mechanism: SaslMechanism = Field("SCRAM-SHA-512", description="SASL mechanism.")
    sasl_username: str | None = Field(None, description="SASL user (SASL_* protocols).")
    sasl_password: SecretStr | None = Field(None, description="SASL password (SASL_* protocols).")
    ssl_cafile: Path | None = Field(None, description="PEM file of the CA(s) to trust.")
    ssl_certfile: Path | None = Field(None, description="Client certificate (PEM), mutual TLS.")
    ssl_keyfile: Path | None = Field(None, description="Client private key (PEM), mutual TLS.")
    ssl_check_hostname: bool = Field(True, description="Check the broker's name in its cert.")
    clusters: dict[str, ClusterOverride] = Field(
        default_factory=dict, description="Per-cluster overrides, by name (see module docs)."
    )


def _hostports(bootstrap: str) -> frozenset[str]:
    return frozenset(h.strip().lower() for h in bootstrap.split(",") if h.strip())


@dataclass(frozen=True)
class ClusterSecurity:
    """The resolved security of one cluster (default fields with its override applied)."""

    name: str
    #: env-variable prefix of its fields, for errors (``TRACEMQ_KAFKA_`` or the override's)
    var_prefix: str
    security_protocol: SecurityProtocol
    sasl_mechanism: SaslMechanism
    sasl_username: str | None
    sasl_password: SecretStr | None
    ssl_cafile: Path | None
    ssl_certfile: Path | None
    ssl_keyfile: Path | None
    ssl_check_hostname: bool
    bootstraps: frozenset[str] = frozenset()
    _ssl: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the variable when the fields do not fit together."""
        p = self.var_prefix
        if self.uses_sasl:
            if not self.sasl_username:
                raise ConfigError(
                    f"{p}SASL_USERNAME is required with "
                    f"{p}SECURITY_PROTOCOL={self.security_protocol} (cluster {self.name!r})"
                )
            if self.sasl_password is None or not self.sasl_password.get_secret_value():
                raise ConfigError(
                    f"{p}SASL_PASSWORD is required with "
                    f"{p}SECURITY_PROTOCOL={self.security_protocol} (cluster {self.name!r})"
                )
        for var, path in (
            ("SSL_CAFILE", self.ssl_cafile),
            ("SSL_CERTFILE", self.ssl_certfile),
            ("SSL_KEYFILE", self.ssl_keyfile),
        ):
            if path is not None and not self.uses_tls:
                raise ConfigError(
                    f"{p}{var} is set but {p}SECURITY_PROTOCOL={self.security_protocol} does not "
                    f"use TLS (cluster {self.name!r}); use SSL or SASL_SSL"
                )
            if path is not None and not path.is_file():
                raise ConfigError(f"{p}{var}={str(path)!r}: no such file (cluster {self.name!r})")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ConfigError(f"{p}SSL_KEYFILE is set without {p}SSL_CERTFILE")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The cluster's TLS context, built on first use and shared by all its clients."""
        if not self.uses_tls:
            return None
        if not self._ssl:
            from aiokafka.helpers import create_ssl_context

            try:
                ctx = create_ssl_context(
                    cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
                    certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
                    keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
                )
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"{self.var_prefix}SSL_CAFILE/SSL_CERTFILE/SSL_KEYFILE of cluster "
                    f"{self.name!r} are not usable PEM files: {exc}"
                ) from None
            ctx.check_hostname = self.ssl_check_hostname
            self._ssl.append(ctx)
        return self._ssl[0]

    def kwargs(self) -> dict[str, Any]:
        """aiokafka keyword arguments (the same for producer, consumer and admin client)."""
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.uses_tls:
            out["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            assert self.sasl_password is not None
            out["sasl_mechanism"] = self.sasl_mechanism
            out["sasl_plain_username"] = self.sasl_username
            out["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return out


@dataclass(frozen=True)
class KafkaSecurity:
    """The default cluster security and the named overrides; :meth:`for_bootstrap` picks."""

    default: ClusterSecurity
    clusters: tuple[ClusterSecurity, ...] = ()

    @classmethod
    def from_settings(cls, s: KafkaSecuritySettings) -> KafkaSecurity:
        base = ClusterSecurity(
            name=DEFAULT_CLUSTER,
            var_prefix=ENV_PREFIX,
            security_protocol=s.security_protocol,
            sasl_mechanism=s.sasl_mechanism,
            sasl_username=s.sasl_username,
            sasl_password=s.sasl_password,
            ssl_cafile=s.ssl_cafile,
            ssl_certfile=s.ssl_certfile,
            ssl_keyfile=s.ssl_keyfile,
            ssl_check_hostname=s.ssl_check_hostname,
        )
        clusters = []
        for name, o in s.clusters.items():
            given = o.model_dump(exclude_none=True, exclude={"bootstrap"})
            fields = {k: getattr(base, k) for k in ClusterOverride.model_fields if k != "bootstrap"}
            clusters.append(
                ClusterSecurity(
                    **{**fields, **given},
                    name=name,
                    var_prefix=f"{ENV_PREFIX}CLUSTERS__{name.upper()}__",
                    bootstraps=_hostports(o.bootstrap),
                )
            )
        out = cls(default=base, clusters=tuple(clusters))
        out.validate()
        return out

    def validate(self) -> None:
        # the default too, though an override may cover every cluster in use: a broken
        # setting fails at start, not at the first route that happens to need it
        for c in (self.default, *self.clusters):
            c.validate()

    def for_bootstrap(self, bootstrap: str) -> ClusterSecurity:
        wanted = _hostports(bootstrap)
        for c in self.clusters:
            if c.bootstraps & wanted:
                return c
        return self.default


_lock = threading.Lock()
_current: KafkaSecurity | None = None


def load() -> KafkaSecurity:
    """Read and validate the settings from the environment."""
    return KafkaSecurity.from_settings(load_settings(KafkaSecuritySettings))


def current() -> KafkaSecurity:
    """The process's security, loaded from the environment on first use (or :func:`install`)."""
    global _current
    if _current is None:
        loaded = load()
        with _lock:
            if _current is None:
                _current = loaded
    return _current


def install(security: KafkaSecurity | None) -> None:
    """Use ``security`` from now on (``None``: read the environment again on next use)."""
    global _current
    with _lock:
        _current = security


def cluster(bootstrap: str) -> ClusterSecurity:
    return current().for_bootstrap(bootstrap)


def client_kwargs(bootstrap: str) -> dict[str, Any]:
    """Keyword arguments securing an aiokafka client of the cluster at ``bootstrap``."""
    return cluster(bootstrap).kwargs()


class _Startable(Protocol):
    async def start(self) -> None: ...


def describe_failure(c: ClusterSecurity, bootstrap: str, exc: BaseException) -> str:
    """One line: which cluster, where, what happened and what to check."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text.removeprefix(f"{name}: ")
    cause = f"{name}: {text}" if text else name
    p = c.var_prefix
    verb = "refused the connection"
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        hint = f"check {p}SSL_CAFILE (the CA that signed the broker's certificate)"
    elif isinstance(exc, ssl.SSLError):
        hint = f"check {p}SECURITY_PROTOCOL (does the broker speak TLS?) and the TLS files"
    elif "Authentication" in name or "Sasl" in name or "Authentication failed" in text:
        hint = f"check {p}SASL_USERNAME, {p}SASL_PASSWORD and {p}SASL_MECHANISM"
    elif isinstance(exc, (ConnectionRefusedError, TimeoutError)) or "Connect call failed" in text:
        verb, hint = "did not answer", "is the cluster running and is this its address?"
    else:
        hint = (
            f"is the cluster up, and does {p}SECURITY_PROTOCOL={c.security_protocol} match "
            "what it requires (TLS, SASL credentials)?"
        )
    return (
        f"Kafka cluster {c.name!r} at {bootstrap} {verb} "
        f"(security_protocol={c.security_protocol}): {cause}; {hint}"
    )


async def diagnose(bootstrap: str, timeout_s: float = 2.0) -> BaseException | None:
    """Open one connection to the first reachable ``host:port`` of ``bootstrap`` the way a
    client would, and return what failed (``None``: it connected). aiokafka only logs why a
    bootstrap failed; this recovers the cause for the error message."""
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    c = cluster(bootstrap)
    kw = c.kwargs()
    first: BaseException | None = None
    for hp in sorted(_hostports(bootstrap)):
        host, _, port = hp.rpartition(":")
        try:
            conn = await create_conn(
                host.strip("[]"), int(port), request_timeout_ms=int(timeout_s * 1000), **kw
            )
        except Exception as exc:  # the cause is the answer
            first = first or exc
            continue
        try:
            # a broker that wants SASL the client does not do closes at its first real request
            await conn.send(MetadataRequest([]))
        except Exception as exc:
            first = first or exc
            continue
        finally:
            conn.close()
        return None
    return first


async def start(client: _Startable, bootstrap: str) -> None:
    """``await client.start()``; a failure to connect raises :class:`KafkaConnectError` naming
    the cluster (the client is left to the caller to stop, as after any failed start)."""
    from aiokafka.errors import KafkaConnectionError, KafkaError

    try:
        await client.start()
    except (KafkaError, OSError, ssl.SSLError, ValueError, KeyError) as exc:
        cause: BaseException = exc
        if isinstance(exc, KafkaConnectionError):
            cause = await diagnose(bootstrap) or exc
        raise KafkaConnectError(describe_failure(cluster(bootstrap), bootstrap, cause)) from exc

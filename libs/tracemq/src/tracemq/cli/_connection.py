"""Where a CLI command finds the stack: options, then ``TRACEMQ_*`` variables, then the running
stack: ``TRACEMQ_DEV_HOME``'s state file when that variable is set, else the one stack of the
registry of running stacks (``tracemq dev up`` and ``tracemq demo`` register theirs; with
several, ``TRACEMQ_STACK=NAME`` picks one), else ``.tracemq/dev``'s state file.

The admin key that signs ``tracemq topic …`` comes the same way: ``TRACEMQ_ADMIN_ACCESS_KEY_ID``
/ ``TRACEMQ_ADMIN_SECRET_KEY`` (else ``TRACEMQ_ACCESS_KEY_ID`` / ``TRACEMQ_SECRET_KEY``), then
the running stack's state file (mode 0600), where the dev stack wrote the key it generated."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracemq.cli._errors import UsageError
from tracemq.cli._registry import running_stacks
from tracemq.protocol.signing import Signer
from tracemq.redis_url import redact
from tracemq.redis_url import split as split_redis_url


def dev_home() -> Path:
    return Path(os.environ.get("TRACEMQ_DEV_HOME", ".tracemq/dev"))


def home_state() -> dict[str, Any] | None:
    """The state file of ``tracemq dev up`` in this ``TRACEMQ_DEV_HOME``."""
    path = dev_home() / "state.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {**data, "state_file": str(path)} if isinstance(data, dict) else None


def dev_state() -> dict[str, Any] | None:
    """The state of the running stack the commands talk to (see the module docstring)."""
    if os.environ.get("TRACEMQ_DEV_HOME"):
        return home_state()
    stacks = running_stacks()
    pick = os.environ.get("TRACEMQ_STACK")
    names = ", ".join(
        f"{s['stack_name']} ({s.get('kind')}, pid {s.get('launcher_pid')})" for s in stacks
    )
    if pick:
        for s in stacks:
            if s["stack_name"] == pick:
                return s
        raise UsageError(
            f"TRACEMQ_STACK={pick!r}: no such running stack (running: {names or 'none'})"
        )
    if len(stacks) == 1:
        return stacks[0]
    if len(stacks) > 1:
        raise UsageError(
            f"{len(stacks)} stacks are running: {names}; pick one with TRACEMQ_STACK=NAME"
        )
    return home_state()


def adopt_kafka_security(state: dict[str, Any]) -> None:
    """Connect to a ``--secure`` stack the way its services do: its ``TRACEMQ_KAFKA_*`` apply
    unless this shell sets Kafka security itself (then those win, all of them)."""
    env = state.get("kafka_client_env") or {}
    if not env or any(k.startswith("TRACEMQ_KAFKA_") for k in os.environ):
        return
    from tracemq import kafka_security

    os.environ.update({str(k): str(v) for k, v in env.items()})
    kafka_security.install(None)  # read again, with the stack's settings


@dataclass(frozen=True)
class Connection:
    redis_url: str
    control_bootstrap: str
    redis_prefix: str
    #: signs admin requests; None: none found (brokers will refuse them as ``unsigned``)
    admin_signer: Signer | None = None


def _admin_signer(state: dict[str, Any] | None) -> Signer | None:
    from tracemq.auth import SignerSettings
    from tracemq.settings import load_settings

    signer = load_settings(SignerSettings).admin_signer()
    if signer is not None:
        return signer
    if state is None:
        try:
            state = dev_state() or {}
        except UsageError:  # several stacks and explicit settings: no key to pick
            return None
    pair = (state.get("signing") or {}).get("admin")
    if isinstance(pair, list) and len(pair) == 2:
        try:
            return Signer(str(pair[0]), str(pair[1]))
        except ValueError:
            return None
    return None


def resolve(redis_url: str | None = None, control_bootstrap: str | None = None) -> Connection:
    # the connection model's defaults, imported here: they cost the CLI's start a Redis client
    from tracemq.routing.keys import DEFAULT_PREFIX
    from tracemq.settings import DEFAULT_CONTROL_BOOTSTRAP, DEFAULT_REDIS_URL

    env_redis = os.environ.get("TRACEMQ_REDIS_URL")
    env_bootstrap = os.environ.get("TRACEMQ_CONTROL_BOOTSTRAP")
    # the stack is looked up only when needed: with several running, explicit settings win
    state: dict[str, Any] | None = (
        {} if (redis_url or env_redis) and (control_bootstrap or env_bootstrap) else None
    )
    if state is None:
        state = dev_state() or {}
    url = redis_url or env_redis or str(state.get("redis_url") or DEFAULT_REDIS_URL)
    try:
        split_redis_url(url)
    except ValueError as exc:
        where = "--redis-url" if redis_url else "TRACEMQ_REDIS_URL" if env_redis else "the stack's"
        raise UsageError(f"{where} {redact(url)}: {exc}") from None
    conn = Connection(
        redis_url=url,
        control_bootstrap=control_bootstrap
        or env_bootstrap
        or str(state.get("business_bootstrap") or DEFAULT_CONTROL_BOOTSTRAP),
        redis_prefix=os.environ.get("TRACEMQ_REDIS_PREFIX", DEFAULT_PREFIX),
        admin_signer=_admin_signer(state or None),
    )
    if not any(k.startswith("TRACEMQ_KAFKA_") for k in os.environ):
        if not state:
            # addresses given explicitly: still the running stack's security if they are its
            with contextlib.suppress(UsageError):
                state = dev_state() or {}
        if state.get("business_bootstrap") == conn.control_bootstrap:
            adopt_kafka_security(state)
    return conn

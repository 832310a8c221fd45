"""Shared fixtures: the real embedded stack (session), unique names, and leak guards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.secrets import StackSecrets

# Property tests without hypothesis's per-example deadline (200 ms): on a loaded 2-core machine
# (two xdist workers beside Spark's JVM) an example of the codec's took 415 ms, which measures
# the machine, not the code. Speed is what bench/ measures; a test that must bound a run's time
# says so itself.
settings.register_profile("tracemq", deadline=None)
settings.load_profile("tracemq")

_SESSION_STACKS: list[EmbeddedStack] = []
#: One set of generated credentials for every stack of the session, so a client built from the
#: environment (which :func:`session_signing_env` gives the keys of) reaches any of them; the
#: Redis password is in each stack's URL, the collector token is what
#: tests/support/collector_api.py sends.
SESSION_SECRETS = StackSecrets.generate()
#: Child processes a session fixture keeps on purpose (the Spark JVM): not leaks.
SESSION_PIDS: set[int] = set()

#: What the tests' own clients (and the services' clients) take from the environment.
CLIENT_TEST_ENV = {"TRACEMQ_CONSUMER_SESSION_TIMEOUT_MS": "3000"}

#: Fast timings so expiry and failover are observable within a test.
TEST_SERVICE_ENV = {
    "TRACEMQ_BROKER_HEARTBEAT_INTERVAL_MS": "1000",
    "TRACEMQ_NAMESRV_EXPIRY_MS": "8000",
    "TRACEMQ_NAMESRV_SCAN_INTERVAL_MS": "500",
    # at most half the expiry: a failover must not let the survivor expire live brokers
    "TRACEMQ_NAMESRV_SESSION_TIMEOUT_MS": "3000",
    "TRACEMQ_SHUTDOWN_TIMEOUT_MS": "8000",
    # Tansu holds a new group member's first join for half the session timeout (5 s with the
    # default 10 s): every consumer start of the suite would pay it
    "TRACEMQ_COLLECTOR_SESSION_TIMEOUT_MS": "3000",
    **CLIENT_TEST_ENV,
}


def signing_env(secrets: StackSecrets) -> dict[str, str]:
    """What ``EmbeddedStack.client_env`` gives a client: its client key and the admin key."""
    ckid, csecret = secrets.signing["client"]
    akid, asecret = secrets.signing["admin"]
    return {
        "TRACEMQ_ACCESS_KEY_ID": ckid,
        "TRACEMQ_SECRET_KEY": csecret,
        "TRACEMQ_ADMIN_ACCESS_KEY_ID": akid,
        "TRACEMQ_ADMIN_SECRET_KEY": asecret,
    }


@pytest.fixture(scope="session", autouse=True)
def session_signing_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Clients and admin clients of the tests sign with the session stacks' keys; the stacks
    the tests launch (`tracemq demo`, `tracemq dev up`) register in a registry of this session
    (each xdist worker its own), never in the user's ``~/.tracemq/stacks``: a command of one
    test must not find another test's stack (nor the developer's)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**signing_env(SESSION_SECRETS), **CLIENT_TEST_ENV}.items():
            mp.setenv(k, v)
        mp.setenv("TRACEMQ_STACKS_DIR", str(tmp_path_factory.mktemp("stacks")))
        # The reconciliation job's JVMs write no class-data archive into the user's cache
        # (the first JVM would spend ~5 s writing it; tests/spark/test_class_archive.py
        # checks it in a directory of its own)
        mp.setenv("TRACEMQ_SPARK_CLASS_ARCHIVE", "off")
        # The CLI's tables take COLUMNS when set (else 200 on a pipe); an xdist worker has
        # COLUMNS=80 in its environment: the commands the tests run would cut their tables.
        # A test that wants a width sets it for its command.
        for name in ("COLUMNS", "LINES"):
            mp.delenv(name, raising=False)
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs on two xdist workers (``--dist loadgroup``): the tests that run Spark
    in this process share one worker, so one JVM (the session's SparkSession) is started, not
    one per worker. Tests marked ``spark_subprocess`` run Spark only in processes of their own
    (spark-submit) and may go to either worker."""
    for item in items:
        if "tests/spark/" in str(item.fspath).replace("\\", "/") and not item.get_closest_marker(
            "spark_subprocess"
        ):
            item.add_marker(pytest.mark.xdist_group("spark-session"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """The embedded stack — the same launcher `make demo` and `tracemq dev up` use."""
    workdir = tmp_path_factory.mktemp("stack")
    s = EmbeddedStack(
        StackConfig(workdir=workdir, service_env=dict(TEST_SERVICE_ENV), secrets=SESSION_SECRETS)
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


@pytest.fixture(scope="session")
def collector(stack: EmbeddedStack) -> ManagedProcess:
    """The session stack's trace collector (started on first use)."""
    proc = stack.processes.get("collector")
    if proc is None or not proc.alive():
        proc = stack.start_collector("collector")
    return proc


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and broker names of one test."""
    return uuid.uuid4().hex[:8]


def _children() -> set[int]:
    me = str(os.getpid())
    kids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            kids.add(int(d.name))
    return kids


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail a test that leaves a child process running that the session stack does not own."""
    yield
    owned = {p.pid for s in _SESSION_STACKS for p in s.processes.values() if p.pid and p.alive()}
    leaked = _children() - owned - SESSION_PIDS
    if leaked:
        pytest.fail(f"test left child processes running: {sorted(leaked)}")

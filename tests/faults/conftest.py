"""The fault suite: trials on a real stack of their own (they kill, stop and poison its parts).

Every test here gets a fresh embedded stack (Tansu ×2, Redis, nameserver, brokers, collector):
a fault must never leak into the session stack the other tests share.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from tracemq_devkit.devstack import EmbeddedStack, StackConfig

from tests.conftest import _SESSION_STACKS, SESSION_SECRETS, TEST_SERVICE_ENV
from tests.support.clients import close_left_clients

__all__ = ["close_left_clients"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            for name in ("faults", "stack", "kafka", "redis"):
                item.add_marker(getattr(pytest.mark, name))


@pytest.fixture(autouse=True)
def _clients_closed_after(request: pytest.FixtureRequest) -> None:
    """An async fault test shuts down the clients it left running, as the integration tests
    do (``close_left_clients``): a failed trial's clients must not fail the next test on its
    worker with their garbage-collected Kafka clients' warnings."""
    if inspect.iscoroutinefunction(getattr(request.node, "function", None)):
        request.getfixturevalue("close_left_clients")


@pytest.fixture
def fault_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """A whole stack with a collector, owned by one test."""
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("fault"),
            service_env=dict(TEST_SERVICE_ENV),
            with_collector=True,
            secrets=SESSION_SECRETS,
        )
    )
    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator

import pytest
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack

from tests.support.clients import close_left_clients

__all__ = ["close_left_clients"]


@pytest.fixture(autouse=True)
def _clients_closed_after(request: pytest.FixtureRequest) -> None:
    """An async integration test shuts down the clients it left running (a failed test's
    clients must not fail the next test on its worker): ``close_left_clients``."""
    if inspect.iscoroutinefunction(getattr(request.node, "function", None)):
        request.getfixturevalue("close_left_clients")


@pytest.fixture
async def admin(stack: EmbeddedStack) -> AsyncIterator[AdminClient]:
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as client:
        yield client


@pytest.fixture
def env(stack: EmbeddedStack) -> dict[str, str]:
    """Client keyword arguments that reach the session stack."""
    return {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}


@pytest.fixture
async def registry(stack: EmbeddedStack) -> AsyncIterator[RegistryReader]:
    r = connect(stack.redis_url)
    try:
        yield RegistryReader(r)
    finally:
        await r.aclose()

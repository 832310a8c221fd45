from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader, connect
from tracemq_devkit.devstack import EmbeddedStack


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

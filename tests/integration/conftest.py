from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tracemq.admin import AdminClient
from tracemq.devstack import EmbeddedStack
from tracemq.routing import RegistryReader, connect


@pytest.fixture
async def admin(stack: EmbeddedStack) -> AsyncIterator[AdminClient]:
    async with AdminClient(stack.business_bootstrap, stack.redis_url) as client:
        yield client


@pytest.fixture
async def registry(stack: EmbeddedStack) -> AsyncIterator[RegistryReader]:
    r = connect(stack.redis_url)
    try:
        yield RegistryReader(r)
    finally:
        await r.aclose()

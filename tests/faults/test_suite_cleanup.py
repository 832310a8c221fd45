"""The fault suite shuts down what a trial left running, as the integration suite does."""

from __future__ import annotations

import pytest
from tracemq._client import ClientBase


async def test_async_trials_close_their_left_clients(request: pytest.FixtureRequest) -> None:
    # the autouse fixture asked for the clean-up, which wraps ClientBase.start to note clients
    assert "close_left_clients" in request.fixturenames
    assert ClientBase.start.__name__ == "start" and ClientBase.start.__qualname__.startswith(
        "closing_left_clients"
    )

"""Consumer-group health (issue 15, point 13) through the real command against the real stack:
a stopped group whose lag in time grows, a flaky group with failures, retries and dead
letters; and each listed message's per-group outcome (point 14, the API under the search page).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually

from tests.support.brokers import fast_broker
from tests.support.groups import cli_env, collector_get, flaky_and_stopped

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


@pytest.fixture(scope="module")
def broker(stack: EmbeddedStack) -> Iterator[str]:
    with fast_broker(stack, "brh") as name:
        yield name


def tracemq(stack: EmbeddedStack, collector: ManagedProcess, *args: str) -> Any:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(stack, collector),
    )


def status_json(stack: EmbeddedStack, collector: ManagedProcess, group: str) -> dict[str, Any]:
    res = tracemq(stack, collector, "group", "status", group, "--json")
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def topic_row(status: dict[str, Any], topic: str) -> dict[str, Any]:
    (group,) = status["groups"]
    return next(t for t in group["topics"] if t["topic"] == topic)


@pytest.mark.timeout(240)
async def test_group_status_of_a_stopped_and_a_flaky_group(
    stack: EmbeddedStack, collector: ManagedProcess, broker: str, unique: str
) -> None:
    sc = await flaky_and_stopped(stack, broker, unique)
    try:
        # -- the stopped group: the late messages wait, and their wait shows as a growing age
        async def stopped() -> Any:
            s = await asyncio.to_thread(status_json, stack, collector, sc.stopped)
            row = topic_row(s, sc.topic)
            ok = s["groups"][0]["state"] == "stopped" and row["lag"] == len(sc.late)
            return s if ok and row["lag_age_ms"] is not None else None

        first = await eventually(stopped, timeout=60, interval=0.5, what="stopped group's lag")
        g = first["groups"][0]
        row = topic_row(first, sc.topic)
        assert g["clients"] == 0 and g["lag"] == len(sc.late)
        assert row["oldest_unconsumed"]["msg_id"] in {sc.ids[b] for b in sc.late}
        assert sum(q["lag"] for q in row["queues"]) == len(sc.late)
        assert row["last_hour"]["consumed"] == 4 and row["last_consume"] is not None

        async def older() -> Any:
            s = await asyncio.to_thread(status_json, stack, collector, sc.stopped)
            r = topic_row(s, sc.topic)
            return s if r["lag_age_ms"] >= row["lag_age_ms"] + 1500 else None

        later = await eventually(older, timeout=20, interval=0.5, what="the lag age to grow")
        again = topic_row(later, sc.topic)
        assert again["lag"] == len(sc.late)  # nothing consumed meanwhile: the age grows
        # every status is a sample: the trend's current minute holds the lag
        assert again["trend"][-1]["lag"] == len(sc.late) or again["trend"][-2]["lag"] == len(
            sc.late
        )
        assert len(again["trend"]) in (60, 61)

        # -- the flaky group: failures, retries, two dead letters, and no lag
        async def flaky() -> Any:
            s = await asyncio.to_thread(status_json, stack, collector, sc.flaky)
            r = topic_row(s, sc.topic)
            h = r["last_hour"]
            done = h["dead_lettered"] == 2 and h["consumed"] == 5 and h["failed"] == 4
            return s if done and r["lag"] == 0 else None

        s = await eventually(flaky, timeout=60, interval=0.5, what="flaky group's counts")
        g = s["groups"][0]
        r = topic_row(s, sc.topic)
        assert g["state"] == "failing" and g["clients"] >= 1
        assert r["last_hour"]["retried"] == 2  # bad-1 and bad-2 came back once each
        assert r["rates_per_min"]["failure"] == pytest.approx(4 / 5)
        assert r["rates_per_min"]["dead_letter"] == pytest.approx(2 / 5)
        assert r["rates_per_min"]["consume"] == pytest.approx(5 / 5)
        assert sum(m["dead_lettered"] for m in r["trend"]) == 2

        # -- every group at once, as a table
        table = await asyncio.to_thread(tracemq, stack, collector, "group", "status")
        assert table.returncode == 0, table.stderr
        assert sc.stopped in table.stdout and sc.flaky in table.stdout
        assert "stopped" in table.stdout and "failing" in table.stdout

        # -- a group nobody ever subscribed: one line, exit 1
        res = await asyncio.to_thread(tracemq, stack, collector, "group", "status", f"no_{unique}")
        assert res.returncode == 1 and res.stdout == ""
        assert len(res.stderr.strip().splitlines()) == 1 and f"no_{unique}" in res.stderr

        # -- point 14: each message of the topic with its outcome per group so far
        async def outcomes() -> Any:
            status, body = await asyncio.to_thread(
                collector_get, collector, "/api/v1/messages", topic=sc.topic, outcomes=1
            )
            assert status == 200, body
            got = {
                it["msg_id"]: {o["group"]: o["outcome"] for o in it["outcomes"]}
                for it in body["items"]
            }
            return got if len(got) == len(sc.ids) else None

        got = await eventually(outcomes, timeout=30, what="every message listed")
        for body, msg_id in sc.ids.items():
            want_flaky = "dead_lettered" if body.startswith(b"bad") else "consumed"
            want_stopped = "pending" if body in sc.late else "consumed"
            assert got[msg_id] == {sc.flaky: want_flaky, sc.stopped: want_stopped}, body
        status, by_key = await asyncio.to_thread(
            collector_get, collector, "/api/v1/traces", key=f"k-{unique}", outcomes=1, limit=2
        )
        assert status == 200 and len(by_key["items"]) == 2 and by_key["next_cursor"]
        assert all(len(it["outcomes"]) == 2 for it in by_key["items"])
    finally:
        await sc.flaky_consumer.shutdown()

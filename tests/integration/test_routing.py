"""Routes on the real embedded stack: topics created by admin requests, the trace topic, the CLI."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from tracemq.admin import AdminClient
from tracemq.routing import RegistryReader
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]


def cli(stack: EmbeddedStack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.client_env(), "TRACEMQ_DEV_HOME": "/nonexistent"}
    return subprocess.run(
        [*tracemq_command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


async def test_created_topic_is_routed_to_broker_a(
    stack: EmbeddedStack, admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    topic = f"Orders_{unique}"
    reply = await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    assert reply["created"] is True

    async def routed() -> bool:
        route = await registry.topic_route(topic)
        return route.brokers == ["broker-a"]

    await eventually(routed, timeout=10, what="route of the new topic")
    route = await registry.topic_route(topic)
    q = route.queues[0]
    assert (q.read_queues, q.write_queues, q.perm) == (4, 4, 6)
    assert q.data_bootstrap == stack.business_bootstrap

    shown = json.loads(cli(stack, "route", "show", topic, "--json").stdout)
    assert [(b["broker"], b["write_queues"]) for b in shown["brokers"]] == [("broker-a", 4)]
    table = cli(stack, "route", "show", topic).stdout
    assert "broker-a" in table


async def test_trace_topic_lives_only_on_the_trace_broker(
    stack: EmbeddedStack, registry: RegistryReader
) -> None:
    route = await registry.topic_route("RMQ_SYS_TRACE_TOPIC")
    assert route.brokers == ["trace-broker"]
    q = route.queues[0]
    assert (q.read_queues, q.write_queues) == (1, 1)
    assert q.data_bootstrap == stack.trace_bootstrap != stack.business_bootstrap
    assert q.trace_topic_enable is True
    shown = json.loads(cli(stack, "route", "show", "RMQ_SYS_TRACE_TOPIC", "--json").stdout)
    assert [b["broker"] for b in shown["brokers"]] == ["trace-broker"]


async def test_update_and_delete_change_the_route(
    admin: AdminClient, registry: RegistryReader, unique: str
) -> None:
    topic = f"Upd_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=4, write_queues=4)
    await admin.update_topic("broker-a", topic, write_queues=2)

    async def shrunk() -> bool:
        r = await registry.topic_route(topic)
        return bool(r.queues) and r.queues[0].write_queues == 2

    await eventually(shrunk, timeout=10, what="write queues 2")
    listed = await admin.list_topics("broker-a")
    assert listed["topics"][topic]["write_queues"] == 2
    await admin.delete_topic("broker-a", topic)

    async def gone() -> bool:
        return not (await registry.topic_route(topic)).queues

    await eventually(gone, timeout=10, what="route removed after delete")
    assert topic not in (await admin.list_topics("broker-a"))["topics"]


def test_cli_topic_commands_and_errors(stack: EmbeddedStack, unique: str) -> None:
    topic = f"Cli_{unique}"
    out = json.loads(
        cli(
            stack, "topic", "create", topic, "--broker", "broker-a", "-r", "2", "-w", "2", "--json"
        ).stdout
    )
    assert out == {"created": True, "perm": 6, "read_queues": 2, "topic": topic, "write_queues": 2}
    bad = cli(stack, "topic", "create", "no spaces", "--broker", "broker-a", check=False)
    assert bad.returncode == 2 and "illegal characters" in bad.stderr
    unknown = cli(stack, "topic", "create", topic, "--broker", "no-such-broker", check=False)
    assert unknown.returncode == 2 and "unknown broker 'no-such-broker'" in unknown.stderr
    missing = cli(stack, "route", "show", f"Missing_{unique}", check=False)
    assert missing.returncode == 1 and "no route" in missing.stderr

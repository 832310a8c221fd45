"""compose.yaml is valid, every long-running tracemq command in it becomes healthy on the
embedded stack with compose's own environment (host names mapped to loopback, volumes to
directories) and its credentials (`.env.example`'s: the embedded Redis gets its password, the
collector wants its token), and the one-shot reconcile job runs with its compose command over
the lake the compose collector wrote."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)
from tracemq.admin import AdminClient
from tracemq.collector_lag import wait_caught_up
from tracemq.kafka_security import KafkaSecuritySettings
from tracemq.routing import RegistryReader, connect
from tracemq_broker.settings import BrokerSettings
from tracemq_collector.lake import lake_filesystem
from tracemq_collector.settings import CollectorSettings
from tracemq_devkit.devstack import EmbeddedStack, StackConfig, free_port
from tracemq_devkit.devstack.secrets import StackSecrets
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually
from tracemq_nameserver.settings import NamesrvSettings

from tests.support.collector_api import http
from tests.support.seaweed import download

pytestmark = [pytest.mark.compose, pytest.mark.stack]

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"nameserver": NamesrvSettings, "broker": BrokerSettings, "collector": CollectorSettings}


def env_example() -> dict[str, str]:
    """``.env.example``: the placeholders compose is validated and run with here."""
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_env_example_holds_no_real_secret() -> None:
    """Every secret in the committed file is an obvious placeholder."""
    for key, value in env_example().items():
        if any(w in key for w in ("PASSWORD", "SECRET", "TOKEN")):
            assert value.startswith("change-me"), f".env.example {key} is not a placeholder"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: `make test` installs it (Debian package docker-compose)"
    bare = subprocess.run(
        [exe, "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT / "docker",  # no .env there: nothing but the environment
        env={k: v for k, v in os.environ.items() if k not in env_example()},
    )
    # without the secrets compose refuses to start, naming what to set
    assert bare.returncode != 0 and "in .env" in bare.stderr, bare.stderr
    res = subprocess.run(
        [exe, "--env-file", str(ROOT / ".env.example"), "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert res.returncode == 0, f"compose.yaml is invalid:\n{res.stderr}"
    return yaml.safe_load(res.stdout)  # type: ignore[no-any-return]


def _ours(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services built from docker/ that run forever (one-shot jobs are checked elsewhere)."""
    return {
        n: s
        for n, s in compose["services"].items()
        if "build" in s and s.get("restart") == "unless-stopped"
    }


def _order(services: dict[str, dict[str, Any]]) -> list[str]:
    done: list[str] = []

    def visit(n: str) -> None:
        if n in done or n not in services:
            return
        for dep in services[n].get("depends_on", {}):
            visit(dep)
        done.append(n)

    for n in services:
        visit(n)
    return done


def test_compose_lists_every_service(compose: dict[str, Any]) -> None:
    names = set(compose["services"])
    assert {
        "redpanda-business",
        "redpanda-trace",
        "redis",
        "nameserver",
        "broker-a",
        "trace-broker",
        "collector",
    } <= names
    for name, svc in _ours(compose).items():
        assert svc["command"][0] == "tracemq", name
        assert svc["command"][1] in SETTINGS, name
        assert "tracemq" in svc["healthcheck"]["test"], name
        for dep, cond in svc.get("depends_on", {}).items():
            want = "service_completed_successfully" if dep.endswith("-init") else "service_healthy"
            assert cond["condition"] == want, (name, dep)
        assert svc["build"]["target"] == svc["command"][1], name


def test_every_long_running_service_restarts_when_it_dies(compose: dict[str, Any]) -> None:
    """A dead service comes back (what `tracemq dev up` does on the embedded stack); the
    one-shot job is never restarted."""
    one_shot = {
        n for n, s in compose["services"].items() if s.get("profiles") or n.endswith("-init")
    }
    assert one_shot == {"reconcile", "redpanda-business-init", "redpanda-trace-init"}
    for name, svc in compose["services"].items():
        want = "no" if name in one_shot else "unless-stopped"
        assert svc.get("restart") == want, f"{name}: restart is {svc.get('restart')!r}"


def test_compose_variables_are_real_settings(compose: dict[str, Any]) -> None:
    """A misspelt variable would be ignored silently at run time; catch it here."""
    for name, svc in _ours(compose).items():
        fields = {f"TRACEMQ_{f.upper()}" for f in SETTINGS[svc["command"][1]].model_fields}
        fields |= {f"TRACEMQ_KAFKA_{f.upper()}" for f in KafkaSecuritySettings.model_fields}
        unknown = set(svc["environment"]) - fields
        assert not unknown, f"{name}: not settings of `tracemq {svc['command'][1]}`: {unknown}"


@pytest.fixture(scope="module")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    example = env_example()
    # the embedded stack with compose's credentials, so compose's URLs and tokens work as written
    secrets = StackSecrets(
        redis_password=example["REDIS_PASSWORD"],
        collector_api_token=example["COLLECTOR_API_TOKEN"],
        signing={
            role: (example[f"{role.upper()}_ACCESS_KEY_ID"], example[f"{role.upper()}_SECRET_KEY"])
            for role in ("broker", "client", "admin")
        },
        kafka_users={
            c: (example["KAFKA_SASL_USERNAME"], example["KAFKA_SASL_PASSWORD"])
            for c in ("business", "trace")
        },
    )
    s = EmbeddedStack(
        StackConfig(
            workdir=tmp_path_factory.mktemp("parity"),
            start_services=False,
            secrets=secrets,
            secure=True,  # SASL as compose's Redpanda (with TLS on top: see _embedded_kafka)
            object_store=True,  # compose's seaweedfs: the collector's lake bucket
            redis_tls=False,  # compose's Redis: a password on a private network, no TLS
        )
    )
    from tests.conftest import _SESSION_STACKS

    _SESSION_STACKS.append(s)
    s.start()
    try:
        yield s
    finally:
        s.stop()
        _SESSION_STACKS.remove(s)


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_every_compose_service_runs_healthy_on_the_embedded_stack(
    compose: dict[str, Any], infra: EmbeddedStack, tmp_path: Path
) -> None:
    services = _ours(compose)
    ports = {n: free_port() for n in services}
    hosts = {
        "redis:6379": infra.redis_url.split("@")[1].split("/")[0],
        "redpanda-business:9092": infra.business_bootstrap,
        "redpanda-trace:9092": infra.trace_bootstrap,
        "seaweedfs:8333": infra.lake_env["TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT"].split("//")[1],
        **{f"{n}:8080": f"127.0.0.1:{p}" for n, p in ports.items()},
    }

    def mapped(name: str, value: str) -> str:
        for host, target in hosts.items():
            value = value.replace(host, target)
        if value == "0.0.0.0":
            return "127.0.0.1"
        if value.startswith("/data"):  # the service's volume, shared with who mounts it too
            return str(tmp_path / _data_volume(compose["services"][name]) / value.lstrip("/"))
        return value

    started = []
    for name in _order(services):
        svc = services[name]
        env = _embedded_kafka(
            infra, {k: mapped(name, str(v)) for k, v in svc["environment"].items()}
        )
        env = _embedded_s3(infra, env)
        env["TRACEMQ_HTTP_PORT"] = str(ports[name])
        started.append(infra.spawn_service(f"compose-{name}", svc["command"][1:], env))
    assert len(started) == len(services) >= 4

    for name in services:
        check = [mapped(name, a) for a in services[name]["healthcheck"]["test"][1:]]
        check = [re.sub(r"localhost:8080", f"127.0.0.1:{ports[name]}", a) for a in check]
        assert check[0] == "tracemq"
        res = subprocess.run(
            [*tracemq_command(), *check[1:]], capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 0, f"{name} healthcheck failed: {res.stdout}{res.stderr}"

    async def wired() -> bool:
        r = connect(infra.redis_url)
        try:
            reader = RegistryReader(r)
            trace = await reader.topic_route("RMQ_SYS_TRACE_TOPIC")
            brokers = await reader.brokers()
            return trace.brokers == ["trace-broker"] and "broker-a" in brokers
        finally:
            await r.aclose()

    # (a broker re-registers every 30 s, BROKER_HEARTBEAT_INTERVAL_MS: a first registration the
    # nameserver did not take under the full suite's load is taken at the next one)
    asyncio.run(eventually(wired, timeout=45, what="compose brokers registered"))

    # the compose collector wants .env.example's token
    collector = f"http://127.0.0.1:{ports['collector']}/api/v1/quarantine"
    assert http(collector, token=None)[0] == 401
    assert http(collector, token=env_example()["COLLECTOR_API_TOKEN"])[0] == 200

    # the one-shot reconcile job, with compose's command, environment and volume, over the lake
    # the compose collector wrote from a traced workload
    example = env_example()
    with pytest.MonkeyPatch.context() as mp:  # this process's clients sign with compose's keys
        mp.setenv("TRACEMQ_ACCESS_KEY_ID", example["CLIENT_ACCESS_KEY_ID"])
        mp.setenv("TRACEMQ_SECRET_KEY", example["CLIENT_SECRET_KEY"])
        mp.setenv("TRACEMQ_ADMIN_ACCESS_KEY_ID", example["ADMIN_ACCESS_KEY_ID"])
        mp.setenv("TRACEMQ_ADMIN_SECRET_KEY", example["ADMIN_SECRET_KEY"])
        group = asyncio.run(_traced_workload(infra, tmp_path))
    job = compose["services"]["reconcile"]
    assert job["build"]["target"] == "reconcile" and job["restart"] == "no"
    assert _data_volume(job) == _data_volume(compose["services"]["collector"])
    entrypoint = _dockerfile_entrypoint("reconcile")
    assert entrypoint == ["tracemq", "reconcile"]
    # The job reads the collector's own lake URI through S3A; this machine has no hadoop-aws
    # (nor the network to fetch it), so it reads a local copy of the bucket's objects instead.
    lake_uri = job["command"][job["command"].index("--lake") + 1]
    assert lake_uri == compose["services"]["collector"]["environment"]["TRACEMQ_COLLECTOR_LAKE_URI"]
    copy = tmp_path / "lake-copy"
    _download_lake(infra, lake_uri, copy)
    command = [str(copy) if a == lake_uri else mapped("reconcile", a) for a in job["command"]]
    job_env = {k: mapped("reconcile", str(v)) for k, v in job["environment"].items()}
    assert job_env.keys() >= {"TRACEMQ_SPARK_S3A_ENDPOINT", "TRACEMQ_SPARK_S3A_PACKAGES"}
    job_env = {k: v for k, v in job_env.items() if not k.startswith("TRACEMQ_SPARK_S3A_")}
    res = subprocess.run(
        [*tracemq_command(), *entrypoint[1:], *command],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_SPARK_S3A_")},
            **_embedded_kafka(infra, job_env),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = Path(mapped("reconcile", job["command"][job["command"].index("--out") + 1]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_group"][group]["CONSUMED"] == WORKLOAD, summary["by_group"]
    assert summary["anomalies"] == 0, summary["outcomes"]

    for proc in reversed(started):
        assert proc.stop() == 0, f"{proc.name} did not stop cleanly:\n{proc.log_tail()}"


WORKLOAD = 12


def _embedded_kafka(infra: EmbeddedStack, env: dict[str, str]) -> dict[str, str]:
    """compose's Kafka settings on the embedded clusters: the same SASL users and mechanism;
    compose's Redpanda listens SASL_PLAINTEXT on its private network, the embedded stack's SASL
    gateway always adds TLS, so the protocol gains SSL and the stack's CA."""
    if env.get("TRACEMQ_KAFKA_SECURITY_PROTOCOL") == "SASL_PLAINTEXT":
        assert infra.tls is not None
        env = {
            **env,
            "TRACEMQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TRACEMQ_KAFKA_SSL_CAFILE": str(infra.tls.ca),
        }
    return env


def _embedded_s3(infra: EmbeddedStack, env: dict[str, str]) -> dict[str, str]:
    """compose's lake key pair (``.env``) → the embedded SeaweedFS's."""
    return {k: infra.lake_env.get(k, v) if k.endswith("_KEY") else v for k, v in env.items()}


def _download_lake(infra: EmbeddedStack, uri: str, to: Path) -> None:
    env = infra.lake_env
    filesystem, root = lake_filesystem(
        uri,
        s3_endpoint=env["TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT"],
        s3_region=env["TRACEMQ_COLLECTOR_LAKE_S3_REGION"],
        s3_access_key=env["TRACEMQ_COLLECTOR_LAKE_S3_ACCESS_KEY"],
        s3_secret_key=env["TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY"],
    )
    assert filesystem is not None
    download(filesystem, root.as_posix(), to)
    assert any(to.rglob("part-*.parquet")), f"nothing in {uri}"


def _data_volume(service: dict[str, Any]) -> str:
    """The named volume a service mounts at /data (compose config writes ``name:/data:rw``)."""
    for v in service.get("volumes", []):
        source, target = (v["source"], v["target"]) if isinstance(v, dict) else v.split(":")[:2]
        if target == "/data":
            return str(source)
    raise AssertionError(f"no volume mounted at /data: {service.get('volumes')}")


def _dockerfile_entrypoint(target: str) -> list[str]:
    """The ENTRYPOINT of a docker/Dockerfile stage (a JSON array)."""
    stage = None
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            stage = m.group(1)
        elif stage == target and line.startswith("ENTRYPOINT"):
            return list(json.loads(line.split(None, 1)[1]))
    raise AssertionError(f"docker/Dockerfile: stage {target} has no ENTRYPOINT")


async def _traced_workload(infra: EmbeddedStack, tmp_path: Path) -> str:
    """A topic on the compose broker-a, messages sent and consumed with trace on; returns the
    consumer group once the compose collector has every trace in its lake."""
    unique = tmp_path.name[-8:].replace("-", "_")
    topic, group = f"TopicCompose_{unique}", f"CG_compose_{unique}"
    env = {"redis_url": infra.redis_url, "control_bootstrap": infra.business_bootstrap}
    async with AdminClient(infra.business_bootstrap, infra.redis_url) as admin:
        await admin.create_topic("broker-a", topic, read_queues=2, write_queues=2)
    consumed: set[str] = set()

    async def on(msgs: list[MessageExt], ctx: Any) -> ConsumeConcurrentlyStatus:
        consumed.update(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group, consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=True, **env
    )
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(on)
    producer = Producer(f"PG_compose_{unique}", enable_msg_trace=True, **env)
    await consumer.start()
    await producer.start()
    try:
        sent = {
            (await producer.send(Message(topic, b"x", keys=f"k{i}"))).msg_id
            for i in range(WORKLOAD)
        }

        async def all_consumed() -> bool:
            return consumed >= sent

        await eventually(all_consumed, timeout=30, what="the compose workload consumed")
    finally:
        await consumer.shutdown()
        await producer.shutdown()
    await wait_caught_up(infra.redis_url, timeout_s=60)
    return group

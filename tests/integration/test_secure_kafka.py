"""`tracemq dev up --secure`: both Kafka clusters behind TLS (a throw-away CA) and SASL/SCRAM
(a generated user per cluster). Every service connects that way, the CLI finds the stack and its
security, and the library's clients in this process (configured from the stack's
``TRACEMQ_KAFKA_*``) send, consume and trace; the collector stores and finds the traces; the
reconcile job's input snapshot reads the committed offsets over the secure connection.
A client without credentials, with a wrong password, another cluster's user or a CA that did
not sign the broker's certificate is refused with one line naming the cluster."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr
from tracemq import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    kafka_security,
)
from tracemq.collector_lag import wait_caught_up
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually
from tracemq_spark.inputs import export

from tests.support.collector_api import http

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

N = 12


def run(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*tracemq_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A `tracemq dev up --secure --detach` stack; this process's clients use its security."""
    home = tmp_path_factory.mktemp("secure")
    env = {
        "TRACEMQ_DEV_HOME": str(home / "dev"),
        "TRACEMQ_STACKS_DIR": str(home / "stacks"),
    }
    up = run("dev", "up", "--secure", "--detach", env=env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    try:
        state = json.loads((home / "dev" / "state.json").read_text())
        with pytest.MonkeyPatch.context() as mp:
            for k, v in state["kafka_client_env"].items():
                mp.setenv(k, v)
            # this stack made its own signing keys: clients and the CLI sign with those
            (ckid, csecret), (akid, asecret) = state["signing"]["client"], state["signing"]["admin"]
            mp.setenv("TRACEMQ_ACCESS_KEY_ID", ckid)
            mp.setenv("TRACEMQ_SECRET_KEY", csecret)
            mp.setenv("TRACEMQ_ADMIN_ACCESS_KEY_ID", akid)
            mp.setenv("TRACEMQ_ADMIN_SECRET_KEY", asecret)
            kafka_security.install(None)
            try:
                yield {"env": env, "state": state, "home": home}
            finally:
                kafka_security.install(None)
    finally:
        down = run("dev", "down", env=env)
        assert down.returncode == 0, down.stderr


@pytest.mark.timeout(300)
async def test_send_consume_trace_collector_and_offsets_over_tls_and_sasl(
    secure: dict[str, Any], unique: str, tmp_path: Path
) -> None:
    env, state = secure["env"], secure["state"]
    # the stack says it is secure, and how (no secret in what status prints)
    status = await asyncio.to_thread(run, "dev", "status", "--json", env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    info = json.loads(status.stdout)
    assert info["secure"] is True and info["healthy"], info
    assert info["kafka_security"]["security_protocol"] == "SASL_SSL"
    assert "gateway-business" in info["infra"] and "gateway-trace" in info["infra"]
    assert "password" not in status.stdout.lower()
    for password in [v for k, v in state["kafka_client_env"].items() if "PASSWORD" in k]:
        assert password not in status.stdout
    # the CLI, through the running stack's state, over TLS + SASL
    topic = f"TopicSec_{unique}"
    made = await asyncio.to_thread(
        run, "topic", "create", topic, "-b", "broker-a", "-r", "2", "-w", "2", env=env
    )
    assert made.returncode == 0, made.stderr
    listed = await asyncio.to_thread(run, "topic", "list", "-b", "broker-a", "--json", env=env)
    assert listed.returncode == 0 and topic in listed.stdout, listed.stderr
    route = await asyncio.to_thread(run, "route", "show", topic, "--json", env=env)
    assert json.loads(route.stdout)["brokers"][0]["data_bootstrap"] == state["business_bootstrap"]

    conn = {"redis_url": state["redis_url"], "control_bootstrap": state["business_bootstrap"]}
    group = f"CG_sec_{unique}"
    seen: set[str] = set()

    async def on(msgs: list[MessageExt], _ctx: Any) -> ConsumeConcurrentlyStatus:
        seen.update(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group, consume_from=ConsumeFromWhere.FIRST_OFFSET, enable_msg_trace=True, **conn
    )
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(on)
    producer = Producer(f"PG_sec_{unique}", enable_msg_trace=True, **conn)
    await consumer.start()
    await producer.start()
    sent: list[str] = []
    try:
        for i in range(N):
            sent.append((await producer.send(Message(topic, f"s{i}".encode()))).msg_id)  # noqa: PERF401

        async def all_seen() -> bool:
            return seen >= set(sent)

        await eventually(all_seen, timeout=60, what="every message consumed")
    finally:
        await consumer.shutdown()  # commits its offsets
        await producer.shutdown()  # flushes its traces

    # the trace went producer → trace cluster (SASL_SSL) → collector (SASL_SSL) → its API
    def lookup(msg_id: str) -> tuple[int, Any]:
        url = f"{state['collector_api']}/api/v1/traces/{msg_id}"
        return http(url, token=state["collector_api_token"])  # this stack's own token

    async def traced() -> dict[str, Any] | None:
        status, view = await asyncio.to_thread(lookup, sent[-1])
        return view if status == 200 and group in json.dumps(view) else None

    await eventually(traced, timeout=60, what="the collector finds the Pub and the Sub traces")
    # the collector's lag reader (its committed offsets on the trace cluster) over SASL_SSL
    await wait_caught_up(state["redis_url"], timeout_s=60)
    lag = await asyncio.to_thread(run, "trace", "lag", "--json", env=env)  # the CLI's reader
    assert lag.returncode == 0, lag.stderr
    assert json.loads(lag.stdout)["lag"] == 0

    # the reconcile job's input snapshot (what `tracemq reconcile` runs before Spark): the
    # groups' committed offsets and the retry copies, read from Kafka over SASL_SSL
    _, offsets_file = await asyncio.to_thread(export, state["redis_url"], tmp_path / "inputs")
    snapshot = json.loads(offsets_file.read_text())
    committed = [
        o["committed"] for o in snapshot["offsets"] if o["topic"] == topic and o["group"] == group
    ]
    assert len(committed) == 2 and sum(committed) == N, snapshot["offsets"]


def _security(
    secure: dict[str, Any], *, protocol: str = "SASL_SSL", **change: Any
) -> kafka_security.KafkaSecurity:
    """The stack's own client security with ``change`` applied to every cluster."""
    cur = kafka_security.current()
    clusters = []
    for c in cur.clusters:
        fields = {**c.__dict__, "security_protocol": protocol, **change}
        fields.pop("_ssl")
        if not protocol.endswith("SSL"):
            fields["ssl_cafile"] = None
        clusters.append(kafka_security.ClusterSecurity(**fields))
    return kafka_security.KafkaSecurity(default=cur.default, clusters=tuple(clusters))


@pytest.mark.timeout(120)
async def test_clients_without_the_right_credentials_or_ca_are_refused_naming_the_cluster(
    secure: dict[str, Any], tmp_path: Path
) -> None:
    state = secure["state"]
    trace = state["trace_bootstrap"]
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    business_user = state["kafka_security"]["users"]["business"]
    business_pw = state["kafka_client_env"]["TRACEMQ_KAFKA_CLUSTERS__BUSINESS__SASL_PASSWORD"]
    cases = {
        "no credentials": (_security(secure, protocol="PLAINTEXT"), "SECURITY_PROTOCOL"),
        "TLS, no SASL": (_security(secure, protocol="SSL"), "SECURITY_PROTOCOL"),
        "wrong password": (
            _security(secure, sasl_password=SecretStr("not-the-password")),
            "SASL_PASSWORD",
        ),
        "the business user on the trace cluster": (
            _security(secure, sasl_username=business_user, sasl_password=SecretStr(business_pw)),
            "SASL_PASSWORD",
        ),
        "wrong CA": (_security(secure, ssl_cafile=other_ca), "SSL_CAFILE"),
    }
    original = kafka_security.current()
    try:
        for case, (security, hint) in cases.items():
            kafka_security.install(security)
            producer = AIOKafkaProducer(
                bootstrap_servers=trace,
                request_timeout_ms=5000,
                **kafka_security.client_kwargs(trace),
            )
            try:
                with pytest.raises(kafka_security.KafkaConnectError) as err:
                    await kafka_security.start(producer, trace)
            finally:
                await producer.stop()
            text = str(err.value)
            assert f"Kafka cluster 'trace' at {trace}" in text, (case, text)
            assert f"TRACEMQ_KAFKA_CLUSTERS__TRACE__{hint}" in text, (case, text)
            assert "\n" not in text, (case, text)
    finally:
        kafka_security.install(original)

    # the CLI with a wrong password: one line naming the cluster, exit 1
    env = {
        **secure["env"],
        **state["kafka_client_env"],
        "TRACEMQ_KAFKA_CLUSTERS__BUSINESS__SASL_PASSWORD": "wrong",
    }
    res = await asyncio.to_thread(run, "topic", "list", "-b", "broker-a", env=env, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and f"Kafka cluster 'business' at {state['business_bootstrap']}" in line
    assert "SaslAuthenticationFailed" in line and "SASL_PASSWORD" in line, line

    # a service with a wrong password stops at start with the same line in its log
    svc_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")},
        **state["kafka_client_env"],
        "TRACEMQ_KAFKA_CLUSTERS__BUSINESS__SASL_PASSWORD": "wrong",
        "TRACEMQ_REDIS_URL": state["redis_url"],
        "TRACEMQ_CONTROL_BOOTSTRAP": state["business_bootstrap"],
        "TRACEMQ_HTTP_PORT": "0",
        # this trial is about Kafka: record signing stays out of its way
        "TRACEMQ_AUTH_DISABLED": "true",
    }
    ns = await asyncio.to_thread(
        subprocess.run,
        [*tracemq_command(), "nameserver"],
        env=svc_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ns.returncode == 1, ns.stdout[-2000:] + ns.stderr[-2000:]
    assert "service failed to start" in ns.stdout + ns.stderr
    assert "Kafka cluster 'business'" in ns.stdout + ns.stderr


@pytest.mark.timeout(120)
async def test_the_secure_stacks_redis_speaks_tls_only(secure: dict[str, Any]) -> None:
    """Redis of a secure stack: rediss:// with the stack's CA in the URL (every service and the
    CLI above used it); without the CA, with a plain redis:// URL or with another CA a client
    is refused with one line naming the Redis, its password hidden."""
    from tracemq.routing import RegistryReader, connect
    from tracemq.routing.registry import describe_failure

    state = secure["state"]
    url = state["redis_url"]
    assert state["redis_tls"] is True and url.startswith("rediss://"), url
    assert "ssl_ca_certs=" in url
    r = connect(url)
    try:
        assert await r.ping()
        assert "broker-a" in await RegistryReader(r).brokers()
    finally:
        await r.aclose()

    base = url.split("?")[0]
    other_ca = secure["home"] / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    password = base.split("@")[0].split(":")[-1]
    for case, bad in (
        ("system trust store", base),
        ("other CA", f"{base}?ssl_ca_certs={other_ca}"),
        ("plain", "redis://" + base.removeprefix("rediss://")),
    ):
        r = connect(bad)
        try:
            with pytest.raises(Exception) as err:  # noqa: PT011 - any client error; the line matters
                await r.ping()
        finally:
            await r.aclose()
        line = describe_failure(err.value, bad)
        assert "\n" not in line and "Redis at" in line, (case, line)
        if case != "plain":
            assert "TLS handshake failed" in line and "ssl_ca_certs" in line, (case, line)
        assert password not in line, (case, line)

    # the CLI with the wrong CA: one line, exit 1
    res = await asyncio.to_thread(
        run,
        "route",
        "show",
        "Anything",
        env={
            **secure["env"],
            "TRACEMQ_REDIS_URL": f"{base}?ssl_ca_certs={other_ca}",
            "TRACEMQ_CONTROL_BOOTSTRAP": state["business_bootstrap"],
        },
        timeout=60,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Redis" in res.stderr, res.stderr
    assert password not in res.stderr

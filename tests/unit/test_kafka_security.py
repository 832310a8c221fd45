"""Kafka security settings (``TRACEMQ_KAFKA_*``): validation names the variable, clusters are
found by bootstrap, one TLS context per cluster; and the dev stack gateway's SASL server
against aiokafka's own SCRAM client (no Kafka needed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka.conn import SaslPlainAuthenticator, ScramAuthenticator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracemq import kafka_security
from tracemq.errors import ConfigError
from tracemq_devkit.devstack import kafka_gateway as gw


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import os

    for k in list(os.environ):
        if k.startswith("TRACEMQ_KAFKA_"):
            monkeypatch.delenv(k)
    kafka_security.install(None)
    yield
    kafka_security.install(None)


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> kafka_security.KafkaSecurity:
    for k, v in env.items():
        monkeypatch.setenv(f"TRACEMQ_KAFKA_{k}", v)
    return kafka_security.load()


def test_default_is_plaintext_with_no_extra_arguments() -> None:
    sec = kafka_security.load()
    assert sec.for_bootstrap("h:1").kwargs() == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SECURITY_PROTOCOL": "SASL_SSL", "SASL_USERNAME": "u"}, "TRACEMQ_KAFKA_SASL_PASSWORD"),
        (
            {"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_PASSWORD": "p"},
            "TRACEMQ_KAFKA_SASL_USERNAME",
        ),
        ({"SECURITY_PROTOCOL": "TLS"}, "TRACEMQ_KAFKA_SECURITY_PROTOCOL"),
        ({"SASL_MECHANISM": "GSSAPI"}, "TRACEMQ_KAFKA_SASL_MECHANISM"),
        (
            {"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": "/nonexistent/ca.pem"},
            "TRACEMQ_KAFKA_SSL_CAFILE",
        ),
        ({"SSL_CAFILE": "{ca}"}, "TRACEMQ_KAFKA_SSL_CAFILE"),  # a CA, but PLAINTEXT
        ({"SECURITY_PROTOCOL": "SSL", "SSL_KEYFILE": "{ca}"}, "TRACEMQ_KAFKA_SSL_KEYFILE"),
        (
            {
                "SECURITY_PROTOCOL": "SASL_SSL",
                "SASL_USERNAME": "u",
                "SASL_PASSWORD": "p",
                "CLUSTERS__TRACE__BOOTSTRAP": "t:1",
                "CLUSTERS__TRACE__SASL_PASSWORD": "",
            },
            "TRACEMQ_KAFKA_CLUSTERS__TRACE__SASL_PASSWORD",
        ),
        ({"CLUSTERS__TRACE__SASL_USERNAME": "u"}, "TRACEMQ_KAFKA_CLUSTERS"),  # no BOOTSTRAP
    ],
)
def test_bad_settings_are_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, ca_file: Path, env: dict[str, str], named: str
) -> None:
    env = {k: v.replace("{ca}", str(ca_file)) for k, v in env.items()}
    with pytest.raises(ConfigError) as err:
        load(monkeypatch, **env)
    text = str(err.value)
    assert named in text.upper().replace(".", "__"), text
    assert "\n" not in text


def test_clusters_are_found_by_any_host_port_of_their_bootstrap(
    monkeypatch: pytest.MonkeyPatch, ca_file: Path
) -> None:
    sec = load(
        monkeypatch,
        SECURITY_PROTOCOL="SASL_SSL",
        SASL_USERNAME="biz",
        SASL_PASSWORD="biz-pw",
        SSL_CAFILE=str(ca_file),
        CLUSTERS__TRACE__BOOTSTRAP="t1:9093, T2:9093",
        CLUSTERS__TRACE__SASL_USERNAME="tr",
        CLUSTERS__TRACE__SASL_PASSWORD="tr-pw",
        CLUSTERS__TRACE__SASL_MECHANISM="SCRAM-SHA-256",
    )
    trace = sec.for_bootstrap("t2:9093,other:1")
    assert trace.name == "trace"
    kw = trace.kwargs()
    assert kw["sasl_plain_username"] == "tr" and kw["sasl_plain_password"] == "tr-pw"
    assert kw["sasl_mechanism"] == "SCRAM-SHA-256" and kw["security_protocol"] == "SASL_SSL"
    business = sec.for_bootstrap("b:9092")
    assert business.name == "default" and business.kwargs()["sasl_plain_username"] == "biz"
    # one TLS context per cluster, made once, trusting the CA file
    assert trace.ssl_context() is trace.kwargs()["ssl_context"]
    assert trace.ssl_context() is not None
    assert trace.ssl_context().check_hostname  # type: ignore[union-attr]


def test_the_same_settings_from_one_json_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sec = load(
        monkeypatch,
        CLUSTERS='{"trace": {"bootstrap": "t:1", "security_protocol": "SASL_PLAINTEXT", '
        '"sasl_username": "u", "sasl_password": "p"}}',
    )
    assert sec.for_bootstrap("t:1").kwargs()["sasl_plain_password"] == "p"
    assert sec.for_bootstrap("b:1").kwargs() == {"security_protocol": "PLAINTEXT"}


def test_a_failure_names_the_cluster_and_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    from aiokafka.errors import SaslAuthenticationFailed

    c = load(monkeypatch).for_bootstrap("h:1")
    bad_ca = kafka_security.describe_failure(
        c, "h:1", ssl.SSLCertVerificationError("certificate verify failed")
    )
    assert "'default' at h:1" in bad_ca and "TRACEMQ_KAFKA_SSL_CAFILE" in bad_ca
    bad_pw = kafka_security.describe_failure(
        c, "h:1", SaslAuthenticationFailed("Authentication failed")
    )
    assert "TRACEMQ_KAFKA_SASL_PASSWORD" in bad_pw
    down = kafka_security.describe_failure(c, "h:1", ConnectionRefusedError("refused"))
    assert "did not answer" in down


# -- the gateway's SASL server, spoken to by aiokafka's own client authenticators -------------
USERS = gw.Users({"alice": "s3cret", "bob": "other"})


def _drive(make: Callable[[asyncio.AbstractEventLoop], Any], server: gw.ScramServer | None) -> str:
    """Run aiokafka's client authenticator against the server; return the user or raise."""

    async def run() -> str:
        step = make(asyncio.get_running_loop()).step
        reply: bytes | None = None
        user = ""
        while True:
            res = await step(reply)
            if res is None:
                return user
            payload, _ = res
            if server is None:
                user, reply = gw.check_plain(USERS, payload), b""
            else:
                reply, _done = server.step(payload)
                user = server.user

    return asyncio.run(run())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_server_accepts_the_right_password_and_refuses_others(mechanism: str) -> None:
    def client(user: str, password: str) -> Callable[[asyncio.AbstractEventLoop], Any]:
        return lambda loop: ScramAuthenticator(
            loop=loop,
            sasl_plain_username=user,
            sasl_plain_password=password,
            sasl_mechanism=mechanism,
        )

    assert _drive(client("alice", "s3cret"), gw.ScramServer(mechanism, USERS)) == "alice"
    for user, password in [("alice", "wrong"), ("bob", "s3cret"), ("mallory", "s3cret")]:
        with pytest.raises(gw.AuthFailed, match="invalid credentials"):
            _drive(client(user, password), gw.ScramServer(mechanism, USERS))


def test_plain_server_checks_the_password() -> None:
    def client(password: str) -> Callable[[asyncio.AbstractEventLoop], Any]:
        return lambda loop: SaslPlainAuthenticator(
            loop=loop, sasl_plain_username="bob", sasl_plain_password=password
        )

    assert _drive(client("other"), None) == "bob"
    with pytest.raises(gw.AuthFailed):
        _drive(client("x"), None)


FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_gateway_decoders_raise_only_auth_failed(first: bytes, second: bytes) -> None:
    for decode in (gw.parse_request, gw.read_string, gw.read_bytes):
        try:
            decode(first)
        except gw.AuthFailed:
            pass
    try:
        gw.check_plain(USERS, first)
    except gw.AuthFailed:
        pass
    server = gw.ScramServer("SCRAM-SHA-256", USERS)
    try:
        server.step(first)
        server.step(second)
    except gw.AuthFailed:
        pass


@FUZZ
@given(st.text(max_size=80), st.text(max_size=120))
def test_scram_server_on_near_valid_text_raises_only_auth_failed(user: str, final: str) -> None:
    server = gw.ScramServer("SCRAM-SHA-512", USERS)
    try:
        server.step(f"n,,n={user},r=abc".encode())
        server.step(f"c=biws,r={server.nonce},{final}".encode())
    except gw.AuthFailed:
        pass

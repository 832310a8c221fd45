"""The Redis URL: password, ACL user and TLS options go through it to the client, bad ones are
refused up front, and no message shows the password. (The bundled redis-server is built without
TLS, so ``rediss://`` is checked here down to the client's SSL context, not against a server.)"""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from tracemq.errors import ConfigError
from tracemq.redis_url import redact, split
from tracemq.routing.registry import connect, describe_failure
from tracemq.settings import CommonSettings, load_settings


async def test_password_and_acl_user_reach_the_client() -> None:
    r = connect("redis://app:p%40ss@127.0.0.1:6380/2")
    try:
        kw = r.connection_pool.connection_kwargs
        assert (kw["username"], kw["password"], kw["port"], kw["db"]) == ("app", "p@ss", 6380, 2)
    finally:
        await r.aclose()


async def test_rediss_options_build_a_verifying_ssl_context(tmp_path: object) -> None:
    r = connect(
        "rediss://:pw@redis.example:6380/0?ssl_ca_certs=/etc/tracemq/ca.pem"
        "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
    )
    try:
        conn = r.connection_pool.make_connection()
        ctx = conn.ssl_context
        assert ctx.ca_certs == "/etc/tracemq/ca.pem"
        assert (ctx.certfile, ctx.keyfile) == ("/c.pem", "/k.pem")
        assert ctx.cert_reqs == ssl.CERT_REQUIRED and ctx.check_hostname is True
    finally:
        await r.aclose()
    r = connect("rediss://h/0?ssl_cert_reqs=none")
    try:
        ctx = r.connection_pool.make_connection().ssl_context
        assert ctx.cert_reqs == ssl.CERT_NONE and ctx.check_hostname is False
    finally:
        await r.aclose()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://h:6379/0", "scheme"),
        ("redis:///0", "needs a host"),
        ("redis://h:99999/0", "not a Redis URL"),
        ("redis://h/0?ssl_ca_certs=/ca.pem", "use rediss://"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("rediss://h/0?ssl_check_hostname=perhaps", "ssl_check_hostname"),
        ("rediss://h/0?ssl_ca_certs=", "needs a file path"),
        ("redis://h/0?socket_timeout=abc", "unknown Redis URL option"),
    ],
)
def test_bad_urls_are_refused_up_front(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=problem):
        split(url)
    with pytest.raises(ConfigError, match=problem):
        connect(url)
    monkeypatch.setenv("TRACEMQ_REDIS_URL", url.replace("//", "//:topsecret@", 1))
    with pytest.raises(ConfigError) as err:
        load_settings(CommonSettings)
    assert "TRACEMQ_REDIS_URL" in str(err.value) and "topsecret" not in str(err.value)


def test_failures_name_the_redis_without_its_password() -> None:
    url = "redis://app:hunter2@10.0.0.5:6379/0"
    for exc in (
        AuthenticationError("invalid username-password pair or user is disabled."),
        ResponseError("NOAUTH Authentication required."),
    ):
        line = describe_failure(exc, url)
        assert line.startswith("Redis at redis://app:***@10.0.0.5:6379/0 refused the login")
        assert "hunter2" not in line and "TRACEMQ_REDIS_URL" in line
    line = describe_failure(RedisConnectionError("Connection refused"), url)
    assert "did not answer" in line and "hunter2" not in line


@given(st.text(max_size=40))
def test_redact_never_shows_a_password(password: str) -> None:
    from urllib.parse import quote

    secret = quote(password, safe="")
    shown = redact(f"redis://u:{secret}@h:1/0")
    if password:
        assert shown == "redis://u:***@h:1/0"


@given(st.text(max_size=200))
def test_any_url_is_accepted_or_refused_with_value_error(url: str) -> None:
    try:
        split(url)
    except ValueError:
        pass
    shown = redact(url)
    assert isinstance(shown, str)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_any_query_is_accepted_or_refused_with_value_error(query: str) -> None:
    for scheme in ("redis", "rediss"):
        try:
            split(f"{scheme}://h:6379/0?{query}")
        except ValueError:
            pass

from __future__ import annotations

from pathlib import Path

import pytest
from tracemq.errors import ConfigError
from tracemq.settings import CommonSettings, load_settings
from tracemq_broker.settings import BrokerSettings
from tracemq_nameserver.settings import NamesrvSettings


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEMQ_HTTP_PORT", "9100")
    monkeypatch.setenv("TRACEMQ_BROKER_ROLE", "trace")
    s = load_settings(BrokerSettings)
    assert s.http_port == 9100 and s.hosts_trace_topic is True
    assert s.advertised_address == "127.0.0.1:9100"
    assert load_settings(NamesrvSettings).namesrv_expiry_ms == 120_000


@pytest.mark.parametrize(
    ("cls", "var", "val"),
    [
        (CommonSettings, "TRACEMQ_HTTP_PORT", "abc"),
        (CommonSettings, "TRACEMQ_HTTP_PORT", "70000"),
        (BrokerSettings, "TRACEMQ_BROKER_ROLE", "queen"),
        (BrokerSettings, "TRACEMQ_BROKER_NAME", "has.dot"),
        (BrokerSettings, "TRACEMQ_BROKER_TRACE_ON", "maybe"),
        (NamesrvSettings, "TRACEMQ_NAMESRV_EXPIRY_MS", "5"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, cls: type, var: str, val: str
) -> None:
    monkeypatch.setenv(var, val)
    with pytest.raises(ConfigError) as info:
        load_settings(cls)
    assert var in str(info.value) and repr(val) in str(info.value)


def test_nameserver_failover_must_fit_inside_the_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEMQ_NAMESRV_EXPIRY_MS", "8000")
    monkeypatch.setenv("TRACEMQ_NAMESRV_SESSION_TIMEOUT_MS", "6000")
    with pytest.raises(ConfigError, match="TRACEMQ_NAMESRV_SESSION_TIMEOUT_MS='6000'.*half"):
        load_settings(NamesrvSettings)
    monkeypatch.setenv("TRACEMQ_NAMESRV_SESSION_TIMEOUT_MS", "4000")
    assert load_settings(NamesrvSettings).namesrv_session_timeout_ms == 4000


def test_one_connection_model_for_services_clients_and_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Services, clients and the command line read where the stack is from one model
    (ConnectionSettings): the same fields, the same defaults, the same check of the URL."""
    from tracemq import ClientSettings
    from tracemq.cli._connection import resolve
    from tracemq.routing.keys import DEFAULT_PREFIX, RedisKeys
    from tracemq.settings import ConnectionSettings

    for var in ("TRACEMQ_REDIS_URL", "TRACEMQ_CONTROL_BOOTSTRAP", "TRACEMQ_REDIS_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRACEMQ_DEV_HOME", str(tmp_path))  # no running stack to fall back on
    assert issubclass(CommonSettings, ConnectionSettings)
    assert issubclass(ClientSettings, ConnectionSettings)
    fields = ("redis_url", "redis_prefix", "control_bootstrap", "control_topic")
    base = ConnectionSettings()
    for s in (CommonSettings(), ClientSettings()):
        assert {f: getattr(s, f) for f in fields} == {f: getattr(base, f) for f in fields}
    assert base.redis_prefix == DEFAULT_PREFIX == RedisKeys().prefix
    conn = resolve()
    assert (conn.redis_url, conn.control_bootstrap, conn.redis_prefix) == (
        base.redis_url,
        base.control_bootstrap,
        base.redis_prefix,
    )

    monkeypatch.setenv("TRACEMQ_REDIS_URL", "http://not-redis:6379")
    with pytest.raises(ConfigError, match="TRACEMQ_REDIS_URL='http://not-redis:6379'"):
        ClientSettings.from_overrides()

from __future__ import annotations

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

"""tracemq.collector_client: the one collector API client of the CLI and the demo, against a
real local HTTP server answering as the collector can (JSON, 401, 404, a page that is not
JSON) and a closed port. Every failure is a CollectorError naming the collector (never the
token); no answer is retriable; locate() finds the URL and token as every command does, and
sends a running stack's token only to that stack's collector."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracemq import collector_client
from tracemq.collector_client import CollectorClient
from tracemq.errors import CollectorError, CollectorUnreachableError, ConfigError

from tests.support.http_stub import QuietHandler, serving

pytestmark = pytest.mark.timeout(20)

TOKEN = "s3cret-token"


class _Collector(QuietHandler):
    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Collector.seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(401, {"error": "missing or wrong bearer token"})
        elif self.path.startswith("/api/v1/traces/missing"):
            self._answer(404, {"error": "no trace of missing"})
        elif self.path.startswith("/viewer"):
            self.reply(200, b"<html>viewer</html>", "text/html")
        else:
            self._answer(200, {"path": self.path})

    def _answer(self, status: int, obj: dict[str, Any]) -> None:
        self.reply(status, json.dumps(obj).encode())


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.seen.clear()
    with serving(_Collector) as url:
        yield url


@pytest.fixture
def no_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TRACEMQ_COLLECTOR_URL", "TRACEMQ_COLLECTOR_API_TOKEN", "TRACEMQ_STACK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRACEMQ_DEV_HOME", str(tmp_path / "dev"))
    monkeypatch.setenv("TRACEMQ_STACKS_DIR", str(tmp_path / "stacks"))
    return tmp_path / "dev"


def test_answers_and_errors(collector: str) -> None:
    c = CollectorClient(collector + "/", TOKEN)
    assert c.trace("AB CD") == {"path": "/api/v1/traces/AB%20CD"}
    found = c.find("k1", topic=None, begin_ms=5, limit=3)
    assert found["path"].startswith("/api/v1/traces?") and "topic" not in found["path"]
    assert "key=k1" in found["path"] and "begin=5" in found["path"] and "limit=3" in found["path"]
    assert c.groups("g/1") == {"path": "/api/v1/groups/g%2F1"}
    assert c.groups() == {"path": "/api/v1/groups"}
    assert {s["auth"] for s in _Collector.seen} == {f"Bearer {TOKEN}"}

    with pytest.raises(CollectorError, match="answered 404: no trace of missing") as missing:
        c.trace("missing")
    assert missing.value.status == 404 and not missing.value.retriable
    with pytest.raises(CollectorError, match="did not answer JSON"):
        c.get_json("/viewer")

    wrong = CollectorClient(collector, "not-the-token")
    with pytest.raises(CollectorError, match="refused the token") as refused:
        wrong.trace("x")
    assert refused.value.status == 401 and "not-the-token" not in str(refused.value)
    assert "TRACEMQ_COLLECTOR_API_TOKEN" in str(refused.value)


def test_a_collector_that_does_not_answer_is_retriable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(CollectorUnreachableError, match=f"the collector at {url} did not answer"):
        CollectorClient(url, TOKEN, timeout_s=2).trace("x")
    assert CollectorUnreachableError.retriable and issubclass(
        CollectorUnreachableError, CollectorError
    )


def test_locate_finds_url_and_token_like_every_command(
    collector: str, no_stack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(CollectorUnreachableError, match="no collector: pass --url"):
        collector_client.locate()
    with pytest.raises(ConfigError, match="--url: 'not-a-url' is not a collector URL"):
        collector_client.locate("not-a-url")
    monkeypatch.setenv("TRACEMQ_COLLECTOR_URL", "ftp://x")
    with pytest.raises(ConfigError, match="TRACEMQ_COLLECTOR_URL: 'ftp://x'"):
        collector_client.locate()
    monkeypatch.delenv("TRACEMQ_COLLECTOR_URL")

    # the running stack's collector and token: the token goes to that collector only
    no_stack.mkdir(parents=True)
    state = {"collector_api": collector + "/", "collector_api_token": TOKEN}
    (no_stack / "state.json").write_text(json.dumps(state))
    found = collector_client.locate()
    assert (found.url, found.token) == (collector, TOKEN)
    assert found.trace("t1") == {"path": "/api/v1/traces/t1"}
    assert collector_client.locate("http://elsewhere:8080").token is None

    monkeypatch.setenv("TRACEMQ_COLLECTOR_API_TOKEN", "from-env")
    assert collector_client.locate("http://elsewhere:8080").token == "from-env"


@pytest.mark.parametrize(
    ("args", "token", "says"),
    [
        (["trace", "show", "missing"], TOKEN, "answered 404: no trace of missing"),
        (["group", "status"], "wrong", "refused the token"),
    ],
)
def test_the_commands_fail_through_it_in_one_line_exit_1(
    collector: str, no_stack: Path, args: list[str], token: str, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRACEMQ_COLLECTOR_URL"}
    env["TRACEMQ_COLLECTOR_API_TOKEN"] = token
    res = subprocess.run(
        [sys.executable, "-m", "tracemq", *args, "--url", collector],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert says in lines[0] and collector in lines[0] and "Traceback" not in res.stderr


def test_a_client_only_install_locates_without_the_cli(
    no_stack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the ``cli`` extra there is no stack registry to read: locate() still works from
    its argument and the environment."""
    monkeypatch.setitem(sys.modules, "tracemq.cli._connection", None)  # import fails
    assert collector_client.locate("http://127.0.0.1:8080").token is None
    monkeypatch.setenv("TRACEMQ_COLLECTOR_API_TOKEN", "t")
    assert collector_client.locate("http://127.0.0.1:8080").token == "t"
    with pytest.raises(CollectorUnreachableError, match="no collector"):
        collector_client.locate()

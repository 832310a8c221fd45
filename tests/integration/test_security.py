"""The dev stack's credentials (issue 13): its Redis wants the generated password, and a wrong
one stops a service and a CLI command with one line that names the Redis, never the password."""

from __future__ import annotations

import os
import subprocess
from urllib.parse import urlsplit

import pytest
import redis
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.stack import free_port, tracemq_command
from tracemq_devkit.waiting import eventually_sync

pytestmark = [pytest.mark.stack, pytest.mark.redis]


def _with_password(url: str, password: str | None) -> str:
    parts = urlsplit(url)
    auth = f":{password}@" if password is not None else ""
    return parts._replace(netloc=f"{auth}{parts.hostname}:{parts.port}").geturl()


@pytest.mark.timeout(120)
def test_redis_wants_the_password_and_a_wrong_one_is_one_clear_line(
    stack: EmbeddedStack, unique: str
) -> None:
    parts = urlsplit(stack.redis_url)
    assert parts.password == stack.secrets.redis_password
    # a client without the password is refused; with it, served
    bare = redis.Redis(host=parts.hostname, port=parts.port, socket_connect_timeout=2)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            bare.ping()
    finally:
        bare.close()
    good = redis.Redis.from_url(stack.redis_url, socket_connect_timeout=2)
    try:
        assert good.ping()
    finally:
        good.close()

    wrong_pw = f"wrong-{unique}"
    wrong = _with_password(stack.redis_url, wrong_pw)
    shown = _with_password(stack.redis_url, "***")

    # A service with a wrong password exits at start, its log naming the Redis and the cause
    # (the collector rides a Redis outage out, but not a refused login).
    procs = []
    for service in ("nameserver", "collector"):
        port = free_port()
        procs.append(
            stack.spawn_service(
                f"{service}-badpw-{unique}",
                [service],
                {
                    **stack.common_env(port),
                    **stack.auth_env(),  # the nameserver's keyrings: it must get as far as Redis
                    "TRACEMQ_REDIS_URL": wrong,
                    "TRACEMQ_NAMESRV_GROUP": f"badpw-{unique}",
                    "TRACEMQ_COLLECTOR_GROUP": f"badpw-{unique}",
                    "TRACEMQ_COLLECTOR_DATA_DIR": str(stack.workdir / "data" / f"badpw-{unique}"),
                },
                wait=False,
            )
        )
    try:
        for proc in procs:
            eventually_sync(
                lambda p=proc: not p.alive(),
                timeout=60,
                what=f"{proc.name} exits",
            )
            assert proc.popen is not None and proc.popen.returncode == 1, proc.name
            log = proc.log_path.read_text()
            assert f"Redis at {shown} refused the login" in log, log[-2000:]
            assert "TRACEMQ_REDIS_URL" in log
            assert wrong_pw not in log
    finally:
        for proc in procs:
            proc.stop()
            stack.processes.pop(proc.name, None)

    # The CLI: one line, exit 1, the password hidden; without any password the same.
    env = {**os.environ, "TRACEMQ_DEV_HOME": "/nonexistent"}
    for url, secret in ((wrong, wrong_pw), (_with_password(stack.redis_url, None), None)):
        res = subprocess.run(
            [*tracemq_command(), "route", "show", "TopicTest", "--redis-url", url],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, res.stderr
        assert "refused the login" in lines[0], lines[0]
        assert f"127.0.0.1:{parts.port}" in lines[0]
        if secret:
            assert secret not in lines[0] and shown in lines[0]

"""A client-only install (``pip install tracemq``, no extras) in a fresh virtualenv: pyarrow, rich
and typer are not there, a traced Producer still sends to the real stack (the message and its
Pub trace are read back here), and the ``tracemq`` script says in one line to install
``tracemq[cli]``.

The venv is built with uv from the local cache, pinned to uv.lock's versions (``uv export``), so
it installs what the workspace tested, in a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tracemq.admin import AdminClient
from tracemq.naming import kafka_topic
from tracemq.trace import TraceType
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.reading import read_topic, read_trace_topic
from tracemq_devkit.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
#: what only the CLI extra and the dev kit bring; a client must not need them
NOT_FOR_CLIENTS = ("pyarrow", "rich", "typer", "numpy")


def _uv() -> str:
    # the workspace's dev group installs uv into .venv; `uv run` (make test) also exports UV
    here = Path(sys.executable).parent / "uv"
    for candidate in (
        os.environ.get("UV"),
        here,
        shutil.which("uv"),
        ROOT / ".tools" / "bin" / "uv",
    ):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.fail("uv not found (UV, .venv/bin, PATH, .tools/bin): `make setup` installs it")


def _run(*args: str | Path, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert res.returncode == 0, f"{args[:3]} failed:\n{res.stdout}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def client_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv holding libs/tracemq and its dependencies only."""
    uv, work = _uv(), tmp_path_factory.mktemp("client-install")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    pins = work / "pins.txt"
    _run(
        uv, "export", "--frozen", "--package", "tracemq", "--no-dev", "--no-hashes",
        "--no-emit-project", "--no-emit-workspace", "--project", ROOT, "-o", pins, env=env,
    )  # fmt: skip
    venv = work / "venv"
    _run(uv, "venv", "--quiet", "--python", sys.executable, venv, env=env)
    python = venv / "bin" / "python"
    _run(
        uv, "pip", "install", "--quiet", "--python", python, "-c", pins, ROOT / "libs" / "tracemq",
        env=env,
    )  # fmt: skip
    return python


def _client_env(stack: EmbeddedStack) -> dict[str, str]:
    # only what `tracemq dev up` tells another shell: nothing of this session leaks in
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEMQ_", "VIRTUAL_ENV"))}
    env.update(stack.client_env())
    return env


@pytest.mark.timeout(90)
async def test_a_client_only_install_sends_a_traced_message(
    client_python: Path, stack: EmbeddedStack, admin: AdminClient, unique: str
) -> None:
    probe = "import importlib.util, sys; print(*(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    present = _run(client_python, "-c", probe, *NOT_FOR_CLIENTS).split()
    assert present == [], f"a client-only install has {present}"

    topic = f"ClientOnly_{unique}"
    await admin.create_topic("broker-a", topic, read_queues=1, write_queues=1)
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from tracemq import Message, Producer

        async def main():
            async with Producer("ClientOnly_{unique}", enable_msg_trace=True) as producer:
                result = await producer.send(Message("{topic}", b"client only", keys="k-{unique}"))
            print(result.msg_id)

        asyncio.run(main())
        assert not {{"pyarrow", "rich", "typer"}} & set(sys.modules)
        """
    )
    msg_id = _run(client_python, "-c", script, env=_client_env(stack)).strip()

    stored = await read_topic(stack.business_bootstrap, kafka_topic("broker-a", topic))
    assert [(r.headers.get("UNIQ_KEY"), r.value) for r in stored] == [(msg_id, b"client only")]

    async def pub_traced() -> bool:
        traces = await read_trace_topic(stack.trace_bootstrap, timeout_s=10)
        return any(
            c.trace_type is TraceType.Pub and any(b.msg_id == msg_id for b in c.trace_beans)
            for t in traces
            for c in t.contexts
        )

    await eventually(pub_traced, timeout=30, interval=0.5, what=f"the Pub trace of {msg_id}")


@pytest.mark.timeout(60)
def test_the_tracemq_script_asks_for_the_cli_extra(client_python: Path) -> None:
    res = subprocess.run(
        [client_python.parent / "tracemq", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 1, res
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'tracemq[cli]'" in lines[0], res.stderr

"""OTLP ingest on the embedded stack: a plain aiokafka producer and consumer, instrumented with
opentelemetry-instrumentation-aiokafka and exporting with opentelemetry-exporter-otlp-proto-http
(in a process of their own: the instrumentation patches aiokafka globally), show up in the
collector as traces found by msgId and by key, in ``tracemq trace show``, with the consuming
group's outcome, and the reconciliation classifies them CONSUMED for that group (the collector
recorded the group in the subscription history); malformed OTLP bodies get 400 and are
counted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from tracemq.collector_lag import wait_caught_up
from tracemq_collector.otlp import msg_id_for
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually

from tests.support.collector_api import TOKEN, get_text, http
from tests.support.reconcile import run_reconcile

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis, pytest.mark.spark]

N = 5


def _api(proc: ManagedProcess) -> str:
    return f"http://127.0.0.1:{proc.env['TRACEMQ_HTTP_PORT']}"


def _post(url: str, body: bytes, ctype: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    hdrs = {"Content-Type": ctype, **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url, data=body, headers=hdrs, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _metric(text: str, name: str, label: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.timeout(420)
async def test_instrumented_aiokafka_spans_become_traces(
    stack: EmbeddedStack, collector: ManagedProcess, unique: str, tmp_path: Path
) -> None:
    base = _api(collector)
    topic, group, service = f"bridge_{unique}", f"billing_{unique}", f"shop_{unique}"
    # malformed bodies first: 400, counted, nothing stored
    before = _metric(
        get_text(f"{base}/metrics"), "tracemq_collector_otlp_rejected_total", "malformed"
    )
    assert (
        await asyncio.to_thread(
            _post, f"{base}/v1/traces", b"\xff\x00garbage", "application/x-protobuf"
        )
    )[0] == 400
    assert (
        await asyncio.to_thread(
            _post, f"{base}/v1/traces", b'{"resourceSpans": 7}', "application/json"
        )
    )[0] == 400
    assert (await asyncio.to_thread(_post, f"{base}/v1/traces", b"{}", "application/json", None))[
        0
    ] == 401
    after = _metric(
        get_text(f"{base}/metrics"), "tracemq_collector_otlp_rejected_total", "malformed"
    )
    assert after - before == 2

    t_from = time.time() - 1
    # the dev kit's bridge, as the demo runs it: its own process (the instrumentation patches
    # aiokafka for the whole process)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracemq_devkit.otel_bridge",
        env={**os.environ, "BRIDGE_BOOTSTRAP": stack.business_bootstrap, "BRIDGE_TOPIC": topic,
             "BRIDGE_GROUP": group, "BRIDGE_SERVICE": service, "BRIDGE_MESSAGES": str(N),
             "BRIDGE_OTLP": base, "TRACEMQ_COLLECTOR_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(child.communicate(), 120)
    assert child.returncode == 0, err.decode()[-2000:]
    got: list[list[Any]] = json.loads(out.decode().strip().splitlines()[-1])
    assert len(got) == N
    ids = {msg_id_for("kafka", f"{topic}.{p}.{o}"): key for p, o, key in got}

    async def viewed(mid: str) -> dict[str, Any] | None:
        status, body = await asyncio.to_thread(http, f"{base}/api/v1/traces/{mid}")
        if status != 200 or not body.get("producer") or not body.get("consumers"):
            return None
        return dict(body)

    for mid, key in ids.items():
        view = await eventually(lambda mid=mid: viewed(mid), timeout=60, what=f"trace of {mid}")
        assert (view["topic"], view["producer"]["group"]) == (topic, service)
        assert view["producer"]["success"] is True
        [consumer] = view["consumers"]
        assert consumer["group"] == group and not consumer["dead_lettered"]
        assert [a["status"] for a in consumer["attempts"]] == ["success"]
        assert key in json.dumps(view["events"])
        status, found = await asyncio.to_thread(
            http, f"{base}/api/v1/traces?key={key}&topic={topic}"
        )
        assert status == 200 and mid in json.dumps(found)

    mid = next(iter(ids))
    cli_env = {**os.environ, "TRACEMQ_COLLECTOR_URL": base, "TRACEMQ_DEV_HOME": "/nonexistent",
               "TRACEMQ_COLLECTOR_API_TOKEN": TOKEN}  # fmt: skip
    shown = await asyncio.to_thread(
        subprocess.run, [*tracemq_command(), "trace", "show", mid, "--json"],
        capture_output=True, text=True, env=cli_env, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    as_json = json.loads(shown.stdout)
    assert as_json["producer"]["group"] == service
    assert as_json["consumers"][0]["group"] == group
    # every span became events: nothing left waiting, nothing counted as unknowable
    text = get_text(f"{base}/metrics")
    assert _metric(text, "tracemq_collector_otlp_spans_total", 'result="no_msg_id"') == 0

    # -- the reconciliation: the group the spans named is expected, and consumed each one ------
    t_to = time.time() + 1
    await wait_caught_up(stack.redis_url, timeout_s=60)
    lake = Path(collector.env["TRACEMQ_COLLECTOR_DATA_DIR"]) / "lake"
    out = tmp_path / "out"
    await run_reconcile(stack, t_from=t_from, t_to=t_to, lake=lake, out=out, timeout_s=300)
    table = ds.dataset(out / "classified", format="parquet", partitioning="hive").to_table()
    rows = {
        (r["msg_id"], r["group"]): r["outcome"] for r in table.to_pylist() if r["topic"] == topic
    }
    assert rows == {(mid, group): "CONSUMED" for mid in ids}, rows

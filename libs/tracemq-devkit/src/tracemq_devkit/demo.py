"""``tracemq demo``: the whole mission end to end on the embedded stack.

Starts the stack (two Kafka clusters, Redis, nameserver, broker-a, trace-broker, collector);
creates the business topic; runs a traced workload — two producers with keys and tags (one
message in twenty delayed 5 s), a transactional producer (one message in twenty; a quarter of
those rolled back), three consumer groups: a healthy one, one failing about 5 % of first
attempts (retried by the broker), one stopped halfway so some messages stay unconsumed; prints
the trace of a sample message and the viewer URL; waits until the collector has every trace in
its lake; runs the Spark reconciliation and prints its summary. The OpenTelemetry bridge
(:mod:`tracemq_devkit.otel_bridge`, its own process) adds a plain aiokafka producer and consumer
group exporting OTLP to the collector: their messages are in the trace view and the
reconciliation too.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import typer
from pydantic import SecretStr
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from tracemq import ClientSettings
from tracemq.admin import AdminClient
from tracemq.cli.plugin import console, fit
from tracemq.cli.trace import trace_table
from tracemq.collector_client import CollectorClient
from tracemq.collector_lag import wait_caught_up
from tracemq.errors import CollectorError
from tracemq.protocol.signing import Signer
from tracemq.redis_url import redact
from tracemq.routing import RegistryReader, TopicRoute, connect

from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.devstack.stack import tracemq_command

DEMO_TOPIC = "TopicTest"
GROUPS = ("demo_healthy", "demo_flaky", "demo_stopped")
#: the outcomes a listener can tell by itself (the others need the traces: never consumed,
#: still pending, trace lost, ...)
LISTENER_OUTCOMES = ("CONSUMED", "CONSUMED_AFTER_RETRY", "DUPLICATE", "FAILED")


def _route_table(route: TopicRoute) -> Table:
    table = Table(title=f"route of {route.topic}")
    for col in ("broker", "cluster", "queues (r/w)", "perm", "data cluster"):
        table.add_column(col)
    for q in route.queues:
        table.add_row(
            q.broker, q.cluster, f"{q.read_queues}/{q.write_queues}", str(q.perm), q.data_bootstrap
        )
    return fit(table)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(),
        transient=False,
    )


class Workload:
    """Two producers (with some delayed messages) and a transactional producer; three consumer
    groups. Counts what happened for the summary."""

    def __init__(self, stack: EmbeddedStack, messages: int, queues: int) -> None:
        self.stack = stack
        self.messages = messages
        self.queues = queues
        kid, secret = stack.secrets.signing["client"]
        settings = ClientSettings.from_overrides(stack.redis_url, stack.business_bootstrap)
        # the clients sign their heartbeats with the stack's generated client key
        self.env: dict[str, Any] = {
            "settings": settings.model_copy(
                update={"access_key_id": kid, "secret_key": SecretStr(secret)}
            )
        }
        self.consumed: dict[str, set[str]] = {g: set() for g in GROUPS}
        #: every listener call's result, per group and msgId: what the reconciliation must
        #: find again in the traces
        self.successes: dict[str, Counter[str]] = {g: Counter() for g in GROUPS}
        self.failures: dict[str, Counter[str]] = {g: Counter() for g in GROUPS}
        #: each client's trace dispatcher counters, read after its shutdown
        self.trace_stats: dict[str, dict[str, float]] = {}
        self.failed_first: set[str] = set()
        self.sent: list[str] = []
        self.delayed: list[str] = []
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        # of `messages`: 1 in 20 delayed (level 2, 5 s), 1 in 20 transactional (1 in 4 of those
        # rolled back); the rest plain
        self.n_tx = max(2, messages // 20)
        self.n_rollback = max(1, self.n_tx // 4)
        self.n_plain = messages - self.n_tx
        self.rng = random.Random(42)  # noqa: S311 - a demo, not crypto
        self.progressed = asyncio.Event()  # set at every first consumption

    async def _until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``done()`` (re-checked at every consumption) or the loop time deadline."""
        loop = asyncio.get_running_loop()
        while not done():
            self.progressed.clear()
            if done():
                break
            try:
                await asyncio.wait_for(self.progressed.wait(), deadline - loop.time())
            except TimeoutError:
                return done()
        return True

    @property
    def deliverable(self) -> int:
        return self.messages - self.n_rollback

    def listener_outcome(self, group: str, msg_id: str) -> str | None:
        """The outcome the listener calls of ``group`` imply for a message (the reconciliation's
        names; None if the listener never saw it)."""
        ok, failed = self.successes[group][msg_id], self.failures[group][msg_id]
        if ok > 1:
            return "DUPLICATE"
        if ok == 1:
            return "CONSUMED_AFTER_RETRY" if failed else "CONSUMED"
        return "FAILED" if failed else None

    def listener_outcomes(self, group: str) -> dict[str, int]:
        """Per outcome, how many messages the listener calls of ``group`` put there."""
        seen = set(self.successes[group]) | set(self.failures[group])
        out = Counter(self.listener_outcome(group, m) for m in seen)
        return {k: out[k] for k in LISTENER_OUTCOMES}

    async def setup(self) -> list[TopicRoute]:
        async with AdminClient(
            self.stack.business_bootstrap,
            self.stack.redis_url,
            signer=Signer(*self.stack.secrets.signing["admin"]),
        ) as admin:
            await admin.create_topic(
                "broker-a", DEMO_TOPIC, read_queues=self.queues, write_queues=self.queues
            )
        r = connect(self.stack.redis_url)
        try:
            reader = RegistryReader(r)
            return [
                await reader.topic_route(DEMO_TOPIC),
                await reader.topic_route("RMQ_SYS_TRACE_TOPIC"),
            ]
        finally:
            await r.aclose()

    def _listener(self, group: str, on_message: Callable[[], None]) -> Any:
        from tracemq import ConsumeConcurrentlyStatus

        async def listener(msgs: list[Any], ctx: Any) -> Any:
            m = msgs[0]
            await asyncio.sleep(self.rng.uniform(0.0005, 0.003))  # "business work"
            if group == "demo_flaky" and m.reconsume_times == 0 and self.rng.random() < 0.05:
                self.failed_first.add(m.msg_id)
                self.failures[group][m.msg_id] += 1
                return ConsumeConcurrentlyStatus.RECONSUME_LATER  # the broker retries it
            self.successes[group][m.msg_id] += 1
            if m.msg_id not in self.consumed[group]:
                self.consumed[group].add(m.msg_id)
                self.progressed.set()
                on_message()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        return listener

    async def run(self) -> None:
        from tracemq import (
            ConsumeFromWhere,
            LocalTransactionState,
            Message,
            Producer,
            PushConsumer,
            TransactionProducer,
        )

        n = self.deliverable
        rollback = set(range(0, self.n_tx, max(1, self.n_tx // self.n_rollback))[: self.n_rollback])

        class Ledger:
            """The demo's local transaction: commit, except the ones it rolls back."""

            def execute_local_transaction(self, msg: Any, arg: Any) -> Any:
                return (
                    LocalTransactionState.ROLLBACK_MESSAGE
                    if arg in rollback
                    else LocalTransactionState.COMMIT_MESSAGE
                )

            def check_local_transaction(self, msg: Any) -> Any:
                return LocalTransactionState.COMMIT_MESSAGE

        with _progress() as progress:
            bars = {g: progress.add_task(f"consumed by {g}", total=n) for g in GROUPS}
            sent_bar = progress.add_task("sent (3 producers)", total=self.messages)
            consumers: dict[str, Any] = {}
            for g in GROUPS:
                c = PushConsumer(
                    g,
                    consume_from=ConsumeFromWhere.FIRST_OFFSET,
                    enable_msg_trace=True,
                    consume_concurrency=8,
                    **self.env,
                )
                c.subscribe(DEMO_TOPIC, "*")
                c.register_message_listener(
                    self._listener(g, functools.partial(progress.advance, bars[g]))
                )
                await c.start()
                consumers[g] = c
            for c in consumers.values():  # a new group's first rebalance takes seconds: the
                # latency figures should show delivery, not the group forming
                if not await c.wait_assigned(60):
                    console().print(f"[yellow]{c.group} not assigned its queues after 60 s[/]")
            producers = [
                Producer(f"demo_{name}_producer", enable_msg_trace=True, **self.env)
                for name in ("orders", "payments")
            ]
            tx = TransactionProducer(
                "demo_ledger_producer", Ledger(), enable_msg_trace=True, **self.env
            )
            for p in (*producers, tx):
                await p.start()
            try:
                half = self.n_plain // 2

                async def produce(p: Any, idx: int, lo: int, hi: int) -> None:
                    tags = ("Created", "Paid") if idx == 0 else ("Paid", "Refunded")
                    for i in range(lo + (lo + idx) % 2, hi, 2):
                        delay = 2 if i % 20 == 10 else 0  # level 2: 5 s
                        msg = Message(
                            DEMO_TOPIC,
                            json.dumps({"order": i}).encode(),
                            tags=tags[i % 4 // 2],
                            keys=[f"order-{i}", f"user-{i % 97}"],
                            delay_level=delay,
                        )
                        msg_id = (await p.send(msg)).msg_id
                        self.sent.append(msg_id)
                        if delay:
                            self.delayed.append(msg_id)
                        progress.advance(sent_bar)

                async def transact(lo: int, hi: int) -> None:
                    for j in range(lo, hi):
                        msg = Message(
                            DEMO_TOPIC,
                            json.dumps({"ledger": j}).encode(),
                            tags="Ledger",
                            keys=[f"ledger-{j}"],
                        )
                        res = await tx.send_message_in_transaction(msg, j)
                        self.sent.append(res.msg_id)
                        (self.rolled_back if j in rollback else self.committed).append(res.msg_id)
                        progress.advance(sent_bar)

                # first half; the third group stops once it consumed half of that, so all of
                # the second half (at least) stays unconsumed by it
                await asyncio.gather(
                    *(produce(p, i, 0, half) for i, p in enumerate(producers)),
                    transact(0, self.n_tx // 2),
                )
                deadline = asyncio.get_running_loop().time() + 120
                await self._until(lambda: len(self.consumed["demo_stopped"]) >= half // 2, deadline)
                stopped = consumers.pop("demo_stopped")
                await stopped.shutdown()
                self._keep_trace_stats("demo_stopped", stopped)
                await asyncio.gather(
                    *(produce(p, i, half, self.n_plain) for i, p in enumerate(producers)),
                    transact(self.n_tx // 2, self.n_tx),
                )
                done = await self._until(
                    lambda: all(len(self.consumed[g]) >= n for g in ("demo_healthy", "demo_flaky")),
                    asyncio.get_running_loop().time() + 120 + self.messages / 50,
                )
                if not done:  # say which, so that their traces can be looked at
                    expected = set(self.sent) - set(self.rolled_back)
                    for g in ("demo_healthy", "demo_flaky"):
                        missing = sorted(expected - self.consumed[g])
                        if missing:
                            console().print(
                                f"[red]{g} has not consumed {len(missing)} message(s) in time: "
                                f"{', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}[/]"
                            )
            finally:
                for name, c in consumers.items():
                    await c.shutdown()
                    self._keep_trace_stats(name, c)
                for p in (*producers, tx):
                    await p.shutdown()  # flushes each one's traces
                    self._keep_trace_stats(p.group, p)

    def _keep_trace_stats(self, name: str, client: Any) -> None:
        if client.trace_dispatcher is not None:
            self.trace_stats[name] = client.trace_dispatcher.stats()


def _wait_trace(
    api: str, token: str, msg_id: str, groups: int, timeout: float = 30
) -> dict[str, Any] | None:
    collector = CollectorClient(api, token, timeout_s=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            view = collector.trace(msg_id)
            if view["producer"] and len(view["consumers"]) >= groups:
                return view
        except CollectorError:  # not there yet (404), or the collector is busy
            pass
        time.sleep(0.2)
    return None


BRIDGE_TOPIC, BRIDGE_GROUP, BRIDGE_SERVICE = "BridgeOtel", "demo_otel", "demo_otel_producer"
BRIDGE_MESSAGES = 20


def _otel_bridge(stack: EmbeddedStack, api: str) -> list[str]:
    """Run the OTel bridge (its own process); the msgIds the collector gives its messages
    (none, with a note, when it failed: the rest of the demo does not depend on it)."""
    import sys

    env = {
        **os.environ,
        "BRIDGE_BOOTSTRAP": stack.business_bootstrap,
        "BRIDGE_TOPIC": BRIDGE_TOPIC,
        "BRIDGE_GROUP": BRIDGE_GROUP,
        "BRIDGE_SERVICE": BRIDGE_SERVICE,
        "BRIDGE_MESSAGES": str(BRIDGE_MESSAGES),
        "BRIDGE_OTLP": api,
        "TRACEMQ_COLLECTOR_API_TOKEN": stack.secrets.collector_api_token,
    }
    try:
        from tracemq_collector.otlp import msg_id_for

        res = subprocess.run(
            [sys.executable, "-m", "tracemq_devkit.otel_bridge"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip().splitlines()[-1:] or res.returncode)
        got = json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - the bridge is an extra; say why it is missing
        console().print(f"[yellow]the OTel bridge did not run: {exc}[/]")
        return []
    return [msg_id_for("kafka", f"{BRIDGE_TOPIC}.{p}.{o}") for p, o, _ in got]


#: consume events are awaited this long after the window (the stopped group's backlog is
#: NOT_CONSUMED once it is over; PENDING before)
HORIZON_S = 5


def _reconcile(
    stack: EmbeddedStack, lake: Path, out: Path, since: datetime, until: datetime
) -> int | None:
    """Run `tracemq reconcile` when the Spark job is installed; return its exit code."""
    cmd = [
        *tracemq_command(),
        "reconcile",
        "--from",
        since.isoformat(),
        "--to",
        until.isoformat(),
        "--horizon",
        f"{HORIZON_S}s",
        "--window",
        "1m",
        "--lake",
        str(lake),
        "--out",
        str(out),
        "--max-delay",
        f"{HORIZON_S}s",
        "--master",
        "local[2]",
        "--driver-memory",
        "1g",
        "--shuffle-partitions",
        "4",
    ]
    help_check = subprocess.run(
        [*tracemq_command(), "reconcile", "--help"], capture_output=True, text=True, check=False
    )
    if help_check.returncode != 0:
        return None
    env = {**os.environ, **stack.client_env()}
    # the JVM's start-up chatter ("Using incubator modules", log-level hints) goes to stderr:
    # shown only when the job fails
    res = subprocess.run(cmd, env=env, check=False, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        console().print(res.stderr[-4000:], markup=False, highlight=False)
    return res.returncode


def _trace_drops(workload: Workload) -> tuple[int, int, int]:
    """(sent, discarded, failed) trace contexts over every client of the workload."""
    stats = workload.trace_stats.values()
    return (
        int(sum(st["sent"] for st in stats)),
        int(sum(st["discarded"] for st in stats)),
        int(sum(st["failed"] + st["oversize"] for st in stats)),
    )


def _keep_evidence(workdir: Path, out: Path) -> Path | None:
    """Copy what explains a reconciliation that disagrees with the listeners — the collector's
    store and lake and every process's log — to ``out/evidence`` before the stack (and its
    temporary workdir) goes; returns where, or None when nothing could be copied."""
    dest = out / "evidence"
    copied = False
    for part in (Path("data") / "collector", Path("logs")):
        src = workdir / part
        if not src.is_dir():
            continue
        try:
            shutil.copytree(src, dest / part, dirs_exist_ok=True)
            copied = True
        except (OSError, shutil.Error) as exc:  # a file written or removed meanwhile
            console().print(f"[yellow]evidence: {part} copied in part ({exc})[/]")
            copied = True
    return dest if copied else None


def _check_against_listeners(workload: Workload, out: Path) -> bool:
    """Compare the reconciliation with what the listeners saw, group by group, for the
    outcomes a listener can tell (consumed, after a retry, twice, failed); print the
    comparison and the first messages that differ. Writes ``listeners.json`` next to the
    summary. True when they agree."""
    import pyarrow.dataset as ds

    summary = json.loads((out / "summary.json").read_text())
    found = {r["group"]: r["outcomes"] for r in summary["by_topic_group"] if r["group"]}
    anomalies: dict[str, dict[str, str]] = {g: {} for g in GROUPS}
    if (out / "anomalies").is_dir():
        table = ds.dataset(out / "anomalies", format="parquet", partitioning="hive").to_table(
            columns=["msg_id", "group", "outcome"]
        )
        for row in table.to_pylist():
            if row["group"] in anomalies:
                anomalies[row["group"]][row["msg_id"]] = row["outcome"]
    saw = {g: workload.listener_outcomes(g) for g in GROUPS}
    (out / "listeners.json").write_text(
        json.dumps({"outcomes": saw, "trace_stats": workload.trace_stats}, indent=2) + "\n"
    )
    table_out = Table(title="the reconciliation against what the listeners saw")
    for col in ("group", *LISTENER_OUTCOMES, "agree"):
        table_out.add_column(col)
    agree = True
    for g in GROUPS:
        got = found.get(g, {})
        ok = all(got.get(o, 0) == n for o, n in saw[g].items())
        agree &= ok
        table_out.add_row(
            g,
            *(
                f"{saw[g][o]}"
                if got.get(o, 0) == saw[g][o]
                else f"[red]{saw[g][o]} ≠ {got.get(o, 0)}[/]"
                for o in LISTENER_OUTCOMES
            ),
            "[green]yes[/]" if ok else "[red]no[/]",
        )
        if not ok:  # which messages: the listener's outcome against the reconciliation's
            seen = set(workload.successes[g]) | set(workload.failures[g])
            differ = [
                (m, workload.listener_outcome(g, m), anomalies[g].get(m, "CONSUMED"))
                for m in sorted(
                    seen | {m for m, o in anomalies[g].items() if o in LISTENER_OUTCOMES}
                )
            ]
            differ = [d for d in differ if d[1] != d[2]]
            for m, mine, theirs in differ[:5]:
                console().print(f"  {g} {m}: listener {mine}, reconciliation {theirs}")
            if len(differ) > 5:
                console().print(f"  … {len(differ) - 5} more")
    console().print(fit(table_out))
    return agree


def demo(
    messages: int = typer.Option(2000, "--messages", "-n", help="Messages to send."),
    keep_running: bool = typer.Option(
        False, "--keep-running", help="Keep the stack and the viewer up until Ctrl-C."
    ),
    queues: int = typer.Option(4, help="Queues of the demo topic."),
    out: Path = typer.Option(  # noqa: B008 - typer reads it
        Path("artifacts/demo"), help="Where the reconciliation goes."
    ),
) -> None:
    """Run the demo on the embedded stack."""
    if messages < 10:
        raise typer.BadParameter("--messages must be at least 10")
    con = console()

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    from tracemq.cli.plugin import register_stack, unregister_stack

    # with --keep-running the stack's lake outlives the demo, for `tracemq reconcile` later
    workdir = Path(".tracemq/demo").resolve() if keep_running else None
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    stack = EmbeddedStack(
        StackConfig(
            workdir=workdir,
            with_collector=True,
            service_env={"TRACEMQ_COLLECTOR_LAKE_FLUSH_INTERVAL_MS": "1000"},
        )
    )
    name = f"demo-{os.getpid()}"
    out = out.resolve()
    try:
        with con.status(
            "starting the embedded stack (2 Kafka clusters, Redis, nameserver, "
            "broker-a, trace-broker, collector)…"
        ):
            stack.start()
        endpoints = stack.endpoints()
        api, lake = endpoints["collector_api"], Path(endpoints["lake"])
        state_file = stack.workdir / "state.json"
        report = out / "report.html"
        stack.write_state(
            state_file, launcher_pid=os.getpid(), status="running", kind="demo", report=str(report)
        )
        register_stack(name, state_file, os.getpid(), kind="demo")
        con.print(
            f"[green]stack up[/] — business Kafka {stack.business_bootstrap}, "
            f"trace Kafka {stack.trace_bootstrap}, Redis {redact(stack.redis_url)}"
        )
        con.print(
            f"trace lake: {lake} "
            + (
                "(kept after exit)"
                if keep_running
                else "(deleted at exit; --keep-running keeps it)"
            )
        )
        workload = Workload(stack, messages, queues)
        routes = asyncio.run(workload.setup())
        for route in routes:
            con.print(_route_table(route))
        if not routes[0].queues or not routes[1].queues:
            con.print("[red]a route is missing[/]")
            raise typer.Exit(1)
        started = datetime.now(UTC)
        asyncio.run(workload.run())
        with con.status("the OTel bridge: plain aiokafka, instrumented, exporting OTLP…"):
            bridged = _otel_bridge(stack, api)
        finished = datetime.now(UTC)
        con.print(
            f"sent {len(workload.sent)} (delayed {len(workload.delayed)}, transactional "
            f"{len(workload.committed) + len(workload.rolled_back)}: committed "
            f"{len(workload.committed)}, rolled back {len(workload.rolled_back)}); "
            "consumed: "
            + ", ".join(f"{g} {len(s)}" for g, s in workload.consumed.items())
            + f"; first attempts failed in demo_flaky: {len(workload.failed_first)}"
        )
        twice = {g: sum(1 for n in workload.successes[g].values() if n > 1) for g in GROUPS}
        if any(twice.values()):  # at least once: a rebalance or a crash can deliver again
            con.print(
                "[yellow]consumed more than once (at-least-once redelivery):[/] "
                + ", ".join(f"{g} {n}" for g, n in twice.items())
            )
        t_sent, t_discarded, t_failed = _trace_drops(workload)
        con.print(
            f"trace contexts: {t_sent} sent by {len(workload.trace_stats)} clients, "
            f"{t_discarded} discarded, {t_failed} failed"
        )
        sample = next(iter(sorted(workload.failed_first)), None) or workload.sent[0]
        view = _wait_trace(api, stack.secrets.collector_api_token, sample, groups=2)
        if view is None:
            con.print(f"[red]the trace of {sample} did not reach the collector in time[/]")
            raise typer.Exit(1)
        con.print(trace_table(view))
        con.print(
            f"trace viewer: [link]{api}/?msgId={sample}[/link] "
            f"(it asks for the stack's token: {stack.secrets.collector_api_token})"
        )
        con.print(f"(same from a shell: tracemq trace show {sample} --url {api})")
        bridge_view = bridged and _wait_trace(
            api, stack.secrets.collector_api_token, bridged[0], groups=1
        )
        if bridge_view:
            con.print(trace_table(bridge_view))
            con.print(
                f"OTel bridge: {len(bridged)} plain aiokafka messages to {BRIDGE_TOPIC}, "
                f"consumed by {BRIDGE_GROUP}, traced from their OTLP spans "
                f"(tracemq trace show {bridged[0]} --url {api})"
            )
        elif bridged:
            con.print(f"[yellow]the OTel bridge's trace of {bridged[0]} did not arrive[/]")
        with con.status("waiting for the collector to make every trace durable in its lake…"):
            asyncio.run(wait_caught_up(stack.redis_url, timeout_s=60))
            # the horizon of the window must be over, or the stopped group's backlog is PENDING
            while datetime.now(UTC) < finished + timedelta(seconds=1 + HORIZON_S):
                time.sleep(0.1)
        shutil.rmtree(out, ignore_errors=True)
        code = _reconcile(
            stack, lake, out, started - timedelta(seconds=5), finished + timedelta(seconds=1)
        )
        if code is None:
            con.print("reconciliation: the Spark job is not installed (tracemq-spark)")
        elif code != 0:
            con.print(f"[red]reconciliation failed (exit {code})[/]")
            raise typer.Exit(1)
        else:  # the job printed the report's path
            if not _check_against_listeners(workload, out):
                if t_discarded or t_failed:
                    con.print(
                        "[yellow]the reconciliation differs from the listeners; "
                        f"{t_discarded + t_failed} trace context(s) were dropped (counted "
                        "above), which it cannot see[/]"
                    )
                else:
                    con.print(
                        "[red]the reconciliation differs from what the listeners saw, with "
                        "every trace delivered: a bug[/]"
                    )
                    evidence = _keep_evidence(stack.workdir, out)
                    if evidence is not None:
                        con.print(f"the collector's store, lake and the logs: {evidence}")
                    raise typer.Exit(1)
        if keep_running:
            con.print(f"stack and viewer up ({api}); Ctrl-C stops everything")
            while all(p.alive() for p in stack.processes.values()):
                time.sleep(1)
            con.print("[red]a process died[/]")
            raise typer.Exit(1)
    except KeyboardInterrupt:
        con.print("interrupted; stopping")
    finally:
        unregister_stack(name)
        with con.status("stopping the stack…"):
            stack.stop()
        con.print("stack stopped; no process left behind")

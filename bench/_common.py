"""Shared helpers of the benchmarks in ``bench/`` (producer.py, consumer.py).

Each bench starts its own :class:`~tracemq_devkit.devstack.EmbeddedStack`, prints human-readable
progress as it goes and a single JSON line last. Every wait is bounded by a deadline; the
``with EmbeddedStack(...)`` block stops the stack on any exit (Ctrl-C included).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tracemq.log import configure_logging
from tracemq.naming import TRACE_TOPIC
from tracemq_devkit.devstack import EmbeddedStack, StackConfig
from tracemq_devkit.reading import read_trace_topic, wait_topic_writable

T = TypeVar("T")

#: Exit codes: 0 = ran (targets met or not), 1 = traces incomplete, 2 = crashed, 130 = Ctrl-C.
EXIT_OK, EXIT_TRACE_INCOMPLETE, EXIT_CRASH, EXIT_INTERRUPTED = 0, 1, 2, 130

_T0 = time.monotonic()


class BenchTimeout(Exception):
    """A bounded wait of the bench ran out."""


# ----------------------------------------------------------------------------- output


def say(msg: str) -> None:
    """A progress line on stdout, prefixed with the seconds since the script started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def emit_json(obj: dict[str, Any]) -> None:
    """The machine-readable result: one JSON line, printed last."""
    sys.stderr.flush()
    print(json.dumps(obj, sort_keys=True, default=str), flush=True)


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b > 0 else 0.0


def split(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` shares that differ by at most one."""
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


def body_of(size: int) -> bytes:
    pattern = b"tracemq-bench-0123456789abcdefghijklmnopqrstuvwxyz-"
    return (pattern * (size // len(pattern) + 1))[:size]


# ----------------------------------------------------------------------------- arguments


def base_parser(description: str, *, concurrency: int, rounds: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--messages", "-n", type=int, default=100_000, help="messages per variant (default 100000)"
    )
    p.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=concurrency,
        help=f"concurrency (default {concurrency})",
    )
    p.add_argument(
        "--rounds", "-r", type=int, default=rounds, help=f"interleaved rounds (default {rounds})"
    )
    p.add_argument("--size", type=int, default=200, help="message body size in bytes (default 200)")
    p.add_argument("--queues", type=int, default=8, help="queues of the bench topic (default 8)")
    p.add_argument(
        "--trace-options",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="trace_options passed to the traced client, e.g. '{\"batch_size\": 500}' "
        "(default: the library's defaults)",
    )
    p.add_argument("--log-level", default="WARNING", help="tracemq client log level (stderr)")
    return p


def check_args(args: argparse.Namespace) -> None:
    for name in ("messages", "concurrency", "rounds", "size", "queues"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1")
    if args.trace_options is not None and not isinstance(args.trace_options, dict):
        raise SystemExit("--trace-options must be a JSON object")


# ----------------------------------------------------------------------------- bounded waits


async def bounded(aw: Awaitable[T], timeout_s: float, what: str) -> T:
    """Await ``aw`` for at most ``timeout_s`` seconds; :class:`BenchTimeout` naming ``what``."""
    try:
        return await asyncio.wait_for(aw, timeout_s)
    except TimeoutError:
        raise BenchTimeout(f"{what} did not finish within {timeout_s:.0f}s") from None


async def wait_progress(
    done: asyncio.Event,
    count: Callable[[], int],
    *,
    timeout_s: float,
    stall_s: float,
    what: str,
    check: Callable[[], None] | None = None,
) -> None:
    """Wait for ``done``; fail after ``timeout_s`` overall, after ``stall_s`` without progress of
    ``count()``, or as soon as ``check()`` raises (e.g. a crashed worker task)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last, last_change = count(), loop.time()
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), 1.0)
        except TimeoutError:
            pass
        now = loop.time()
        if check is not None:
            check()
        n = count()
        if n != last:
            last, last_change = n, now
        elif not done.is_set() and now - last_change > stall_s:
            raise BenchTimeout(f"{what}: no progress for {stall_s:.0f}s (stuck at {n})")
        if not done.is_set() and now > deadline:
            raise BenchTimeout(f"{what} did not finish within {timeout_s:.0f}s (at {n})")


def crashed_tasks(tasks: Iterable[asyncio.Task[Any]], what: str) -> None:
    """Raise if one of ``tasks`` ended with an exception (a library worker that died)."""
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            raise RuntimeError(
                f"{what}: task {t.get_name()!r} died: {exc.__class__.__name__}: {exc}"
            ) from exc


class Ticker:
    """Prints ``label: count/total (rate)`` every ``interval_s`` while running (async ctx)."""

    def __init__(
        self, label: str, count: Callable[[], int], total: int, interval_s: float = 5.0
    ) -> None:
        self.label, self.count, self.total, self.interval_s = label, count, total, interval_s
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        start, base = time.perf_counter(), self.count()
        while True:
            await asyncio.sleep(self.interval_s)
            n = self.count()
            el = time.perf_counter() - start
            say(f"    {self.label}: {n}/{self.total} ({rate(n - base, el):,.0f} msg/s so far)")

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


# ----------------------------------------------------------------------------- the stack


def client_env(stack: EmbeddedStack) -> dict[str, Any]:
    """Keyword arguments that point a Producer / PushConsumer at ``stack``."""
    return {"redis_url": stack.redis_url, "control_bootstrap": stack.business_bootstrap}


def producer_pool_kwargs() -> dict[str, Any]:
    """The AIOKafkaProducer settings tracemq's ProducerPool uses (linger, batch size, ...)."""
    from tracemq.transport import PRODUCER_DEFAULTS

    return dict(PRODUCER_DEFAULTS)


async def create_topic(
    stack: EmbeddedStack, topic: str, queues: int, broker: str = "broker-a"
) -> None:
    from tracemq.admin import AdminClient

    async with AdminClient(stack.business_bootstrap, stack.redis_url, timeout_s=30) as admin:
        await bounded(
            admin.create_topic(broker, topic, read_queues=queues, write_queues=queues),
            60,
            f"creating topic {topic}",
        )


async def wait_trace_topic_route(stack: EmbeddedStack, timeout_s: float = 30.0) -> None:
    """The trace broker creates the trace topic at start; wait until clients can see its route."""
    await wait_topic_writable(stack.redis_url, TRACE_TOPIC, timeout=timeout_s)


# ----------------------------------------------------------------------------- CPU accounting


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


class GcTimer:
    """Collections and seconds spent in CPython's garbage collector, per generation, while it
    is entered (``gc.callbacks``): where part of a client's CPU per message goes."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            g = info["generation"]
            self.collections[g] += 1
            self.seconds[g] += time.perf_counter() - self._began

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def snapshot(self) -> tuple[list[int], list[float]]:
        return list(self.collections), list(self.seconds)

    @staticmethod
    def delta(
        before: tuple[list[int], list[float]], after: tuple[list[int], list[float]]
    ) -> dict[str, Any]:
        """{"collections": per generation, "ms": per generation} between two snapshots."""
        return {
            "collections": [b - a for a, b in zip(before[0], after[0], strict=True)],
            "ms": [round((b - a) * 1000, 1) for a, b in zip(before[1], after[1], strict=True)],
        }


class TaskCpu:
    """CPU time (the thread's) of every event-loop callback of this process, by what it runs:
    a task's coroutine (``PushConsumer._worker``, ``Fleet._loop``,
    ``AsyncTraceDispatcher._run``, aiokafka's ``Sender._send_produce_req`` ...) or a plain
    callback's name. It wraps ``asyncio.events.Handle._run`` while entered.

    A diagnostic: two clock reads per callback (~1 us together) are added to every callback,
    on both sides of a comparison, so a run with it says where the time goes, not what the
    headline figures are."""

    def __init__(self) -> None:
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._original: Any = None

    @staticmethod
    def _name(handle: Any) -> str:
        callback = handle._callback
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return str(getattr(coro, "__qualname__", type(coro).__name__))
        return str(getattr(callback, "__qualname__", type(callback).__name__))

    def __enter__(self) -> TaskCpu:
        original = self._original = asyncio.events.Handle._run
        seconds, name, clock = self.seconds, self._name, time.thread_time

        def _run(handle: Any) -> None:
            key = name(handle)  # (before the run: a callback may cancel its own handle)
            began = clock()
            try:
                original(handle)
            finally:
                seconds[key] += clock() - began

        asyncio.events.Handle._run = _run  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    @staticmethod
    def us_per(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
        """CPU us per message (of ``n``) by callback between two snapshots, largest first."""
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        return {
            k: round(v / n * 1e6, 3)
            for k, v in sorted(delta.items(), key=lambda kv: -kv[1])
            if v / n * 1e6 >= 0.005
        }


def cpu_snapshot(stack: EmbeddedStack) -> dict[str, float]:
    """CPU seconds so far of this process ("bench") and of every process of the stack."""
    snap = {"bench": time.process_time()}
    for name, proc in stack.processes.items():
        if proc.pid:
            snap[name] = _proc_cpu_s(proc.pid)
    return snap


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after.get(k, 0.0) - v, 3) for k, v in before.items()}


def add_cpu(total: dict[str, float], delta: dict[str, float]) -> None:
    for k, v in delta.items():
        total[k] = round(total.get(k, 0.0) + v, 3)


# ----------------------------------------------------------------------------- traces


@dataclass
class TraceIndex:
    """The trace topic, indexed: (trace type, group, msgId) -> [success flags]."""

    messages: int = 0
    contexts: int = 0
    decode_errors: int = 0
    by_key: dict[tuple[str, str, str], list[bool]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def count(self, trace_type: str, group: str, msg_id: str) -> list[bool]:
        return self.by_key.get((trace_type, group, msg_id), [])


async def read_trace_index(stack: EmbeddedStack, timeout_s: float = 180.0) -> TraceIndex:
    """Read the whole trace topic (:func:`tracemq_devkit.reading.read_trace_topic`) and index it."""
    messages = await bounded(
        read_trace_topic(stack.trace_bootstrap, timeout_s=timeout_s),
        timeout_s + 30,
        "reading the trace topic",
    )
    idx = TraceIndex(messages=len(messages))
    for m in messages:
        idx.decode_errors += len(m.errors)
        for c in m.contexts:
            idx.contexts += 1
            for b in c.trace_beans:
                idx.by_key[(c.trace_type.name, c.group_name or "", b.msg_id or "")].append(
                    bool(c.success)
                )
    return idx


def dispatcher_stats(clients: Iterable[Any]) -> dict[str, float]:
    """Sum of the trace dispatchers' stats() over ``clients`` (traced ones)."""
    total: dict[str, float] = defaultdict(float)
    for c in clients:
        d = c.trace_dispatcher
        if d is None:
            continue
        for k, v in d.stats().items():
            if k in ("appended", "sent", "sent_messages", "discarded", "failed", "oversize"):
                total[k] += v
    return {k: int(v) for k, v in total.items()}


# ----------------------------------------------------------------------------- main


def run_bench(
    name: str,
    args: argparse.Namespace,
    body: Callable[[EmbeddedStack, argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
) -> int:
    """Start the stack, run ``body``, print its JSON line last; return the exit code.

    ``body`` returns the result dict; its ``trace_complete`` decides between exit 0 and 1.
    """
    result: dict[str, Any] = {
        "bench": name,
        "messages": args.messages,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "size": args.size,
        "trace_options": args.trace_options,
    }
    return run_on_stack(
        name, args, body, result, ok_key="trace_complete", bad_code=EXIT_TRACE_INCOMPLETE
    )


def run_on_stack(
    name: str,
    args: argparse.Namespace,
    body: Callable[[EmbeddedStack, argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]],
    result: dict[str, Any],
    *,
    ok_key: str,
    bad_code: int,
    config: StackConfig | None = None,
) -> int:
    """The frame of every bench: start the embedded stack, run ``body`` into ``result``, print
    the JSON line last. Exit 0 if it ran (targets met or not), ``bad_code`` if ``result[ok_key]``
    is false, 2 on a crash, 130 on Ctrl-C."""
    configure_logging(getattr(args, "log_level", "WARNING"), json=False)  # logs to stderr
    wall0 = time.monotonic()
    code = EXIT_OK
    try:
        say(f"{name} bench: starting the embedded stack")
        with EmbeddedStack(config or StackConfig()) as stack:
            say(
                f"stack up in {time.monotonic() - wall0:.1f}s: business={stack.business_bootstrap}"
                f" trace={stack.trace_bootstrap} redis={stack.redis_url}"
            )
            # the bench's clients and admin requests sign with the stack's generated keys
            os.environ.update({k: v for k, v in stack.client_env().items() if "KEY" in k})
            result.update(asyncio.run(body(stack, args)))
            say("stopping the stack")
        if not result.get(ok_key, False):
            code = bad_code
    except KeyboardInterrupt:
        say("interrupted; the stack has been stopped")
        result.update(error="interrupted")
        code = EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - report any crash in the JSON line too
        traceback.print_exc()
        result.update(error=f"{exc.__class__.__name__}: {exc}")
        code = EXIT_CRASH
    result["wall_s"] = round(time.monotonic() - wall0, 1)
    result["exit_code"] = code
    emit_json(result)
    return code

"""Every Python snippet of the README and of docs/*.md runs as written against the real stack and
prints what the page says it prints; the quick start's trace is then in the collector, as its
``tracemq trace show`` line says.

Convention (checked here): a ```python block is followed by the ```text block of what it
prints — the next fenced block, before any other code block. In that text a msgId (32 hex
digits) stands for any msgId, the same one wherever it repeats, and a run of digits for any
number (queues, offsets, counts). A block that cannot run alone says so on the line before it
with ``<!-- snippet: fragment -->``; at most :data:`MAX_FRAGMENTS` may.

A snippet runs in its own interpreter with only the environment ``tracemq dev up`` tells a user
to export (``EmbeddedStack.client_env``), with the page's topic ``TopicTest`` renamed to this
module's own topic, which is made with the quick start's own ``tracemq topic create`` line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from tracemq_devkit.devstack import EmbeddedStack
from tracemq_devkit.devstack.process import ManagedProcess
from tracemq_devkit.devstack.stack import tracemq_command
from tracemq_devkit.waiting import eventually_sync

pytestmark = [pytest.mark.stack, pytest.mark.kafka, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- snippet: fragment -->"
#: snippets allowed to be fragments (not run): a page should show code that works
MAX_FRAGMENTS = 1
#: the topic the pages' snippets use
PAGE_TOPIC = "TopicTest"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", flags=re.S | re.M)
_MSG_ID = r"[0-9A-F]{32}"
_TOKEN = re.compile(rf"({_MSG_ID}|\d+)")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str
    prints: str | None
    fragment: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    out = []
    for path in PAGES:
        text = path.read_text()
        blocks = list(_FENCE.finditer(text))
        for i, block in enumerate(blocks):
            if block.group(1) != "python":
                continue
            before = text[: block.start()].rstrip().rsplit("\n", 1)[-1].strip()
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            prints = after.group(2) if after is not None and after.group(1) == "text" else None
            out.append(
                Snippet(
                    page=str(path.relative_to(ROOT)),
                    line=text.count("\n", 0, block.start()) + 1,
                    code=block.group(2),
                    prints=prints,
                    fragment=before == FRAGMENT,
                )
            )
    return out


SNIPPETS = snippets()


def expected_pattern(prints: str) -> re.Pattern[str]:
    """What ``prints`` promises, as a pattern: msgIds and numbers stand for any, a msgId that
    repeats must repeat in the output."""
    ids: dict[str, str] = {}
    parts = []
    for piece in _TOKEN.split(prints.strip()):
        if re.fullmatch(_MSG_ID, piece):
            if piece in ids:
                parts.append(f"(?P={ids[piece]})")
            else:
                ids[piece] = f"id{len(ids)}"
                parts.append(f"(?P<{ids[piece]}>{_MSG_ID})")
        elif re.fullmatch(r"\d+", piece):
            parts.append(r"\d+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def test_the_pages_show_snippets_that_run() -> None:
    """The convention holds: the quick start's snippet is found, few are fragments, and every
    snippet that runs says what it prints."""
    assert any(s.page == "README.md" for s in SNIPPETS), "README.md shows no Python snippet"
    fragments = [s.id for s in SNIPPETS if s.fragment]
    assert len(fragments) <= MAX_FRAGMENTS, f"too many fragments: {fragments}"
    silent = [s.id for s in SNIPPETS if not s.fragment and s.prints is None]
    assert not silent, f"snippets without the ```text block of what they print: {silent}"


def test_expected_pattern() -> None:
    p = expected_pattern(
        "sent 7F00000100002A9F0000000000000001 to T#2 offset 0\n"
        "received 7F00000100002A9F0000000000000001 ['k'] 0\n"
    )
    a, b = "AB" * 16, "CD" * 16
    assert p.fullmatch(f"sent {a} to T#3 offset 17\nreceived {a} ['k'] 0")
    assert not p.fullmatch(f"sent {a} to T#3 offset 17\nreceived {b} ['k'] 0")  # not the same id
    assert not p.fullmatch(f"sent {a} to T#3 offset 17")  # nothing received


def _env(stack: EmbeddedStack) -> dict[str, str]:
    # only what `tracemq dev up` prints for another shell: nothing of the test session leaks in
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEMQ_")}
    env.update(stack.client_env())
    env["TRACEMQ_DEV_HOME"] = str(stack.workdir / "no-dev-home")  # this stack, none other
    # what the CLI would read from `tracemq dev up`'s state
    env["TRACEMQ_COLLECTOR_URL"] = stack.endpoints()["collector_api"]
    env["COLUMNS"] = "200"
    return env


def _cli(stack: EmbeddedStack, line: str, topic: str) -> subprocess.CompletedProcess[str]:
    args = shlex.split(line.split("#", 1)[0].replace(PAGE_TOPIC, topic))
    assert args[0] == "tracemq", line
    return subprocess.run(
        [*tracemq_command(), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(stack),
    )


def _quick_start_line(prefix: str) -> str:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in quick.splitlines() if ln.strip().startswith(prefix)]
    assert lines, f"the quick start shows no `{prefix} …` line"
    return lines[0]


@pytest.fixture(scope="module")
def topic(stack: EmbeddedStack, collector: ManagedProcess) -> str:
    """The pages' TopicTest for this module, made as the quick start makes it."""
    name = f"{PAGE_TOPIC}{uuid.uuid4().hex[:8]}"
    res = _cli(stack, _quick_start_line("tracemq topic create"), name)
    assert res.returncode == 0, res.stdout + res.stderr
    return name


@pytest.mark.timeout(150)
@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if not s.fragment], ids=lambda s: s.id)
def test_snippet_prints_what_the_page_says(
    snippet: Snippet, stack: EmbeddedStack, topic: str
) -> None:
    assert snippet.prints is not None, f"{snippet.id} does not say what it prints"
    res = subprocess.run(
        [sys.executable, "-c", snippet.code.replace(PAGE_TOPIC, topic)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(stack),
        cwd=stack.workdir,
    )
    assert res.returncode == 0, f"{snippet.id} failed:\n{res.stdout}\n{res.stderr[-4000:]}"
    want = expected_pattern(snippet.prints.replace(PAGE_TOPIC, topic))
    assert want.fullmatch(res.stdout.strip()), (
        f"{snippet.id} printed:\n{res.stdout}\nthe page says:\n{snippet.prints}"
    )
    if snippet.page == "README.md" and "PushConsumer" in snippet.code:
        _check_quick_start_trace(stack, topic, res.stdout)


def _check_quick_start_trace(stack: EmbeddedStack, topic: str, printed: str) -> None:
    """The quick start's next step: `tracemq trace show <msgId>` shows the Pub and the
    consumer group's successful attempt."""
    msg_id = re.search(_MSG_ID, printed)
    assert msg_id, printed
    line = re.sub(_MSG_ID, msg_id.group(), _quick_start_line("tracemq trace show"))
    named = re.search(r'PushConsumer\("(\w+)"', _quick_start_code())
    assert named, "the quick start's consumer has no group name"
    group = named.group(1)

    last: list[str] = []

    def shown() -> bool:
        res = _cli(stack, line, topic)
        last[:] = [res.stdout, res.stderr]
        rows = res.stdout.splitlines()
        pub = [r for r in rows if "Pub" in r and "success" in r]
        sub = [r for r in rows if "Sub" in r and group in r and "success" in r]
        return res.returncode == 0 and bool(pub) and bool(sub)

    try:
        eventually_sync(shown, timeout=30, interval=0.5, what=f"the trace of {msg_id.group()}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; `{line}` printed:\n" + "\n".join(last)) from None


def _quick_start_code() -> str:
    return next(s.code for s in SNIPPETS if s.page == "README.md" and "PushConsumer" in s.code)

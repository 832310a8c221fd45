"""Every `tracemq ...` command shown in the README and in docs/*.md parses against the real CLI:
no stale sub-command or option (what they do is exercised by the integration tests)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from tracemq.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[str]:
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("tracemq "):
                    out.append(line)
    return out


COMMANDS = _commands()


def test_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("line", COMMANDS)
def test_command_parses(line: str) -> None:
    args = shlex.split(line.replace("[", "").replace("]", "").replace("...", "x"))[1:]
    cmd = app  # the lazy group: sub-commands are imported as they are looked up
    path = ["tracemq"]
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        sub = cmd.get_command(None, args[0])
        assert sub is not None, f"unknown command {args[0]!r} in {line!r}"
        path.append(args.pop(0))
        cmd = sub
    # parses options and arguments exactly as a run would (raises on unknown ones); runs nothing
    cmd.make_context(" ".join(path), args)

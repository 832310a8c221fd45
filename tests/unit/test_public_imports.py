"""The services, the Spark job, the dev kit and the benches use the library through its public names only: no import
of a private ``tracemq`` module (``tracemq._kafka``, ``tracemq.protocol._envelope``,
``tracemq.cli._connection``, ...), so the library may change what is behind them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = [
    *sorted((ROOT / "services").glob("*/src")),
    ROOT / "spark" / "src",
    ROOT / "libs" / "tracemq-devkit" / "src",
    ROOT / "bench",
]


def _private_tracemq_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "tracemq" and any(
                p.startswith("_") and not p.startswith("__") for p in parts[1:]
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
                break
    return found


def test_nothing_outside_the_library_imports_a_private_tracemq_module() -> None:
    files = [f for src in OUTSIDE for f in sorted(src.rglob("*.py"))]
    assert len(files) > 20  # the walk found the packages
    reaches = [r for f in files for r in _private_tracemq_imports(f)]
    assert not reaches, "\n".join(reaches)

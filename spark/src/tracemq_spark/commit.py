"""Stage "atomic commit" of the reconciliation job (:mod:`tracemq_spark.job`).

A run writes everything under ``<out>/_staging/<run id>`` (:class:`Staging`); when the whole
output is staged and checked (:func:`validate_staging`), :func:`commit` swaps exactly the run's
windows of every dataset and the run files into place, moving everything back on a failure;
:func:`cleanup` removes the staging area whatever happened. Test checkpoints
(``Params.fail_at``) are raised by :func:`checkpoint`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tracemq_spark.params import Params, _window_label


class Staging:
    """Paths of one run: everything is written under ``<out>/_staging/<run id>`` first."""

    def __init__(self, out: str, run_id: str) -> None:
        self.out = out.rstrip("/")
        self.root = f"{self.out}/_staging/{run_id}"
        self.previous = f"{self.root}/_previous"

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def final(self, *parts: str) -> str:
        return "/".join([self.out, *parts])


def checkpoint(params: Params, name: str) -> None:
    if params.fail_at == name:
        raise RuntimeError(f"injected failure at {name!r}")


def cleanup(fs: Any, stage: Staging, out: str, out_existed: bool) -> None:
    try:
        fs.delete(stage.root)
        fs.delete_if_empty(f"{stage.out}/_staging")
        if not out_existed:
            fs.delete_if_empty(out)
    except Exception:  # noqa: S110 - cleaning up must not hide the real error
        pass


def validate_staging(fs: Any, st: Staging, keep_classified: bool, summary: dict[str, Any]) -> None:
    """The staged output is whole: every dataset committed, summary.json readable."""
    for ds in ("anomalies", "summary") + (("classified",) if keep_classified else ()):
        if not fs.exists(st.path(ds, "_SUCCESS")):
            raise RuntimeError(f"staged {ds} is incomplete (no _SUCCESS)")
    staged = json.loads(fs.read_text(st.path("summary.json")))
    if staged.get("outcomes") != summary["outcomes"]:
        raise RuntimeError("staged summary.json does not match the computed summary")
    labels = set(summary["run"]["windows"])
    for ds in ("anomalies", "summary"):
        for name, is_dir, _ in fs.list(st.path(ds)):
            if is_dir and name.startswith("window=") and name[7:] not in labels:
                raise RuntimeError(f"staged {ds} has a window outside the run: {name}")


# per-window swap
def commit(fs: Any, st: Staging, p: Params, windows: list[int], say: Callable[[str], None]) -> None:
    """Replace exactly this run's windows of every dataset, and the run files.

    Each target is first moved to ``<staging>/_previous``, then the staged one moved in;
    a failure on the way moves everything back. A window with no rows any more loses its
    old partition (which Spark's own dynamic overwrite would leave behind).
    """
    moves: list[tuple[str, str | None, str | None]] = []  # (target, backup, staged)
    datasets = ["anomalies", "summary"] + (["classified"] if p.keep_classified else [])
    for ds in datasets:
        for start in windows:
            part = f"window={_window_label(start)}"
            moves.append((st.final(ds, part), st.path("_previous", ds, part), st.path(ds, part)))
    moves.extend(
        (st.final(name), st.path("_previous", name), st.path(name))
        for name in (
            "summary.json",
            "report.html",
            "report.png",
            "inputs/subscriptions.json",
            "inputs/offsets.json",
        )
    )
    done: list[tuple[str, str | None, str | None, bool, bool]] = []
    try:
        for target, backup, staged in moves:
            had_old = fs.exists(target)
            has_new = staged is not None and fs.exists(staged)
            if not had_old and not has_new:
                continue
            if had_old and backup is not None:
                fs.rename(target, backup)
            done.append((target, backup, staged, had_old, False))
            checkpoint(p, "during_commit")
            if has_new and staged is not None:
                fs.rename(staged, target)
                done[-1] = (target, backup, staged, had_old, True)
        for ds in datasets:  # readers of the dataset root expect a _SUCCESS marker
            fs.write_text(st.final(ds, "_SUCCESS"), "")
    except BaseException:
        for target, backup, staged, had_old, moved_in in reversed(done):
            try:
                if moved_in and staged is not None:
                    fs.rename(target, staged)
                if had_old and backup is not None:
                    fs.rename(backup, target)
            except Exception as exc:  # pragma: no cover - reported, never hidden
                say(f"ROLLBACK FAILED for {target}: {exc!r}; previous copy in {backup}")
        raise

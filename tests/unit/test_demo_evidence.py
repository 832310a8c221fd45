"""The demo keeps the collector's store, lake and logs when its reconciliation disagrees with
the listeners (a bug to explain after the stack's temporary workdir is gone)."""

from __future__ import annotations

from pathlib import Path

from tracemq_devkit.demo import _keep_evidence


def test_the_store_lake_and_logs_are_copied_next_to_the_reconciliation(tmp_path: Path) -> None:
    workdir, out = tmp_path / "stack", tmp_path / "out"
    collector = workdir / "data" / "collector"
    (collector / "lake" / "date=2026-11-28" / "hour=13").mkdir(parents=True)
    (collector / "traces.db").write_bytes(b"store")
    (collector / "lake" / "date=2026-11-28" / "hour=13" / "part-1.parquet").write_bytes(b"lake")
    (workdir / "logs").mkdir()
    (workdir / "logs" / "collector.log").write_text("ingest\n")
    (workdir / "data" / "kafka-trace").mkdir()  # not evidence: left out
    (workdir / "data" / "kafka-trace" / "log").write_bytes(b"x" * 10)

    dest = _keep_evidence(workdir, out)

    assert dest == out / "evidence"
    assert (dest / "data" / "collector" / "traces.db").read_bytes() == b"store"
    part = dest / "data" / "collector" / "lake" / "date=2026-11-28" / "hour=13" / "part-1.parquet"
    assert part.read_bytes() == b"lake"
    assert (dest / "logs" / "collector.log").read_text() == "ingest\n"
    assert not (dest / "data" / "kafka-trace").exists()


def test_nothing_to_copy_says_so(tmp_path: Path) -> None:
    assert _keep_evidence(tmp_path / "gone", tmp_path / "out") is None
    assert not (tmp_path / "out").exists()

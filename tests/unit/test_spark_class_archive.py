"""The driver JVM's class-data archive (``tracemq_spark.class_archive``), its decisions without a
JVM: where archives go, when a JVM maps one or writes one, what names a configuration, which
leftovers are removed, and that only a checked archive is ever moved into place. The real JVMs:
tests/spark/test_class_archive.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from tracemq_spark import class_archive as ca
from tracemq_spark.params import ReconcileError


@pytest.fixture
def spark_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake Spark home with two jars, and a fake java (JAVA_HOME) with its libjvm."""
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"core")
    (home / "jars" / "hadoop.jar").write_bytes(b"hadoop")
    monkeypatch.setattr("pyspark.find_spark_home._find_spark_home", lambda: str(home))
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "lib" / "server").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("#!/bin/sh\n")
    (java_home / "lib" / "server" / "libjvm.so").write_bytes(b"jvm 17.0.15")
    return home


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"JAVA_HOME": str(tmp_path / "jdk"), "HOME": str(tmp_path / "home"), **more}


def test_cache_dir_settings(tmp_path: Path) -> None:
    assert ca.cache_dir({"HOME": "/h"}) == Path("/h/.cache/tracemq-spark")
    assert ca.cache_dir({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x/tracemq-spark")
    assert ca.cache_dir({"HOME": "/h", ca.ENV: "AUTO"}) == Path("/h/.cache/tracemq-spark")
    assert ca.cache_dir({ca.ENV: "off"}) is None
    assert ca.cache_dir({ca.ENV: str(tmp_path / "d")}) == tmp_path / "d"
    with pytest.raises(ReconcileError, match=r"TRACEMQ_SPARK_CLASS_ARCHIVE='rel/dir'.*absolute"):
        ca.cache_dir({ca.ENV: "rel/dir"})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ca.ClassArchiveError, match="not a directory"):
        ca.cache_dir({ca.ENV: str(tmp_path / "file")})


def test_first_jvm_writes_the_archive_later_ones_map_it(spark_home: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, **{ca.ENV: str(tmp_path / "cache")})
    first = ca.plan("-XX:+UseParallelGC", [], env)
    assert first is not None and first.part is not None and first.state == "dumped"
    assert first.part.parent == tmp_path / "cache" and first.part.name.endswith(".part")
    assert f"-XX:ArchiveClassesAtExit={first.part}" in first.java_option()
    second = ca.plan("-XX:+UseParallelGC", [], env)
    assert second is not None and second.part != first.part  # each JVM its own part file
    first.archive.write_bytes(b"archive")
    third = ca.plan("-XX:+UseParallelGC", [], env)
    assert third is not None and third.part is None and third.state == "used"
    assert third.java_option() == f"-XX:SharedArchiveFile={first.archive}"


def test_no_plan_when_off_or_decided_by_the_user_or_without_java(
    spark_home: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path, **{ca.ENV: str(tmp_path / "cache")})
    assert ca.plan("", [], {**env, ca.ENV: "off"}) is None
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/a.jsa", "-XX:ArchiveClassesAtExit=/b",
                "-XX:-UseSharedSpaces"):  # fmt: skip
        assert ca.plan(f"-Xmx1g {own}", [], env) is None, own
    assert ca.plan("", [], {**env, "JAVA_HOME": str(tmp_path / "nojdk")}) is None
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


def test_the_configuration_name_follows_java_jars_class_path_and_flags(
    spark_home: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    jar = tmp_path / "job.jar"
    jar.write_bytes(b"v1")
    key = ca.config_key("-XX:+UseParallelGC -XX:CompileThresholdScaling=4", [str(jar)], env)
    assert key is not None
    same = ca.config_key(
        "-XX:+UseParallelGC -Xms4g -Dlog4j2.configurationFile=/x -Xlog:gc -XX:CompileThresholdScaling=4",
        [str(jar)],
        env,
    )
    assert same == key  # heap size, properties and logging do not change the archive
    assert ca.config_key("-XX:+UseG1GC -XX:CompileThresholdScaling=4", [str(jar)], env) != key
    jar.write_bytes(b"v2 longer")  # the job's jar rebuilt
    assert ca.config_key("-XX:+UseParallelGC -XX:CompileThresholdScaling=4", [str(jar)], env) != key
    jar.write_bytes(b"v1")
    os.utime(jar, ns=(0, 0))
    k2 = ca.config_key("-XX:+UseParallelGC -XX:CompileThresholdScaling=4", [str(jar)], env)
    (spark_home / "jars" / "extra.jar").write_bytes(b"new")  # Spark upgraded
    assert ca.config_key("-XX:+UseParallelGC -XX:CompileThresholdScaling=4", [str(jar)], env) != k2
    libjvm = tmp_path / "jdk" / "lib" / "server" / "libjvm.so"
    before = ca.config_key("", [], env)
    libjvm.write_bytes(b"jvm 17.0.16 update")  # Java updated
    assert ca.config_key("", [], env) != before


def test_stale_parts_are_removed_live_and_young_ones_kept(spark_home: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    gone_pid = _exited_pid()
    old = time.time() - 2 * ca.STALE_PART_S
    stale = cache / f"spark-driver-k.{gone_pid}.1.part"
    young = cache / f"spark-driver-k.{gone_pid}.2.part"
    live = cache / f"spark-driver-k.{os.getpid()}.3.part"
    odd = cache / "spark-driver-k.x.part"
    for p in (stale, young, live, odd):
        p.write_bytes(b"half an archive")
    for p in (stale, live, odd):
        os.utime(p, (old, old))
    ca.plan("", [], _env(tmp_path, **{ca.ENV: str(cache)}))
    assert not stale.exists() and not odd.exists()
    assert young.exists()  # its JVM may still be writing it
    assert live.exists()  # this process's own session has not finished yet


def _exited_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


class _Proc:
    def __init__(self, writes: bytes | None, part: Path) -> None:
        self.writes, self.part, self.stdin, self.waited = writes, part, None, False

    def wait(self, timeout: float) -> int:
        self.waited = True
        if self.writes is not None:
            self.part.write_bytes(self.writes)
        return 0


def _dump_plan(tmp_path: Path, writes: bytes | None) -> ca.Plan:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    p = ca.Plan(cache / "spark-driver-k.jsa", part=cache / f"spark-driver-k.{os.getpid()}.9.part")
    p.java, p.check_args = "/usr/bin/java", ["-cp", "x"]
    p.proc = _Proc(writes, p.part)
    return p


def test_finish_keeps_only_a_checked_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[tuple[Path, bytes]] = []

    def check(archive: Path, java: Any, args: Any) -> bool:
        checked.append((archive, archive.read_bytes()))
        return archive.read_bytes() == b"good"

    monkeypatch.setattr(ca, "check", check)
    bad = _dump_plan(tmp_path, b"truncated")
    assert ca.finish(bad) is False
    assert bad.proc.waited and checked == [(bad.part, b"truncated")]
    assert not bad.part.exists() and not bad.archive.exists()
    good = _dump_plan(tmp_path, b"good")
    assert ca.finish(good) is True
    assert good.archive.read_bytes() == b"good" and not good.part.exists()
    assert ca.finish(good) is False  # once (stop_session, then the interpreter's exit)
    none = _dump_plan(tmp_path, None)  # the JVM wrote nothing (killed, disk full)
    none.archive.unlink()
    assert ca.finish(none) is False and not none.archive.exists()


def test_finish_keeps_the_newest_archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca, "check", lambda *a: True)
    cache = tmp_path / "cache"
    cache.mkdir()
    olds = []
    for i in range(4):
        a = cache / f"spark-driver-old{i}.jsa"
        a.write_bytes(b"x")
        os.utime(a, (1000 + i, 1000 + i))
        olds.append(a)
    p = _dump_plan(tmp_path, b"new")
    assert ca.finish(p)
    left = sorted(x.name for x in cache.glob("*.jsa"))
    assert left == sorted([p.archive.name, olds[3].name, olds[2].name])


def test_an_archive_in_use_outlives_newer_unused_ones(
    spark_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning goes by last use: mapping an archive renews it (two checkouts on one machine,
    each making archives of its own, must not push out the one the other keeps using)."""
    monkeypatch.setattr(ca, "check", lambda *a: True)
    env = _env(tmp_path, **{ca.ENV: str(tmp_path / "cache")})
    used = ca.plan("-XX:+UseParallelGC", [], env)
    assert used is not None
    used.archive.write_bytes(b"archive")
    os.utime(used.archive, (1000, 1000))  # made long ago
    for i in range(3):
        a = tmp_path / "cache" / f"spark-driver-other{i}.jsa"
        a.write_bytes(b"x")
        os.utime(a, (2000 + i, 2000 + i))
    again = ca.plan("-XX:+UseParallelGC", [], env)
    assert again is not None and again.state == "used"
    assert used.archive.stat().st_mtime > 2002
    p = _dump_plan(tmp_path, b"new")
    assert ca.finish(p)
    assert used.archive.exists()
    assert not (tmp_path / "cache" / "spark-driver-other0.jsa").exists()


def test_check_refuses_what_a_jvm_cannot_map(tmp_path: Path) -> None:
    """The check runs a real JVM; a file that is no archive fails it (the real archives:
    tests/spark/test_class_archive.py)."""
    junk = tmp_path / "junk.jsa"
    junk.write_bytes(b"\0" * 4096)
    java = shutil.which("java")
    assert java is not None, "Java 17 is part of the machine (the Spark tests need it)"
    assert ca.check(junk, java, []) is False
    assert ca.check(junk, None, []) is False


def test_an_unwritable_directory_only_maps_what_is_there(
    spark_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JVM told to write where it cannot would fail at exit, every run: no plan then; an
    archive already there is still mapped. (The tests run as root, which os.access lets
    write anywhere: the check is replaced.)"""
    env = _env(tmp_path, **{ca.ENV: str(tmp_path / "cache")})
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(ca.os, "access", lambda path, mode: False)
    assert ca.plan("", [], env) is None
    key = ca.config_key("", [], env)
    (tmp_path / "cache" / f"spark-driver-{key}.jsa").write_bytes(b"archive")
    used = ca.plan("", [], env)
    assert used is not None and used.state == "used"

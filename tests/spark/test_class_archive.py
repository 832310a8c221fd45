"""The driver JVM's class-data archive on real JVMs (``tracemq_spark.class_archive``): a first
session's JVM writes it at exit and it is kept only once checked; the next session's JVM maps
it and loads Spark's classes from it; a damaged archive fails the check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tracemq_spark import class_archive as ca

SCRIPT = """
import json, sys
from tracemq_spark import job, session
s = job.build_session("local[1]", driver_memory="1g", app_name="class-archive-test",
    extra={"spark.ui.enabled": "false",
           "spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1]})
total = s.range(1000).selectExpr("sum(id) AS t").collect()[0]["t"]
jvm = s.sparkContext._jvm
args = [str(a) for a in jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        .getInputArguments()]
p = session._ARCHIVES.get(id(s.sparkContext))
out = {"total": total, "state": session.archive_state(s), "args": args,
       "java": p.java if p else None, "check_args": p.check_args if p else None}
job.stop_session(s)
print(json.dumps(out))
"""


def _session_run(tmp_path: Path, cache: Path, name: str) -> tuple[dict, str]:
    script = tmp_path / "session_run.py"
    script.write_text(SCRIPT)
    log = tmp_path / f"{name}.classes.log"
    env = {**os.environ, ca.ENV: str(cache)}
    done = subprocess.run(
        [sys.executable, str(script), str(log)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), log.read_text()


def test_first_session_writes_the_archive_the_next_maps_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, first_log = _session_run(tmp_path, cache, "first")
    assert first["total"] == 499500 and first["state"] == "dumped"
    assert any(a.startswith("-XX:ArchiveClassesAtExit=") for a in first["args"])
    archives = list(cache.glob("*.jsa"))
    assert len(archives) == 1, sorted(p.name for p in cache.iterdir())
    assert not list(cache.glob("*.part"))
    archive = archives[0]
    assert "org.apache.spark.SparkContext source: shared objects file (top)" not in first_log

    second, second_log = _session_run(tmp_path, cache, "second")
    assert second["total"] == 499500 and second["state"] == "used"
    assert f"-XX:SharedArchiveFile={archive}" in second["args"]
    # Spark's classes came from the archive the first JVM wrote ("top": the dynamic archive
    # above the JDK's own)
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in second_log
    assert "org.apache.spark.sql.SparkSession source: shared objects file (top)" in second_log
    assert sorted(p.name for p in cache.iterdir()) == [archive.name]

    # the check a written archive passes before it is kept: the real one passes, a truncated
    # or bit-flipped copy fails (mapping either would crash the JVM)
    java, args = first["java"], first["check_args"]
    assert ca.check(archive, java, args)
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert not ca.check(truncated, java, args)
    flipped = tmp_path / "flipped.jsa"
    shutil.copyfile(archive, flipped)
    os.chmod(flipped, 0o644)
    with flipped.open("r+b") as f:
        f.seek(flipped.stat().st_size * 2 // 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    assert not ca.check(flipped, java, args)

"""The job's JVM flags reach the JVM ``build_session`` starts, a user's own choice of
garbage collector is kept, and the job's file operations through that JVM keep every byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracemq_spark.session import _with_jvm_flags


def test_driver_jvm_runs_with_the_job_flags(spark: Any) -> None:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:-DontCompileHugeMethods" in args, args
    assert "-XX:+UseParallelGC" in args, args
    assert "-XX:CompileThresholdScaling=4" in args, args
    assert "-XX:MetaspaceSize=256m" in args, args
    names = [
        gc.getName()
        for gc in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    ]
    assert any("PS " in n or "Parallel" in n for n in names), names


def test_a_chosen_collector_is_kept() -> None:
    jit = "-XX:-DontCompileHugeMethods -XX:CompileThresholdScaling=4 -XX:MetaspaceSize=256m"
    assert _with_jvm_flags("-XX:+UseG1GC") == f"-XX:+UseG1GC {jit}"
    assert _with_jvm_flags("-XX:+UseZGC -XX:-DontCompileHugeMethods") == (
        "-XX:+UseZGC -XX:-DontCompileHugeMethods -XX:CompileThresholdScaling=4 "
        "-XX:MetaspaceSize=256m"
    )
    assert _with_jvm_flags("") == f"{jit} -XX:+UseParallelGC"


def test_a_chosen_compile_threshold_and_metaspace_size_are_kept() -> None:
    assert _with_jvm_flags("-XX:CompileThresholdScaling=1 -XX:+UseG1GC") == (
        "-XX:CompileThresholdScaling=1 -XX:+UseG1GC -XX:-DontCompileHugeMethods "
        "-XX:MetaspaceSize=256m"
    )
    assert _with_jvm_flags("-XX:MetaspaceSize=64m -XX:+UseG1GC") == (
        "-XX:MetaspaceSize=64m -XX:+UseG1GC -XX:-DontCompileHugeMethods "
        "-XX:CompileThresholdScaling=4"
    )


def test_files_go_through_the_jvm_whole(spark: Any, tmp_path: Path) -> None:
    """The job's file writes, reads and copies (contents never cross py4j) keep every byte and
    leave what Hadoop's own writes leave (a checksum file beside each file)."""
    from tracemq_spark.fs import HadoopFS

    fs = HadoopFS(spark)
    data = bytes(range(256)) * 4099 + b"\xff\x00"
    target = fs.qualify(str(tmp_path / "a" / "b.bin"))
    fs.write_bytes(target, data)
    fs.write_bytes(target, data[::-1])  # replaced, not appended
    assert (tmp_path / "a" / "b.bin").read_bytes() == data[::-1]
    assert (tmp_path / "a" / ".b.bin.crc").exists()
    assert fs.read_bytes(target) == data[::-1]
    fs.copy(target, fs.qualify(str(tmp_path / "c" / "d.bin")))
    assert (tmp_path / "c" / "d.bin").read_bytes() == data[::-1]
    assert (tmp_path / "c" / ".d.bin.crc").exists()


def test_the_driver_heap_starts_at_its_full_size() -> None:
    from tracemq_spark.session import session_conf

    opts = session_conf(heap="3g")["spark.driver.extraJavaOptions"].split()
    assert "-Xms3g" in opts
    assert "-Xms3g" not in session_conf(heap="3g")["spark.executor.extraJavaOptions"].split()
    assert not any(
        o.startswith("-Xms") for o in session_conf()["spark.driver.extraJavaOptions"].split()
    )
    kept = session_conf(heap="3g", extra={"spark.driver.extraJavaOptions": "-Xms1g"})
    assert [o for o in kept["spark.driver.extraJavaOptions"].split() if o.startswith("-Xms")] == [
        "-Xms1g"
    ]

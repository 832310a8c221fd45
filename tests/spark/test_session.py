"""The job's JVM flags reach the JVM ``build_session`` starts, and a user's own choice of
garbage collector is kept."""

from __future__ import annotations

from typing import Any

from tracemq_spark.session import _with_jvm_flags


def test_driver_jvm_runs_with_the_job_flags(spark: Any) -> None:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:-DontCompileHugeMethods" in args, args
    assert "-XX:+UseParallelGC" in args, args
    names = [
        gc.getName()
        for gc in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    ]
    assert any("PS " in n or "Parallel" in n for n in names), names


def test_a_chosen_collector_is_kept() -> None:
    assert _with_jvm_flags("-XX:+UseG1GC") == "-XX:+UseG1GC -XX:-DontCompileHugeMethods"
    assert _with_jvm_flags("-XX:+UseZGC -XX:-DontCompileHugeMethods") == (
        "-XX:+UseZGC -XX:-DontCompileHugeMethods"
    )
    assert _with_jvm_flags("") == "-XX:-DontCompileHugeMethods -XX:+UseParallelGC"

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


def test_the_figures_pool_gets_cores_while_a_default_pool_job_has_tasks_queued(spark: Any) -> None:
    """The session schedules its pools fairly (``spark.scheduler.mode`` FAIR, the packaged
    allocation file): a job of the figures' pool (``outputs.FIGURES_POOL``) submitted while a
    job of the default pool still has most of its tasks queued runs on the next free core,
    instead of behind every one of them (FIFO)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tracemq_spark.outputs import FIGURES_POOL

    sc = spark.sparkContext
    assert sc.getConf().get("spark.scheduler.mode") == "FAIR"
    assert sc._jsc.sc().getPoolForName(FIGURES_POOL).isDefined()  # type: ignore[attr-defined]
    tasks = 40
    done = sc.accumulator(0)

    def work(_: Any) -> list[int]:
        # (the task's work: it holds its core for half a second, so that the default pool's
        # job lasts ~10 s on two cores and the figures' job has seconds to be scheduled in
        # even on a loaded host)
        time.sleep(0.5)
        done.add(1)
        return [1]

    def default_job() -> int:
        return sc.parallelize(range(tasks), tasks).mapPartitions(work).count()

    def figures_job() -> int:
        sc.setLocalProperty("spark.scheduler.pool", FIGURES_POOL)
        try:
            return sc.parallelize(range(2), 1).count()
        finally:
            sc.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]

    with ThreadPoolExecutor(max_workers=2) as pool:
        big = pool.submit(default_job)
        deadline = time.monotonic() + 120
        while done.value < 1:  # the default pool's job is running, the rest queued
            assert time.monotonic() < deadline, "the default pool's job never ran a task"
            assert not big.done(), big.exception()
            time.sleep(0.05)
        assert pool.submit(figures_job).result(timeout=120) == 2
        finished_before = done.value
        assert big.result(timeout=300) == tasks
    assert finished_before < tasks // 2, (
        f"the figures' job waited for {finished_before} of the default pool's {tasks} tasks"
    )

"""The driver JVM's class-data archive (HotSpot's application class-data sharing, "AppCDS"):
the ~15 000 classes of Spark, Hadoop, Parquet and the job's own jar that a run loads, parsed,
verified and laid out once, then mapped by every later JVM of the same Java and class path
instead of being read from ~250 jars and verified again (issue 19 goal 4). On this machine it
takes ~2 s off a session's start and ~1 – 3 s of the first stages' class loading (figures:
spark/README.md, fourteenth pass).

How (Java 17, no ``-XX:+AutoCreateSharedArchive`` before Java 19):

* :func:`plan`, when :func:`tracemq_spark.session.build_session` starts a JVM: the archive of
  this configuration (a name hashed from the Java build, the Spark jars, the job's jar and the
  JVM flags) in the cache directory. When it is there the JVM maps it
  (``-XX:SharedArchiveFile``); when not, the JVM writes one when it exits
  (``-XX:ArchiveClassesAtExit``) under a ``.part`` name of its own — that first run is ~5 s
  slower.
* :func:`finish`, when the session ends (:func:`tracemq_spark.session.stop_session`, or at the
  interpreter's exit): the JVM is let go and waited for, the written archive checked by a JVM
  of the same Java, flags and class path with ``-Xshare:on -XX:+VerifySharedSpaces`` (every
  region's checksum), and only then renamed into place. A truncated or damaged archive would
  crash the JVM that maps it (SIGBUS, even with ``-Xshare:auto``), so nothing else is ever
  given to a JVM.

Settings: ``TRACEMQ_SPARK_CLASS_ARCHIVE`` — ``auto`` (default: ``$XDG_CACHE_HOME/tracemq-spark``
or ``~/.cache/tracemq-spark``), ``off``, or a directory. A user's own ``-Xshare`` or archive
flag in ``spark.driver.extraJavaOptions`` wins: no plan then.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracemq.log import get_logger

from tracemq_spark.params import ReconcileError

log = get_logger("reconcile.class_archive")

ENV = "TRACEMQ_SPARK_CLASS_ARCHIVE"
#: archives kept in the cache directory (the newest; one per configuration in use)
KEEP = 3
#: a ``.part`` file whose writer is gone and that nobody wrote to for this long is removed
STALE_PART_S = 60.0
#: how long :func:`finish` waits for the JVM to write the archive and exit
EXIT_WAIT_S = 120.0
_PREFIX = "spark-driver-"
#: JVM options that are the user's own decision about class-data sharing
_OWN = re.compile(r"-Xshare:|SharedArchiveFile|ArchiveClassesAtExit|UseSharedSpaces")
#: JVM options that do not change what the archive holds or whether it maps (per-run paths,
#: logging,
#: the heap's size): left out of the configuration's name
_NOT_KEYED = re.compile(r"^-(D|Xms|Xmx|Xss|Xlog)")


class ClassArchiveError(ReconcileError):
    """``TRACEMQ_SPARK_CLASS_ARCHIVE`` names something that cannot be used."""


@dataclass
class Plan:
    """What one JVM does with the archive of its configuration."""

    archive: Path  # the configuration's archive
    part: Path | None = None  # None: the JVM maps ``archive``; else it writes this at exit
    #: set once the JVM runs (:func:`attach`): how to check and finish the written archive
    java: str | None = None
    check_args: list[str] = field(default_factory=list)
    proc: Any = None  # the JVM's process (pyspark's launcher ``Popen``)
    done: bool = False

    @property
    def state(self) -> str:
        return "used" if self.part is None else "dumped"

    def java_option(self) -> str:
        if self.part is None:
            return f"-XX:SharedArchiveFile={self.archive}"
        # (without its warnings about the classes it leaves out: signed jars, old class
        # files, generated classes — on the console of the job's first run, noise)
        return f"-XX:ArchiveClassesAtExit={self.part} -Xlog:cds*=off"


def cache_dir(env: dict[str, str] | None = None) -> Path | None:
    """The directory archives go to; None when switched off. Raises ClassArchiveError naming a
    value that is neither ``auto``, ``off`` nor an absolute directory path (checked before a
    JVM starts)."""
    env = dict(os.environ) if env is None else env
    value = env.get(ENV, "auto").strip() or "auto"
    if value.lower() == "off":
        return None
    if value.lower() == "auto":
        base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
        return Path(base) / "tracemq-spark"
    path = Path(value)
    if not path.is_absolute():
        raise ClassArchiveError(
            f"{ENV}={value!r}: expected auto, off or an absolute directory path"
        )
    if path.exists() and not path.is_dir():
        raise ClassArchiveError(f"{ENV}={value!r}: not a directory")
    return path


def _java(env: dict[str, str]) -> Path | None:
    """The java binary Spark's launcher runs (``$JAVA_HOME/bin/java``, else ``java`` on PATH)."""
    home = env.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH"))
    if not found or not os.path.isfile(found):
        return None
    return Path(os.path.realpath(found))


def _stat(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:-"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def config_key(driver_opts: str, class_path: list[str], env: dict[str, str]) -> str | None:
    """The configuration's name: a hash of the Java build (its libjvm), the Spark jars (names,
    sizes, times), the extra class path entries and the JVM flags that matter. None when the
    java binary cannot be found."""
    java = _java(env)
    if java is None:
        return None
    home = java.parent.parent
    parts = [_stat(java), _stat(home / "lib" / "server" / "libjvm.so")]
    try:
        from pyspark.find_spark_home import _find_spark_home

        jars = Path(_find_spark_home()) / "jars"
        parts += sorted(_stat(p) for p in jars.iterdir())
    except Exception:  # no Spark home found: the launcher will fail on its own
        return None
    parts += [_stat(Path(p)) for p in class_path]
    parts += [o for o in driver_opts.split() if not _NOT_KEYED.match(o)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def plan(driver_opts: str, class_path: list[str], env: dict[str, str] | None = None) -> Plan | None:
    """The archive plan of a JVM about to start with ``driver_opts`` and the extra
    ``class_path`` entries; None when off, when the options decide on sharing themselves, or
    when the configuration cannot be named. Removes stale ``.part`` files on the way."""
    env = dict(os.environ) if env is None else env
    directory = cache_dir(env)
    if directory is None or _OWN.search(driver_opts):
        return None
    key = config_key(driver_opts, class_path, env)
    if key is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("class archive directory unusable; running without", dir=str(directory),
                    error=str(exc))  # fmt: skip
        return None
    _remove_stale_parts(directory)
    archive = directory / f"{_PREFIX}{key}.jsa"
    if archive.is_file():
        # (its time is its last use: pruning keeps the archives in use, not the last made —
        # several checkouts or Java builds on one machine each keep theirs)
        with contextlib.suppress(OSError):
            os.utime(archive)
        return Plan(archive)
    if not os.access(directory, os.W_OK | os.X_OK):
        # (a JVM told to write there would fail at exit, and every run would pay for trying)
        log.warning("class archive directory not writable; running without", dir=str(directory))
        return None
    return Plan(archive, part=directory / f"{_PREFIX}{key}.{os.getpid()}.{time.time_ns()}.part")


def _remove_stale_parts(directory: Path) -> None:
    now = time.time()
    for p in directory.glob(f"{_PREFIX}*.part"):
        try:
            pid = int(p.name.split(".")[1])
        except (IndexError, ValueError):
            pid = -1
        try:
            age = now - p.stat().st_mtime
        except OSError:
            continue
        if _alive(pid) and age < 24 * 3600:
            continue
        if age >= STALE_PART_S:
            with contextlib.suppress(OSError):
                p.unlink()


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def attach(p: Plan, spark: Any) -> None:
    """Note how the running JVM was started (java, flags, class path: what the check of its
    archive needs) and finish the archive at the interpreter's exit unless :func:`finish` ran
    before."""
    if p.part is None:
        return
    jvm = spark.sparkContext._jvm
    p.java = str(Path(str(jvm.System.getProperty("java.home"))) / "bin" / "java")
    args = [str(a) for a in jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
            .getInputArguments()]  # fmt: skip
    p.check_args = [
        a for a in args if not a.startswith("-XX:ArchiveClassesAtExit") and not a.startswith("-Xms")
    ] + ["-cp", str(jvm.System.getProperty("java.class.path"))]
    p.proc = getattr(spark.sparkContext._gateway, "proc", None)
    atexit.register(finish, p)


def finish(p: Plan) -> bool:
    """After the session stopped: let its JVM go (the gateway shut down, its stdin closed),
    wait for it to write the archive and exit, check the archive and move it into place.
    True when an archive was added. Never raises; a failure is logged and the part removed."""
    if p.done or p.part is None:
        return False
    p.done = True
    try:
        _let_jvm_go(p)
        if not p.part.is_file():
            log.warning("the JVM wrote no class archive", part=str(p.part))
            return False
        if not check(p.part, p.java, p.check_args):
            log.warning("class archive failed its check; removed", part=str(p.part))
            return False
        os.replace(p.part, p.archive)
        _prune(p.archive.parent, keep=p.archive)
        return True
    except Exception as exc:  # the job's result stands; the next run tries again
        log.warning("class archive not kept", error=repr(exc))
        return False
    finally:
        with contextlib.suppress(OSError):
            p.part.unlink()


def _let_jvm_go(p: Plan) -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway  # type: ignore[attr-defined]
    if gateway is not None and getattr(gateway, "proc", None) is p.proc:
        with contextlib.suppress(Exception):
            gateway.shutdown()
        SparkContext._gateway = None  # type: ignore[attr-defined]
        SparkContext._jvm = None  # type: ignore[attr-defined]
    proc = p.proc
    if proc is None:
        raise RuntimeError("the JVM's process is unknown")
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the gateway exits on EOF: the archive is written then
    proc.wait(timeout=EXIT_WAIT_S)


def check(archive: Path, java: str | None, args: list[str]) -> bool:
    """Whether a JVM of that java, flags and class path maps ``archive`` with every region's
    checksum right (a separate process: a damaged archive crashes the JVM that maps it)."""
    if java is None:
        return False
    with tempfile.TemporaryDirectory(prefix="tracemq-cds-check-") as tmp:
        # (a crash's report goes to this directory, not the caller's working directory)
        cmd = [java, *args, f"-XX:SharedArchiveFile={archive}", "-Xshare:on",
               "-XX:+VerifySharedSpaces", f"-XX:ErrorFile={tmp}/hs_err.log",
               "-XX:-CreateCoredumpOnCrash", "-version"]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=60, check=False, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0


def _prune(directory: Path, keep: Path) -> None:
    """The :data:`KEEP` archives used last stay (``keep`` always)."""
    archives = sorted(
        directory.glob(f"{_PREFIX}*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in [a for a in archives if a != keep][KEEP - 1 :]:
        with contextlib.suppress(OSError):
            old.unlink()

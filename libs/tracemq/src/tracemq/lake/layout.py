"""Where the trace lake's files are, what they are called and which of them are live. Pure Python.

Layout (Hive-partitioned by the event's UTC date and hour)::

    <root>/date=YYYY-MM-DD/hour=HH/part-<trace topic>-<partition:05d>-<start:020d>-<end:020d>.parquet
    <root>/date=YYYY-MM-DD/hour=HH/compacted-<trace topic>-<partition:05d>-<min start:020d>-<max end:020d>-<parts:05d>.parquet

A ``part-`` file holds the events of the trace offsets ``[start, end)`` of one trace partition
that fall in its hour; a ``compacted-`` file merges files of one trace partition in one hour and
names them in its footer (:data:`tracemq.lake.schema.COMPACTED_FROM_KEY`). Names are a function
of the partition and the offset range only, so any number of collectors can write one lake (a
directory or a bucket) without two ever choosing one name for different rows. Lakes written
before compaction was per partition also hold ``compacted-<start>-<end>-<parts>.parquet`` files
(no topic, no partition): they are still read, and only the footer rule applies to them. The
collector
(``tracemq_collector.lake``) writes and compacts only files of these two names; writers put
their temporary files under names starting with :data:`TMP_PREFIX`.

Readers (the Spark job, ``tracemq_spark.lake_scan``) read every file of an hour directory that
is not hidden (:func:`is_hidden`: Hadoop's and Spark's rule, which the temporary files rely on),
minus the superseded ones. **The compaction rule** (:func:`live_files`), in one directory:

1. a file named in the ``compacted_from`` list of another file is superseded;
2. a file of a trace partition whose offset range lies inside the range of another
   ``compacted-`` file of the same partition is superseded, unless that file's range is the
   same and it does not rank above (ties: a ``compacted-`` file above a ``part-`` file, then more
   parts, then the larger name).

Rule 2 is what makes compaction safe when a partition changes owner while its old owner is
still compacting: two owners that listed different sets of files write two compacted files of
one partition, and the one with the smaller range holds no row the larger lacks (a compacted
file is written only from files that together cover its whole range: see
``tracemq_collector.lake``). The collector applies the same function to its own files, so the
two cannot disagree on which rows a lake holds.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import NamedTuple

HOUR_MS = 3_600_000
#: Row order inside every lake file: by msgId, so each row group's msgId min/max statistics
#: cover a narrow range — a look-up by msgId reads one row group of a file, or none
#: (``tracemq_collector.lake_lookup``), and the reconciliation job reads a msgId range of a
#: file without the rest (``io.tracemq.spark.Ranges``); then by coordinates, so the order is
#: total. The collector writes so, and the devkit's generator as it does.
FILE_SORT_KEYS = ("msg_id", "trace_offset", "trace_index")
#: Rows per row group: a look-up reads one group whole. Measured (bench/lake_lookup.py, 400k
#: events): 16 384 rows → 535 kB and ~15 ms per hit; 8192 → 262 kB, ~13 ms, same file size;
#: 4096 → 134 kB, ~9 ms, files 2 % larger and footers twice as long. 8192: no size cost.
ROW_GROUP_ROWS = 8192
#: Prefix of a writer's temporary files (hidden: see :func:`is_hidden`).
TMP_PREFIX = ".tmp-"

# DOTALL: any trace topic the collector accepts reads back (part_name's inverse).
_PART = re.compile(
    r"part-(?P<topic>.+)-(?P<partition>\d{5})-(?P<start>\d{20})-(?P<end>\d{20})\.parquet",
    re.DOTALL,
)
_COMPACTED = re.compile(
    r"compacted-(?P<topic>.+)-(?P<partition>\d{5})-(?P<start>\d{20})-(?P<end>\d{20})"
    r"-(?P<parts>\d{5,})\.parquet",
    re.DOTALL,
)
# before compaction was per trace partition (read, never written)
_COMPACTED_LEGACY = re.compile(
    r"compacted-(?P<start>\d{20})-(?P<end>\d{20})-(?P<parts>\d{5,})\.parquet"
)
_DATE_DIR = re.compile(r"date=(\d{4})-(\d{2})-(\d{2})")
_HOUR_DIR = re.compile(r"hour=(\d{2})")
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


# ------------------------------------------------------------------------ directories


@lru_cache(maxsize=4096)
def partition_of_hour(hour_number: int) -> tuple[str, int]:
    """The UTC ``(date, hour)`` partition of the ``hour_number``-th hour since the epoch."""
    # Events arrive clustered in a few hours, so a small cache saves a date computation per row.
    day, hour = divmod(hour_number, 24)
    return _dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat(), hour


def date_dir(date: str) -> str:
    """The directory name of a ``YYYY-MM-DD`` date."""
    return f"date={date}"


def hour_dir(date: str, hour: int) -> str:
    """The path of an hour partition below the lake root: ``date=YYYY-MM-DD/hour=HH``."""
    return f"date={date}/hour={hour:02d}"


def parse_date_dir(name: str) -> str | None:
    """The ``YYYY-MM-DD`` a ``date=`` directory name states (None: not such a name)."""
    match = _DATE_DIR.fullmatch(name)
    return None if match is None else name[5:]


def parse_hour_dir(name: str) -> int | None:
    """The hour an ``hour=HH`` directory name states (None: not such a name)."""
    match = _HOUR_DIR.fullmatch(name)
    return None if match is None else int(match.group(1))


def hour_start_ms(date_name: str, hour_name: str) -> int | None:
    """Epoch ms at which the partition ``date=…/hour=…`` starts (None: not lake names)."""
    date = _DATE_DIR.fullmatch(date_name)
    hour = parse_hour_dir(hour_name)
    if date is None or hour is None:
        return None
    year, month, day = (int(g) for g in date.groups())
    try:
        day_start = calendar.timegm((year, month, day, 0, 0, 0))
    except ValueError:
        return None
    return day_start * 1000 + hour * HOUR_MS


def hours_overlapping(lo_ms: int, hi_ms: int) -> dict[str, set[int]]:
    """The hour partitions that hold events of ``[lo_ms, hi_ms)``: date → hours (empty range:
    none)."""
    wanted: dict[str, set[int]] = {}
    for hour_number in range(lo_ms // HOUR_MS, (hi_ms - 1) // HOUR_MS + 1):
        date, hour = partition_of_hour(hour_number)
        wanted.setdefault(date, set()).add(hour)
    return wanted


# ------------------------------------------------------------------------ file names


class LakeFileName(NamedTuple):
    """What a collector file's name states: the trace offsets ``[start, end)`` of one trace
    partition it covers and how many ``part-`` files it stands for (``topic``/``partition`` are
    None for a legacy ``compacted-`` name only)."""

    compacted: bool
    topic: str | None
    partition: int | None
    start: int
    end: int
    parts: int


def check_trace_topic(trace_topic: str) -> None:
    """Raise ValueError unless ``trace_topic`` can be part of a file name (:func:`part_name`)."""
    if not trace_topic or "/" in trace_topic or "\x00" in trace_topic or trace_topic[0] == ".":
        raise ValueError(f"trace topic {trace_topic!r} cannot name a lake file")


def part_name(trace_topic: str, partition: int, start: int, end: int) -> str:
    """The ``part-`` file of the trace offsets ``[start, end)`` of one trace partition: the same
    range always gets the same name, so a rewrite replaces it. The topic must pass
    :func:`check_trace_topic`."""
    return f"part-{trace_topic}-{partition:05d}-{start:020d}-{end:020d}.parquet"


def compacted_name(trace_topic: str, partition: int, start: int, end: int, parts: int) -> str:
    """The ``compacted-`` file merging ``parts`` original ``part-`` files of the trace offsets
    ``[start, end)`` of one trace partition (in one hour). The topic must pass
    :func:`check_trace_topic`."""
    return f"compacted-{trace_topic}-{partition:05d}-{start:020d}-{end:020d}-{parts:05d}.parquet"


def parse_file_name(name: str) -> LakeFileName | None:
    """What a ``part-`` or ``compacted-`` name states; None for any other name."""
    part = _PART.fullmatch(name)
    if part is not None:
        return LakeFileName(
            False, part["topic"], int(part["partition"]), int(part["start"]), int(part["end"]), 1
        )
    legacy = _COMPACTED_LEGACY.fullmatch(name)
    if legacy is not None:
        return LakeFileName(
            True, None, None, int(legacy["start"]), int(legacy["end"]), int(legacy["parts"])
        )
    compacted = _COMPACTED.fullmatch(name)
    if compacted is not None:
        return LakeFileName(
            True,
            compacted["topic"],
            int(compacted["partition"]),
            int(compacted["start"]),
            int(compacted["end"]),
            int(compacted["parts"]),
        )
    return None


def is_hidden(name: str) -> bool:
    """Whether readers skip a file of a lake directory whatever it holds: names starting with
    ``.`` or ``_`` (temporary files, ``_SUCCESS``) and Hadoop checksum files."""
    return name.startswith((".", "_")) or name.endswith(".crc")


# ------------------------------------------------------------------------ the compaction rule


def live_files(files: Mapping[str, Iterable[str]]) -> tuple[list[str], list[str]]:
    """The compaction rule (see the module docstring): ``(live, superseded)`` of ``files``, each
    in the given order.

    Args:
        files: ``/``-separated path → the names its ``compacted_from`` footer lists (empty for
            a file that is not a compacted one). Paths of several directories may be mixed: a
            name or a range supersedes only files of the same directory, never the file
            listing it.
    """
    superseded: set[str] = set()
    # (directory, topic, partition) → its files, and the compacted ones among them
    groups: dict[tuple[str, str, int], list[tuple[str, LakeFileName]]] = {}
    covers: dict[tuple[str, str, int], list[tuple[str, LakeFileName]]] = {}
    for path, names in files.items():
        parent, sep, own = path.rpartition("/")
        superseded.update(parent + sep + name for name in names if name != own)
        parsed = parse_file_name(own)
        if parsed is not None and parsed.topic is not None and parsed.partition is not None:
            key = (parent, parsed.topic, parsed.partition)
            groups.setdefault(key, []).append((path, parsed))
            if parsed.compacted:
                covers.setdefault(key, []).append((path, parsed))
    for key, compacted in covers.items():
        for path, y in groups[key]:
            if any(
                x.start <= y.start and y.end <= x.end and _rank(other, x) > _rank(path, y)
                for other, x in compacted
            ):
                superseded.add(path)
    live = [p for p in files if p not in superseded]
    return live, [p for p in files if p in superseded]


def _rank(path: str, parsed: LakeFileName) -> tuple[int, bool, int, str]:
    # A strict order among the files of one partition: with containment it decides which of
    # two files covering the same rows is read, and never lets two supersede each other.
    return (parsed.end - parsed.start, parsed.compacted, parsed.parts, path)

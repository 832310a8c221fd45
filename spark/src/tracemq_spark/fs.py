"""File-system operations on any Hadoop-supported URI (``file:``, ``hdfs:``, ``s3a:``, …),
through the JVM of the Spark session, so the job works the same locally and on a cluster."""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tracemq import lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class Footer(NamedTuple):
    """A Parquet file's footer, as :meth:`HadoopFS.parquet_footers` reads it."""

    kv: dict[str, str | None]  # the key-value metadata asked for (None: absent)
    rows: int
    ranges: dict[str, tuple[int, int] | None]  # (min, max) by the row groups' statistics


class HadoopFS:
    """A thin wrapper of ``org.apache.hadoop.fs.FileSystem`` for the paths the job touches."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._conf: Any = spark._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
        self._gateway: Any = spark.sparkContext._gateway  # type: ignore[attr-defined]

    def _footers_class(self) -> Any:
        """``io.tracemq.spark.Footers`` when the job's jar is on the class path, else None."""
        from py4j.java_gateway import JavaClass

        try:
            cls = self._jvm.io.tracemq.spark.Footers
        except Exception:  # noqa: BLE001 - py4j raises assorted errors for a missing class
            return None
        return cls if isinstance(cls, JavaClass) else None

    # -- paths ----------------------------------------------------------------------------
    def _path(self, uri: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def qualify(self, uri: str) -> str:
        """The absolute URI (with scheme) of ``uri``; relative paths are local to the CWD."""
        p = self._path(uri)
        return str(self._fs(p).makeQualified(p).toString())

    @staticmethod
    def join(base: str, *parts: str) -> str:
        out = base.rstrip("/")
        for part in parts:
            out = f"{out}/{part.strip('/')}"
        return out

    # -- queries --------------------------------------------------------------------------
    def exists(self, uri: str) -> bool:
        p = self._path(uri)
        return bool(self._fs(p).exists(p))

    def is_dir(self, uri: str) -> bool:
        p = self._path(uri)
        fs = self._fs(p)
        return bool(fs.exists(p) and fs.getFileStatus(p).isDirectory())

    def list(self, uri: str) -> list[tuple[str, bool, int]]:
        """Entries of a directory: (name, is_dir, length); [] if it does not exist."""
        p = self._path(uri)
        fs = self._fs(p)
        if not fs.exists(p):
            return []
        return [
            (str(s.getPath().getName()), bool(s.isDirectory()), int(s.getLen()))
            for s in fs.listStatus(p)
        ]

    def data_files(self, uri: str) -> list[str]:
        """Files directly in a directory that a reader reads (:func:`tracemq.lake.is_hidden`
        ones skipped)."""
        return [
            self.join(uri, name)
            for name, is_dir, _ in self.list(uri)
            if not is_dir and not lake.is_hidden(name)
        ]

    # -- changes --------------------------------------------------------------------------
    def mkdirs(self, uri: str) -> None:
        p = self._path(uri)
        if not self._fs(p).mkdirs(p):
            raise OSError(f"cannot create directory {uri}")

    def delete(self, uri: str) -> None:
        p = self._path(uri)
        fs = self._fs(p)
        if fs.exists(p):
            fs.delete(p, True)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (the parent of ``dst`` is created); raise if it fails."""
        s, d = self._path(src), self._path(dst)
        fs = self._fs(s)
        parent = d.getParent()
        if parent is not None and not fs.exists(parent):
            fs.mkdirs(parent)
        if not fs.rename(s, d):
            raise OSError(f"cannot move {src} to {dst}")

    def delete_if_empty(self, uri: str) -> None:
        p = self._path(uri)
        fs = self._fs(p)
        if fs.exists(p) and fs.getFileStatus(p).isDirectory() and not list(fs.listStatus(p)):
            fs.delete(p, False)

    # Contents never cross py4j: it moves a byte[] base64-encoded, which took minutes for the
    # offsets snapshot (650 MB at 10M messages). They go through a local temporary file that
    # the JVM copies (so every scheme, and Hadoop's checksum files, behave as before).
    def write_bytes(self, uri: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix="tracemq-spark-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.copy_from_local(tmp, uri)
        finally:
            os.unlink(tmp)

    def copy_from_local(self, local_path: str, uri: str) -> None:
        """Copy a driver-local file to ``uri`` (replaced if it exists)."""
        p = self._path(uri)
        out = self._fs(p).create(p, True)
        try:
            stream = self._jvm.java.io.FileInputStream(str(Path(local_path).resolve()))
            try:
                self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 65536, False)
            finally:
                stream.close()
        finally:
            out.close()

    def write_text(self, uri: str, text: str) -> None:
        self.write_bytes(uri, text.encode("utf-8"))

    def read_bytes(self, uri: str) -> bytes:
        p = self._path(uri)
        fs = self._fs(p)
        if str(fs.getScheme()) == "file":
            with open(str(fs.pathToFile(p)), "rb") as f:  # the driver's own disk
                return f.read()
        with tempfile.TemporaryDirectory(prefix="tracemq-spark-") as tmp:
            local = Path(tmp) / "copy"
            fs.copyToLocalFile(False, p, self._path(local.as_uri()), True)
            return local.read_bytes()

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def copy(self, src: str, dst: str) -> None:
        """Copy a file (``dst`` replaced), inside the JVM."""
        s, d = self._path(src), self._path(dst)
        util = self._jvm.org.apache.hadoop.fs.FileUtil
        if not util.copy(self._fs(s), s, self._fs(d), d, False, True, self._conf):
            raise OSError(f"cannot copy {src} to {dst}")

    # -- Parquet footers ------------------------------------------------------------------
    def parquet_footers(
        self,
        files: list[str],
        keys: tuple[str, ...],
        ranged: tuple[str, ...] = (),
        threads: int = 8,
    ) -> dict[str, Footer]:
        """What each file's footer says: its key-value metadata ``keys`` (None when absent),
        its row count and, for each column of ``ranged`` (top-level, integer), the range of
        its values by the row groups' statistics (None when a row group has none).

        Raises the JVM's error for a file that is not Parquet (bad magic, cut footer).
        """
        reader_cls = self._jvm.org.apache.parquet.hadoop.ParquetFileReader
        input_file = self._jvm.org.apache.parquet.hadoop.util.HadoopInputFile
        compiled = self._footers_class()
        if compiled is not None:  # (the jar's: one py4j call per file, not per row group)

            def strings(values: tuple[str, ...]) -> Any:
                arr = self._gateway.new_array(self._jvm.String, len(values))
                for i, v in enumerate(values):
                    arr[i] = v
                return arr

            jkeys, jranged = strings(keys), strings(ranged)

            def one_compiled(uri: str) -> tuple[str, Footer]:
                doc = json.loads(compiled.read(uri, self._conf, jkeys, jranged))
                ranges = {
                    c: None if v is None else (int(v[0]), int(v[1]))
                    for c, v in doc["ranges"].items()
                }
                return uri, Footer(dict(doc["kv"]), int(doc["rows"]), ranges)

            if len(files) <= 1:
                return dict(one_compiled(f) for f in files)
            with ThreadPoolExecutor(max_workers=threads) as pool:
                return dict(pool.map(one_compiled, files))

        def one(uri: str) -> tuple[str, Footer]:
            reader = reader_cls.open(input_file.fromPath(self._path(uri), self._conf))
            try:
                footer = reader.getFooter()
                meta = footer.getFileMetaData()
                kv = meta.getKeyValueMetaData()
                values = {k: kv.get(k) for k in keys}
                schema = meta.getSchema()
                index = {c: schema.getFieldIndex(c) for c in ranged if schema.containsField(c)}
                ranges: dict[str, tuple[int, int] | None] = {c: None for c in ranged}
                spans: dict[str, list[int]] = {}
                complete = {c: c in index for c in ranged}
                rows = 0
                for block in footer.getBlocks():
                    n = int(block.getRowCount())
                    rows += n
                    if not n:
                        continue
                    columns = block.getColumns()
                    for c, i in index.items():
                        if not complete[c]:
                            continue
                        st = columns.get(i).getStatistics()
                        if st is None or st.isEmpty() or not st.hasNonNullValue():
                            complete[c] = False
                            continue
                        lo, hi = int(st.genericGetMin()), int(st.genericGetMax())
                        span = spans.setdefault(c, [lo, hi])
                        span[0], span[1] = min(span[0], lo), max(span[1], hi)
                for c in ranged:
                    if complete[c] and c in spans:
                        ranges[c] = (spans[c][0], spans[c][1])
                kvs = {k: None if v is None else str(v) for k, v in values.items()}
                return uri, Footer(kvs, rows, ranges)
            finally:
                reader.close()

        if len(files) <= 1:
            return dict(one(f) for f in files)
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return dict(pool.map(one, files))

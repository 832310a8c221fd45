"""The offsets snapshot read by the JVM (:mod:`tracemq_spark.snapshot`) against the Python
parser of :mod:`tracemq_spark.input_files`, the reference: the same committed offsets, copies'
count and last deliveries on the exporter's documents; anything else is left to the Python
parser (whose errors name the row)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tracemq_spark import classify, cogroup, snapshot
from tracemq_spark.fs import HadoopFS
from tracemq_spark.input_files import last_deliveries, parse_copies, parse_offsets

A, B = "10.0.0.1:10911", "10.0.0.2:10911"


def _document(seed: int, n: int) -> dict[str, Any]:
    rnd = random.Random(seed)
    groups = ["G1", "G2", "Gb"]
    offsets: list[dict[str, Any]] = [
        {
            "group": g,
            "topic": topic,
            "broker": "broker-a",
            "store_addr": store,
            "queue_id": q,
            "committed": rnd.choice([None, rnd.randrange(0, 400)]),
            "client_host": rnd.choice([None, "", "10.1.1.1"]) if g == "Gb" else None,
        }
        for g in groups
        for topic in ("TopicA", f"%RETRY%{g}", f"%DLQ%{g}")
        for store in (A, B)
        for q in range(2)
    ]
    offsets.append(dict(offsets[1], committed=10_000))  # a key twice: the highest offset
    offsets.append({"group": "G1", "topic": "TopicA", "committed": None})  # no offset: skipped
    copies: list[dict[str, Any]] = []
    for i in range(n):
        g = rnd.choice(groups)
        dlq = rnd.random() < 0.2
        row: dict[str, Any] = {
            "group": rnd.choice([g, g, None, ""]),
            "topic": f"%DLQ%{g}" if dlq else f"%RETRY%{g}",
            "broker": "broker-a",
            "store_addr": rnd.choice([A, B]),
            "queue_id": rnd.randrange(2),
            "queue_offset": i,  # unique: no ties between two copies of one message
            "msg_id": rnd.choice([f"M{rnd.randrange(n // 4)}", f"M{rnd.randrange(n // 4)}", ""]),
            "reconsume_times": rnd.choice([None, 0, 1, 2, 3, 16]),
        }
        if rnd.random() < 0.1:
            del row["reconsume_times"]
        if rnd.random() < 0.05:
            row["msg_id"] = None
        copies.append(row)
        if rnd.random() < 0.1:
            copies.append(dict(row))  # read twice: one copy
    return {"taken_at": 1, "offsets": offsets, "copies": copies}


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_jvm_reads_what_python_parses(spark: Any, tmp_path: Path, seed: int) -> None:
    assert cogroup.available(spark)
    doc = _document(seed, 3000)
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps(doc, indent=1))
    snap, why = snapshot.read(spark, str(path))
    assert snap is not None, why
    text = path.read_text()
    offsets = parse_offsets(text)
    copies = parse_copies(text)
    assert snap.offsets == offsets
    assert snap.n_copies == len(copies)
    ref = last_deliveries(copies, offsets)
    assert len(snap) == len(ref)
    fs = HadoopFS(spark)
    py = classify.deliveries_frame(spark, fs, str(tmp_path / "py"), ref)
    jv = snap.frame(str(tmp_path / "jvm"))
    assert py is not None and jv is not None
    assert jv.schema == py.schema
    assert _rows(jv) == _rows(py)
    # written once: the JVM has let go of them
    again = snap.frame(str(tmp_path / "jvm"))
    assert again is not None and _rows(again) == _rows(py)
    with pytest.raises(RuntimeError, match="staged already"):
        snap.frame(str(tmp_path / "elsewhere"))
    with pytest.raises(RuntimeError, match="staged already"):
        snap.split(["M1"])
    # split by msgId range for the co-group instead (the job's way with sorted lake files):
    # each range's rows as the Python rows' side split by the same bounds gives them; none
    # for other bounds; once
    snap, why = snapshot.read(spark, str(path))
    assert snap is not None, why
    bounds = ["M1", "M3", "M5"]
    snap.split(bounds)
    assert snap.ranges(["M2"]) is None
    got = cogroup.RangeSplit(None, snap.ranges(bounds), len(bounds) + 1)
    want = cogroup.RangeSplit(
        None,
        cogroup.ranges(spark, cogroup.split(spark, classify.delivery_side(py), bounds)),
        len(bounds) + 1,
    )
    per_range = [_rows(got.frame(spark, i)) for i in range(got.n)]
    assert per_range == [_rows(want.frame(spark, i)) for i in range(want.n)]
    assert sum(map(len, per_range)) == sum(1 for r in ref if r[0] is not None)
    assert all(per_range), per_range
    with pytest.raises(RuntimeError, match="staged already"):
        snap.frame(str(tmp_path / "jvm2"))


def test_without_copies_or_deliveries(spark: Any, tmp_path: Path) -> None:
    doc = {
        "offsets": [{"group": "G", "topic": "T", "store_addr": A, "queue_id": 0, "committed": 3}]
    }
    for d in (doc, {**doc, "copies": None}, {**doc, "copies": []}):
        path = tmp_path / "offsets.json"
        path.write_text(json.dumps(d))
        snap, why = snapshot.read(spark, str(path))
        assert snap is not None, why
        assert snap.offsets == parse_offsets(path.read_text())
        assert (snap.n_copies, len(snap)) == (0, 0)
        assert snap.frame(str(tmp_path / "d")) is None


_OFF = {"group": "G", "topic": "T", "store_addr": A, "queue_id": 0, "committed": 3}
_COPY = {
    "group": "G",
    "topic": "%RETRY%G",
    "store_addr": A,
    "queue_id": 0,
    "queue_offset": 1,
    "msg_id": "M",
    "reconsume_times": 1,
}


@pytest.mark.parametrize(
    "doc",
    [
        [_OFF],  # a bare list: Python takes it
        {"copies": []},  # no offsets: Python's error
        {"offsets": [{**_OFF, "group": 5}]},  # Python's str() takes it
        {"offsets": [{**_OFF, "queue_id": 1.0}]},
        {"offsets": [{**_OFF, "committed": 2**70}]},
        {"offsets": [{**_OFF, "queue_id": 2**40}]},
        {"offsets": [_OFF], "copies": [{**_COPY, "topic": "TopicA"}]},  # Python's error
        {"offsets": [_OFF], "copies": [{**_COPY, "queue_offset": "x"}]},
        {"offsets": [_OFF], "copies": [{**_COPY, "reconsume_times": True}]},
        {"offsets": [_OFF], "copies": [{**_COPY, "msg_id": 7}]},
        {"offsets": [_OFF], "copies": [7]},
    ],
)
def test_anything_else_is_left_to_python(spark: Any, tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "offsets.json"
    path.write_text(json.dumps(doc))
    snap, why = snapshot.read(spark, str(path))
    assert snap is None and why


def test_not_json_is_left_to_python(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    path.write_text('{"offsets": [')
    assert snapshot.read(spark, str(path))[0] is None
    assert snapshot.read(spark, str(tmp_path / "missing.json"))[0] is None

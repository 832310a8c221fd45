"""Where the collector's lake is: ``TRACEMQ_COLLECTOR_LAKE_URI`` (a directory, ``file://`` or
``s3://``) and its S3 settings; bad values are one clear error naming what is wrong."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs
import pytest
from tracemq.errors import ConfigError
from tracemq.settings import load_settings
from tracemq_collector.lake import lake_filesystem
from tracemq_collector.settings import CollectorSettings


def test_a_path_or_file_uri_is_a_local_lake() -> None:
    assert lake_filesystem("/srv/lake") == (None, Path("/srv/lake"))
    assert lake_filesystem("file:///srv/lake") == (None, Path("/srv/lake"))
    assert lake_filesystem("relative/lake") == (None, Path("relative/lake"))


def test_an_s3_uri_opens_the_bucket_with_its_settings() -> None:
    filesystem, root = lake_filesystem(
        "s3://traces/lake/prod/",
        s3_endpoint="http://127.0.0.1:8333",
        s3_region="eu-west-1",
        s3_access_key="a",
        s3_secret_key="s",
    )
    assert isinstance(filesystem, pafs.S3FileSystem)
    assert filesystem.region == "eu-west-1"
    assert root == PurePosixPath("traces/lake/prod")


@pytest.mark.parametrize(
    ("uri", "kw", "message"),
    [
        ("ftp://host/lake", {}, "scheme must be file:// or s3://"),
        ("s3:///lake", {}, "names no bucket"),
        ("file://host/lake", {}, "names no host"),
        ("s3://b/p", {"s3_access_key": "a"}, "TRACEMQ_COLLECTOR_LAKE_S3_SECRET_KEY"),
        ("s3://b/p", {"s3_endpoint": "127.0.0.1:8333"}, "expected http(s)://host"),
    ],
)
def test_a_bad_location_is_named(uri: str, kw: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lake_filesystem(uri, **kw)


def test_the_settings_default_to_the_data_dir_and_name_a_bad_uri(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRACEMQ_COLLECTOR_DATA_DIR", str(tmp_path))
    assert load_settings(CollectorSettings).lake_uri() == str(tmp_path / "lake")
    monkeypatch.setenv("TRACEMQ_COLLECTOR_LAKE_URI", "s3://bucket/lake")
    assert load_settings(CollectorSettings).lake_uri() == "s3://bucket/lake"
    for bad, variable in (
        ("gs://bucket/lake", "TRACEMQ_COLLECTOR_LAKE_URI"),
        ("s3:///lake", "TRACEMQ_COLLECTOR_LAKE_URI"),
    ):
        monkeypatch.setenv("TRACEMQ_COLLECTOR_LAKE_URI", bad)
        with pytest.raises(ConfigError, match=variable):
            load_settings(CollectorSettings)
    monkeypatch.setenv("TRACEMQ_COLLECTOR_LAKE_URI", "s3://bucket/lake")
    monkeypatch.setenv("TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT", "seaweed:8333")
    with pytest.raises(ConfigError, match="TRACEMQ_COLLECTOR_LAKE_S3_ENDPOINT"):
        load_settings(CollectorSettings)

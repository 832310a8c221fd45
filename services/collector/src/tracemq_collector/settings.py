"""Collector settings (environment variables ``TRACEMQ_*``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode
from tracemq.naming import TRACE_TOPIC, validate_topic
from tracemq.offset_reset import OffsetResetPolicy
from tracemq.settings import CommonSettings

_PATTERN_CHARS = re.compile(r"[A-Za-z0-9%|_\-*?\[\]!]")


def is_topic_pattern(entry: str) -> bool:
    """True if a ``collector_trace_topics`` entry is a glob pattern (topic names have no
    ``*``, ``?`` or ``[``)."""
    return any(c in entry for c in "*?[")


class CollectorSettings(CommonSettings):
    collector_data_dir: Path = Field(
        Path("./data/collector"), description="Trace store (traces.db) and lake (lake/)."
    )
    collector_lake_uri: str | None = Field(
        None,
        description="Where the trace lake is written: a directory (path or file:///path) or "
        "s3://bucket/prefix (any S3-compatible store; see the TRACEMQ_COLLECTOR_LAKE_S3_* "
        "settings). Any number of collectors may share one. Default: lake/ in the data dir.",
    )
    collector_lake_s3_endpoint: str | None = Field(
        None, description="S3 endpoint URL (http(s)://host:port) of an S3-compatible store."
    )
    collector_lake_s3_region: str | None = Field(None, description="S3 region of the bucket.")
    collector_lake_s3_access_key: str | None = Field(
        None, description="S3 access key (unset: the AWS SDK's default credential chain)."
    )
    collector_lake_s3_secret_key: str | None = Field(None, description="S3 secret key.")
    collector_lake_s3_virtual_addressing: bool = Field(
        False, description="Virtual-host-style S3 requests (default path-style)."
    )
    collector_lake_lookup: bool = Field(
        True,
        description="Look-ups the live stores miss (by msgId, key, topic and time) are answered "
        "from the lake.",
    )
    collector_lake_lookup_hours: int = Field(
        24,
        ge=1,
        le=31 * 24,
        description="Hours after a msgId's creation its events are looked for in the lake "
        "(consume events come later: retries, lagging groups; RocketMQ's 16 retries span "
        "about 4 h 46 min).",
    )
    collector_lake_search_hours: int = Field(
        24,
        ge=1,
        le=31 * 24,
        description="Hours of the lake a key or topic search reads at most (the newest of the "
        "asked range).",
    )
    collector_lake_readers: int = Field(
        4, ge=1, le=64, description="Lake look-ups that run at once (threads); more wait."
    )
    collector_backfill: bool = Field(
        True,
        description="A trace partition this collector takes over (or owns on an empty disk) is "
        "backfilled into its store from the lake, within retention, in the background.",
    )
    collector_group: str = Field(
        "tracemq-collector", description="Kafka consumer group shared by all collectors."
    )
    collector_trace_topics: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [TRACE_TOPIC, "*"],
        description="Trace topics to collect (JSON list or comma-separated): a name is followed "
        "wherever it is routed; a glob pattern (*, ?, [..]) matches the topics that "
        "trace-enabled brokers host, new ones included. Default: RMQ_SYS_TRACE_TOPIC and every "
        "topic of a trace broker; a list narrows it.",
    )
    collector_advertised_url: str | None = Field(
        None, description="URL other collectors use to reach this API (default http host:port)."
    )
    collector_api_token: str | None = Field(
        None, description="Bearer token required by the API and /metrics (not /healthz)."
    )
    collector_retention_days: float = Field(3.0, gt=0, description="Trace store retention.")
    collector_batch_max_records: int = Field(5000, ge=1, description="Records per ingest batch.")
    collector_lake_flush_interval_ms: int = Field(
        5000, ge=100, description="Longest time events wait before they are written to the lake."
    )
    collector_lake_segment_rows: int = Field(
        200_000, ge=1, description="Events that trigger a lake write before the interval."
    )
    collector_compact_after_ms: int = Field(
        3_600_000, ge=0, description="Hours closed this long ago get their small files merged."
    )
    collector_compact_lookback_ms: int = Field(
        7 * 86_400_000,
        ge=3_600_000,
        description="Compaction looks at hours that closed at most this long before its cutoff "
        "(older ones keep the files a very late event adds; each hour looked at costs requests "
        "in an object store).",
    )
    collector_group_sample_interval_s: float = Field(
        60.0,
        ge=0,
        description="Seconds between samples of every consumer group's lag for the hour trend "
        "of `tracemq group status` (0: sample only when a status is asked for).",
    )
    collector_group_max_events: int = Field(
        200_000,
        ge=1,
        description="Consume events one collector reads for a group status (the last hour's).",
    )
    collector_store_page_size: int = Field(
        16384,
        description="SQLite page size of a trace store file the collector creates (an existing "
        "file keeps its own). 16384 (default): ~8 – 13 % less ingest CPU per event than 4096 "
        "at 1 M events, for ~25 % more bytes written to the disk; 4096 where the disk's write "
        "bandwidth is the limit (docs/performance.md, collector ingest, tenth pass).",
    )
    collector_fanout_timeout_ms: int = Field(2000, ge=100, description="Peer query time-out.")
    collector_session_timeout_ms: int = Field(
        10_000, ge=1000, description="Kafka group session timeout."
    )
    collector_offset_reset: OffsetResetPolicy = Field(
        OffsetResetPolicy.EARLIEST,
        description="Where a trace partition resumes when its offset is outside its log "
        "(the cluster lost its data, the topic was recreated, retention passed): earliest "
        "(default: nothing still in the log is skipped) or latest. Counted, never silent.",
    )
    collector_offset_check_interval_ms: int = Field(
        5000, ge=100, description="An idle trace partition's offset is checked against its log."
    )
    collector_arrow_memory_pool: Literal["system", "jemalloc", "mimalloc"] = Field(
        "system",
        description="Allocator of the lake's Arrow buffers. system (default): freed buffers go "
        "back to the OS — peak RSS 30–60 MiB lower at 1 M events than with pyarrow's own "
        "default (mimalloc in its wheels) or jemalloc, which keep freed pages for reuse, for "
        "~0.5 µs more CPU per event (bench/collector_ingest.py). ARROW_DEFAULT_MEMORY_POOL is "
        "not read by the collector.",
    )

    @field_validator("collector_store_page_size")
    @classmethod
    def _page_size(cls, v: int) -> int:
        if v not in (4096, 8192, 16384, 32768, 65536):
            raise ValueError(f"must be 4096, 8192, 16384, 32768 or 65536 (SQLite pages), not {v}")
        return v

    @field_validator("collector_lake_uri")
    @classmethod
    def _lake_uri(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from urllib.parse import urlsplit

        scheme = urlsplit(v).scheme
        if not v.strip() or scheme not in ("", "file", "s3"):
            raise ValueError("expected a directory, file:///path or s3://bucket/prefix")
        if scheme == "s3" and not urlsplit(v).netloc:
            raise ValueError("s3:// needs a bucket: s3://bucket/prefix")
        return v

    @field_validator("collector_lake_s3_endpoint")
    @classmethod
    def _s3_endpoint(cls, v: str | None) -> str | None:
        from urllib.parse import urlsplit

        if v is not None and (
            urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).netloc
        ):
            raise ValueError("expected http(s)://host[:port]")
        return v

    @field_validator("collector_api_token")
    @classmethod
    def _token(cls, v: str | None) -> str | None:
        # an empty token would let "Authorization: Bearer" with nothing after it in
        if v is not None and (not v.strip() or v != v.strip()):
            raise ValueError("empty or padded with spaces: unset it (open API) or set a token")
        return v

    @field_validator("collector_trace_topics", mode="before")
    @classmethod
    def _topics(cls, v: object) -> object:
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [t.strip() for t in text.split(",") if t.strip()]
        return v

    @field_validator("collector_trace_topics")
    @classmethod
    def _valid(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one trace topic is needed")
        for t in v:
            if is_topic_pattern(t):
                bad = sorted({c for c in t if not _PATTERN_CHARS.match(c)})
                if bad:
                    raise ValueError(
                        f"trace topic pattern {t!r} contains illegal characters {''.join(bad)!r}; "
                        "allowed: topic characters and the wildcards * ? [ ] !"
                    )
            else:
                validate_topic(t)
        return v

    def lake_uri(self) -> str:
        """The lake's location: ``collector_lake_uri``, else ``lake/`` in the data dir."""
        return self.collector_lake_uri or str(self.collector_data_dir / "lake")

    def topic_names(self) -> list[str]:
        """The configured trace topics that are names, not patterns."""
        return [t for t in self.collector_trace_topics if not is_topic_pattern(t)]

    def topic_patterns(self) -> list[str]:
        """The configured glob patterns, matched against trace brokers' topics."""
        return [t for t in self.collector_trace_topics if is_topic_pattern(t)]

    @property
    def api_url(self) -> str:
        host = "127.0.0.1" if self.http_host in ("0.0.0.0", "") else self.http_host
        return self.collector_advertised_url or f"http://{host}:{self.http_port}"

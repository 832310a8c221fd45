"""Read a Prometheus counter from a service's /metrics (with the session's collector token:
a collector's /metrics needs it, the other services ignore it)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.support.collector_api import get_text


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = get_text(url, timeout=5)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(url: str, name: str, **labels: str) -> float:
    return scrape(url).get((name, tuple(sorted(labels.items()))), 0.0)

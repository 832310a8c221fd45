"""The README and docs/ keep their promises: every setting of every service is in the
configuration reference, every local link and image resolves, and the README leads a newcomer
through quick start, concepts and operations in that order."""

from __future__ import annotations

import re
from pathlib import Path

from tracemq.kafka_security import KafkaSecuritySettings
from tracemq_broker.settings import BrokerSettings
from tracemq_collector.settings import CollectorSettings
from tracemq_nameserver.settings import NamesrvSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_every_setting_is_documented() -> None:
    missing = [
        f"{prefix}{name.upper()}"
        for cls in (NamesrvSettings, BrokerSettings, CollectorSettings, KafkaSecuritySettings)
        for prefix in [str(cls.model_config.get("env_prefix") or "TRACEMQ_").upper()]
        for name in cls.model_fields
        if f"`{prefix}{name.upper()}`" not in CONFIGURATION
    ]
    assert not missing, f"docs/configuration.md lacks: {missing}"


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README and "make test" in README


def test_readme_order_is_quick_start_concepts_operations() -> None:
    top = re.findall(r"^## (.+)$", README, flags=re.M)
    assert top[:4] == ["Contents", "Quick start", "Concepts", "Operations"], top


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_local_link_and_image_resolves() -> None:
    broken = []
    for path in [ROOT / "README.md", *DOCS]:
        text = path.read_text()
        # links inside code blocks are examples, not links
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_reference_pages_are_linked_from_the_readme() -> None:
    unlinked = [p.name for p in DOCS if f"(docs/{p.name})" not in README]
    assert not unlinked, f"README does not link: {unlinked}"

"""The repository stands alone: README links resolve, every statistic is defined, the licence is declared."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pvf_lmeval.decoding import STAT_KEYS
from pvf_lmeval.decoding.registry import DECODER_NAMES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_readme_links_resolve_inside_the_repository():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert "docs/decoding.md" in local and "docs/design.md" in local and "LICENSE" in local
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which is not in the repository"
    # The design notes outside the repository are not referenced any more.
    assert "SPEC.md" not in README and "DESIGN.md" not in README


def test_docs_links_resolve_inside_the_repository():
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert {"benchmarks.md", "model-card.md"} <= {p.name for p in pages}
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"


def test_readme_statistics_section_names_every_statistic_once():
    section = _section(README, "Statistics")
    named = re.findall(r"`([a-z_]+)`", section)
    assert sorted(named) == sorted(STAT_KEYS), (named, STAT_KEYS)
    assert "docs/decoding.md#statistics" in section     # where each is defined and aggregated


def test_readme_decoder_table_lists_every_decoder_in_the_registry_s_order():
    head = "| `decoder=` | what one step does | from |\n"
    assert README.count(head) == 1
    table = README.split(head)[1].split("\n\n")[0].splitlines()[1:]
    assert [re.match(r"\| `([a-z-]+)`", row).group(1) for row in table] == list(DECODER_NAMES)


def test_readme_is_a_manual_of_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_decoding_doc_has_the_sections_code_comments_cite():
    doc = (ROOT / "docs" / "decoding.md").read_text()
    cited = set()
    for path in (ROOT / "pvf_lmeval").rglob("*.py"):
        cited.update(" ".join(c.split()) for c in re.findall(r'SPEC "([^"]+)"', path.read_text()))
    # A citation names a heading or a term in bold (a paragraph of the fine print).
    names = set(re.findall(r"^##+ (.+)$", doc, flags=re.M)) | set(re.findall(r"\*\*([^*]+)\*\*", doc))
    assert {"Cache modes", "Statistics", "PVF step"} <= cited
    missing = sorted(c for c in cited if c not in names)
    assert not missing, f"docs/decoding.md lacks sections cited in the code: {missing}"
    defined = set()
    for line in _section(doc, "Statistics").splitlines():
        if line.startswith("| `"):
            defined.update(re.findall(r"`([a-z_]+)`", line.strip("|").split("|")[0]))
    assert defined == set(STAT_KEYS)


def test_licence_is_apache_2_and_declared():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]

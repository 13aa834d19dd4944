"""The project's own docs: every reference a docstring or comment makes to ``docs/<file>.md#<section>``
names a file and a section that exist, and nothing points at documents outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
OUTSIDE = re.compile(r"nni-contract\.md|DESIGN\.md|(?<![\w/])platforms\.md|(?<![\w/])prefect\.md|shared/reference")


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _sources() -> list[Path]:
    return sorted(p for folder in ("trialflow", "tests", "benchmarks") for p in (ROOT / folder).rglob("*.py"))


def test_every_docs_reference_in_the_code_names_a_file_and_section_that_exist():
    anchors = {doc.name: {_slug(line.lstrip("#")) for line in doc.read_text().splitlines() if line.startswith("#")}
               for doc in (ROOT / "docs").glob("*.md")}
    seen = 0
    for path in _sources():
        for name, anchor in REFERENCE.findall(path.read_text()):
            seen += 1
            assert name in anchors, f"{path.relative_to(ROOT)} cites docs/{name}, which does not exist"
            assert not anchor or anchor in anchors[name], \
                f"{path.relative_to(ROOT)} cites docs/{name}#{anchor}; its sections are {sorted(anchors[name])}"
    assert seen >= 20  # the platform and NNI-behaviour notes are cited from the modules that implement them


def test_no_docstring_points_at_documents_outside_the_repository():
    for path in [*_sources(), ROOT / "README.md"]:
        if path == Path(__file__).resolve():
            continue  # the patterns above
        found = OUTSIDE.findall(path.read_text())
        assert not found, f"{path.relative_to(ROOT)} points outside the repository: {found}"

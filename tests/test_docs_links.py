"""Every relative link in the README and the other Markdown pages leads somewhere: the file or folder exists, and
a ``#fragment`` names a heading of the page it points to (GitHub's anchors)."""

import re
from pathlib import Path

import pytest

from helpers import REPO

PAGES = sorted(
    [REPO / "README.md", REPO / "RESULTS.md", REPO / "BENCHMARKS.md", REPO / "data" / "README.md"]
    + list((REPO / "docs").glob("*.md"))
    + list((REPO / "examples").glob("*.md"))
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")


def prose(path: Path) -> str:
    """The page without its fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: the heading's text lowercased, punctuation but '-' and '_' dropped, spaces as
    '-'; a repeated one gets '-1', '-2', ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(
        r"^#+ (.*)$", re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M), flags=re.M
    ):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_the_pages_exist():
    assert REPO / "docs" / "pretrain.md" in PAGES and len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_relative_links_lead_somewhere(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)

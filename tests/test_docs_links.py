"""Every relative link and image in the README and the docs points at a file that exists,
and every ``#anchor`` at a heading of the file it names (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("bench/*.md")],
)
#: ``[text](target)`` and ``![alt](target)``, outside code; the target has no spaces.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ +(.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m.group(1) for m in LINK.finditer(text)]


def test_slug_is_githubs():
    assert slug("Speed of `opcost predict`") == "speed-of-opcost-predict"
    assert slug("Accuracy against issue #9's targets") == "accuracy-against-issue-9s-targets"
    assert slug("2. Edit the profile: partition, account") == "2-edit-the-profile-partition-account"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](page.md#top) [gone](nothere.md) [bad](page.md#nope)\n")
    assert broken(page) == ["nothere.md: no such file", "page.md#nope: no such heading"]


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: no such heading")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert not broken(page), f"{page.relative_to(REPO)}: {broken(page)}"

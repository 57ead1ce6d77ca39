"""Every relative link of the user-facing Markdown (README, docs/, configs/, experiments/) names a file that
exists and, where it has one, an anchor that one of that file's headings makes (GitHub's rule: lowercase,
punctuation but ``-`` and ``_`` dropped, spaces to ``-``, a repeated heading numbered ``-1``, ``-2``, ...)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "configs/README.md",
    ROOT / "experiments/README.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (outside fenced code)."""
    seen, out, fenced = Counter(), set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = re.match(r"#{1,6} (.*)", line)
        if fenced or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def test_github_anchors_follow_githubs_rule():
    text = "# A b\n## `--tree auto` verifies (2026-12-06)\n```\n# not a heading\n```\n## A b\n"
    assert github_anchors(text) == {"a-b", "--tree-auto-verifies-2026-12-06", "a-b-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            bad.append(f"{target}: no heading makes #{anchor}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)

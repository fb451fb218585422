"""The README and the docs pages, and the code blocks in them, for the tests that run those blocks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README and every page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def code_blocks(page: Path, lang: str = "python") -> list[str]:
    """The fenced code blocks of ``page`` in ``lang`` ("" for blocks with no language), read fence
    by fence so that a closing fence never opens a block."""
    blocks, current, current_lang = [], None, ""
    for line in page.read_text().splitlines(keepends=True):
        if current is None:
            if line.startswith("```"):
                current, current_lang = [], line[3:].strip()
        elif line.rstrip() == "```":
            if current_lang == lang:
                blocks.append("".join(current))
            current = None
        else:
            current.append(line)
    assert current is None, f"{page.name}: a code block is not closed"
    return blocks


def code_block(page: Path, lang: str, wanted: Callable[[str], bool]) -> str:
    """The one ``lang`` block of ``page`` that ``wanted`` picks; fails if there is none or several."""
    found = [block for block in code_blocks(page, lang) if wanted(block)]
    assert len(found) == 1, f"{page.relative_to(ROOT)}: expected one such {lang} block, found {len(found)}"
    return found[0]

"""The documentation's relative links lead somewhere: every `[text](target)` in README.md,
docs/*.md and the other guides names a file or folder of the repository, and a `#fragment`
names a heading of the page it points to (as GitHub makes anchors of headings)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

PAGES: List[Path] = sorted(
    [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "deploy" / "README.md",
     ROOT / "python" / "README.md", ROOT / "protocol" / "SPEC.md"]
    + list((ROOT / "docs").glob("*.md")) + list((ROOT / "bench" / "results").glob("*.md")))

LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> Iterator[Tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def anchors(page: Path) -> Set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped,
    spaces made hyphens, a repeated one numbered."""
    seen: Set[str] = set()
    for _, line in prose(page.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        base, k = slug, 1
        while slug in seen:
            slug = f"{base}-{k}"
            k += 1
        seen.add(slug)
    return seen


def links(page: Path) -> Iterator[Tuple[int, str]]:
    for n, line in prose(page.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "``", line)  # code is not a link; [`x`](y) still is
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            yield n, target


def test_the_pages_exist() -> None:
    for name in ("protocol.md", "security.md", "operations.md", "deployment.md", "python.md",
                 "cpp.md", "configuration.md"):
        assert (ROOT / "docs" / name).is_file(), name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    if not page.exists():
        pytest.skip(f"{page.relative_to(ROOT)} is not in this tree")
    broken: List[str] = []
    for n, target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"line {n}: {target} (no such file)")
            continue
        if fragment and dest.is_file() and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"line {n}: {target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_every_test_file_is_in_the_table_of_parts() -> None:
    """docs/testing.md's table "Where each part's tests are" names every test file (C++
    under tests/, Python under python/tests/; a folder covers what is in it), and every path
    it names exists."""
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    section = text.split("## Where each part's tests are", 1)[1].split("\n## ", 1)[0]
    roots = (ROOT / "tests", ROOT / "python" / "tests")
    named: List[Path] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("part", "---"):
            continue
        for root, cell in zip(roots, cells[1:]):
            for path in re.findall(r"`([^`]+)`", cell):
                where = root / path
                assert where.exists(), f"docs/testing.md names {where.relative_to(ROOT)}"
                named.append(where)
    assert named, "the table is gone from docs/testing.md"
    tests = [p for pattern in ("unit/*_test.cpp", "protocol/*_test.cpp",
                               "integration/*_test.cpp", "install/test_*.py",
                               "packaging/test_*.py", "soak/*.py", "fuzz/*.cpp")
             for p in roots[0].glob(pattern)]
    tests += list(roots[1].rglob("test_*.py"))
    missing = [str(t.relative_to(ROOT)) for t in tests
               if not any(t == n or (n.is_dir() and n in t.parents) for n in named)]
    assert not missing, f"not in docs/testing.md's table of parts: {missing}"

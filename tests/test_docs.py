"""The README is one screen with a picture of a turn, and every link of it and of docs/ stays in the repo.

Pure: reads the Markdown files and kvtb.steps, starts nothing.
"""
from __future__ import annotations

import re
from pathlib import Path

from kvtb.steps import NAMES, Step

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # docs/results/ is generated: not checked here
MAX_README_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+\.(?:py|c|md|yaml)\b")
STEP_LABEL = re.compile(r":\s*(\d+) ")  # a mermaid message or note whose text starts with a step's number


def prose(text: str) -> str:
    """The text outside fenced code blocks (whose brackets are code, not links)."""
    return "".join(text.split("```")[0::2])


def mermaid(text: str) -> str:
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"the README has {len(blocks)} mermaid blocks, not one"
    return blocks[0]


def step_rows(text: str) -> list[list[str]]:
    """The README's "step | what | file" table, one list of cells per row."""
    table = text.split("| step | what | file |", 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in table]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.*)$", prose(page.read_text()), re.M)}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_one_screen():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def test_the_readme_s_picture_shows_the_eight_steps_each_with_the_file_that_does_it():
    picture = mermaid(README.read_text())
    files: dict[int, list[str]] = {}
    for line in picture.splitlines():
        label = STEP_LABEL.search(line)
        if label:
            files.setdefault(int(label.group(1)), []).extend(PATH.findall(line))
    assert sorted(files) == [int(s) for s in Step]
    assert [n for n, named in files.items() if not named] == [], "steps shown without the file that does them"
    for path in PATH.findall(picture):
        assert (ROOT / path).is_file(), path


def test_the_readme_s_step_table_follows_kvtb_steps_and_links_each_file():
    rows = step_rows(README.read_text())
    assert [(row[0], row[1]) for row in rows] == [(str(int(s)), NAMES[s]) for s in Step]
    for number, _, files in rows:
        targets = LINK.findall(files)
        assert targets, f"step {number} links no file"
        for target in targets:
            assert (ROOT / target).is_file(), (number, target)
        assert PATH.findall(LINK.sub("", files)) == [], f"step {number} names a file without a link"


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_no_link_of_the_readme_or_docs_leaves_the_repo():
    outside = []
    for page in PAGES:
        if "../shared" in page.read_text():
            outside.append(f"{page.relative_to(ROOT)}: ../shared")
        for target in links(page):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if not dest.is_relative_to(ROOT):
                outside.append(f"{page.relative_to(ROOT)}: {target}")
    assert outside == []

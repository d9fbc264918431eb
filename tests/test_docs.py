"""The code blocks of README.md and docs/*.md run as written, and the README's links resolve.

Every ```python and ```bash block runs in a fresh process (``sys.executable``; bash with the
venv's ``orch`` on PATH) in an empty folder, and must exit 0. A block that cannot run there
(it needs a cluster, several hosts, a placeholder, a terminal that stays open) is marked with
the line ``<!-- fragment -->`` directly before its opening fence. A fence of any other kind
fails, so that no block hides from the check. Blocks that launch runs start real processes:
they end their runs (``run.wait()``, ``run.close()``, a ``with`` block), and the autouse
fixture of conftest.py checks that no process outlives them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"
LANGUAGES = ("python", "bash", "text", "")  # what may follow a fence's backticks
BLOCK_TIMEOUT = 240.0  # seconds; the blocks take seconds, more on a busy machine

pytestmark = pytest.mark.timeout(300)

_OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, counted from 1
    fence: str
    info: str
    code: str
    fragment: bool
    closed: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = _OPENING.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"]
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]
        ]
        found.append(
            Block(
                page=page,
                line=i + 1,
                fence=fence,
                info=info.strip(),
                code="\n".join(body) + "\n",
                fragment=i > 0 and lines[i - 1].strip() == FRAGMENT,
                closed=end < len(lines),
            )
        )
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def runnable(language: str) -> list[pytest.ParameterSet]:
    return [pytest.param(b, id=b.name) for b in ALL if b.info == language and not b.fragment]


def env_for_blocks() -> dict[str, str]:
    """This environment (ORCH_TEST_TAG included, for the leftover check), without
    PYTHONPATH (orch is installed in the venv), with the venv's scripts first on PATH."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_block(block: Block, argv: list[str], tmp_path: Path) -> None:
    try:
        proc = subprocess.run(
            argv, cwd=tmp_path, env=env_for_blocks(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{block.name}: still running after {BLOCK_TIMEOUT:g}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}"
        )
    assert proc.returncode == 0, (
        f"{block.name} exited {proc.returncode} (a block that cannot run as written is marked "
        f"{FRAGMENT} on the line before its fence)\n--- the block ---\n{block.code}"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


@pytest.mark.parametrize("block", runnable("python"))
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    run_block(block, [sys.executable, script.name], tmp_path)


@pytest.mark.parametrize("block", runnable("bash"))
def test_bash_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.sh"
    script.write_text(block.code, encoding="utf-8")
    run_block(block, ["bash", "-euo", "pipefail", script.name], tmp_path)


def test_every_fence_is_one_the_check_knows() -> None:
    """No block hides from the check: backtick fences only, closed, tagged python, bash,
    text or nothing; and each fragment mark stands right before a fence."""
    wrong = [
        f"{b.name}: {b.fence}{b.info}" + ("" if b.closed else " (never closed)")
        for b in ALL
        if b.fence[0] != "`" or b.info not in LANGUAGES or not b.closed
    ]
    assert not wrong, f"fences other than ```python, ```bash, ```text or ```: {wrong}"
    stray = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == FRAGMENT and (i + 1 >= len(lines) or not _OPENING.match(lines[i + 1])):
                stray.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not stray, f"{FRAGMENT} must stand directly before an opening fence: {stray}"
    assert runnable("python"), "no python block runs: the check would check nothing"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    code = {line for b in blocks(page) for line in range(b.line, b.line + b.code.count("\n") + 2)}
    lines = page.read_text(encoding="utf-8").splitlines()
    return {
        slug(line.lstrip("#")) for n, line in enumerate(lines, 1) if line.startswith("#") and n not in code
    }


def relative_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [m["target"] for m in _LINK.finditer(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", m["target"])]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(
                f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}"
            )
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: {file.name} has no heading #{anchor}")
    return broken


def test_readme_links_into_docs_point_at_files() -> None:
    readme = ROOT / "README.md"
    into_docs = [t for t in relative_links(readme) if t.startswith("docs/")]
    assert into_docs, "README.md links to no page of docs/"
    assert not broken_links(readme), broken_links(readme)
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in into_docs}
    unlisted = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlisted, f"README.md does not link to these pages of docs/: {unlisted}"


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_docs_page_links_back_and_resolves(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page.name} starts with its title"
    head = "\n".join(lines[1:6])
    assert "](../README.md)" in head, f"{page.name}: its summary under the title links back to the README"
    assert not broken_links(page), broken_links(page)

"""Every Python example in the documentation (docs/, and sdgruntime/README.md) is either run
here or copied from a file the test suite runs. The scheme, stated once (docs/index.md
says it to readers):

* Each ```python block is preceded by a marker comment (invisible in the built site):

  - ``<!-- example: run -->``: a complete program. It is run here, as a script in a fresh
    interpreter from the repository root, and must exit 0. Its asserts are the example's
    claims, so a runnable example that stops being true fails.
  - ``<!-- example: PATH -->``: an excerpt of PATH, a test module (or conftest) under
    tests/, or an example file with the test that runs it (EXERCISED_BY). The block must
    appear in PATH verbatim, line for line (indentation may differ as a whole); a line
    ``...`` on its own stands for lines left out.
  - ``<!-- example: project:PATH -->``: the file PATH of the page's project (a tutorial
    that builds one, as custom-resources.md does), in any language; the blocks of one
    PATH are joined in page order. The page's files are written into an empty folder
    outside the repository and its tests run there with pytest (which starts a control
    plane: integration), so every file such a page shows is the whole of its file.

* A ```python block without a marker fails here; so does a marker on anything but a code
  block. Other languages may carry a marker too (a ```yaml excerpt of a manifest is
  checked the same way); unmarked, they are not checked.

* Runnable examples import nothing of Shared Device Group: they are sdgruntime's.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "sdgruntime" / "README.md"]
MARKER = re.compile(r"^\s*<!-- example: (\S+) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
#: Example files outside tests/, and the test that runs each of them.
EXERCISED_BY = {
    "examples/operator/mirror.py": "tests/runtime/integration/test_example_operator.py",
    "examples/operator/webhooks.yaml": "tests/runtime/integration/test_example_operator.py",
    "examples/operator/rbac.yaml": "tests/runtime/integration/test_example_operator.py",
}
SDG_PACKAGES = {"api", "controllers", "webhooks"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    marker: str | None
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, lang = fence.groups()
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: unclosed code block"
        i += 1
        before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = MARKER.match(before)
        found.append(
            Block(page, start + 1, lang, marker.group(1) if marker else None, "\n".join(body))
        )
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL if b.marker == "run"]
PROJECT = "project:"
EXCERPTS = [
    b for b in ALL if b.marker not in (None, "run") and not (b.marker or "").startswith(PROJECT)
]
PROJECT_PAGES = sorted({b.page for b in ALL if (b.marker or "").startswith(PROJECT)})


def test_the_docs_have_examples_of_both_kinds() -> None:
    assert len(RUNNABLE) >= 5 and len(EXCERPTS) >= 10, (len(RUNNABLE), len(EXCERPTS))


def test_every_python_block_is_marked() -> None:
    unmarked = [b.where for b in ALL if b.lang == "python" and b.marker is None]
    assert unmarked == [], "python blocks without <!-- example: run|PATH -->"


def test_every_marker_is_on_a_code_block() -> None:
    marked = {(b.page, b.line) for b in ALL if b.marker is not None}
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            if MARKER.match(line):
                nxt = next((k for k in range(n + 1, len(lines)) if lines[k].strip()), None)
                if nxt is None or (page, nxt + 1) not in marked:
                    stray.append(f"{page.relative_to(ROOT)}:{n + 1}")
    assert stray == []


# --- runnable examples ----------------------------------------------------------------------


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_runnable_example_runs(block: Block) -> None:
    assert block.lang == "python", f"{block.where}: only python blocks can be run"
    assert not top_imports(block.code, block.where) & SDG_PACKAGES, (
        f"{block.where} imports Shared Device Group"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "OTEL_"))}
    proc = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block.where}\n{proc.stdout}\n{proc.stderr}"


def top_imports(code: str, where: str) -> set[str]:
    tree = ast.parse(code, where)
    return {
        ((n.module or "") if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom) and not getattr(n, "level", 0)
        for a in n.names
    }


# --- a page's project -------------------------------------------------------------------------


def project_files(page: Path) -> dict[str, str]:
    """PATH -> text of the page's ``project:PATH`` blocks, joined in page order (by two
    blank lines, or one before a block that goes on indented: a class's next method)."""
    files: dict[str, str] = {}
    for b in blocks(page):
        if b.marker and b.marker.startswith(PROJECT):
            path = b.marker.removeprefix(PROJECT)
            if path in files:
                files[path] += "\n" if b.code.startswith(" ") else "\n\n"
            files[path] = files.get(path, "") + b.code + "\n"
    return files


@pytest.mark.integration
@pytest.mark.parametrize("page", PROJECT_PAGES, ids=[p.name for p in PROJECT_PAGES])
def test_a_pages_project_passes_its_own_tests(page: Path, tmp_path: Path) -> None:
    """Written into an empty folder outside the repository, with sdgruntime as installed
    here and nothing else of this repository (no PYTHONPATH, not its conftest)."""
    files = project_files(page)
    assert any(path.startswith("tests/test_") for path in files), f"{page.name}: no tests"
    project = tmp_path / "project"
    for path, text in files.items():
        target = project / path
        assert target.resolve().is_relative_to(project), path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if path.endswith(".py"):
            assert not top_imports(text, path) & SDG_PACKAGES, f"{path} imports SDG"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KUBECONFIG", "OTEL_", "PYTHONPATH", "PYTEST_"))
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{page.name}\n{proc.stdout}\n{proc.stderr}"
    assert " passed" in proc.stdout.splitlines()[-1], proc.stdout


# --- excerpts -------------------------------------------------------------------------------


def chunks(code: str) -> list[list[str]]:
    """The block's runs of lines between ``...`` lines, without blank lines at their ends."""
    out: list[list[str]] = [[]]
    for line in code.splitlines():
        if line.strip() == "...":
            out.append([])
        else:
            out[-1].append(line.rstrip())
    trimmed = []
    for chunk in out:
        while chunk and not chunk[0]:
            chunk = chunk[1:]
        while chunk and not chunk[-1]:
            chunk = chunk[:-1]
        if chunk:
            trimmed.append(chunk)
    return trimmed


def find_chunk(chunk: list[str], lines: list[str], start: int) -> int | None:
    """Index after the first window at or after ``start`` equal to ``chunk`` up to one
    indentation added to all its lines; None if there is none."""
    first = chunk[0]
    for i in range(start, len(lines) - len(chunk) + 1):
        line = lines[i].rstrip()
        if not line.endswith(first):
            continue
        indent = line[: len(line) - len(first)]
        if indent.strip():
            continue
        window = [ln.rstrip() for ln in lines[i : i + len(chunk)]]
        if all(w == (indent + c if c else "") for w, c in zip(window, chunk, strict=True)):
            return i + len(chunk)
    return None


def is_excerpt_of(code: str, source: str) -> bool:
    lines, at = source.splitlines(), 0
    for chunk in chunks(code):
        found = find_chunk(chunk, lines, at)
        if found is None:
            return False
        at = found
    return True


def test_the_excerpt_check_is_strict() -> None:
    source = "def f():\n    a = 1\n    b = 2\n    return a + b\n"
    assert is_excerpt_of("def f():\n    a = 1\n", source)
    assert is_excerpt_of("a = 1\nb = 2\n", source)  # dedented as a whole
    assert is_excerpt_of("def f():\n...\n    return a + b\n", source)
    assert not is_excerpt_of("    a = 1\n  b = 2\n", source)  # not one indentation
    assert not is_excerpt_of("b = 2\n...\na = 1\n", source)  # out of order
    assert not is_excerpt_of("a = 1\nreturn a + b\n", source)  # a line left out silently
    assert not is_excerpt_of("a = 2\n", source)


@pytest.mark.parametrize("block", EXCERPTS, ids=[b.where for b in EXCERPTS])
def test_excerpt_is_verbatim_from_a_tested_file(block: Block) -> None:
    source = ROOT / block.marker  # type: ignore[operator]
    assert source.is_file(), f"{block.where}: {block.marker} does not exist"
    assert is_excerpt_of(block.code, source.read_text()), (
        f"{block.where} is not an excerpt of {block.marker} (copy it again from there)"
    )
    rel = source.relative_to(ROOT).as_posix()
    if rel.startswith("tests/"):
        assert source.name.startswith("test_") or source.name == "conftest.py", rel
    else:
        runner = EXERCISED_BY.get(rel)
        assert runner, f"{block.where}: no test is known to run {rel} (EXERCISED_BY)"
        assert source.name in (ROOT / runner).read_text(), f"{runner} does not use {rel}"


# --- links out of the pages mkdocs does not build ---------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", ["README.md", "sdgruntime/README.md"])
def test_readme_links_stay_in_the_repository(page: str) -> None:
    """Relative links resolve to files of this repository (the docs site's own links are
    checked by ``mkdocs build --strict``); the web is linked with absolute URLs."""
    path = ROOT / page
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []


# --- the logger names on the reference page ---------------------------------------------------


def test_the_reference_names_every_logger_of_sdgruntime() -> None:
    """reference.md's Logging table lists exactly the modules that log (``log =
    logging.getLogger(__name__)``) and from_context's default logger."""
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text[text.index("## Logging") :]
    section = section[: section.index("\n## ")]
    table = [line for line in section.splitlines() if line.startswith("| `sdgruntime.")]
    documented = {name for line in table for name in re.findall(r"`(sdgruntime\.[\w.]+)`", line)}
    package = ROOT / "sdgruntime"
    logging_modules = {
        ".".join(("sdgruntime", *path.relative_to(package).with_suffix("").parts))
        for path in package.rglob("*.py")
        if "build" not in path.relative_to(package).parts
        and re.search(r"^log = logging\.getLogger\(__name__\)$", path.read_text(), re.M)
    }
    assert documented == logging_modules | {"sdgruntime.reconcile"}

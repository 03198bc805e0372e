"""The import graph of SDG's packages: layered sdgruntime -> api -> webhooks -> controllers
-> cli (a lower layer never imports a higher one, type-checking imports included) and
free of cycles, so each package can be read, tested and shipped without those above it."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

#: Highest first, as grimp's layer contracts take them.
LAYERS = ("cli", "controllers", "webhooks", "api", "sdgruntime")

#: Cycles tolerated for now; none are left.
KNOWN_CYCLES: list[set[str]] = []


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*LAYERS, cache_dir=None)


def test_no_layer_imports_a_higher_one(graph: grimp.ImportGraph) -> None:
    illegal = graph.find_illegal_dependencies_for_layers(layers=LAYERS)
    found = sorted(
        f"{d.importer} -> {d.imported}: {' -> '.join(r.importer for r in d.routes)}"
        for d in illegal
    )
    assert found == []


def _cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, [])
            if i < len(targets):
                work.append((node, i + 1))
                nxt = targets[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def test_the_import_graph_has_no_cycle(graph: grimp.ImportGraph) -> None:
    cycles = [c for c in _cycles(graph) if c not in KNOWN_CYCLES]
    assert cycles == []


def _toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> grimp.ImportGraph:
    """A package whose low layer imports its high one only for type checking, and two
    modules importing each other."""
    root = tmp_path / "toy"
    (root / "low").mkdir(parents=True)
    (root / "high").mkdir()
    (root / "__init__.py").write_text("")
    (root / "high" / "__init__.py").write_text("")
    (root / "low" / "__init__.py").write_text("")
    (root / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import toy.high\n"
        "import toy.low.b\n"
    )
    (root / "low" / "b.py").write_text("import toy.low.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return grimp.build_graph("toy", cache_dir=None)


def test_the_checks_see_type_checking_imports_and_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checks that could not fail would prove nothing: on a toy package they do."""
    toy = _toy(tmp_path, monkeypatch)
    illegal = toy.find_illegal_dependencies_for_layers(
        layers=("toy.high", "toy.low"), containers=set()
    )
    assert {(d.importer, d.imported) for d in illegal} == {("toy.low", "toy.high")}
    assert _cycles(toy) == [{"toy.low.a", "toy.low.b"}]

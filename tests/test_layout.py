"""The layout shows the architecture: the root holds the method, each file a concept a reader of the paper
would name, and the two entry points; the set-up of a run (its config checked, the run assembled) sits in
launch/, the machinery in infra/, the studies beside the method in studies/, the study of runs in lab/, and
the imports run one way.

The import graph is read from the source with `ast`: every `import` and `from ... import`, those inside
functions included (an import deferred into a function is still a dependency; deferring one is how a
circle hides). `from pkg import name` is an arrow to the module pkg.name when that is a file, else to
pkg itself. Asserted: no circles; nothing outside lab/ imports lab/, except evaluate.py (the entry point
that measures, with lab's statistics); only the set-up (launch/) and lab/ import studies/, the project's
studies beside the method, except GiGPO's bookkeeping (studies/gigpo.py), which its entry of the estimators'
table and the rollout's state keys read; only the entry points and lab/ import launch/; infra/ imports
neither the method nor the set-up; no module imports an entry point; the root holds exactly ROOT_FILES.

    python tests/test_layout.py [DIR]     # the graph's figures (floors, arrows, back-up arrows) of a tree
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The method, in the order a reader meets it in a training step, and the two entry points: at most 9 files.
ROOT_FILES = {"train.py", "evaluate.py", "config.py", "schedule.py", "rollout.py", "engine.py", "batch.py",
              "algorithms.py", "losses.py"}
STUDIES = "studies"  # the project's studies beside the method: reached through its one hook object
ESTIMATOR_STUDY = "studies.gigpo"  # GiGPO (--algo gigpo): an estimator of the table, its bookkeeping a study's
SET_UP = "launch"  # a run's set-up: the config checked and derived (checks.py), the run assembled (startup.py)
ENTRY_POINTS = {"train", "evaluate"}
LAB = "lab"
NOT_CODE = {"tests", "bench", "results", "docs", "runs"}  # folders of the root that hold no project module


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of the project: the root's .py files and every package
    (a folder with __init__.py, under a chain of packages), tests and benchmarks left out."""
    found = {p.stem: p for p in root.glob("*.py")}

    def walk(folder: Path, prefix: str) -> None:
        if not (folder / "__init__.py").exists():
            return
        for p in sorted(folder.iterdir()):
            if p.is_dir() and not p.name.startswith((".", "_")):
                walk(p, f"{prefix}.{p.name}")
            elif p.suffix == ".py":
                found[prefix if p.name == "__init__.py" else f"{prefix}.{p.stem}"] = p

    for folder in sorted(root.iterdir()):
        if folder.is_dir() and not folder.name.startswith(".") and folder.name not in NOT_CODE:
            walk(folder, folder.name)
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported project module, inside a function?) for every import statement of one module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deferred = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f) if n is not f}
    out = []

    def target(dotted: str) -> str | None:  # the longest prefix that is a project module
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in known:
                return ".".join(parts[:i])
        return None

    for node in ast.walk(tree):
        inside = id(node) in deferred
        if isinstance(node, ast.Import):
            out += [(t, inside) for a in node.names if (t := target(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from this module's package
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                t = f"{base}.{a.name}".lstrip(".")
                t = t if t in known else target(base) if base else None
                if t:
                    out.append((t, inside))
    return [(t, inside) for t, inside in out if t != name]


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], int]:
    """Arrows module -> the project modules it imports, and how many imports sit inside functions."""
    mods = modules(root)
    edges, deferred = {}, 0
    for name, path in mods.items():
        found = imports(name, path, set(mods))
        edges[name] = {t for t, _ in found}
        deferred += sum(inside for _, inside in found)
    return edges, deferred


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def figures(edges: dict[str, set[str]], deferred: int) -> dict:
    """Floors: layers of the graph with each circle taken as one node (a module's floor is 1 + the
    highest floor it imports; a module importing nothing is floor 0). Back-up arrows: arrows inside a
    circle (in a graph without circles every arrow goes down a floor)."""
    comp = {v: v for v in edges}
    for c in circles(edges):
        for v in c:
            comp[v] = c[0]
    floor = {}

    def height(c):
        if c not in floor:
            floor[c] = -1  # cannot recurse into itself: arrows inside the circle are skipped below
            floor[c] = 1 + max((height(comp[w]) for v in edges if comp[v] == c for w in edges[v]
                                if comp[w] != c), default=-1)
        return floor[c]

    for v in edges:
        height(comp[v])
    arrows = sum(len(t) for t in edges.values())
    back = sum(comp[v] == comp[w] for v in edges for w in edges[v])
    return {"modules": len(edges), "arrows": arrows, "floors": 1 + max(floor.values()), "back-up arrows": back,
            "circles": [c for c in circles(edges)], "imports inside functions": deferred}


# ------------------------------------------------------------------ the rules

def in_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def in_set_up(name: str) -> bool:
    return name == SET_UP or name.startswith(SET_UP + ".")


def test_no_import_circles():
    found = circles(graph()[0])
    assert not found, f"import circles: {found}"


def test_the_core_never_imports_the_lab():
    edges = graph()[0]
    bad = [f"{v} -> {w}" for v in sorted(edges) if not in_lab(v) and v != "evaluate" for w in sorted(edges[v])
           if in_lab(w)]
    assert not bad, "the algorithm and its machinery import the study of runs: " + ", ".join(bad)


def test_only_the_set_up_and_the_lab_import_the_studies():
    """The method's files never import studies/ (the trainer reaches it through the `Studies` object the
    set-up builds), nor does the machinery."""
    edges = graph()[0]
    inside = lambda name: name == STUDIES or name.startswith(STUDIES + ".")  # noqa: E731
    bad = [f"{v} -> {w}" for v in sorted(edges) if not (inside(v) or in_lab(v) or in_set_up(v))
           for w in sorted(edges[v]) if inside(w) and w != ESTIMATOR_STUDY]
    assert not bad, "the method or its machinery imports the studies: " + ", ".join(bad)


def test_only_the_entry_points_and_the_lab_import_the_set_up():
    """launch/ assembles a run from the method, the machinery and the studies: nothing it builds imports it."""
    edges = graph()[0]
    bad = [f"{v} -> {w}" for v in sorted(edges) if not (in_set_up(v) or in_lab(v) or v in ENTRY_POINTS)
           for w in sorted(edges[v]) if in_set_up(w)]
    assert not bad, "the set-up is imported by what it assembles: " + ", ".join(bad)


def test_no_module_imports_an_entry_point():
    edges = graph()[0]
    bad = [f"{v} -> {w}" for v in sorted(edges) for w in sorted(edges[v]) if w in ENTRY_POINTS]
    assert not bad, "entry points are imported: " + ", ".join(bad)


def test_the_machinery_imports_no_method_file():
    """infra/ is what the method runs on; the method's files (the root) import it, never the other way."""
    edges = graph()[0]
    root = {p.stem for p in ROOT.glob("*.py")}
    bad = [f"{v} -> {w}" for v in sorted(edges) if v.startswith("infra.") for w in sorted(edges[v])
           if w in root or in_set_up(w)]
    assert not bad, "infra/ imports method or set-up files: " + ", ".join(bad)


def test_the_root_holds_the_algorithm_and_the_entry_points():
    assert {p.name for p in ROOT.glob("*.py")} == ROOT_FILES


def test_the_graph_reader_resolves_every_kind_of_import(tmp_path):
    (tmp_path / "a.py").write_text("import os, pkg.sub\nfrom pkg import mod, name\n\ndef f():\n    from b import x\n")
    (tmp_path / "b.py").write_text("class B:\n    def g(self):\n        import a\n")
    (tmp_path / "c.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .mod import y\n")
    (tmp_path / "pkg" / "sub.py").write_text("from . import mod\nfrom .mod import z\n")
    (tmp_path / "pkg" / "mod.py").write_text("from .. import c\n")
    edges, deferred = graph(tmp_path)
    assert edges == {"a": {"pkg.sub", "pkg.mod", "pkg", "b"}, "b": {"a"}, "c": set(), "pkg": {"pkg.mod"},
                     "pkg.sub": {"pkg.mod"}, "pkg.mod": {"c"}}
    assert deferred == 2 and circles(edges) == [["a", "b"]]
    f = figures(edges, deferred)  # floors: c; pkg.mod; pkg and pkg.sub; the circle a, b
    assert (f["arrows"], f["back-up arrows"], f["floors"]) == (8, 2, 4)


if __name__ == "__main__":
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for key, value in figures(*graph(tree)).items():
        print(f"{key}: {value}")

"""The README and the docs pages: every relative link and image resolves (a file, and a heading when the
link names one), every command names a file that exists, every docs page is reachable from the README,
and the README stays a guide (at most 25,000 characters; the measurements live on the docs pages)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"python(?:3[.\d]*)? (?:-m ([\w.]+)|([\w./-]+\.py))")  # python -m lab.report, python train.py


def pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_command_names_a_file_of_the_repository():
    """`python X.py` and `python -m pkg.mod` (of this repository's packages) name files that exist, so a
    module that moves leaves no stale command behind, in the pages or in the tables they copy."""
    stale = []
    for page in pages():
        for module, script in COMMAND.findall(page.read_text()):
            top = module.split(".")[0]
            if module and not ((ROOT / top).is_dir() or (ROOT / f"{top}.py").exists()):
                continue  # an installed module: pytest, venv, pip
            path = ROOT / (script or module.replace(".", "/") + ".py")
            if not path.exists() and not (path.with_suffix("") / "__main__.py").exists():
                stale.append(f"{page.relative_to(ROOT)}: python {script or '-m ' + module}")
    assert not stale, "\n".join(stale)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_readme_is_a_guide_not_a_notebook():
    size = len((ROOT / "README.md").read_text())
    assert size <= 25_000, f"README.md has {size} characters; move measurements to a docs/ page"


DEFAULT_PATH = ["train.py", "launch/startup.py", "rollout.py", "batch.py", "engine.py", "infra/distributed.py"]


def test_the_diagram_names_functions_the_default_path_calls():
    """Every dotted name in the README's diagram is a function of the project (module.function, or
    Class.method of a class defined in the project), and the default training path calls it."""
    import ast
    import importlib
    import re

    text = (ROOT / "README.md").read_text()
    diagram = text[text.index("```\n") + 4:text.index("```\n", text.index("```\n") + 4)]
    names = sorted(set(re.findall(r"\b[A-Za-z_]+(?:\.[A-Za-z_]+)+\b", diagram)))
    assert len(names) >= 10, names
    called = set()
    for file in DEFAULT_PATH:
        for node in ast.walk(ast.parse((ROOT / file).read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None))
                # a function handed to a helper that calls it (rollout's `calls(pool, [(env.step, text)])`)
                called.update(a.attr for arg in node.args for a in ast.walk(arg) if isinstance(a, ast.Attribute))
    classes = {}
    for path in [*ROOT.glob("*.py"), *ROOT.glob("infra/*.py"), ROOT / "envs" / "__init__.py"]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (path, {n.name for n in node.body if isinstance(n, ast.FunctionDef)})
    problems = []
    for name in names:
        head, *rest = name.split(".")
        if head[0].isupper():
            if head not in classes or rest[0] not in classes[head][1]:
                problems.append(f"{name}: no class {head} with a method {rest[0]} in the project")
        else:
            module = next((m for m in (head, f"infra.{head}") if (ROOT / (m.replace(".", "/") + ".py")).exists()), None)
            if module is None or not callable(getattr(importlib.import_module(module), rest[0], None)):
                problems.append(f"{name}: not a function of the project")
        if rest[-1] not in called:
            problems.append(f"{name}: the default path ({', '.join(DEFAULT_PATH)}) never calls {rest[-1]}")
    assert not problems, "\n".join(problems)

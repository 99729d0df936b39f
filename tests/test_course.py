"""docs/course.md, the tour from each equation to its line, stays true to the code.

Every code reference in the tour is written as `FILE.py` `SNIPPET` in `FUNCTION`: three code spans, the
file, a fragment of one of its lines, and the function (or Class.method) whose body holds that line. No
line numbers: a reference stays true when code above it moves. This test checks that the file exists,
that some line of that function holds the fragment, and that every test the tour names
(`tests/test_x.py::test_name`, in prose or in a command) is defined in its file. When code moves out of
its function, the failure says where the fragment is now."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "docs" / "course.md"
REF = re.compile(r"`([\w./-]+\.py)(?::(\d+))?`\s+`([^`]+)`\s+in\s+`([\w.]+)`")
TEST = re.compile(r"(tests/test_\w+\.py)::(\w+)")
NUMBERED = re.compile(r"`[\w./-]+\.py:\d+`")


def references() -> list[tuple[str, str, str]]:
    return [(f, snippet, func) for f, _, snippet, func in REF.findall(COURSE.read_text())]


def enclosing(path: Path, line: int) -> str:
    """The dotted name of the innermost function (with its classes) whose body holds `line`."""
    best = ""

    def visit(node, prefix):
        nonlocal best
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if child.lineno <= line <= child.end_lineno:
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        best = name
                    visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return best


def test_every_code_reference_is_in_its_function():
    refs = references()
    assert len(refs) >= 30, f"the tour holds only {len(refs)} references; is the notation still parsed?"
    assert not NUMBERED.findall(COURSE.read_text()), "write `file.py` `fragment` in `function`, without a line number"
    problems = []
    for file, snippet, func in refs:
        path = ROOT / file
        if not path.is_file():
            problems.append(f"`{file}`: no such file")
            continue
        lines = path.read_text().splitlines()
        hits = [i for i, text in enumerate(lines, 1) if snippet in text]
        if not any(enclosing(path, i) == func for i in hits):
            where = ", ".join(f"line {i} in `{enclosing(path, i) or 'module level'}`" for i in hits)
            problems.append(f"`{file}` `{snippet}`: not in `{func}`; " + (f"found at {where}" if hits else
                                                                          "no line of the file holds it"))
    assert not problems, "docs/course.md is stale:\n" + "\n".join(problems)


def test_every_named_test_exists():
    named = set(TEST.findall(COURSE.read_text()))
    assert len(named) >= 12, f"the tour names only {len(named)} tests"
    missing = []
    for file, name in sorted(named):
        path = ROOT / file
        if not path.is_file() or not re.search(rf"^\s*(async\s+)?def {name}\(", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/course.md names tests that do not exist: {missing}"


def test_the_reference_notation_is_what_the_parser_reads():
    text = "x `algorithms.py` `adv = centred` in `group_baseline` and `rollout.py:9` `y` in `f`"
    found = [(f, s, fn) for f, _, s, fn in REF.findall(text)]
    assert found == [("algorithms.py", "adv = centred", "group_baseline"), ("rollout.py", "y", "f")]
    assert NUMBERED.findall(text) == ["`rollout.py:9`"]
    assert enclosing(ROOT / "rollout.py", next(i for i, t in enumerate((ROOT / "rollout.py").read_text().splitlines(), 1)
                                               if "def observation" in t) + 1) == "ChatFormat.observation"

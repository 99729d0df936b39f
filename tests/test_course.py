"""docs/course.md, the tour from each equation to its line, stays true to the code.

Every code reference in the tour is written as `FILE.py:LINE` `SNIPPET` in `FUNCTION`: three code spans,
the file and line, a fragment of that line, and the function (or Class.method) whose body holds it.
This test checks that the file exists, that the line contains the fragment and lies inside that
function, and that every test the tour names (`tests/test_x.py::test_name`, in prose or in a command)
is defined in its file. When code moves, the failure says where the fragment is now."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "docs" / "course.md"
REF = re.compile(r"`([\w./-]+\.py):(\d+)`(?:\s+`([^`]+)`\s+in\s+`([\w.]+)`)?")
TEST = re.compile(r"(tests/test_\w+\.py)::(\w+)")


def references() -> list[tuple[str, int, str | None, str | None]]:
    return [(f, int(n), snippet or None, func or None) for f, n, snippet, func in REF.findall(COURSE.read_text())]


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


def test_every_code_reference_points_at_its_line():
    refs = references()
    assert len(refs) >= 30, f"the tour holds only {len(refs)} references; is the notation still parsed?"
    problems = []
    for file, line, snippet, func in refs:
        where = f"`{file}:{line}`"
        path = ROOT / file
        if snippet is None:
            problems.append(f"{where} needs the fragment and the function beside it: `{file}:{line}` `code` in `name`")
            continue
        if not path.is_file():
            problems.append(f"{where}: no such file")
            continue
        lines = path.read_text().splitlines()
        if not (1 <= line <= len(lines)) or snippet not in lines[line - 1]:
            now = [str(i) for i, text in enumerate(lines, 1) if snippet in text]
            problems.append(f"{where} should contain `{snippet}`; " +
                            (f"it is now on line {', '.join(now)}" if now else "no line of the file holds it"))
            continue
        found = enclosing(path, line)
        if found != func:
            problems.append(f"{where} `{snippet}` is in `{found or 'module level'}`, the tour says `{func}`")
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
    text = "x `algorithms.py:232` `adv = centred` in `group_baseline` and `rollout.py:9` alone"
    found = [(f, int(n), s or None, fn or None) for f, n, s, fn in REF.findall(text)]
    assert found == [("algorithms.py", 232, "adv = centred", "group_baseline"), ("rollout.py", 9, None, None)]
    assert enclosing(ROOT / "rollout.py", 85) == "ChatFormat.observation"


def renumber() -> int:
    """Move every stale line number to the one line that now holds its fragment inside the named function
    (`python tests/test_course.py`, after code moved); a fragment found nowhere, or more than once, is left
    for a person. Returns how many references changed."""
    text, changed = COURSE.read_text(), 0

    def fix(match):
        nonlocal changed
        file, line, snippet, func = match.group(1), int(match.group(2)), match.group(3), match.group(4)
        path = ROOT / file
        if not (snippet and path.is_file()):
            return match.group(0)
        hits = [i for i, t in enumerate(path.read_text().splitlines(), 1) if snippet in t and enclosing(path, i) == func]
        if len(hits) != 1 or hits[0] == line:
            return match.group(0)
        changed += 1
        return match.group(0).replace(f"{file}:{line}`", f"{file}:{hits[0]}`", 1)

    COURSE.write_text(REF.sub(fix, text))
    return changed


if __name__ == "__main__":
    print(f"{renumber()} references renumbered in {COURSE.relative_to(ROOT)}")

"""README.md's references to the code stay true, as tests/test_course.py keeps docs/course.md's.

Three kinds are checked: a dotted name in a code span whose first part is one of the project's modules
(`train.update`, `passes.pad`, `batch.token_logprobs`, `rollout.Episode.reward_index` is written
`Episode.reward_index` and names a class, so it is read from the module that defines the class) must be
defined there; a path to a .py file in a code span must exist; and the file tree's `infra/` list names
every module of infra/."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FOLDERS = ("", "infra/", "lab/", "envs/", "models/", "studies/", "launch/")
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"`((?:[\w-]+/)*[\w-]+\.py)")
NOT_NAMES = {"json", "jsonl", "png", "md", "py", "txt", "sh", "html", "safetensors", "toml"}


def module(name: str) -> Path | None:
    return next((ROOT / f"{folder}{name}.py" for folder in FOLDERS if (ROOT / f"{folder}{name}.py").is_file()), None)


def defined(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, and each class's own names (methods, fields)."""
    tree = ast.parse(path.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top.add(node.name)
            if isinstance(node, ast.ClassDef):
                members[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} | {
                    t.id for n in node.body if isinstance(n, (ast.AnnAssign, ast.Assign))
                    for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets) if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in [node.target] if isinstance(node, ast.AnnAssign) else node.targets:
                top |= {t.id} if isinstance(t, ast.Name) else set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return {"": top, **members}


def classes() -> dict[str, Path]:
    """Every class of the project's modules -> its file (for `Class.member` references)."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, path)
    return out


def test_every_dotted_reference_names_something_defined():
    found, problems, owners = 0, [], classes()
    for ref in sorted(set(DOTTED.findall(README))):
        head, *rest = ref.split(".")
        if rest[0] in NOT_NAMES:
            continue
        if module(head) is not None:
            path, names = module(head), rest
        elif head in owners:
            path, names = owners[head], [head, *rest]
        else:
            continue  # not the project's (torch.std, collective_rpc, ...)
        found += 1
        table = defined(path)
        if names[0] not in table[""]:
            problems.append(f"`{ref}`: {path.relative_to(ROOT)} defines no {names[0]}")
        elif len(names) > 1 and names[0] in table and names[1] not in table[names[0]]:
            problems.append(f"`{ref}`: {names[0]} in {path.relative_to(ROOT)} has no {names[1]}")
    assert found >= 25, f"only {found} references found; is the notation still parsed?"
    assert not problems, "README.md is stale:\n" + "\n".join(problems)


def test_every_file_path_exists():
    paths = set(PATH.findall(README))
    assert len(paths) >= 10
    missing = [p for p in sorted(paths) if not (ROOT / p).is_file() and module(Path(p).stem) is None]
    assert not missing, f"README.md names files that do not exist: {missing}"


def test_the_file_tree_lists_every_infra_module():
    start = README.index("infra/            machinery")
    tree = README[start:README.index("\nmodels/", start)]
    listed = set(re.findall(r"(\w+\.py)", tree))
    modules = {p.name for p in (ROOT / "infra").glob("*.py") if p.name != "__init__.py"}
    assert modules <= listed, f"README's infra/ list lacks {sorted(modules - listed)}"


TEST = re.compile(r"(tests/test_\w+\.py)::(\w+)")
SECTION = re.compile(r"README(?:'s)?,? \"([^\"]+)\"|README, ([A-Z][\w ]+)[).;]")


def test_every_named_test_exists():
    """A claim the README makes of a test (`tests/test_x.py::test_name`) names a test that is there."""
    named = set(TEST.findall(README))
    assert named, "the README names no test; is the notation still parsed?"
    missing = [f"{f}::{name}" for f, name in sorted(named)
               if not re.search(rf"^def {name}\(", (ROOT / f).read_text() if (ROOT / f).is_file() else "", re.M)]
    assert not missing, f"README.md names tests that do not exist: {missing}"


def test_pointers_to_readme_sections_name_one():
    """A docstring or docs page that sends the reader to a README section (README, "Results") names a heading
    the README has: sections that moved to a docs page (docs/paper.md's "Comparing with the paper") leave
    no pointer behind."""
    headings = {line.lstrip("#").strip() for line in README.splitlines() if line.startswith("##")}
    files = [*ROOT.glob("*.py"), *ROOT.glob("*/*.py"), *(ROOT / "docs").glob("*.md")]
    pointers = [(p.relative_to(ROOT), a or b) for p in files if ".venv" not in p.parts
                for a, b in SECTION.findall(p.read_text())]
    assert pointers, "no pointer found; is the notation still parsed?"
    stale = [f"{p}: README, {title!r}" for p, title in pointers if title.strip() not in headings]
    assert not stale, f"pointers to README sections that are not there: {stale}"


SET_UP = ("bash run.sh ", "bash bench/", ".venv/bin/", "source .venv/bin/activate", "python3.11 -m venv ", ".venv-gpu/bin/")


def test_every_command_in_a_code_block_runs_in_a_fresh_shell():
    """Each command of a ```bash block starts with what the set-up provides (run.sh and its .venv, the
    prerequisites' python3.11): a bare `python` or `torchrun` is the shell's, not the venv's."""
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        continued = False
        for line in block.splitlines():
            command, continued, was = line.split("#")[0].strip(), line.rstrip().endswith("\\"), continued
            if was or not command:
                continue
            for part in re.split(r"&&|\|\||;|\|", command):
                part = re.sub(r"^(\w+=\S*\s+)+", "", part.strip())  # VAR=value before the command
                assert part.startswith(SET_UP), f"README: {part!r} needs the venv: write `bash run.sh python ...`"

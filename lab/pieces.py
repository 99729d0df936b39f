"""A long experiment as resumable pieces, and the record each leaves (lab/protocol.py runs its steps here).

A piece is one command (an epoch of imitation, an RL run, an evaluation) whose output is the directory
runs/NAME/. When it finishes, piece.json is written there and the same record is appended to the result
folder's pieces.jsonl: its wall seconds, the CPU seconds of its whole process tree, the CPU kind it ran
on, what it measured (`measure`), and for a trained model the sha256 of its weights. A rerun skips a
finished piece.

The result folder is committed, runs/ is not (weights never are), so the record must be enough on a
machine that never ran the piece: an evaluation's transcripts are archived in the folder (xz) and restored
from it, and a training piece's logs are kept in train/NAME/ (`keep_logs`); a piece whose model a later
piece needs is built again, and its new record says `rebuilt` and whether it made the same weights. CPU
seconds buy different work on each CPU kind, so a folder holds one kind's pieces (`other_machine`).
Tests: python -m pytest tests/test_protocol.py
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Pieces:
    runs: Path      # this machine's piece directories (models, logs): runs/NAME
    results: Path   # the committed result folder: pieces.jsonl, evals/ (archived transcripts)
    nproc: int = 2  # ranks of each piece: `measure` turns a per-rank CPU figure into the run's

    def done(self, name: str, reuse: bool = False) -> dict | None:
        """The finished piece's record: this machine's piece.json, or (with `reuse`: nothing later needs the
        piece's files, only what it measured) the record committed in the result folder, which outlives the
        machine that ran it. A reused evaluation gets its transcripts back from the folder's archive."""
        path = self.runs / name / "piece.json"
        if path.exists():
            record = json.loads(path.read_text())
            if record["kind"] != "eval" and not (self.results / "train" / name).exists():
                keep_logs(self.runs / name, self.results / "train" / name)  # a piece finished before logs were kept
            return record
        record = self.recorded(name) if reuse else None
        if record is not None and record["kind"] == "eval" and (self.results / "evals" / name).exists():
            restore(self.results / "evals" / name, self.runs / name)
        return record

    def recorded(self, name: str) -> dict | None:
        """The latest record of piece `name` in the result folder's pieces.jsonl (a rebuilt piece adds one)."""
        path = self.results / "pieces.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return next((r for r in reversed(rows) if r["piece"] == name), None)

    def run(self, name: str, cmd, kind: str, fresh: bool = True, reuse: bool = False, expect: dict | None = None,
            **info) -> dict:
        """Run `cmd()` as piece `name` unless finished; record its wall and CPU seconds (the whole process
        tree: every rank, its generator and env threads) and what it measured; publish the record. `cmd` is a
        callable, so that a finished piece never builds a command (nor the models that command starts from).
        `expect`: values the piece must measure (an epoch's demonstrations: the finite set's size), else it
        stops unrecorded, so that its rerun plays it again."""
        if (record := self.done(name, reuse or kind == "eval")) is not None:
            return record
        earlier = self.recorded(name)  # finished on another machine, whose files this one lacks: built again
        cmd = cmd()
        out = self.runs / name
        if fresh and out.exists():  # a crashed piece that cannot resume starts again
            shutil.rmtree(out)
        print(f"[protocol] {name}: {' '.join(cmd[cmd.index('--nproc_per_node') + 2:])}", flush=True)
        played_before = played(out) if kind == "eval" else 0  # a resumed evaluation plays only the rest
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"error: piece {name} failed (exit {proc.returncode}); rerun the same command to resume")
        record = {"piece": name, "kind": kind, "wall_s": round(time.perf_counter() - t, 1),
                  "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
                  "machine": machine(), **info}
        record.update(measure(out, kind, self.nproc))
        if wrong := {k: record.get(k) for k, v in (expect or {}).items() if record.get(k) != v}:
            raise SystemExit(f"error: piece {name} measured {wrong}, not {expect}: its log says why (an expert "
                             f"that failed?); rerun the same command to run it again")
        if kind == "eval":  # what the seconds above bought: --status's estimates divide by it
            record["episodes_timed"] = record["episodes"] - played_before
        if earlier is not None:
            record["rebuilt"] = True
            if earlier.get("weights_sha256") and record.get("weights_sha256"):
                record["same_weights_as_recorded"] = earlier["weights_sha256"] == record["weights_sha256"]
        (out / "piece.json").write_text(json.dumps(record, indent=1) + "\n")
        if kind == "eval":
            archive(out, self.results / "evals" / name)
        else:
            keep_logs(out, self.results / "train" / name)
        with open(self.results / "pieces.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        return record


def machine() -> str:
    """The CPU kind a piece ran on: CPU seconds buy different work on each (compare arms of one kind only)."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown"
    flags = set(info.get("flags", "").split())
    bf16 = "amx_bf16" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "no bf16"
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, " \
           f"{bf16}, {os.cpu_count()} cores)"


def machine_tag(kind: str) -> str:
    """A short name for a CPU kind, for a result folder of its own: 'f25m17-avx512_bf16'."""
    found = re.search(r"family (\S+) model (\S+), ([^,]+),", kind)
    return "-".join((f"f{found[1]}m{found[2]}", found[3].replace(" ", "_"))) if found else "other"


def other_machine(results: Path, runs: str, results_flag: str) -> str | None:
    """A result folder whose pieces ran on another CPU kind cannot be continued here: CPU seconds buy different
    work on each kind (float32 on an AVX2-only EPYC, bf16 at 2-4x the speed where the CPU has it), so the
    screen's settings and the arms would get unequal budgets, and an epoch built again here would be another
    model. One line naming both ways on, before anything starts."""
    path = results / "pieces.jsonl"
    kinds = {json.loads(line).get("machine") for line in path.read_text().splitlines() if line.strip()} \
        if path.exists() else set()
    here = machine()
    if not kinds or kinds == {here}:
        return None
    theirs = " / ".join(sorted(str(k) for k in kinds - {here}))
    tag = machine_tag(here)
    return (f"{results} holds pieces measured on {theirs}, and this machine is {here}: continue on that kind, or "
            f"start a folder of this kind: --runs {runs}-{tag} --results {results_flag}-{tag}")


def fingerprint(model: Path) -> str | None:
    """sha256 of a saved model's weight files: a piece built again on another machine says whether it made the
    same model (the same CPU kind and thread count replay the same float operations; another kind does not)."""
    files = sorted(model.glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def archive(out: Path, dest: Path) -> None:
    """An evaluation's transcripts (xz) and results.json into the result folder: what a later machine needs to
    tabulate it without its model."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "transcripts.jsonl.xz").write_bytes(lzma.compress((out / "transcripts.jsonl").read_bytes()))
    for name in ("results.json", "piece.json"):
        if (out / name).exists():
            shutil.copyfile(out / name, dest / name)


LOGS = ("config.json", "metrics.jsonl", "warmstart.jsonl", "provenance.jsonl")


def keep_logs(out: Path, dest: Path) -> None:
    """A training piece's logs into the result folder (train/NAME/, a few kB to 40 kB): what each step did
    (an RL arm's skipped rows: how many of its episodes carried a signal; an imitation run's losses) stays
    readable once runs/ is gone. Weights never."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in LOGS:
        if (out / name).exists() and (out / name).stat().st_size:  # an imitation run's metrics.jsonl is empty
            shutil.copyfile(out / name, dest / name)


def restore(archived: Path, out: Path) -> None:
    """archive's inverse: the evaluation directory evaluate.py wrote, on a machine that never ran it."""
    if (out / "results.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "transcripts.jsonl").write_bytes(lzma.decompress((archived / "transcripts.jsonl.xz").read_bytes()))
    for name in ("results.json", "piece.json"):
        if (archived / name).exists():
            shutil.copyfile(archived / name, out / name)


def played(out: Path) -> int:
    """Episodes an evaluation's transcripts hold (0 before it starts)."""
    path = out / "transcripts.jsonl"
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


def measure(out: Path, kind: str, world: int) -> dict:
    """What a finished piece measured, from its own files: an evaluation's success; an RL run's steps,
    episodes and budgeted CPU seconds (time/cpu_step is the ranks' mean); an imitation run's last line."""
    if kind == "eval":
        from lab.stats import task_means
        rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines() if line.strip()]
        means = task_means(rows)
        return {"success": sum(means.values()) / max(len(means), 1), "tasks": len(means), "episodes": len(rows)}
    if kind == "rl":  # a resumed run logs again the steps after its checkpoint: the last row of a step counts
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rows = list({r.get("step"): r for r in rows}.values())
        return {"steps": len(rows), "episodes_played": int(sum(r.get("episodes", 0) for r in rows)),
                "budget_cpu_s": round(sum(r.get("time/cpu_step", 0.0) * world for r in rows), 1),
                "train_success": rows[-1].get("success") if rows else None, "weights_sha256": fingerprint(out)}
    done = json.loads((out / "warmstart.jsonl").read_text().splitlines()[-1])
    return {"demonstrations": done["demonstrations"], "played": done.get("played"), "optimizer_steps": done["optimizer_steps"],
            "budget_cpu_s": round(done.get("budget_spent", 0.0), 1), "actor": done.get("actor"),
            "weights_sha256": fingerprint(out / "warmstart")}

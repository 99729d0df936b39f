"""The recipe's RL step, two ways side by side: two commits, or one commit with two sets of flags.

    python bench/rl_step.py --model runs/sciworld-smollm2-seed0/warmstart --env sciworld \\
        --a "--compile-generator off" --b "--compile-generator on"        # this tree, two flag sets
    python bench/rl_step.py --model runs/sciworld-smollm2-seed0/warmstart --env sciworld --base-commit ad76be2
                                                                          # that commit (a), this tree (b)

Each arm is train.py as `bash run.sh train` runs it (2 ranks under infra/lifeline.py, or under an older
commit's own launcher; `--preset smollm2`) from the same warm-started model (`--model`, no new warm start:
`--bc-episodes 0`), the same seed and tasks, `--steps` GRPO steps, no in-training evaluation. The arms run one
after the other, (a) then (b), on the same machine; `--rounds 2` runs a, b, b, a so that a drift in the
machine's load hits both. Printed: per arm the mean over its steps of train.py's own timers (metrics.jsonl:
time/step, time/generate, time/update, time/logprobs, time/env, time/sync) and the ratio b / a, with the CPU's
name.
`--base-commit REV` checks REV out into a temporary git worktree for arm (a), so "today's commit against
the new one" is one command.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_name  # noqa: E402

TIMERS = ("time/step", "time/generate", "time/update", "time/logprobs", "time/env", "time/sync")


def run_arm(repo: Path, out: Path, args, flags: list[str]) -> list[dict]:
    """train.py in `repo` for `args.steps` GRPO steps; returns its metrics rows."""
    # the launcher as that commit's run.sh used it: infra/lifeline.py, lifeline.py before the code moved into
    # infra/, torchrun before either existed
    launcher = next((m for m, f in (("infra.lifeline", "infra/lifeline.py"), ("lifeline", "lifeline.py"))
                     if (repo / f).exists()), "torch.distributed.run")
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node", str(args.nproc), "train.py",
           "--preset", "smollm2", "--env", args.env, "--model", str(Path(args.model).resolve()), "--bc-episodes", "0",
           "--eval-every", "0", "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(out), *flags]
    print(f"$ (in {repo.name}) {shlex.join(cmd[1:])}", flush=True)
    proc = subprocess.run(cmd, cwd=repo)
    if proc.returncode:
        raise SystemExit(f"error: the arm in {repo} failed (exit {proc.returncode})")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the warm-started model directory both arms start from")
    p.add_argument("--env", default="babyai")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps per arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=int, default=2, help="ranks (the recipe: 2 on 2 cores)")
    p.add_argument("--a", default="", help="train.py flags of arm a")
    p.add_argument("--b", default="", help="train.py flags of arm b")
    p.add_argument("--base-commit", help="run arm a in a worktree of this commit (arm b: this tree)")
    p.add_argument("--rounds", type=int, default=1, choices=(1, 2), help="2: a, b, b, a")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if not (Path(args.model) / "config.json").exists():
        raise SystemExit(f"error: {args.model} is not a model directory (no config.json); give a run's warmstart/")
    rows: dict[str, list[dict]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        repo_a = ROOT
        if args.base_commit:
            repo_a = Path(tmp) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(repo_a), args.base_commit], cwd=ROOT, check=True)
            (repo_a / "runs").mkdir(exist_ok=True)
        try:
            order = ["a", "b"] if args.rounds == 1 else ["a", "b", "b", "a"]
            for i, arm in enumerate(order):
                repo, flags = (repo_a, args.a) if arm == "a" else (ROOT, args.b)
                rows[arm] += run_arm(repo, Path(tmp) / f"{arm}{i}", args, shlex.split(flags))
        finally:
            if args.base_commit:
                subprocess.run(["git", "worktree", "remove", "--force", str(repo_a)], cwd=ROOT)
    label = {"a": f"a: {args.base_commit or 'this tree'} {args.a}".strip(), "b": f"b: this tree {args.b}".strip()}
    print(f"\nCPU: {cpu_name()}; {args.env}, {args.steps} GRPO steps per arm and round, {args.rounds} round(s), "
          f"{args.nproc} ranks, from {args.model}")
    print(f"| timer (s, mean per step) | {label['a']} | {label['b']} | b / a |")
    print("|---|---|---|---|")
    figures = {"cpu": cpu_name(), "env": args.env, "steps": args.steps, "rounds": args.rounds, "arms": label,
               "a": {}, "b": {}}
    for key in TIMERS:
        a, b = mean(rows["a"], key), mean(rows["b"], key)
        figures["a"][key], figures["b"][key] = a, b
        print(f"| {key} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

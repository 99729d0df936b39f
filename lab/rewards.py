"""SciWorld's training reward, chosen on validation: a short screen of `--reward` x `--success-bonus`.

    python -m lab.rewards [--steps 3] [--val-tasks 32] [--out runs/sciworld-rewards]    # about 1.5-2 hours here
    python -m lab.rewards --table runs/sciworld-rewards                                  # the table again
    python -m lab.rewards --publish runs/sciworld-rewards results/sciworld-rewards       # its evidence, to commit

Why: under SciWorld's own reward (score / 100, -1 for a wrong `focus on`, 0 for running out of turns) a
weak policy gains most by never answering; the recipe's three seeds raised the mean score that way while
success fell (docs/results.md). The screen trains the same warm start (recipes.sciworld_recipe, seed 0)
for `--steps` GRPO steps of the recipe under each of six training rewards: env, progress and best
(batch.REWARDS), each without and with a success bonus of 1, then scores every model and the warm start
on the first `--val-tasks` validation tasks (one sample, the recipe's 16 turns, evaluate.py) by the env's
own score: success (score 100), progress (the score with a failure counted as 0) and the paper's mean
score, each paired against the warm start and against `env` with task-level bootstrap intervals.

The rule, fixed before any result: the variant with the highest validation progress among those whose
validation success is at least `env`'s; `choice.json` records it. No test task is played here.
Every step is resumable: a finished training run or evaluation is skipped on a rerun.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from lab.stats import paired_bootstrap

VARIANTS = {"env": ("env", 0.0), "env+bonus": ("env", 1.0), "progress": ("progress", 0.0),
            "progress+bonus": ("progress", 1.0), "best": ("best", 0.0), "best+bonus": ("best", 1.0)}
LAUNCH = [sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", "2"]
RULE = "the highest validation progress among the variants whose validation success is at least env's"


def run(cmd: list, log: Path) -> None:
    print("$ " + " ".join(map(str, cmd)), flush=True)
    with open(log, "a") as f:
        code = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"error: exit {code}; see {log}")


def screen(args) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    warm = out / "warmstart-run"
    if not (warm / "warmstart" / "config.json").exists():  # the recipe's warm start, seed 0, no RL step
        run([*LAUNCH, "train.py", "--preset", "smollm2", "--env", "sciworld", "--seed", 0, "--steps", 0,
             "--eval-every", 0, "--out", warm], out / "warmstart.log")
    models = {"warm start": warm / "warmstart"}
    for name, (reward, bonus) in VARIANTS.items():
        folder = out / name
        if not (folder / "checkpoints" / "latest").exists() or len(metrics(folder)) < args.steps:
            if not (folder / "warmstart" / "config.json").exists():  # the same warm start for every variant
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copytree(warm / "warmstart", folder / "warmstart", dirs_exist_ok=True)
            run([*LAUNCH, "train.py", "--preset", "smollm2", "--env", "sciworld", "--seed", 0, "--steps", args.steps,
                 "--horizon", args.horizon, "--reward", reward, "--success-bonus", bonus, "--eval-every", 0,
                 "--resume", "--out", folder], out / f"{name}.log")
        models[name] = folder
    config = json.loads((warm / "config.json").read_text())
    for label, model in models.items():
        dest = out / "val" / label.replace(" ", "-")
        if not (dest / "results.json").exists():
            run([*LAUNCH, "evaluate.py", "--env", "sciworld", "--env-options", config["env_options"].replace(" ", ""),
                 "--model", model, "--split", "val", "--limit", args.val_tasks, "--k", 1, "--turns", 16,
                 "--max-tokens", config["max_tokens"], "--max-context", config["max_context"], "--out", dest],
                out / f"val-{dest.name}.log")
    print(table(out))


def metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def outcomes(folder: Path) -> dict[int, dict]:
    """task id -> its one validation episode's env score (reward) and success: from a published folder's
    outcomes.jsonl, else from evaluate.py's transcripts.jsonl."""
    path = folder / "outcomes.jsonl" if (folder / "outcomes.jsonl").exists() else folder / "transcripts.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["task_id"]: {k: r[k] for k in KEEP if k in r} for r in rows}


KEEP = ("task_id", "subtask", "sample", "budget", "reward", "success", "turns", "end")


def evaluated(folder: Path) -> bool:
    return (folder / "outcomes.jsonl").exists() or (folder / "results.json").exists()


FIGURES = {"success": lambda r: float(r["success"]), "progress": lambda r: max(float(r["reward"]), 0.0),
           "mean score": lambda r: float(r["reward"])}


def table(out: Path) -> str:
    labels = ["warm start", *VARIANTS]
    data = {label: outcomes(out / "val" / label.replace(" ", "-")) for label in labels
            if evaluated(out / "val" / label.replace(" ", "-"))}
    tasks = sorted(set.intersection(*(set(d) for d in data.values())))
    lines = [f"Validation: the first {len(tasks)} SciWorld validation tasks x 1 sample, 16 turns; success %, "
             "progress (a failure as 0) and the paper's mean score; paired differences with task-level bootstrap "
             "95% intervals (10,000 resamples, seed 0).", "",
             "| model | success % | progress | mean score | minus the warm start: success, points | progress | "
             "minus env: success, points | progress |", "|---|---|---|---|---|---|---|---|"]
    per = {label: {k: [f(d[t]) for t in tasks] for k, f in FIGURES.items()} for label, d in data.items()}

    def diff(a, b, key, scale):
        if a not in per or b not in per or a == b:
            return ""
        d = paired_bootstrap(per[b][key], per[a][key])
        return f"{scale * d['diff']:+.{1 if scale == 100 else 3}f} [{scale * d['lo']:+.{1 if scale == 100 else 3}f}, " \
               f"{scale * d['hi']:+.{1 if scale == 100 else 3}f}]"

    for label, v in per.items():
        mean = {k: sum(x) / len(x) for k, x in v.items()}
        lines.append(f"| {label} | {100 * mean['success']:.1f} | {mean['progress']:.3f} | {mean['mean score']:+.3f} | "
                     f"{diff(label, 'warm start', 'success', 100)} | {diff(label, 'warm start', 'progress', 1)} | "
                     f"{diff(label, 'env', 'success', 100)} | {diff(label, 'env', 'progress', 1)} |")
    if all(name in per for name in VARIANTS):
        mean = {name: {k: sum(x) / len(x) for k, x in per[name].items()} for name in VARIANTS}
        eligible = [n for n in VARIANTS if mean[n]["success"] >= mean["env"]["success"]]
        chosen = max(eligible, key=lambda n: (mean[n]["progress"], mean[n]["success"]))
        (out / "choice.json").write_text(json.dumps({"rule": RULE, "chosen": chosen, "reward": VARIANTS[chosen][0],
                                                     "success_bonus": VARIANTS[chosen][1], "validation": mean},
                                                    indent=1) + "\n")
        lines += ["", f"Rule (fixed before the screen): {RULE}. Chosen: **{chosen}** "
                      f"(`--reward {VARIANTS[chosen][0]} --success-bonus {VARIANTS[chosen][1]:g}`)."]
    return "\n".join(lines)


def publish(out: Path, dest: Path) -> None:
    """The screen's evidence, without weights: each run's config, metrics and provenance, each validation
    evaluation's config, outcomes and provenance, the table (tables.md) and the choice (choice.json)."""
    dest.mkdir(parents=True, exist_ok=True)
    for run_dir in [out / "warmstart-run", *(out / name for name in VARIANTS)]:
        for name in ("config.json", "metrics.jsonl", "provenance.jsonl", "warmstart.jsonl"):
            if (run_dir / name).exists():
                (dest / "runs" / run_dir.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(run_dir / name, dest / "runs" / run_dir.name / name)
    for folder in sorted((out / "val").iterdir()):
        (dest / "val" / folder.name).mkdir(parents=True, exist_ok=True)
        if not evaluated(folder):
            continue
        for name in ("config.json", "provenance.jsonl", "results.json"):
            if (folder / name).exists():
                shutil.copy(folder / name, dest / "val" / folder.name / name)
        rows = sorted(outcomes(folder).values(), key=lambda r: r["task_id"])
        (dest / "val" / folder.name / "outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table(out)
    if (out / "choice.json").exists():
        shutil.copy(out / "choice.json", dest / "choice.json")
    (dest / "tables.md").write_text(f"# {dest.name}\n\nGenerated by `python -m lab.rewards --table {dest}` from this "
                                    f"folder's files.\n\n{text}\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/sciworld-rewards"))
    p.add_argument("--steps", type=int, default=3, help="GRPO steps per variant (the recipe's 8 at most)")
    p.add_argument("--horizon", default="10", help="their turn budget (the recipe's first stage)")
    p.add_argument("--val-tasks", type=int, default=32, help="validation tasks each model is scored on")
    p.add_argument("--table", type=Path, help="print the table of a finished screen's folder and stop")
    p.add_argument("--publish", type=Path, nargs=2, metavar=("SCREEN", "DEST"), help="copy a screen's evidence")
    args = p.parse_args(argv)
    if args.publish:
        publish(*args.publish)
        return 0
    if args.table:
        print(table(args.table))
        return 0
    screen(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ScalingInter in miniature (the paper's second claim, after "RL works"): from one warm start,
GRPO under staged turn budgets against a fixed short and a fixed long budget, with the same steps,
seeds and everything else; each run's validation curve at one turn budget (--eval-turns), each final
model on the same test tasks, the paired differences between schedules, and a figure.

    python -m lab.horizons --warmstart runs/babyai-smollm2/warmstart --out runs/horizons \
        --arms staged=5,8@4 short=5 long=8 --seeds 0 1 --steps 8 [-- more train.py flags]
    python -m lab.horizons --publish runs/horizons results/horizons-babyai    # the folder to commit
    python -m lab.horizons results/horizons-babyai                           # its tables, from its files only

A run (out/ARM-seedS) or evaluation already finished is skipped, an interrupted one resumes, so the
first command can be repeated after a crash. Arms whose schedules agree on their first k steps (a staged
arm and the fixed arm of its first stage) play those steps once: a later arm of the same seed starts from
the earlier one's checkpoint at step k, with its log rows before k. A run is a pure function of its seed
and step (schedule.py: the tasks, the turn budget and the sampling seed), so this is the run it would have been on its own. The warm start is evaluated on the test tasks too (the
common "before"). The figure is results/NAME/validation.png. Tests: tests/test_horizons.py
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from lab.results import publish
from lab.tables import _jsonl
from schedule import parse as schedule
from lab.stats import clustered_se, paired_table, task_means

LAUNCH = [sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node"]


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmstart", required=True, help="the model every arm starts from: train.py's warmstart/ "
                   "directory, or any train.py --model")
    p.add_argument("--preset", default="smollm2", help="train.py --preset of every run")
    p.add_argument("--out", default="runs/horizons", help="one run directory per arm and seed goes under it")
    p.add_argument("--arms", nargs="+", default=["staged=5,8@4", "short=5", "long=8"],
                   help="NAME=SCHEDULE, a train.py --horizon each")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-tasks", type=int, default=60, help="validation tasks of each in-training evaluation")
    p.add_argument("--eval-turns", type=int, default=0, help="turn budget of every evaluation (0: the largest of all arms)")
    p.add_argument("--test-tasks", type=int, default=100, help="first N test tasks of the final evaluations")
    p.add_argument("--k", type=int, default=1, help="samples per test task")
    p.add_argument("--nproc", type=int, default=2)
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.arms = dict(arm.split("=", 1) for arm in a.arms)
    try:
        parsed = [schedule(h) for h in a.arms.values()]
    except ValueError as exc:
        raise SystemExit(f"error: --arms: {exc}") from None
    a.eval_turns = a.eval_turns or max(max(s.budgets) for s in parsed)
    a.save_every = math.gcd(*[s.stage_length or a.steps for s in parsed])  # a checkpoint at every stage boundary
    return a, extra


def as_args(flags: dict) -> list[str]:
    return [part for key, value in flags.items() for part in (f"--{key}", str(value))]


def run(a: argparse.Namespace, extra: list[str]) -> None:
    out, warm = Path(a.out), Path(a.warmstart)
    if "/" in a.warmstart and not (warm / "config.json").exists():
        raise SystemExit(f"error: {warm} holds no model (config.json); give train.py's warmstart/ directory")
    launch, failed = LAUNCH + [str(a.nproc)], []
    for seed in a.seeds:
        for arm, horizon in a.arms.items():
            d = out / f"{arm}-seed{seed}"
            if not (d / "config.json").exists():
                reuse(out, arm, seed, a)
            if not (d / "checkpoints" / f"step_{a.steps:06d}").exists():
                print(f"== {arm} (--horizon {horizon}), seed {seed}: {d}", flush=True)
                flags = {"preset": a.preset, "model": warm, "bc-episodes": 0, "horizon": horizon, "seed": seed,
                         "steps": a.steps, "eval-every": a.eval_every, "eval-tasks": a.eval_tasks,
                         "eval-turns": a.eval_turns, "save-every": a.save_every, "keep": a.steps, "out": d}
                resume = ["--resume"] if (d / "config.json").exists() else []
                code = subprocess.run(launch + ["train.py", *as_args(flags), *resume, *extra]).returncode
                if code:  # the other arms still run; this one resumes when the command is repeated
                    failed.append(f"{d} (train.py exit {code})")
                    continue
            failed += evaluate(launch, d, d, d / "eval-test", a)
        if seed == a.seeds[0]:  # the common "before", as soon as one run has set the decoding
            failed += evaluate(launch, out / f"{next(iter(a.arms))}-seed{seed}", warm, out / "eval-warmstart", a)
    if failed:
        raise SystemExit("error: not finished: " + "; ".join(failed) + ". Run the same command again to resume.")


def shared_steps(first: str, second: str, steps: int) -> int:
    """How many leading steps two --horizon schedules give the same turn budget."""

    s1, s2 = schedule(first), schedule(second)
    return next((k for k in range(steps) if s1(k) != s2(k)), steps)


def reuse(out: Path, arm: str, seed: int, a: argparse.Namespace) -> None:
    """Start `arm` from the checkpoint of an earlier arm of this seed at the last step their schedules
    share (when it is saved): the checkpoint, and the log rows of the steps before it."""
    names = list(a.arms)
    options = [(shared_steps(a.arms[other], a.arms[arm], a.steps), other) for other in names[:names.index(arm)]]
    for k, other in sorted(options, reverse=True):
        src = out / f"{other}-seed{seed}"
        ckpt = src / "checkpoints" / f"step_{k:06d}"
        if 0 < k < a.steps and (ckpt / "state.json").exists():
            d = out / f"{arm}-seed{seed}"
            shutil.copytree(ckpt, d / "checkpoints" / ckpt.name)
            (d / "checkpoints" / "latest").write_text(ckpt.name + "\n")
            for name in ("metrics.jsonl", "evals.jsonl", "episodes.jsonl"):
                rows = [r for r in _jsonl(src / name) if r["step"] < k]
                (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
            shutil.copyfile(src / "config.json", d / "config.json")  # train.py rewrites it with this arm's flags
            print(f"== {arm}, seed {seed}: steps 0-{k - 1} are {other}'s (the same turn budgets): starting from "
                  f"{ckpt}", flush=True)
            return


def evaluate(launch: list[str], run_dir: Path, model: Path, dest: Path, a: argparse.Namespace) -> list[str]:
    """The test evaluation of `model` with the run's env and decoding (skipped when finished); what failed."""
    if (dest / "results.json").exists():
        return []
    if not (run_dir / "config.json").exists():
        return [f"{dest} (no run to take the decoding from)"]
    cfg = json.loads((run_dir / "config.json").read_text())
    flags = {"model": model, "split": "test", "limit": a.test_tasks, "k": a.k, "turns": a.eval_turns, "out": dest,
             **{key.replace("_", "-"): cfg[key] for key in ("env", "env_options", "max_tokens", "max_context", "engine")}}
    code = subprocess.run(launch + ["evaluate.py", *as_args(flags)]).returncode
    return [f"{dest} (evaluate.py exit {code})"] if code else []


def publish_all(runs: Path, dest: Path) -> None:
    """results/NAME/: warm-start/ and one folder per arm and seed (results.publish), then tables.md."""
    arms = sorted(d for d in runs.iterdir() if (d / "eval-test" / "results.json").exists())
    if not arms:
        raise SystemExit(f"error: {runs} holds no finished run with a test evaluation (eval-test/)")
    publish(None, dest / "warm-start", [("warm start", runs / "eval-warmstart")])
    for d in arms:
        publish(d, dest / d.name, [(d.name.rsplit("-seed", 1)[0], d / "eval-test")])
    (dest / "tables.md").write_text(render(dest))


def load(dest: Path) -> dict:
    """{arm: {seed: {"curve": {steps trained: (successes, tasks)}, "test": outcomes}}} and the warm start."""
    arms: dict = defaultdict(dict)
    for d in sorted(p for p in dest.iterdir() if "-seed" in p.name):
        arm, seed = d.name.rsplit("-seed", 1)
        curve = defaultdict(dict)
        for r in _jsonl(d / "run" / "evals.jsonl"):  # the last outcome of a task at a point wins (a resume re-evaluates)
            curve[r["step"] + (r["eval"] != "eval_start")][r["task_id"]] = float(r["success"])
        test = _jsonl(next((d / "evals").iterdir()) / "outcomes.jsonl")
        arms[arm][int(seed)] = {"curve": {s: (sum(v.values()), len(v)) for s, v in curve.items()}, "test": test}
    warm = _jsonl(dest / "warm-start" / "evals" / "warm-start" / "outcomes.jsonl")
    return {"arms": dict(arms), "warm": warm}


def pooled(seeds: dict, offset: int = 1000) -> list[dict]:
    """One arm's test outcomes over its seeds, a task's samples from every seed kept together."""
    return [{**r, "sample": r["sample"] + offset * i} for i, s in enumerate(sorted(seeds)) for r in seeds[s]["test"]]


def render(dest: Path, resamples: int = 10_000) -> str:
    data = load(dest)
    arms = data["arms"]
    points = sorted({p for seeds in arms.values() for s in seeds.values() for p in s["curve"]})
    lines = [f"# {dest.name}: ScalingInter in miniature", "",
             f"Generated by `python -m lab.horizons results/{dest.name}` from that folder's files. Each arm: GRPO from the same warm "
             "start, one run per seed; the runs' settings are in ARM-seedS/run/config.json.", "",
             "## Validation curves (success %, in-training evaluation, one sample per task)", "",
             "| arm | seed | " + " | ".join(f"step {p}" for p in points) + " |", "|" + "---|" * (len(points) + 2)]
    for arm, seeds in arms.items():
        for seed, s in sorted(seeds.items()):
            cells = [f"{100 * s['curve'][p][0] / s['curve'][p][1]:.1f}" if p in s["curve"] else "" for p in points]
            lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    lines += ["", "## Test (final models; seeds pooled: a task's samples from every seed together)", "",
              "| arm | seeds | tasks | episodes | success % | SE (tasks) | per seed % |", "|---|---|---|---|---|---|---|"]
    rows = [("warm start", {0: {"test": data["warm"]}})] if data["warm"] else []
    for label, seeds in rows + list(arms.items()):
        recs = pooled(seeds)
        means = task_means(recs)
        per_seed = ", ".join(f"{100 * sum(task_means(s['test']).values()) / len(task_means(s['test'])):.1f}"
                             for _, s in sorted(seeds.items()))
        lines.append(f"| {label} | {len(seeds)} | {len(means)} | {len(recs)} | "
                     f"{100 * sum(means.values()) / len(means):.1f} | {100 * clustered_se(list(means.values())):.1f} "
                     f"| {per_seed} |")
    runs = [("warm start", data["warm"])] if data["warm"] else []
    runs += [(arm, pooled(seeds)) for arm, seeds in arms.items()]
    lines += paired_table(runs, resamples)
    return "\n".join(lines) + "\n"


def figure(dest: Path, out: Path) -> Path:
    """Validation success by steps trained: a thin line per seed, a thick line for each arm's mean."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (arm, seeds) in enumerate(load(dest)["arms"].items()):
        color = f"C{i}"
        by_point = defaultdict(list)
        for s in seeds.values():
            xs = sorted(s["curve"])
            ax.plot(xs, [100 * s["curve"][x][0] / s["curve"][x][1] for x in xs], color=color, lw=0.8, alpha=0.4)
            for x in xs:
                by_point[x].append(100 * s["curve"][x][0] / s["curve"][x][1])
        xs = sorted(by_point)
        ax.plot(xs, [sum(by_point[x]) / len(by_point[x]) for x in xs], color=color, lw=2.2, marker="o",
                label=f"{arm} (mean of {len(seeds)} seed{'s' * (len(seeds) > 1)})")
    ax.set(xlabel="GRPO steps", ylabel="validation success %", title=f"{dest.name}: turn schedules from one warm start")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["--publish"]:
        if len(argv) != 3:
            raise SystemExit("usage: python -m lab.horizons --publish RUNS_DIR results/NAME")
        publish_all(Path(argv[1]), Path(argv[2]))
        print(f"figure: {figure(Path(argv[2]), Path(argv[2]) / 'validation.png')}")
        print((Path(argv[2]) / "tables.md").read_text(), end="")
    elif len(argv) == 1 and (Path(argv[0]) / "warm-start").exists():
        print(render(Path(argv[0])), end="")
    else:
        a, extra = parse(argv)
        run(a, extra)


if __name__ == "__main__":
    main(sys.argv[1:])

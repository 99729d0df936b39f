"""The RL step, two ways side by side: two commits, or one commit with two sets of flags; in useful work per CPU-hour.

    python bench/rl_step.py --model WARMSTART --env babyai --steps 3 --rounds 2 --base-commit 30fafca
                                                              # that commit (a) against this tree (b): a, b, b, a
    python bench/rl_step.py --model WARMSTART --env sciworld --common "" \
        --a "--compile-generator off" --b "--compile-generator on"        # this tree, two flag sets

Each arm is train.py as `bash run.sh train` runs it (2 ranks under infra/lifeline.py, or under an older
commit's own launcher; `--preset smollm2`) from the same imitation checkpoint (`--model`, no new warm start:
`--bc-episodes 0`), the same seed and tasks, `--steps` GRPO steps, no in-training evaluation. `--common` holds
the workload both arms share; by default the finite-demonstrations protocol's RL arm as its screen chose it
(lab/protocol.py's "wide-groups": 4 tasks x 8 samples; 8 turns; the recipe's 40 tokens a reply). The arms run
one after the other on the same machine; `--rounds 2` runs a, b, b, a so that a drift in the machine's load hits
both. Printed, per arm, with the CPU's name and the load average before and after:

- episodes per CPU-hour, steady: the steps' episodes over their CPU seconds (`time/cpu_step`, every rank's
  process together: the generator's threads, the envs, the update); and with start-up: every episode over every CPU second the arm's processes used from launch
  to exit (getrusage of the children: loading, the generator's compile, the kernel build included);
- episodes with a non-zero advantage per CPU-hour: the rows the update did not skip (a constant group's rows
  carry no gradient under GRPO without a KL term: `skipped`);
- per unit of work, so that steps of different luck compare (a step whose groups were all constant makes no
  update): a rank's generate seconds per 1,000 tokens it sampled, and its update seconds per episode with a
  non-zero advantage;
- the step's split, from train.py's own timers (seconds, mean per step, the slowest rank's clock averaged over
  ranks): generate, env, logprobs (the scoring pass), update, sync;
- the ratio b / a of each.
`--base-commit REV` checks REV out into a temporary git worktree for arm (a), so "the old commit against the new
one" is one command. A checkpoint the arms cannot load is refused before anything starts.
"""
from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_name  # noqa: E402

TIMERS = ("time/step", "time/generate", "time/env", "time/logprobs", "time/update", "time/sync")
PROTOCOL_RL = "--tasks-per-step 4 --samples-per-task 8 --horizon 8"  # lab/protocol.py's RL arm (wide-groups), 8 turns


def children_cpu() -> float:
    """CPU seconds (user + system) of every finished, waited-for descendant process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"


def run_arm(repo: Path, out: Path, args, flags: list[str]) -> dict:
    """train.py in `repo` for `args.steps` GRPO steps; returns its metrics rows, and the CPU and wall seconds of
    all its processes from launch to exit."""
    # the launcher as that commit's run.sh used it: infra/lifeline.py, lifeline.py before the code moved into
    # infra/, torchrun before either existed
    launcher = next((m for m, f in (("infra.lifeline", "infra/lifeline.py"), ("lifeline", "lifeline.py"))
                     if (repo / f).exists()), "torch.distributed.run")
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node", str(args.nproc), "train.py",
           "--preset", "smollm2", "--env", args.env, "--model", str(Path(args.model).resolve()), "--bc-episodes", "0",
           "--eval-every", "0", "--steps", str(args.steps), "--seed", str(args.seed), "--out", str(out), *flags]
    print(f"$ (in {repo.name}) {shlex.join(cmd[1:])}", flush=True)
    cpu0, wall0, load0 = children_cpu(), time.perf_counter(), load()
    proc = subprocess.run(cmd, cwd=repo)
    if proc.returncode:
        raise SystemExit(f"error: the arm in {repo} failed (exit {proc.returncode})")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"rows": rows, "cpu_s": children_cpu() - cpu0, "wall_s": time.perf_counter() - wall0,
            "load": f"{load0} -> {load()}"}


def figures(runs: list[dict], nproc: int) -> dict:
    """An arm's runs as per-CPU-hour figures (module docstring)."""
    steady = every = [r for run in runs for r in run["rows"]]
    cpu_step = sum(r["time/cpu_step"] * nproc for r in steady)  # time/cpu_step is logged as the ranks' mean
    played = lambda r: r.get("dynamic/played", r["episodes"])  # noqa: E731  (--dynamic-sampling plays more than it trains)
    episodes = sum(played(r) for r in steady)
    useful = sum(r["episodes"] * (1 - r["skipped"]) for r in steady)
    total_cpu = sum(run["cpu_s"] for run in runs)
    out = {"steps": len(steady), "episodes_per_step": episodes / len(steady),
           "cpu_s_per_step": cpu_step / len(steady),
           "episodes_per_cpu_hour": 3600 * episodes / cpu_step, "useful_per_cpu_hour": 3600 * useful / cpu_step,
           "useful_share": useful / episodes,
           "episodes_per_cpu_hour_with_startup": 3600 * sum(played(r) for r in every) / total_cpu,
           "useful_per_cpu_hour_with_startup": 3600 * sum(r["episodes"] * (1 - r["skipped"]) for r in every) / total_cpu,
           "cpu_s_with_startup": total_cpu, "wall_s_with_startup": sum(run["wall_s"] for run in runs),
           "load": [run["load"] for run in runs]}
    out.update({key: mean(steady, key) for key in TIMERS})
    # the largest rank's peak resident memory over the steps' phases (infra/peaks.py), as metrics.jsonl logs it
    out["peak_mb"] = max((v for r in steady for k, v in r.items() if k.startswith("mem/peak/")), default=float("nan"))
    # per unit of work, so that steps of different luck compare: a rank's generate seconds per 1,000 tokens it
    # sampled, and its update seconds per episode that carried a gradient
    sampled = sum(r["response_tokens"] * r["episodes"] / nproc for r in steady)  # the trained episodes' replies
    out["generate_s_per_1k_tokens"] = 1000 * sum(r["time/generate"] for r in steady) / sampled
    out["update_s_per_useful_episode"] = (sum(r["time/update"] for r in steady) / (useful / nproc)
                                          if useful else float("nan"))
    return out


def model_name(path: str) -> str:
    """The model directory as the saved figures name it: relative to the repository, or its own name (a result
    file names no machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name


def mean(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="the warm-started model directory both arms start from (required unless --from)")
    p.add_argument("--env", default="babyai")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps per arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=int, default=2, help="ranks (the recipe: 2 on 2 cores)")
    p.add_argument("--common", default=PROTOCOL_RL, help="train.py flags of both arms: the workload (default: the "
                   "protocol's RL arm, " + PROTOCOL_RL + ")")
    p.add_argument("--a", default="", help="train.py flags of arm a")
    p.add_argument("--b", default="", help="train.py flags of arm b")
    p.add_argument("--base-commit", help="run arm a in a worktree of this commit (arm b: this tree)")
    p.add_argument("--rounds", type=int, default=1, choices=(1, 2), help="2: a, b, b, a")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--from", dest="saved", type=Path, help="print the table of a saved --out file (no runs)")
    args = p.parse_args(argv)
    if args.saved:
        saved = json.loads(args.saved.read_text())
        return report(saved["runs"], saved["label"], saved["setup"], saved["nproc"], None)
    if not args.model:
        p.error("--model is required (or --from a saved run)")
    if not (Path(args.model) / "config.json").exists() or not any(Path(args.model).glob("*.safetensors")):
        raise SystemExit(f"error: {args.model} is not a model directory (no config.json or no *.safetensors "
                         f"weights); give a run's warmstart/")
    runs: dict[str, list[dict]] = {"a": [], "b": []}
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
                runs[arm].append(run_arm(repo, Path(tmp) / f"{arm}{i}", args, shlex.split(args.common + " " + flags)))
        finally:
            if args.base_commit:
                subprocess.run(["git", "worktree", "remove", "--force", str(repo_a)], cwd=ROOT)
    label = {"a": f"a: {args.base_commit or 'this tree'} {args.a}".strip(), "b": f"b: this tree {args.b}".strip()}
    setup = (f"CPU: {cpu_name()}; {args.env}, {args.steps} GRPO steps per arm and round, {args.rounds} round(s), "
             f"{args.nproc} ranks, from {model_name(args.model)}; both arms: {args.common}")
    return report(runs, label, setup, args.nproc, args.out)


def report(runs: dict, label: dict, setup: str, nproc: int, out: Path | None) -> int:
    """The side-by-side table of the arms' runs; with `out`, the runs themselves saved (`--from` reprints them)."""
    f = {arm: figures(runs[arm], nproc) for arm in "ab"}
    print(f"\n{setup}")
    print(f"load average before -> after each run: a {f['a']['load']}, b {f['b']['load']}")
    print(f"| per arm ({f['a']['steps']} / {f['b']['steps']} steps) | {label['a']} | {label['b']} | b / a |")
    print("|---|---|---|---|")
    rows = [("episodes per CPU-hour (steady)", "episodes_per_cpu_hour", "{:.0f}"),
            ("episodes with a non-zero advantage per CPU-hour (steady)", "useful_per_cpu_hour", "{:.0f}"),
            ("episodes per CPU-hour, start-up included", "episodes_per_cpu_hour_with_startup", "{:.0f}"),
            ("non-zero-advantage episodes per CPU-hour, start-up included", "useful_per_cpu_hour_with_startup", "{:.0f}"),
            ("share of episodes with a non-zero advantage", "useful_share", "{:.2f}"),
            ("CPU s per step (all ranks)", "cpu_s_per_step", "{:.1f}"),
            ("generate s per 1,000 sampled tokens (a rank's)", "generate_s_per_1k_tokens", "{:.1f}"),
            ("update s per episode with a non-zero advantage (a rank's)", "update_s_per_useful_episode", "{:.1f}"),
            *((f"{key} (s, mean per step)", key, "{:.1f}") for key in TIMERS),
            ("peak resident MB of the largest rank, over the steps' phases", "peak_mb", "{:.0f}"),
            ("CPU s of the arm's processes, start-up included", "cpu_s_with_startup", "{:.0f}"),
            ("wall s of the arm, start-up included", "wall_s_with_startup", "{:.0f}")]
    for name, key, fmt in rows:
        a, b = f["a"].get(key, float("nan")), f["b"].get(key, float("nan"))  # older files lack newer figures
        print(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {b / a if a else float('nan'):.2f} |")
    if out:
        out.write_text(json.dumps({"setup": setup, "label": label, "nproc": nproc, "runs": runs, "figures": f},
                                  indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

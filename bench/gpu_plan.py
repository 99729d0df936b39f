"""The lent GPU's time, planned before it is spent (bench/gpu_run.py runs the parts): the scales part B runs
at, the device time every call fits in (`DEVICE_PLAN`), and part B's phase seconds (the finite-demonstrations
protocol's W* and its three arms, lab/protocol.py, at GPU scale).

Why a plan: a lent GPU gives 15 minutes of device time for every call together, the machine's start
included, and a phase killed by its call's limit saves nothing. So each part-B phase's seconds are
estimated before it runs, from the generator's benchmark on that GPU and the fixed costs measured on the
first H200 run (`estimate`, `needs`); each phase's timeout is its own seconds plus a margin (`timeout_for`);
the three arms (RL, more imitation, self-imitation; side by side, the same seconds each) get what the other
phases leave (`fit_rl`), fitted again at run time into what the earlier phases really left.

Tests: python -m pytest tests/test_gpu_config.py -k "fit or phase"
"""
from __future__ import annotations

import os


# GPU scale: what part B's seconds are spent on (override with GPU_RUN_<NAME>=value). bc_episodes: the train
# tasks the expert plays once, drawn by demo_seed (the protocol's 10,000 + seed 0): its successes are the finite
# set. W* is wstar_epochs passes over it: the protocol's plateau needs a validation after each epoch, which the
# lent minutes cannot pay for, so the epochs are fixed. 4 leaves the arms a minute; each pass more takes ~15 s
# from them. The CPU plateaus peaked at epoch 2 (AVX2 folder) and 11 (AVX512-BF16, epoch 4 10 points below it):
# this W* may sit short of its plateau, which favours arm B; docs/gpu.md says how to read part B for that.
# rl_seconds caps each arm's seconds, `fit_rl` gives them what the other phases leave; self_episodes: train
# tasks W* may play in the self-imitation arm (for at most half of its seconds); timeout: a phase's where the
# plan gives none
GPU = dict(tasks=64, samples=8, rl_seconds=330, bc_episodes=400, demo_seed=10_000, wstar_epochs=4,
           self_episodes=512, micro_tokens=32768, test_tasks=200, k=2, chunk=200, turns=8, max_tokens=40,
           horizon="6,8@6", timeout=300)
# toy scale on the CPU: the same commands, seconds instead of minutes; every phase's timeout at least 900 s
# (the GPU's estimates say nothing of this CPU: the dry run checks the commands, the tests the GPU's timeouts)
DRY = dict(tasks=2, samples=2, rl_seconds=6, bc_episodes=8, demo_seed=10_000, wstar_epochs=2, self_episodes=4,
           micro_tokens=2048, test_tasks=3, k=2, chunk=3, turns=2, max_tokens=12, horizon="2", timeout=900)

# Device time: a session gets 15 minutes for every call together; a machine's start, the transfers and the
# minutes a machine idles warm count too (the device notes). The set-up call and part B (part A has passed)
# fit in it: tests/test_gpu_config.py adds these up.
DEVICE_S = 900
CHECK_S, GENERATE_S = 90, 120  # the set-up call's phases' timeouts: bench/gpu_check.py, bench/generate.py
BUDGET = {"setup": CHECK_S + GENERATE_S + 5, "A": 170, "B": 450}  # each part's wall seconds (GPU_RUN_BUDGET)
RESERVE = {"setup": 5, "A": 25, "B": 15}  # of which the summary and the copy back keep (Phases.reserve)
DEVICE_PLAN = {
    "machine start": 120,                   # "a minute or more"; a failed start costs 1 to 2 minutes
    "set-up call": 15 + BUDGET["setup"],    # installing the carried wheels (13 MiB), then the part
    "transfers": 2 * 20,                    # the tree and a carried folder (up to 54 MiB) there, results back
    "warm between the two calls": 30,       # the machine goes back after about 30 s idle
    "part B call": 10 + BUDGET["B"],        # the GGUF put together and checked, then the part
    "give_back at once": 10,
}

# a process's start-up with SmolLM2 on the H200 (first run: imports, the model, the engine), and the save that
# ends a training phase (weights, and RL's checkpoint with AdamW's state: assumed, not yet measured)
STARTUP_S, SAVE_S = 20, 15


def scale(dry: bool) -> dict:
    s = dict(DRY if dry else GPU)
    for key in s:
        if f"GPU_RUN_{key.upper()}" in os.environ:
            s[key] = type(s[key])(os.environ[f"GPU_RUN_{key.upper()}"])
    return s


def estimate(s: dict, bench: dict | None) -> dict:
    """Part B's work in seconds before any is run, from the generator's benchmark on this GPU (the set-up
    call's bench/generate.py --device cuda) and fixed costs measured on the first H200 run (docs/gpu.md):
    the GGUF's conversion (36 s), the expert's play (58 ms an episode), the env's share of a 512-episode step
    (1.7 s). Without the benchmark it assumes 5 ms a decode step at batch 512 (1.7x the bound of 3 ms) and
    200k prefill tokens/s, and says so. Assumed too: 0.5 s an imitation step (8 episodes), and 6 s a report
    phase (python -m lab.report: 7 CPU seconds each in the CPU dry run, mostly imports)."""
    decode_ms, prefill = 5.0, 200_000.0
    if bench:
        row = bench["batches"].get("512") or bench["batches"][max(bench["batches"], key=int)]
        decode_ms, prefill = row["decode_ms_per_step"], row["prefill_tokens_per_s"]
    episodes = s["tasks"] * s["samples"]
    turns = int(str(s["horizon"]).split("@")[0].split(",")[-1])
    # a turn: its new tokens prefilled (the observation, ~120 tokens a row) and max_tokens decode steps
    gen = turns * (s["max_tokens"] * decode_ms / 1000 + episodes * 120 / prefill)
    update = 3 * episodes * 700 / 400_000  # old and reference logprobs, then forward + backward: ~400k tokens/s
    bc_steps = -(-int(0.6 * s["bc_episodes"]) // 8)  # one pass over the successful demonstrations (57% on the H200)
    return {"assumed": not bench, "decode_ms_512": decode_ms, "prefill_tokens_s": prefill,
            "grpo_step_s": round(gen + 1.7 * episodes / 512 + update, 1),
            "convert_s": 36, "expert_s": round(0.058 * s["bc_episodes"], 1),
            "imitate_s": 0.5 * bc_steps * s["wstar_epochs"],
            "bc_step_s": 0.5, "evals_s": round(STARTUP_S + 2 * s["test_tasks"] * turns * 0.004
                                               + turns * s["max_tokens"] * decode_ms / 1000, 1),
            "report_s": 6}


def needs(s: dict, est: dict) -> dict:
    """Each part-B phase's seconds, by name: its own work, a process's start-up and the save that ends it.
    train.py stops after the step during which --rl-seconds ran out (the arms run no validation);
    --bc-seconds likewise ends after an optimizer step, and counts the expert's replay of the finite set (the
    imitation arm plays it again) or W*'s own play; self-imitation's play stops between rounds of its
    env pool, so it may overrun its half by one round (a GRPO step's generation bounds it). The four
    evaluations and the three report phases each need the same."""
    rl = s["rl_seconds"]
    return {"b0-convert": est["convert_s"],
            "b1-wstar": STARTUP_S + est["expert_s"] + est["imitate_s"] + SAVE_S,
            "b2-rl": STARTUP_S + rl + est["grpo_step_s"] + SAVE_S,
            "b2-imitation": STARTUP_S + max(rl, est["expert_s"]) + est["bc_step_s"] + SAVE_S,  # replays included
            "b2-self": STARTUP_S + rl + est["grpo_step_s"] + est["bc_step_s"] + SAVE_S,
            "b3-eval": est["evals_s"], "b4-report": est["report_s"]}


ARMS = ("b2-rl", "b2-imitation", "b2-self")


def timeout_for(need: float) -> int:
    """A phase's timeout: its estimated seconds and a margin for the estimate (a fifth more, and 10 s)."""
    return int(need * 1.2 + 10)


def fit_rl(s: dict, est: dict, left: float) -> int:
    """The most seconds an arm gets, at most s["rl_seconds"] and at least 30, for which the three arms'
    timeouts (side by side: the longest counts), then the evaluations' and the three report phases', fit in
    `left` seconds."""
    rl = s["rl_seconds"]
    while rl > 30:
        n = needs({**s, "rl_seconds": rl}, est)
        after = timeout_for(n["b3-eval"]) + 3 * timeout_for(n["b4-report"])
        if timeout_for(max(n[arm] for arm in ARMS)) + after <= left:
            break
        rl -= 5
    return rl


def plan_b(s: dict, est: dict, budget: float, reserve: float) -> dict:
    """Part B's plan before it runs: the conversion and W* taking their whole timeouts, the arms fitted into
    what they leave (at run time they are fitted again into what those really left); each phase's need and
    timeout, and the sum of the timeouts of its stages (phases side by side count once: the longest)."""
    first = needs(s, est)
    used = timeout_for(first["b0-convert"]) + timeout_for(first["b1-wstar"])
    s = {**s, "rl_seconds": fit_rl(s, est, budget - reserve - used)}
    n = needs(s, est)
    phases = {name: {"need": round(v), "timeout": timeout_for(v)} for name, v in n.items()}
    arm = max(ARMS, key=lambda name: phases[name]["timeout"])
    stages = ("b0-convert", "b1-wstar", arm, "b3-eval", "b4-report", "b4-report", "b4-report")
    return {"rl_seconds": s["rl_seconds"], "phases": phases,
            "grpo_steps_expected": int(s["rl_seconds"] // est["grpo_step_s"]),
            "timeouts_s": sum(phases[name]["timeout"] for name in stages), "budget_s": budget, "reserve_s": reserve}

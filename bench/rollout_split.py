"""Where one rank's rollout spends its generation on a CPU: the prefill of each turn's new tokens and the
decode steps, each beside the float32 (or bf16) matmul peak measured in the same run.

    python bench/rollout_split.py --model RUN/warmstart [--env babyai --tasks 2 --samples 8 --turns 8]

The workload is one rank's share of the finite-demonstrations protocol's RL arm (BabyAI, 4 tasks x 8 samples
over 2 ranks: 2 tasks x 8 here, 8 turns, 40 tokens a reply, temperature 1), played by `rollout()` with the
generator `engine auto` picks on this CPU (infra/decode.py's loop; the split needs it: vLLM does not say
which of its seconds were prefill). One warm-up rollout, then `--repeats` timed ones, other seeds each.

Printed per rollout and in total, with the CPU's name and the load average:
- prefill: the tokens prefilled (a turn's prompt minus what the rows kept from the last turn), seconds, and
  the linear layers' FLOP/s over those seconds (2 x the decoder's linear parameters a token; attention is
  the rest of the seconds, so this is a floor of the arithmetic rate);
- decode: steps, rows a step, ms a step, the linear layers' FLOP/s (the LM head included), and the share of
  row-steps that sampled a token (a call decodes until its longest reply ends; finished rows ride along);
- the matmul peak of one thread (`--threads`), the compute bound both are set against;
- `--profile N`: one more rollout under torch.profiler, its N ops with the most own time (the decode
  attention loop is a C++ extension the profiler does not see: its seconds are in the rollout's own line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def linear_parameters(model) -> tuple[int, int]:
    """(the decoder layers' linear weights, the LM head's): what a token multiplies through."""
    import torch

    layers = sum(m.weight.numel() for m in model.get_decoder().layers.modules() if isinstance(m, torch.nn.Linear))
    return layers, model.get_output_embeddings().weight.numel()


def play(eng, chat, env_list, make_env, plan, args, seed: int) -> dict:
    from rollout import Play, rollout

    spent = {"_build": 0.0, "_decode": 0.0}
    rows_steps = [0]
    originals = {name: getattr(eng, name) for name in spent}

    def timed(name):
        def call(*a, **k):
            steps = eng.stats["decode_steps"]
            t = time.perf_counter()
            out = originals[name](*a, **k)
            spent[name] += time.perf_counter() - t
            if name == "_decode":
                rows_steps[0] += len(a[0]) * (eng.stats["decode_steps"] - steps)
            return out
        return call

    for name in spent:
        setattr(eng, name, timed(name))
    before = dict(eng.stats)
    t = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            eps, timing = rollout(eng, chat, env_list, make_env, plan,
                                  Play(args.turns, args.max_tokens, args.max_context, args.temperature, 1.0, seed), pool)
    finally:
        for name in spent:
            delattr(eng, name)  # the class's methods again
    return {"wall_s": time.perf_counter() - t, "generate_s": timing["generate"], "env_s": timing["env"],
            "prefill_s": spent["_build"], "decode_s": spent["_decode"],
            "prefill_tokens": eng.stats["prefill_tokens"] - before["prefill_tokens"],
            "reused_tokens": eng.stats["reused_tokens"] - before["reused_tokens"],
            "decode_steps": eng.stats["decode_steps"] - before["decode_steps"], "row_steps": rows_steps[0],
            "sampled_tokens": sum(sum(e.mask) for e in eps), "turns": sum(e.turns for e in eps),
            "episodes": len(eps), "solved": sum(bool(e.success) for e in eps)}


def profiled(eng, chat, env_list, make_env, plan, args) -> dict:
    """One rollout under torch.profiler: its `args.profile` ops with the most own time, and the rollout's
    own line (Python and what the profiler does not see)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("the rollout itself"):
            play(eng, chat, env_list, make_env, plan, args, seed=1000)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) / 1e6
    return {"rollout_s": total, "ops": [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in rows[:args.profile]]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model directory (the protocol's warm start, W*)")
    p.add_argument("--env", default="babyai")
    p.add_argument("--env-options", default='{"brief": true}')
    p.add_argument("--tasks", type=int, default=2, help="train tasks of one rank's rollout")
    p.add_argument("--samples", type=int, default=8, help="episodes a task (the group)")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=2, help="timed rollouts after one warm-up")
    p.add_argument("--threads", type=int, default=1, help="threads of the rank (torchrun: cores / ranks)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="also profile one rollout: its top N ops")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():  # one line before any heavy start-up
        print(f"error: --model {args.model} holds no config.json: give a checkpoint directory (e.g. a run's "
              "warmstart/)", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    import envs
    from bench.machine import cpu_name, matmul_peak
    from engine import make_engine
    from infra.engines import engine_kind
    from launch import checks
    from rollout import ChatFormat
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    if (kind := engine_kind("auto", "cpu")) != "torch":
        print(f"error: engine auto picks {kind} on this CPU; the split needs infra/decode.py's loop "
              "(its prefill and decode are timed apart)", file=sys.stderr)
        return 2
    dtype = checks.compute_dtype(args.dtype, "cpu", args.model)
    options = json.loads(args.env_options)
    make_env = lambda: envs.make(args.env, **options)  # noqa: E731
    ids = make_env().tasks("train")
    plan = [(ids[(7919 * (t + 1)) % len(ids)], t) for t in range(args.tasks) for _ in range(args.samples)]
    env_list = [make_env() for _ in plan]
    eng = make_engine(args.model, "torch", "cpu", dtype, args.max_context, 0)
    chat = ChatFormat(AutoTokenizer.from_pretrained(args.model), args.model)
    layers, head = linear_parameters(eng.model)
    peak = matmul_peak(getattr(torch, dtype))
    play(eng, chat, env_list, make_env, plan, args, seed=1)  # warm-up: the kernel's build, the allocator
    runs = [play(eng, chat, env_list, make_env, plan, args, seed=2 + r) for r in range(args.repeats)]
    total = {k: sum(r[k] for r in runs) for k in runs[0]}
    top = profiled(eng, chat, env_list, make_env, plan, args) if args.profile else None

    def figures(r: dict) -> dict:
        return {"prefill_linear_gflops": 2 * layers * r["prefill_tokens"] / r["prefill_s"] / 1e9,
                "decode_ms_per_step": 1000 * r["decode_s"] / r["decode_steps"],
                "decode_rows_per_step": r["row_steps"] / r["decode_steps"],
                "decode_linear_gflops": 2 * (layers + head) * r["row_steps"] / r["decode_s"] / 1e9,
                "sampled_share_of_row_steps": r["sampled_tokens"] / r["row_steps"],
                "prefill_share_of_generate": r["prefill_s"] / r["generate_s"],
                "decode_share_of_generate": r["decode_s"] / r["generate_s"]}

    out = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "dtype": dtype,
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "matmul_peak_gflops": peak / 1e9, "linear_parameters": {"layers": layers, "head": head},
           "workload": {k: getattr(args, k) for k in ("env", "env_options", "tasks", "samples", "turns", "max_tokens",
                                                      "temperature", "repeats")},
           "rollouts": [{**r, **figures(r)} for r in runs], "total": {**total, **figures(total)}, "profile": top}
    t, f = total, figures(total)
    print(f"CPU: {out['cpu']} ({out['cores']} cores), {dtype}, {args.threads} thread(s); load average "
          f"{' '.join(f'{x:.2f}' for x in load_before)} before, {' '.join(f'{x:.2f}' for x in out['load_average_after'])} after")
    print(f"matmul peak of {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s ({dtype})")
    print(f"{args.repeats} rollouts of {args.tasks} tasks x {args.samples} samples, {args.turns} turns, "
          f"{args.max_tokens} tokens: {t['episodes']} episodes, {t['turns']} turns, {t['solved']} solved")
    print("| | seconds | share of generate | tokens or steps | linear GFLOP/s | of the peak |")
    print("|---|---|---|---|---|---|")
    print(f"| prefill | {t['prefill_s']:.1f} | {f['prefill_share_of_generate']:.0%} | {t['prefill_tokens']:,} tokens "
          f"({t['reused_tokens']:,} kept from the last turn) | {f['prefill_linear_gflops']:.1f} | "
          f"{f['prefill_linear_gflops'] / (peak / 1e9):.0%} |")
    print(f"| decode | {t['decode_s']:.1f} | {f['decode_share_of_generate']:.0%} | {t['decode_steps']} steps of "
          f"{f['decode_rows_per_step']:.1f} rows, {f['decode_ms_per_step']:.0f} ms each | "
          f"{f['decode_linear_gflops']:.1f} | {f['decode_linear_gflops'] / (peak / 1e9):.0%} |")
    print(f"generate {t['generate_s']:.1f} s of {t['wall_s']:.1f} s wall; {t['sampled_tokens']:,} tokens sampled in "
          f"{t['row_steps']:,} row-steps ({f['sampled_share_of_row_steps']:.0%})")
    if top:
        print(f"one more rollout under torch.profiler ({top['rollout_s']:.1f} s): own seconds by op")
        for name, seconds, calls in top["ops"]:
            print(f"  {name}: {seconds:.1f} s ({seconds / top['rollout_s']:.0%}), {calls:,} calls")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The generator as train.py builds it, beside the machine's memory-bandwidth bound.

    python bench/generate.py [--batch 16] [--prompt 600] [--new 32] [--threads 1] [--episodes RUN/episodes.jsonl]
    python bench/generate.py --compare      # vLLM eager, then torch.compile'd, side by side
    python bench/generate.py --device cuda  # infra/decode.py's own loop on a GPU (bench/decode_loop.py)
    python bench/generate.py --engine torch --levers [--vllm compiled]   # its CPU levers one at a time, and vLLM
                                                                          # (bench/decode_levers.py)

One process plays one rank: `engine.make_engine` (vLLM's CPU build, in-process) for SmolLM2-135M-Instruct in
the compute dtype `--dtype auto` picks, with the recipe's per-rank batch (`--batch`: 8 tasks x 4 samples over
2 ranks) and its thread split (`--threads 1`: torchrun gives each of 2 ranks one thread on 2 cores). Measured
side by side in one run, every figure with the CPU's name:

- read bandwidth: a float32 sum over 512 MB, with `--threads` threads and with every core;
- the bound of one decode step: the weights' bytes read once, at that bandwidth; and with the KV cache of
  the batch at its prompt length read as well (attention reads every cached token of every sequence);
- decode, ms per step, at `--batch` and at 1: (time for `--new` tokens - time for 1) / (`--new` - 1), the
  prompts already prefix-cached, every request running to `--new` tokens (ignore_eos). Three sampler
  settings: the project's (temperature 1, the sampled token's logprob: a log-softmax over the vocabulary),
  without the logprob, and greedy without it, so the sampler's share shows;
- prefill, tokens/s, on fresh prompts;
- stragglers, from a recipe run's episodes.jsonl (`--episodes`): a turn's generate call runs until its
  longest reply ends; the share of its decode steps during which more than half of the batch is still live.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.machine import timed, bandwidth, cpu_name  # noqa: E402


def stragglers(path: Path) -> dict:
    """From a run's episodes.jsonl: per (step, turn), the sampled reply lengths of the episodes that took
    that turn; a generate call runs max(lengths) decode steps, and at step s the live sequences are those
    longer than s. Returns the share of decode steps with more than half of the batch live."""
    turns: dict[tuple, list[int]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        replies = [seg["tokens"] for seg in row.get("segments", []) if seg.get("trained")]
        for t, n in enumerate(replies):
            turns.setdefault((row["step"], t), []).append(n)
    steps = busy = 0
    for lengths in turns.values():
        longest = max(lengths)
        steps += longest
        busy += sum(sum(n > s for n in lengths) > len(lengths) / 2 for s in range(longest))
    return {"turn_calls": len(turns), "decode_steps": steps, "half_live_share": busy / max(steps, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="one rank's episodes per generate call (the recipe: 16)")
    p.add_argument("--prompt", type=int, help="prompt tokens (default 600, a mid-episode BabyAI context; "
                   "1,000 with --engine torch)")
    p.add_argument("--new", type=int, help="decode steps timed per call (default 32; 64 with --engine torch)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: infra/decode.py's loop on the GPU (implies --engine torch; bench/decode_loop.py)")
    p.add_argument("--engine", choices=("vllm", "torch"), default="vllm",
                   help="vllm (CPU build) or torch: infra/decode.py's own loop, random weights of SmolLM2's shape")
    p.add_argument("--batches", type=int, nargs="+", default=[64, 256, 512], help="--engine torch: batch sizes")
    p.add_argument("--hf-new", type=int, default=16,
                   help="--engine torch: also time transformers' generate for this many tokens (0: no)")
    p.add_argument("--threads", type=int, default=1, help="threads of the rank (torchrun: cores / ranks)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it), bfloat16 or float32")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="vLLM's KV cache dtype: auto (the model's) or e.g. fp8_e4m3 (half the bytes attention reads)")
    p.add_argument("--episodes", type=Path, help="a recipe run's episodes.jsonl, for the straggler share")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager",
                   help="vLLM's model eager (enforce_eager) or torch.compile'd by inductor (engine.compiles)")
    p.add_argument("--compare", action="store_true",
                   help="run eager, then compiled, each in its own process, and print them side by side")
    p.add_argument("--levers", action="store_true",
                   help="--engine torch on the CPU: infra/decode.py's levers side by side (bench/decode_levers.py)")
    p.add_argument("--vllm", choices=("eager", "compiled"),
                   help="--levers: vLLM's CPU build in the same process and rounds, eager or compiled")
    p.add_argument("--rounds", type=int, default=4, help="--levers: rounds over the variants, alternated")
    p.add_argument("--profile", action="store_true", help="--levers: where a plain and a levered step go")
    p.add_argument("--profile-variant", help="--levers --profile: the levered variant profiled (default the last)")
    args = p.parse_args(argv)
    if args.levers:
        from bench import decode_levers
        args.prompt, args.new = args.prompt or 620, args.new or 24
        return decode_levers.main(args)
    if args.device == "cuda" or args.engine == "torch":
        from bench import decode_loop
        args.prompt, args.new = args.prompt or 1000, args.new or 64
        return decode_loop.main(args)
    args.prompt, args.new = args.prompt or 600, args.new or 32
    if args.compare:
        return compare(args, [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--compare"])
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from launch import checks
    from engine import make_engine
    from models import resolve_model

    cores = os.cpu_count() or 1
    bw = {"rank": bandwidth(args.threads), "all": bandwidth(cores)}
    torch.set_num_threads(args.threads)
    model_dir = resolve_model("smollm2")
    dtype = checks.compute_dtype(args.dtype, "cpu", "smollm2")
    start = time.perf_counter()
    engine = make_engine(model_dir, "vllm", "cpu", dtype, 2048, 0, max_seqs=args.batch,
                         vllm=dict(compile="on" if args.mode == "compiled" else "off",
                                   kv_cache_dtype=args.kv_cache_dtype))
    start = time.perf_counter() - start  # compiled: inductor's build, or its cache's load
    weights = _weight_bytes(model_dir, dtype)
    kv = _kv_bytes(model_dir, dtype, args.batch, args.prompt)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    gen = torch.Generator().manual_seed(0)
    vocab = 49152

    def prompts(n: int) -> list:
        return [TokensPrompt(prompt_token_ids=torch.randint(100, vocab, (args.prompt,), generator=gen).tolist())
                for _ in range(n)]

    settings = {"project (T=1, logprob)": dict(temperature=1.0, logprobs=0),
                "T=1, no logprob": dict(temperature=1.0), "greedy, no logprob": dict(temperature=0.0)}

    def run(batch: list, tokens: int, kw: dict) -> float:
        sp = SamplingParams(max_tokens=tokens, ignore_eos=True, detokenize=False, seed=None, **kw)
        return timed(lambda: engine.llm.generate(batch, [sp] * len(batch), use_tqdm=False))

    rows = {}
    for size in (args.batch, 1):
        batch = prompts(size)
        run(batch, 1, settings["project (T=1, logprob)"])  # prefill once: later calls hit the prefix cache
        for name, kw in settings.items():
            one = min(run(batch, 1, kw) for _ in range(2))
            full = min(run(batch, args.new, kw) for _ in range(2))
            rows[f"decode ms/step, batch {size}, {name}"] = 1000 * (full - one) / (args.new - 1)
        fresh = prompts(size)
        rows[f"prefill tokens/s, batch {size}"] = size * args.prompt / run(fresh, 1, settings["project (T=1, logprob)"])
    bound = 1000 * weights / (bw["rank"] * 1e9)
    bound_kv = 1000 * (weights + kv) / (bw["rank"] * 1e9)
    figures = {"cpu": cpu_name(), "threads": args.threads, "dtype": dtype, "batch": args.batch, "prompt": args.prompt,
               "bandwidth_gbs": bw, "weight_bytes": weights, "kv_bytes_at_prompt": kv,
               "bound_ms": bound, "bound_with_kv_ms": bound_kv, "mode": args.mode, "kv_cache_dtype": args.kv_cache_dtype,
               "engine_start_s": start, **rows}
    if args.episodes:
        figures["stragglers"] = stragglers(args.episodes)
    print(f"CPU: {figures['cpu']} ({cores} cores), {dtype}, {args.threads} thread(s) a rank, vLLM {args.mode} "
          f"(engine start {start:.0f} s)")
    print(f"read bandwidth: {bw['rank']:.1f} GB/s ({args.threads} thread), {bw['all']:.1f} GB/s ({cores})")
    print(f"weights {weights / 1e6:.0f} MB, KV cache of {args.batch} x {args.prompt} tokens {kv / 1e6:.0f} MB")
    print("| figure | value | against the bound |")
    print("|---|---|---|")
    print(f"| bound: weights read once | {bound:.1f} ms | |")
    print(f"| bound: weights + the batch's KV cache | {bound_kv:.1f} ms | |")
    for name, value in rows.items():
        if name.startswith("decode"):
            ref = bound_kv if f"batch {args.batch}," in name else bound
            print(f"| {name} | {value:.1f} ms | {value / ref:.1f}x |")
        else:
            print(f"| {name} | {value:,.0f} | |")
    if args.episodes:
        s = figures["stragglers"]
        print(f"| stragglers ({args.episodes.name}): decode steps with > half the batch live | "
              f"{100 * s['half_live_share']:.0f}% of {s['decode_steps']:,} | |")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    engine.close()
    return 0


def compare(args, argv: list[str]) -> int:
    """Eager, then compiled, each a fresh process (one vLLM per process), one after the other on the same
    machine; their figures side by side, and both in --out."""
    import subprocess
    import tempfile

    rest = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]
    modes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("eager", "compiled"):
            out = Path(tmp) / f"{mode}.json"
            proc = subprocess.run([sys.executable, __file__, *rest, "--mode", mode, "--out", str(out)])
            if proc.returncode:
                print(f"error: the {mode} run failed (exit {proc.returncode})", file=sys.stderr)
                return proc.returncode
            modes[mode] = json.loads(out.read_text())
    eager, compiled = modes["eager"], modes["compiled"]
    print(f"\nside by side: {eager['cpu']}, {eager['dtype']}, {eager['threads']} thread(s), batch {eager['batch']}")
    print("| figure | eager | compiled | compiled / eager |")
    print("|---|---|---|---|")
    for name in [k for k in eager if k.startswith(("decode", "prefill")) or k == "engine_start_s"]:
        a, b = eager[name], compiled[name]
        print(f"| {name} | {a:,.1f} | {b:,.1f} | {b / a:.2f} |")
    for mode, f in modes.items():
        step = f[f"decode ms/step, batch {f['batch']}, project (T=1, logprob)"]
        print(f"{mode}: decode at batch {f['batch']} with the project's sampler is {step / f['bound_with_kv_ms']:.2f}x "
              "the weights + KV bound")
    if args.out:
        args.out.write_text(json.dumps({"modes": modes}, indent=1) + "\n")
    return 0


def _weight_bytes(model_dir: str, dtype: str) -> int:
    """Bytes of the weights one decode step reads: every parameter once in the compute dtype (the tied
    embedding counted once: the LM head reads it, the input side only one row per sequence)."""
    from safetensors import safe_open
    size = 2 if dtype == "bfloat16" else 4
    total = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                total += _numel(st.get_slice(name).get_shape())
    return total * size


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _kv_bytes(model_dir: str, dtype: str, batch: int, tokens: int) -> int:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head
    return batch * tokens * per_token * (2 if dtype == "bfloat16" else 4)


if __name__ == "__main__":
    raise SystemExit(main())

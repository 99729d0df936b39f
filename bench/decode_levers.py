"""infra/decode.py's CPU levers one at a time, beside the weights + KV bound and vLLM, side by side in one process.

    python bench/generate.py --engine torch --levers [--batch 16] [--prompt 620] [--new 24] [--threads 1]
    python bench/generate.py --engine torch --levers --vllm compiled      # `engine auto` on the CPU as well

SmolLM2-135M-Instruct (the real weights) in the compute dtype `--dtype auto` picks on this CPU, one rank's
batch of `--batch` random prompts of `--prompt` tokens, `--threads` threads (torchrun gives each of 2 ranks one
thread on 2 cores). One TorchEngine runs every variant: its two switches (`packed`: the linear layers through
weights packed once for oneDNN, q/k/v and gate/up fused; `kept_attention`: decode attention as two matrix
products over the kept positions instead of SDPA's flash kernel; `kernel`: the same as one C++ loop that reads
each cached key and value once, infra/decode_kernel.py) are set between calls, so every variant
reads the same weights and KV rows. The variants run in rounds, the order reversed every other round
(A B C, C B A, ...), so a drift in the machine's load hits every variant; per variant the median and the best
of the rounds are printed.

Figures, every one with the CPU's name and the load average before and after:
- read bandwidth with `--threads` threads, and the bound of a decode step: the weights' bytes plus the batch's
  KV cache at its mean context, read once at that bandwidth;
- decode ms per step: (a call of `--new` tokens - a call of 1) / (`--new` - 1), the prompts' KV already cached,
  every row forced to `--new` tokens (no stop id), the project's sampler (temperature 1, the sampled token's
  logprob); the same way for vLLM (bench/generate.py's own measure); and for the decode loop its own clock
  over the steps after its two warm-up steps (`steady`), which subtracts nothing and so suffers less from a
  loaded machine;
- where a plain and a levered step go: torch.profiler's self time per decode step, by kind of op.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name -> (packed, kept_attention, kernel)
    "plain (SDPA, module weights)": (False, False, False),
    "packed weights": (True, False, False),
    "kept attention": (False, True, False),
    "packed + kept attention": (True, True, False),
    "packed + attention loop (C++)": (True, True, True),
}
# torch.profiler op names by kind, for "where a step goes"
KINDS = {"linear layers": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"),
         "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::_softmax",
                       "aten::_scaled_dot_product_attention_math"),
         "KV written (scatter)": ("aten::scatter_",),
         "the call's KV rows copied (once a call)": ("aten::index",)}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"


def main(args) -> int:
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from launch import checks
    from bench.generate import _kv_bytes, _weight_bytes
    from bench.machine import bandwidth, cpu_name
    from infra.decode import TorchEngine
    from infra.samples import Sampling
    from models import resolve_model

    torch.set_num_threads(args.threads)
    load_before = load()
    model_dir = resolve_model("smollm2")
    dtype = checks.compute_dtype(args.dtype, "cpu", "smollm2")
    bw = bandwidth(args.threads)
    weights = _weight_bytes(model_dir, dtype)
    context = args.prompt + args.new / 2
    kv = _kv_bytes(model_dir, dtype, args.batch, int(context))
    bound_ms = 1000 * (weights + kv) / (bw * 1e9)

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 49152, (args.prompt,), generator=gen).tolist() for _ in range(args.batch)]
    forced = lambda n: Sampling(max_tokens=n, seed=1)  # noqa: E731  (no stop ids: every row runs to n)
    eng = TorchEngine(model_dir, "cpu", dtype)
    eng.generate(prompts, forced(1))  # the prefill: every later call reuses these rows

    def timed(n: int) -> float:
        start = time.perf_counter()
        eng.generate(prompts, forced(n))
        return time.perf_counter() - start

    variants = dict(VARIANTS)
    runners = {name: lambda n: timed(n) for name in variants}
    vllm = None
    if args.vllm:
        from engine import make_engine
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        start = time.perf_counter()
        vllm = make_engine(model_dir, "vllm", "cpu", dtype, 2048, 0, max_seqs=args.batch,
                           vllm=dict(compile="on" if args.vllm == "compiled" else "off"))
        vllm_start_s = time.perf_counter() - start
        tokens = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def vllm_timed(n: int) -> float:
            sp = SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False, temperature=1.0, logprobs=0)
            start = time.perf_counter()
            vllm.llm.generate(tokens, [sp] * len(tokens), use_tqdm=False)
            return time.perf_counter() - start
        vllm_timed(1)  # its prefill: later calls hit its prefix cache
        runners[f"vLLM CPU ({args.vllm}; engine auto)"] = vllm_timed

    def use(name: str) -> None:
        if name in variants:
            eng.packed, eng.kept_attention, eng.kernel = variants[name]
            eng.linears = None  # packed (or not) again on the next call

    results = {name: [] for name in runners}
    steady = {name: [] for name in variants}  # the engine's own clock: decode steps only, no per-call work
    names = list(runners)
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            use(name)
            run = runners[name]
            run(args.new)  # warm: this variant's shapes, its packing, its graph
            one = min(run(1) for _ in range(2))
            before = dict(eng.stats)
            full = run(args.new)
            results[name].append(1000 * (full - one) / (args.new - 1))
            if name in steady:
                steady[name].append(1000 * (eng.stats["steady_s"] - before["steady_s"])
                                    / (eng.stats["steady_steps"] - before["steady_steps"]))
            print(f"round {r + 1}: {name}: {results[name][-1]:.1f} ms/step"
                  + (f" (steady {steady[name][-1]:.1f})" if name in steady else ""), flush=True)

    where = {}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for name in (names[0], args.profile_variant or names[len(variants) - 1]):
            use(name)
            eng.generate(prompts, forced(args.new))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                eng.generate(prompts, forced(args.new))
            steps = args.new
            kinds = dict.fromkeys(KINDS, 0.0)
            total = 0.0
            for e in prof.key_averages():
                ms = e.self_cpu_time_total / 1000 / steps
                total += ms
                for kind, ops in KINDS.items():
                    if e.key in ops:
                        kinds[kind] += ms
            kinds["everything else (norms, rotary, sampler, Python)"] = total - sum(kinds.values())
            where[name] = {"total_ms_per_step": total, **kinds}

    figures = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "dtype": dtype,
               "model": "SmolLM2-135M-Instruct", "batch": args.batch, "prompt": args.prompt, "new": args.new,
               "load_average_before": load_before, "load_average_after": load(), "bandwidth_gbs": bw,
               "weight_bytes": weights, "kv_bytes_at_mean_context": kv, "bound_ms": bound_ms,
               "decode_ms_per_step": results, "steady_ms_per_step": steady, "rounds": args.rounds, "where_a_step_goes_ms": where}
    if vllm is not None:
        figures["vllm_start_s"] = vllm_start_s
    print(f"\nCPU: {figures['cpu']} ({figures['cores']} cores), {dtype}, {args.threads} thread(s); load average "
          f"{load_before} before, {figures['load_average_after']} after")
    print(f"read bandwidth {bw:.1f} GB/s; weights {weights / 1e6:.0f} MB + KV of {args.batch} x {context:.0f} tokens "
          f"{kv / 1e6:.0f} MB: bound {bound_ms:.1f} ms a step")
    print(f"| decode at batch {args.batch}, ms/step | median | best | median / bound | median / plain | "
          "steady clock: median | its / plain |")
    print("|---|---|---|---|---|---|---|")
    plain, plain_steady = statistics.median(results[names[0]]), statistics.median(steady[names[0]])
    for name, ms in results.items():
        med = statistics.median(ms)
        own = f"{statistics.median(steady[name]):.1f} | {statistics.median(steady[name]) / plain_steady:.2f}" \
            if name in steady else " | "
        print(f"| {name} | {med:.1f} | {min(ms):.1f} | {med / bound_ms:.1f}x | {med / plain:.2f} | {own} |")
    for name, kinds in where.items():
        print(f"\nwhere a step goes, {name} (torch.profiler, ms a step):")
        for kind, ms in kinds.items():
            print(f"  {kind}: {ms:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.out}")
    if vllm is not None:
        vllm.close()
    return 0

"""The other way to generate on a CPU: transformers' own model with a static KV cache, beside the bound.

    python bench/hf_decode.py [--batch 16] [--prompt 600] [--new 32] [--threads 1] [--vllm bench/results/X.json]

vLLM's CPU build spends about 40% of a recipe's decode step in its paged-attention kernel (docs/performance.md).
This benchmark measures the alternative that replaces that kernel and vLLM's scheduler: SmolLM2 in
transformers, one rank's batch of `--batch` prompts of `--prompt` tokens, decoding `--new` tokens with the
project's sampler (temperature 1, the sampled token's logprob), in one process with `--threads` threads:

- `dynamic`: the default cache, which grows by a concatenation every step (what HFEngine's `generate` uses);
- `static`: a StaticCache preallocated at prompt + new tokens, written in place; attention is PyTorch's SDPA
  over the whole preallocated length with a mask (the cost of a fixed shape);
- `static, compiled`: the same decode step through torch.compile (inductor's C++ kernels, one fixed shape,
  so one graph for every step).

`--attn eager` swaps PyTorch's CPU flash kernel (`sdpa`, built for many query tokens) for plain matmuls.

Each figure is ms per decode step (the prefill apart), best of two, with the bound measured on the same
machine (the weights' bytes plus the batch's KV cache, read once at one thread's bandwidth), and, with
`--vllm`, bench/generate.py's figure for the same settings from its JSON, if measured on the same CPU.
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

from bench.machine import bandwidth, cpu_name  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="one rank's episodes per generate call (the recipe: 16)")
    p.add_argument("--prompt", type=int, default=600, help="prompt tokens (a mid-episode BabyAI context)")
    p.add_argument("--new", type=int, default=32, help="decode steps timed")
    p.add_argument("--threads", type=int, default=1, help="threads of the rank (torchrun: cores / ranks)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it), bfloat16 or float32")
    p.add_argument("--model", default="smollm2", help="a model name of models.resolve_model, or a directory")
    p.add_argument("--modes", default="dynamic,static,compiled", help="which of dynamic, static, compiled to run")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                   help="transformers' attention: sdpa (PyTorch's CPU flash kernel) or eager (two matmuls and a softmax)")
    p.add_argument("--vllm", type=Path, help="bench/generate.py's --out JSON (or --compare's) to set beside")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"dynamic", "static", "compiled"}:
        p.error(f"--modes {args.modes!r}: give some of dynamic,static,compiled")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    from launch import checks
    from models import resolve_model
    from bench.generate import _kv_bytes, _weight_bytes

    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    bw = bandwidth(args.threads)
    model_dir = resolve_model(args.model)
    dtype = checks.compute_dtype(args.dtype, "cpu", "smollm2")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation=args.attn)
    model.eval()
    bound = 1000 * (_weight_bytes(model_dir, dtype) + _kv_bytes(model_dir, dtype, args.batch, args.prompt)) / (bw * 1e9)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = torch.randint(100, vocab, (args.batch, args.prompt), generator=gen)

    def sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The project's sampler: temperature 1 over the full vocabulary, and the sampled token's logprob."""
        logp = torch.log_softmax(logits.float(), -1)
        token = torch.multinomial(logp.exp(), 1, generator=gen)
        return token, logp.gather(-1, token)

    @torch.no_grad()
    def decode(mode: str, step) -> float:
        """Prefill, then `--new` decode steps; returns ms per decode step."""
        length = args.prompt + args.new
        cache = StaticCache(config=model.config, max_cache_len=length) if mode != "dynamic" else None
        positions = torch.arange(args.prompt)
        out = model(input_ids=prompts, past_key_values=cache, cache_position=positions, use_cache=True)
        cache = out.past_key_values
        token, _ = sample(out.logits[:, -1])
        t = time.perf_counter()
        for i in range(args.new):
            pos = torch.tensor([args.prompt + i])
            logits = step(token, cache, pos)
            token, _ = sample(logits)
        return 1000 * (time.perf_counter() - t) / args.new

    def eager_step(token, cache, pos):
        return model(input_ids=token, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1]

    compiled_forward = None
    rows, starts = {}, {}
    for mode in modes:
        step = eager_step
        if mode == "compiled":
            compiled_forward = torch.compile(model.forward, dynamic=False)

            def step(token, cache, pos):  # noqa: E306
                return compiled_forward(input_ids=token, past_key_values=cache, cache_position=pos,
                                        use_cache=True).logits[:, -1].clone()
            t = time.perf_counter()
            decode(mode, step)  # the first call builds the graph: inductor's C++ build
            starts[mode] = time.perf_counter() - t
        rows[mode] = min(decode(mode, step) for _ in range(2))
        print(f"{mode}: {rows[mode]:.1f} ms a decode step", flush=True)
    vllm = _vllm_figures(args.vllm, args.batch) if args.vllm else {}
    figures = {"cpu": cpu_name(), "cores": cores, "threads": args.threads, "dtype": dtype, "batch": args.batch,
               "prompt": args.prompt, "new": args.new, "bandwidth_gbs": bw, "bound_with_kv_ms": bound,
               "attn": args.attn, "decode_ms": rows, "compile_s": starts, "vllm_decode_ms": vllm}
    print(f"\nCPU: {figures['cpu']} ({cores} cores), {dtype}, {args.threads} thread(s), batch {args.batch} x "
          f"{args.prompt}-token prompts, {args.new} new tokens, the project's sampler, {args.attn} attention")
    print(f"bound (weights + the batch's KV cache at {bw:.1f} GB/s): {bound:.1f} ms")
    print("| generator | decode ms/step | against the bound |")
    print("|---|---|---|")
    names = {"dynamic": "transformers, dynamic cache", "static": "transformers, static cache",
             "compiled": "transformers, static cache, torch.compile"}
    for mode, ms in rows.items():
        print(f"| {names[mode]} | {ms:.1f} | {ms / bound:.2f}x |")
    for name, ms in vllm.items():
        print(f"| vLLM CPU, {name} (from {args.vllm.name}) | {ms:.1f} | {ms / bound:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def _vllm_figures(path: Path, batch: int) -> dict:
    """bench/generate.py's decode figure at this batch with the project's sampler, per mode it holds."""
    data = json.loads(path.read_text())
    modes = data.get("modes") or {data.get("mode", "eager"): data}
    key = f"decode ms/step, batch {batch}, project (T=1, logprob)"
    return {mode: f[key] for mode, f in modes.items() if key in f}


if __name__ == "__main__":
    sys.exit(main())

"""infra/decode.py's generator beside its memory-bandwidth bound, on a GPU (or, at toy scale, this CPU).

    python bench/generate.py --device cuda                   # batches 64, 256, 512 at ~1,000-token contexts
    python bench/generate.py --device cpu --batches 2 4 --prompt 96 --new 8      # the same, a dry run here

Random weights of SmolLM2-135M's shape (no GGUF needed: decoding reads the same bytes whatever they
hold), in bfloat16 on CUDA. Measured side by side in one process, every figure with the device's name:

- read bandwidth: the best of several sums over 2 GiB (CUDA) or 512 MB (CPU);
- per batch size: the bound of one decode step (the weights + the batch's KV cache at its mean context
  read once, at that bandwidth); decode ms per step, steady state (the engine's own clock over the steps
  after its two warm-up steps: on CUDA, CUDA-graph replays), every row forced to `--new` tokens (no stop
  id); the call's time per step too (prefill of the new prompt token, graph capture and the host's
  bookkeeping included); prefill tokens/s of fresh prompts;
- transformers' own generate (engine.HFEngine) at the smallest and largest batch, for `--hf-new` tokens:
  the engine the GPU ran before (170 ms a step at batch 512 on an H200).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
               rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


def device_name(device: str) -> str:
    import torch
    from bench.machine import cpu_name
    return torch.cuda.get_device_name() if device == "cuda" else cpu_name()


def read_bandwidth(device: str) -> float:
    """GB/s: the best of 5 float32 sums over 2 GiB (CUDA) or 512 MB (CPU, every thread)."""
    import torch
    from bench.machine import bandwidth
    if device != "cuda":
        return bandwidth(torch.get_num_threads())
    x = torch.ones(2**29, device=device)  # 2 GiB
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize()
        t = time.perf_counter()
        x.sum()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def random_model(directory: Path, dtype: str) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2)).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    return str(directory)


def run(args) -> dict:
    import torch
    import engine as engines
    from infra.decode import TorchEngine

    device, dtype = args.device, args.dtype if args.dtype != "auto" else ("bfloat16" if args.device == "cuda" else "float32")
    bw = read_bandwidth(device)
    c = 2 if dtype == "bfloat16" else 4
    per_token = 2 * SMOLLM2["num_hidden_layers"] * SMOLLM2["num_key_value_heads"] * 64 * c  # K and V
    with tempfile.TemporaryDirectory() as tmp:
        path = random_model(Path(tmp), dtype)
        own = TorchEngine(path, device, dtype)
        weights = sum(p.numel() for p in own.model.parameters()) * c  # the tied head counted once
        gen = torch.Generator().manual_seed(0)
        figures = {"device": device_name(device), "device_kind": device, "dtype": dtype, "engine": "torch (infra/decode.py)",
                   "prompt": args.prompt, "new": args.new, "bandwidth_gbs": bw, "weight_bytes": weights,
                   "kv_bytes_per_token": per_token, "batches": {}}
        forced = lambda n: engines.Sampling(max_tokens=n, seed=1)  # noqa: E731  (no stop ids: every row runs to n)
        for batch in args.batches:
            prompts = [torch.randint(100, SMOLLM2["vocab_size"], (args.prompt,), generator=gen).tolist()
                       for _ in range(batch)]
            own.reset()
            start = own._clock()
            own.generate(prompts, forced(1))                  # fresh prompts: the prefill
            prefill_s = own._clock() - start
            own.generate(prompts, forced(args.new))           # warm: the rows now cached, every shape seen once
            before = dict(own.stats)
            start = own._clock()
            own.generate(prompts, forced(args.new))
            call_s = own._clock() - start
            steady = (own.stats["steady_s"] - before["steady_s"]) / (own.stats["steady_steps"] - before["steady_steps"])
            context = args.prompt + args.new / 2
            bound = (weights + batch * context * per_token) / (bw * 1e9)
            row = {"bound_ms": 1000 * bound, "kv_bytes_at_mean_context": batch * context * per_token,
                   "decode_ms_per_step": 1000 * steady, "decode_x_bound": steady / bound,
                   "call_ms_per_step": 1000 * call_s / args.new, "prefill_tokens_per_s": batch * (args.prompt - 1) / prefill_s}
            figures["batches"][str(batch)] = row
            print(f"batch {batch}: decode {row['decode_ms_per_step']:.2f} ms/step ({row['decode_x_bound']:.1f}x the bound "
                  f"{row['bound_ms']:.2f} ms), call {row['call_ms_per_step']:.2f} ms/step, prefill "
                  f"{row['prefill_tokens_per_s']:,.0f} tokens/s", flush=True)
        own.close()
        del own
        if args.hf_new:
            hf = engines.HFEngine(path, device, dtype)
            figures["hf"] = {}
            for batch in sorted({min(args.batches), max(args.batches)}):
                prompts = [torch.randint(100, SMOLLM2["vocab_size"], (args.prompt,), generator=gen).tolist()
                           for _ in range(batch)]
                times = []
                for n in (1, args.hf_new):
                    if device == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    hf.generate(prompts, forced(n))
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
                ms = 1000 * (times[1] - times[0]) / (args.hf_new - 1)
                figures["hf"][str(batch)] = {"decode_ms_per_step": ms}
                print(f"transformers' generate, batch {batch}: {ms:.1f} ms/step", flush=True)
    return figures


def table(f: dict) -> str:
    lines = [f"{f['device']}, {f['dtype']}, SmolLM2-135M's shape (random weights), {f['prompt']}-token prompts + "
             f"{f['new']} new tokens; read bandwidth {f['bandwidth_gbs']:,.0f} GB/s",
             "", "| batch | bound (weights + KV) ms | decode ms/step | x bound | call ms/step | prefill tokens/s | "
             "transformers ms/step |", "|---|---|---|---|---|---|---|"]
    for batch, r in f["batches"].items():
        hf = f.get("hf", {}).get(batch, {}).get("decode_ms_per_step")
        lines.append(f"| {batch} | {r['bound_ms']:.2f} | {r['decode_ms_per_step']:.2f} | {r['decode_x_bound']:.1f} | "
                     f"{r['call_ms_per_step']:.2f} | {r['prefill_tokens_per_s']:,.0f} | "
                     f"{'' if hf is None else f'{hf:.1f}'} |")
    return "\n".join(lines)


def main(args) -> int:
    figures = run(args)
    print(table(figures))
    out = args.out or Path("bench/results") / f"generate_{figures['device'].lower().replace(' ', '_')}.json"
    if args.device == "cuda" or args.out:
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {out}")
    return 0

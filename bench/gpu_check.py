"""CUDA's own checks of infra/decode.py, run first on a lent GPU (under a minute there), before the runs
that depend on them. What the CPU tests cannot show, because CUDA does not run on their machine:

    python bench/gpu_check.py --device cuda --out /tmp/gpu_check.json     # bench/gpu_run.py setup runs this first
    python bench/gpu_check.py --device cpu                                 # the dry run: CUDA-only checks skipped

1. sampler: `decode_sampling.uniform` on the device's int64 tensors equals its `splitmix64` in Python's integers
   (the tests check the CPU's wrapping multiplication; this checks CUDA's);
2. graphs: the same greedy tokens, and the same seeded samples, with CUDA graphs on and off, and the
   engine did capture;
3. sdpa: the kernel SDPA runs for a decode step's shapes under the engine's list (decode.BACKENDS), named
   from the profiler's kernels, beside what torch would pick unpinned; one step's logprobs against the math
   kernel's;
4. capture: a capture invalidated by a sync inside the step leaves the caller's stream current, a later
   capture on the same stream works, and reserved memory comes back; the engine given one failed capture
   decodes the same tokens and captures on its next call. Then, for the record, whether torch.cuda.graph
   itself leaves the capture stream current after such a failure (what decode_cuda.capture avoids).

Each check is "ok", "FAILED" or "skipped: <why>", with its figures, printed and written to --out (JSON);
the exit code is 1 if any failed. Random weights of SmolLM2-135M's shape (bench/decode_loop.py), in bfloat16
on CUDA; on the CPU in float32 with 2 layers, so that the dry run takes seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

import engine as engines  # noqa: E402
from bench.decode_loop import SMOLLM2, device_name  # noqa: E402
from infra import decode, decode_cuda  # noqa: E402
from infra.decode_sampling import splitmix64, uniform  # noqa: E402

NO_CUDA = "skipped: no CUDA on this machine"


def check_sampler(device: str) -> dict:
    gen = torch.Generator().manual_seed(0)
    seeds = [0, 1, 2**63 - 1, 2**62 + 12345] + torch.randint(0, 2**62, (2044,), generator=gen).tolist()
    positions = [0, 70000, 4095, 1] + torch.randint(0, 8192, (2044,), generator=gen).tolist()
    got = uniform(torch.tensor(seeds, device=device), torch.tensor(positions, device=device)).cpu().tolist()
    wrong = sum(g != splitmix64(s, p) for g, s, p in zip(got, seeds, positions))
    return {"status": "ok" if wrong == 0 else "FAILED", "draws": len(seeds), "different": wrong}


def random_model(directory: Path, dtype: str, layers: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers}))
    model.to(getattr(torch, dtype)).save_pretrained(directory)
    return str(directory)


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(100, SMOLLM2["vocab_size"], (int(k),), generator=gen).tolist()
            for k in torch.randint(40, 300, (n,), generator=gen)]


def same(a, b) -> dict:
    """How two generate calls' samples differ: rows with other tokens, and the largest logprob gap where equal."""
    rows = sum(x.ids != y.ids for x, y in zip(a, b))
    gap = max((abs(p - q) for x, y in zip(a, b) if x.ids == y.ids for p, q in zip(x.logprobs, y.logprobs)), default=0.0)
    return {"rows": len(a), "rows_with_other_tokens": rows, "max_logprob_gap": gap}


def eager(path: str, device: str, dtype: str) -> decode.TorchEngine:
    """An engine that wants graphs but has given up capturing: the graph's own steps, run eagerly (what a
    failed capture falls back to; an engine made with graphs=False may take another attention path)."""
    eng = decode.TorchEngine(path, device, dtype, graphs=True)
    eng.capture_failures = decode.CAPTURE_TRIES
    return eng


def check_graphs(path: str, device: str, dtype: str) -> dict:
    if device != "cuda":
        eng = decode.TorchEngine(path, device, dtype)  # the eager path still runs, so the dry run exercises it
        n = sum(len(s.ids) for s in eng.generate(prompts(4), engines.Sampling(max_tokens=8, temperature=0.0)))
        return {"status": f"{NO_CUDA} (eager decode ran: {n} tokens)"}
    on, off = decode.TorchEngine(path, device, dtype, graphs=True), eager(path, device, dtype)
    out = {}
    for name, params in (("greedy", engines.Sampling(max_tokens=48, temperature=0.0)),
                         ("sampled", engines.Sampling(max_tokens=48, seed=5))):
        a, b = on.generate(prompts(16), params), off.generate(prompts(16), params)
        out[name] = same(a, b)
    ok = all(r["rows_with_other_tokens"] == 0 and r["max_logprob_gap"] == 0 for r in out.values())
    captured = on.stats["graph_captures"]
    return {"status": "ok" if ok and captured == 2 else "FAILED", "graph_captures": captured,
            "capture_failures": on.stats["capture_failures"], **out}


def check_sdpa(path: str, device: str, dtype: str) -> dict:
    eng = decode.TorchEngine(path, device, dtype)
    heads, kv, dim = SMOLLM2["num_attention_heads"], SMOLLM2["num_key_value_heads"], 64
    g, rows, width = heads // kv, 64, 1024
    dt = getattr(torch, dtype)
    q = torch.randn(rows, 1, heads, dim, device=device, dtype=dt)          # a decode step: one position a row
    k = torch.randn(rows, kv, width, dim, device=device, dtype=dt)
    v = torch.randn(rows, kv, width, dim, device=device, dtype=dt)
    visible = torch.arange(width, device=device)[None, None] <= torch.randint(0, width, (rows, 1, 1), device=device)
    bias = decode.attention_bias(visible, g, dt)
    qq = q.view(rows, 1, kv, g, dim).permute(0, 2, 3, 1, 4).reshape(rows, kv, g, dim)  # as `attend` lays it out
    unpinned = SDPBackend(torch._fused_sdp_choice(qq, k, v, attn_mask=bias, scale=eng.scale)).name
    with eng.scope():
        pinned = SDPBackend(torch._fused_sdp_choice(qq, k, v, attn_mask=bias, scale=eng.scale)).name
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            decode.attend(q, k, v, bias, eng.scale)
            if device == "cuda":
                torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events()
                    if any(w in e.name.lower() for w in ("attention", "fmha", "flash", "cudnn", "attn"))})
    # one step (prefill, then the first token) under the engine's kernels, and under the math kernel
    batch, params = prompts(16, seed=2), engines.Sampling(max_tokens=1, temperature=0.0)
    a = eng.generate(batch, params)
    eng.reset()
    eng.backends = [SDPBackend.MATH]
    b = eng.generate(batch, params)
    diff = same(a, b)
    # bf16: the two kernels sum in different orders; a gap of a few hundredths in a logprob is rounding
    ok = pinned in [x.name for x in decode.BACKENDS[device]] and \
        diff["max_logprob_gap"] < (0.1 if dtype == "bfloat16" else 1e-4)
    print(f"SDPA: {pinned} under the engine's list (unpinned torch picks {unpinned}); profiler: {names[:6]}",
          flush=True)
    return {"status": "ok" if ok else "FAILED", "chosen": pinned, "unpinned_choice": unpinned, "kernels": names[:12],
            "list": [x.name for x in decode.BACKENDS[device]], "against_math": diff}


def check_capture(path: str, device: str, dtype: str) -> dict:
    if device != "cuda":
        return {"status": NO_CUDA + " (tests/test_decode_cuda.py runs decode_cuda.capture against a stand-in)"}
    caller, side = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.ones(1 << 20, device=device)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()

    def invalid():  # a host sync inside the capture: CUDA invalidates it
        (x * 2).sum().item()
    error = ""
    try:
        decode_cuda.capture(invalid, side)
    except RuntimeError as exc:
        error = str(exc).splitlines()[0][:200]
    restored = torch.cuda.current_stream() == caller
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_after = torch.cuda.memory_reserved()
    y = torch.zeros_like(x)
    graph = decode_cuda.capture(lambda: y.add_(x), side)  # a later capture on the same stream
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    later_ok = bool((y == 2).all())
    # the engine: its first capture fails (the same sync inside), it decodes eagerly, its next call captures
    on, off = decode.TorchEngine(path, device, dtype, graphs=True), eager(path, device, dtype)
    real = on._capture

    def failing_once(step):
        on._capture = real

        def broken():
            step()
            torch.zeros(1, device=device).item()
        return real(broken)
    on._capture = failing_once
    params = engines.Sampling(max_tokens=24, temperature=0.0)
    first = same(on.generate(prompts(8, 3), params), off.generate(prompts(8, 3), params))
    engine_restored = torch.cuda.current_stream() == caller
    second = same(on.generate(prompts(8, 4), params), off.generate(prompts(8, 4), params))
    figures = {"error": error, "stream_restored": restored, "reserved_mb_before": reserved / 2**20,
               "reserved_mb_after": reserved_after / 2**20, "later_capture_ok": later_ok,
               "engine_stream_restored": engine_restored, "engine_failures": on.stats["capture_failures"],
               "engine_captures": on.stats["graph_captures"], "first_call": first, "second_call": second}
    figures["pool_given_back"] = reserved_after <= reserved  # else the failed capture's pool kept its memory
    ok = (error and restored and later_ok and figures["pool_given_back"] and engine_restored
          and on.stats["capture_failures"] == 1
          and on.stats["graph_captures"] == 1 and first["rows_with_other_tokens"] == 0
          and second["rows_with_other_tokens"] == 0)
    # for the record, last (it may leave this process on a side stream): torch.cuda.graph after the same failure
    plain = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(plain):
            invalid()
    except RuntimeError:
        pass
    figures["torch_cuda_graph_left_its_stream"] = torch.cuda.current_stream() != caller
    torch.cuda.set_stream(caller)
    return {"status": "ok" if ok else "FAILED", **figures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = p.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no GPU visible to torch; --device cpu for the dry run", file=sys.stderr)
        return 2
    dtype, layers = ("bfloat16", SMOLLM2["num_hidden_layers"]) if device == "cuda" else ("float32", 2)
    start = time.perf_counter()
    figures = {"device": device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
               "cudnn": torch.backends.cudnn.version() if device == "cuda" else None, "dtype": dtype, "layers": layers,
               "checks": {}}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        path = random_model(Path(tmp), dtype, layers)
        for name, check in (("sampler", lambda: check_sampler(device)),
                            ("graphs", lambda: check_graphs(path, device, dtype)),
                            ("sdpa", lambda: check_sdpa(path, device, dtype)),
                            ("capture", lambda: check_capture(path, device, dtype))):
            t = time.perf_counter()
            try:
                result = check()
            except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' figures
                result = {"status": "FAILED", "error": f"{type(exc).__name__}: {exc}"[:500]}
            result["seconds"] = round(time.perf_counter() - t, 2)
            figures["checks"][name] = result
            print(f"[{name}] {result['status']} ({result['seconds']} s)", flush=True)
    figures["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 1 if any(r["status"] == "FAILED" for r in figures["checks"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

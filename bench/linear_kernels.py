"""SmolLM2's linear layers through the CPU kernels a vLLM generator can use, side by side, one thread, bf16:
vLLM's oneDNN path (its default on x86), AMD's zentorch (what vLLM's ZenCpuPlatform uses when zentorch is
installed on an AMD CPU with AVX-512, weights prepacked), and plain `torch.nn.functional.linear`.

zentorch is not one of the project's packages. To measure it, install it beside them, matching torch:

    pip install --no-deps --target /tmp/zentorch-site zentorch==2.13.0.2 deprecated wrapt
    PYTHONPATH=/tmp/zentorch-site python bench/linear_kernels.py

Prints, for 1, 16 and 256 rows (a decode step of one sequence, the recipe's batch, a prefill chunk), each
layer's milliseconds per call under each kernel (best of two alternated passes), zentorch's time over
oneDNN's, and the sum over one decode step of the 30 blocks and the LM head, with the CPU's name.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.machine import cpu_name  # noqa: E402

# (out, in) of SmolLM2-135M's linear layers as vLLM fuses them; the LM head is tied to the embedding
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
BLOCKS = 30


def per_call_ms(f, x, calls: int) -> float:
    for _ in range(3):
        f(x)
    t = time.perf_counter()
    for _ in range(calls):
        f(x)
    return (time.perf_counter() - t) / calls * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256])
    args = p.parse_args(argv)
    try:
        import zentorch  # noqa: F401  (registers torch.ops.zentorch)
    except ImportError:
        raise SystemExit("error: zentorch is not importable; install it beside the project's packages "
                         "(this file's docstring has the command)")
    from vllm import _custom_ops as ops

    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"CPU: {cpu_name()}; one thread, bf16")
    print("| rows | layer | oneDNN ms | zentorch ms | torch ms | zentorch / oneDNN |")
    print("|---|---|---|---|---|---|")
    for m in args.rows:
        step = {"oneDNN": 0.0, "zentorch": 0.0, "torch": 0.0}
        for name, (n, k) in SHAPES.items():
            w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
            x = torch.randn(m, k, dtype=torch.bfloat16)
            handle = ops.create_onednn_mm(w.t(), 32)
            packed = torch.ops.zentorch.zentorch_weight_prepack_for_linear(w)
            kernels = {"oneDNN": lambda v: ops.onednn_mm(handle, v, None),
                       "zentorch": lambda v: torch.ops.zentorch.zentorch_linear_unary(
                           v, packed, None, is_weight_prepacked=True),
                       "torch": lambda v: torch.nn.functional.linear(v, w)}
            ref = kernels["torch"](x).float()
            for kname, f in kernels.items():  # all three must compute the same product
                torch.testing.assert_close(f(x).float(), ref, rtol=2e-2, atol=2e-2)
            calls = 20 if name == "lm_head" else 200
            best = dict.fromkeys(kernels, float("inf"))
            for _ in range(2):  # alternated, so a drift in the machine's load hits all three
                for kname, f in kernels.items():
                    best[kname] = min(best[kname], per_call_ms(f, x, calls))
            for kname in step:
                step[kname] += best[kname] * (1 if name == "lm_head" else BLOCKS)
            print(f"| {m} | {name} | {best['oneDNN']:.3f} | {best['zentorch']:.3f} | {best['torch']:.3f} | "
                  f"{best['zentorch'] / best['oneDNN']:.2f} |")
        print(f"| {m} | one decode step ({BLOCKS} blocks + LM head) | {step['oneDNN']:.1f} | {step['zentorch']:.1f} | "
              f"{step['torch']:.1f} | {step['zentorch'] / step['oneDNN']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

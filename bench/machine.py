"""The machine's own limits, measured where a benchmark runs: its CPU's name, its read bandwidth (the
bound of memory-bound work such as decoding) and its matmul peak (the bound of compute-bound work such as
the update). bench/generate.py, bench/train_step.py --flops and bench/rl_step.py set their figures beside
these."""
from __future__ import annotations

import platform
import time
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def bandwidth(threads: int, mbytes: int = 512, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of `repeats` float32 sums over `mbytes` MB with `threads` threads."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    x = torch.ones(mbytes * 2**20 // 4)
    x.sum()  # touch every page once
    best = min(timed(lambda: x.sum()) for _ in range(repeats))
    torch.set_num_threads(before)
    return x.numel() * 4 / best / 1e9


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def matmul_peak(dtype, repeats: int = 5) -> float:
    """This process's best matmul FLOP/s in `dtype` over shapes of the update (a micro-batch of 4,096 rows
    through SmolLM2's 576 x 576 and 576 x 1,536 projections) and one square 2,048: the compute bound."""
    import torch  # here, not at the top: generate.py sets OMP_NUM_THREADS before torch first loads

    best = 0.0
    for m, k, n in ((4096, 576, 576), (4096, 576, 1536), (4096, 1536, 576), (2048, 2048, 2048)):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        a @ b  # warm-up: the kernel's first call
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = max(best, 2 * m * k * n / (time.perf_counter() - t))
    return best

"""The update against the machine, for bench/train_step.py's `--flops` and `--profile N`: one more step,
counted or profiled (never timed), beside what the CPU can do.

- `flops`: the FLOPs of every matmul and attention of one step (torch's FlopCounterMode; attention
  counted without causal skipping), summed over ranks, at the timed update's seconds, beside the matmul
  peak in the compute dtype measured on every rank at once (bench/machine.py);
- `profile`: one step under torch.profiler; each rank prints, in turn, its N operators of most self CPU
  time and their share of the step: where the update's time goes (bench/results/update_epyc.md).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from infra import distributed


def flops(run_step: Callable[[], object], dtype: str, update_seconds: float) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from bench.machine import matmul_peak
    counter = FlopCounterMode(display=False)
    with counter:
        run_step()
    dist.barrier()
    counted, = distributed.all_sum(counter.get_total_flops())
    peak, = distributed.all_sum(matmul_peak(getattr(torch, dtype)))
    return {"update_flops": counted, "update_flops_per_s": counted / update_seconds, "peak_flops_per_s": peak}


def profile(run_step: Callable[[], object], top: int, rank: int, world: int, table: Callable[[list], str]) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler
    with profiler(activities=[ProfilerActivity.CPU]) as prof:
        run_step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    for r in range(world):
        dist.barrier()
        if r == rank:
            print(f"\n# rank {rank}: the {top} operators of most self CPU time in one profiled step "
                  f"({total / 1e6:.1f} s of self time in all)")
            rows = [(e.key[:60], e.count, f"{e.self_cpu_time_total / 1e6:.2f}",
                     f"{100 * e.self_cpu_time_total / total:.1f}%") for e in events[:top]]
            print(table([("operator", "calls", "self s", "share"), *rows]), flush=True)

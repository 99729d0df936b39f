"""Time budgets (--rl-seconds, --bc-seconds) on one of two clocks (--budget-clock).

    wall   seconds on the slowest rank's clock: what a user waiting for a result spends;
    cpu    CPU seconds of every rank's process together (all its threads: the generator, the env
           threads, torch's own): what two runs sharing one machine each really got.

Why both: arms of a comparison run one after another on one machine (lab/protocol.py), and whatever
else runs there slows them unequally. Wall seconds then favour the arm that ran on a quiet machine; CPU
seconds do not. Each rank reads its own clock; the budget is decided on the ranks' combined figure, one
verdict for all (a rank that stopped alone would leave the other waiting in its next collective).
Test: tests/test_budget.py
"""
from __future__ import annotations

import math
import time

CLOCKS = ("wall", "cpu")


def now(clock: str) -> float:
    """This process's reading of `clock`, in seconds."""
    if clock not in CLOCKS:
        raise ValueError(f"unknown budget clock {clock!r}; choose one of {CLOCKS}")
    return time.process_time() if clock == "cpu" else time.perf_counter()


def combined(clock: str, seconds: float, reduce_sum, reduce_max) -> float:
    """Every rank's `seconds` on `clock` as one figure: their sum (cpu) or their maximum (wall).
    `reduce_sum(*xs) -> list` and `reduce_max(x)` are the collectives (infra/distributed.all_sum, all_max);
    every rank must call this."""
    if clock == "cpu":
        return float(reduce_sum(seconds)[0])
    # all_max reduces integers: microseconds, rounded up so that any time spent counts against a budget
    return float(reduce_max(math.ceil(seconds * 1_000_000)) / 1_000_000)

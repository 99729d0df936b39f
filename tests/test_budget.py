"""Time budgets on the wall clock or in CPU seconds (infra/budget.py, --budget-clock)."""
from __future__ import annotations

import math
import time

import pytest

from infra import budget


def test_the_cpu_clock_counts_work_not_waiting():
    cpu0, wall0 = budget.now("cpu"), budget.now("wall")
    time.sleep(0.3)
    slept_cpu, slept_wall = budget.now("cpu") - cpu0, budget.now("wall") - wall0
    assert slept_wall >= 0.29 and slept_cpu < 0.1  # waiting (a shared machine's other work) is not spent
    cpu0 = budget.now("cpu")
    x = 0
    while budget.now("cpu") - cpu0 < 0.2:
        x += 1
    assert budget.now("cpu") - cpu0 >= 0.2


def test_ranks_combine_by_sum_on_cpu_and_by_max_on_the_wall():
    two_ranks = [1.5, 2.25]  # each rank's seconds; the collectives below are what all_sum / all_max return
    reduce_sum = lambda *xs: [sum(two_ranks)]  # noqa: E731
    reduce_max = lambda x: max(math.ceil(s * 1_000_000) for s in two_ranks)  # noqa: E731
    assert budget.combined("cpu", two_ranks[0], reduce_sum, reduce_max) == 3.75
    assert budget.combined("wall", two_ranks[0], reduce_sum, reduce_max) == 2.25


def test_an_unknown_clock_is_refused():
    with pytest.raises(ValueError, match="wall"):
        budget.now("gpu")


def test_any_time_spent_counts_against_a_wall_budget():
    """A budget of a nanosecond is spent by the first measurable instant (no rounding down to zero)."""
    assert budget.combined("wall", 1e-9, lambda *xs: list(xs), lambda x: x) > 1e-9

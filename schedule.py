"""What a training step plays: its turn budget (the horizon schedule), its tasks and its sampling seed.

ScalingInter-RL (AgentGym-RL) trains with short horizons first (stable exploitation) and raises the
turn budget in stages (exploration), e.g. SciWorld 10 -> 20 -> 30 turns every 100 steps. `fixed(n)` is
the constant baseline. A schedule is a pure function of the 0-based training step: it holds no counter,
so a run resumed at step k gets exactly the budget an uninterrupted run has at step k. (The original
kept a counter that came back off by one after resuming, shifting every later stage boundary.)

    s = parse("10,20,30@100")     # or parse("20") for fixed(20)
    s.max_turns(150)              # -> 20
    s.describe()                  # 'steps 0-99: 10 turns | 100-199: 20 | 200+: 30'

The step's tasks (`tasks_for_step`) and the seed its rollout samples with (`play_seed`) are pure functions of
the step as well, so a resumed run sees exactly the data and samples an uninterrupted one would. (Which
rank plays which of their episodes is machinery: infra/stepplan.py.)

Tests: python -m pytest tests/test_schedule.py tests/test_stepplan.py
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass

FORM = "use 'N' for a fixed budget or 'N1,N2,...@STEPS' for stages, e.g. '20' or '10,20,30@100'"


def _count(x, what: str) -> int:
    """x as a positive int; bools and floats are refused rather than silently truncated."""
    if isinstance(x, bool):
        raise ValueError(f"{what} must be a positive integer, got {x!r}; {FORM}")
    try:
        n = operator.index(x)
    except TypeError:
        raise ValueError(f"{what} must be a positive integer, got {x!r}; {FORM}") from None
    if n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n}; {FORM}")
    return n


@dataclass(frozen=True)
class Schedule:
    budgets: tuple[int, ...]      # turn budget of each stage, non-decreasing
    stage_length: int | None      # training steps per stage; None for a fixed budget

    def max_turns(self, step: int) -> int:
        """Turn budget at 0-based training `step`; the last stage lasts for ever."""
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0 (0-based training step), got {step}")
        if self.stage_length is None:
            return self.budgets[0]
        return self.budgets[min(step // self.stage_length, len(self.budgets) - 1)]

    __call__ = max_turns

    def describe(self) -> str:
        """One line for the log, e.g. 'steps 0-99: 10 turns | 100-199: 20 | 200+: 30'."""
        if self.stage_length is None:
            return f"all steps: {self.budgets[0]} turns"
        parts, k = [], self.stage_length
        for i, turns in enumerate(self.budgets):
            span = f"{i * k}+" if i == len(self.budgets) - 1 else f"{i * k}-{(i + 1) * k - 1}"
            parts.append(f"steps {span}: {turns} turns" if i == 0 else f"{span}: {turns}")
        return " | ".join(parts)

    def spec(self) -> str:
        """The command-line form; parse(s.spec()) == s."""
        if self.stage_length is None:
            return str(self.budgets[0])
        return ",".join(map(str, self.budgets)) + f"@{self.stage_length}"


def fixed(turns: int) -> Schedule:
    """The same budget at every step (the paper's non-ScalingInter baseline)."""
    return Schedule((_count(turns, "turn budget"),), None)


def stepwise(budgets, stage_length: int) -> Schedule:
    """Stage i covers steps [i * stage_length, (i + 1) * stage_length); the last stage never ends."""
    budgets = tuple(_count(b, "each turn budget") for b in budgets)
    if not budgets:
        raise ValueError(f"stepwise needs at least one turn budget; {FORM}")
    if any(b < a for a, b in zip(budgets, budgets[1:])):
        raise ValueError(f"turn budgets must not decrease (ScalingInter grows the horizon), got "
                         f"{list(budgets)}; {FORM}")
    return Schedule(budgets, _count(stage_length, "stage length"))


def parse(spec: str) -> Schedule:
    """'20' -> fixed(20); '10,20,30@100' -> stepwise([10, 20, 30], 100). ValueError on anything else."""
    text = str(spec).strip()
    head, at, tail = text.partition("@")
    try:
        budgets = [int(p) for p in head.split(",")]
        length = int(tail) if at else None
    except ValueError:
        raise ValueError(f"cannot parse horizon schedule {spec!r}; {FORM}") from None
    if length is None:
        if len(budgets) > 1:
            raise ValueError(f"schedule {spec!r} lists several budgets but no '@STEPS' stage length; {FORM}")
        return fixed(budgets[0])
    return stepwise(budgets, length)


def tasks_for_step(train_ids: list[int], step: int, count: int, seed: int) -> list[int]:
    """The step's tasks: consecutive slices of per-epoch shuffles of `train_ids`."""
    out, n = [], len(train_ids)
    for k in range(step * count, (step + 1) * count):
        epoch, i = divmod(k, n)
        order = list(train_ids)
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(order[i])
    return out


def play_seed(seed: int, step: int) -> int:
    """The seed a training step's rollout samples with (rollout.Play.seed; each reply's own seed is hashed from
    it, rollout.reply_seed): a pure function of the run's seed and the step, so a resumed run samples as an
    uninterrupted one. Step -1 is the in-training evaluation's; the self-imitation control plays as step 3."""
    return (seed * 7919 + step) * 131

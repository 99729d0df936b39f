"""Tasks the current policy sometimes solves, learnt from the run's own rollouts (`--sometimes-solved H`),
reached through `Studies.rollout`.

A task the policy always or never solves gives a group of G equal outcomes: under GRPO a zero advantage,
no gradient. Rutherford et al. 2024 ("No Regrets", Sampling For Learnability) train on the levels an agent
"can sometimes solve, but not always", scored p (1 - p) from its success rate p. Here p is each train
task's success estimate from the outcomes of the episodes the run has played (no separate evaluation),
and a task's weight is the chance that a group of G of its episodes has mixed outcomes,
1 - p^G - (1 - p)^G (the same order as p (1 - p)). The step's tasks are a weighted draw of distinct
tasks (`tasks`; Efraimidis and Spirakis 2006: each task's key log(u) / w, the largest keys win).

The estimate: p = (s + K m) / (n + K), with s successes in n episodes of the task and a prior of K = 2
episodes at m, its level's success share (s_L + 1) / (n_L + 2) over every episode of the level (a task
never played has its level's m; one level for an env without levels). Every count fades with a half-life
of H steps, so the estimates follow the policy as it moves: a task weighted down for always or never
being solved returns toward its level's weight unless it is played again and does the same.

Each step's outcomes go to RUN/solved.jsonl (rank 0), and a resumed run replays the steps before its
start in order, so its draws are the uninterrupted run's. The draw is a pure function of those
outcomes, the seed, the step and the round, so every rank draws the same tasks.

Tests: python -m pytest tests/test_studies.py -k solved
"""
from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from pathlib import Path

PRIOR = 2.0  # episodes' worth of the level's share in a task's estimate


class SolveRates:
    """Faded success counts per train task and per level; `tasks` draws from them, `observe` adds a step's."""

    def __init__(self, train_ids: list[int], level, samples: int, half_life: int, seed: int,
                 log: str | Path | None = None, start: int = 0):
        self.ids, self.samples, self.seed = list(train_ids), samples, seed
        self.level = {t: level(t) for t in self.ids}
        self.fade = 0.5 ** (1.0 / half_life)  # per step
        self.task: dict[int, tuple[float, float, int]] = {}   # task -> (successes, episodes, at step), faded
        self.levels: dict[str, tuple[float, float, int]] = {}
        self.log = Path(log) if log else None
        if self.log and self.log.exists():  # replay the steps before `start`; a step logged twice (played,
            rows = {}                        # crashed before its checkpoint, played again) counts as its last line
            for line in self.log.read_text().splitlines():
                row = json.loads(line) if line.strip() else None
                if row and row["step"] < start:
                    rows[row["step"]] = row
            for step in sorted(rows):
                self._add(step, rows[step]["outcomes"])

    def faded(self, counts: tuple[float, float, int] | None, step: int) -> tuple[float, float]:
        """(successes, episodes) as they count at `step`."""
        if counts is None:
            return 0.0, 0.0
        s, n, at = counts
        f = self.fade ** (step - at)
        return s * f, n * f

    def estimate(self, task: int, step: int) -> float:
        """The task's success estimate at `step` (module docstring), in (0, 1)."""
        s_level, n_level = self.faded(self.levels.get(self.level.get(task)), step)
        m = (s_level + 1.0) / (n_level + 2.0)
        s, n = self.faded(self.task.get(task), step)
        return (s + PRIOR * m) / (n + PRIOR)

    def weight(self, task: int, step: int) -> float:
        """The chance that a group of `samples` episodes of the task has mixed outcomes."""
        p = self.estimate(task, step)
        return 1.0 - p ** self.samples - (1.0 - p) ** self.samples

    def tasks(self, step: int, count: int, round_: int = 0, used: set[int] = frozenset()) -> list[int]:
        """`count` distinct train tasks, none of `used` while enough are left, drawn with probability
        growing with their weight (a weighted draw without replacement)."""
        rng = random.Random((self.seed * 1_000_003 + step) * 1_009 + round_)
        pool = [t for t in self.ids if t not in used]
        pool = pool if len(pool) >= count else self.ids
        keys = sorted(((math.log(1.0 - rng.random()) / max(self.weight(t, step), 1e-12), t) for t in pool),
                      reverse=True)
        return [keys[i % len(keys)][1] for i in range(count)]  # a split smaller than a step repeats tasks

    def observe(self, step: int, outcomes: list[tuple[int, bool]], write: bool) -> None:
        """`outcomes`: (task, success) of every episode the step played, over all ranks and rounds (an episode
        an env error ended left out). `write` (rank 0) appends the step to the log."""
        counts = defaultdict(lambda: [0, 0])
        for task, success in outcomes:
            counts[task][0] += int(success)
            counts[task][1] += 1
        rows = [[t, s, n] for t, (s, n) in sorted(counts.items())]
        self._add(step, rows)
        if write and self.log:
            with self.log.open("a") as f:
                f.write(json.dumps({"step": step, "outcomes": rows}) + "\n")

    def _add(self, step: int, rows: list[list[int]]) -> None:
        levels = defaultdict(lambda: [0, 0])
        for task, s, n in rows:
            old_s, old_n = self.faded(self.task.get(task), step)
            self.task[task] = (old_s + s, old_n + n, step)
            levels[self.level.get(task)][0] += s
            levels[self.level.get(task)][1] += n
        for name, (s, n) in levels.items():
            old_s, old_n = self.faded(self.levels.get(name), step)
            self.levels[name] = (old_s + s, old_n + n, step)

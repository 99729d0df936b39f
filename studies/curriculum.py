"""Two studies of the step's groups, reached through the hooks of studies/hooks.py: which tasks a step
draws (the method's uniform draw is schedule.tasks_for_step) and when the optimizer steps.

`Curriculum` (`--curriculum`) draws the step's tasks by level instead: a level's weight is the Laplace
estimate (informative + 1) / (groups + 2) of how often its groups have been informative so far in the
run, i.e. had rewards that were not all equal. A constant group's advantage is exactly 0 under GRPO and
RLOO: it teaches nothing, yet costs its whole rollout. Levels the policy always or never solves fade
without vanishing (their weight stays above 1 / (groups + 2)), so a level it starts to solve returns.
This is the "levels on which the warm start succeeds sometimes but not always" curriculum, learnt
online; each step's tasks and informative flags go to RUN/curriculum.jsonl, which a resumed run replays
to rebuild the weights it had at its checkpoint.

`Accumulation` (`--min-groups K`) decides when the optimizer steps. Adam moves every weight by about the
learning rate whatever the gradient's size, so a step whose batch held one informative group makes a
full-size move from one task's four episodes. From the BabyAI warm start, 3 of the recipe's 12 steps had
one informative group (2 had none, 4 had two), and the run shifted one action's share in every subtask at
once (docs/results.md, "What GRPO changes"). With K > 0, gradients add up over steps until their batches
held K informative groups; the weights do not change in between, so the later rollouts are still
on-policy and the pooled gradient is that of one larger batch (DAPO's dynamic sampling does this by
generating more within a step: --dynamic-sampling, dynamic.py). A step that saves a checkpoint always steps, so a resumed run accumulates
exactly as an uninterrupted one.

Tests: python -m pytest tests/test_stepplan.py
"""
from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path


def informative_groups(rows: list[tuple[int, float]], groups: int) -> list[bool]:
    """`rows`: (group, reward) of every episode of a step over all ranks; for each group 0..groups-1,
    whether its rewards differ (a constant group's GRPO/RLOO advantage is exactly 0)."""
    rewards = defaultdict(list)
    for g, r in rows:
        rewards[g].append(r)
    return [bool(rewards[g]) and max(rewards[g]) - min(rewards[g]) > 1e-9 for g in range(groups)]


class Accumulation:
    """When the optimizer steps under `--min-groups` (module docstring): `due` after each step's rollouts."""

    def __init__(self, min_groups: int):
        self.min_groups, self.pending = min_groups, 0

    def due(self, informative: int, must: bool) -> bool:
        """Add this step's informative groups; True when the optimizer steps now (then the count restarts).
        `must`: a checkpoint or the last step."""
        self.pending += informative
        if must or self.pending >= self.min_groups:
            self.pending = 0
            return True
        return False


class Curriculum:
    """Per-level counts of groups and informative groups; `tasks` draws a step's tasks from them (a pure
    function of the counts, the step and the seed, so every rank draws the same), `observe` updates them
    from the step's gathered rewards (the same on every rank)."""

    def __init__(self, train_ids: list[int], level, seed: int, log: str | Path | None = None, start: int = 0):
        self.seed, self.log = seed, Path(log) if log else None
        self.ids = defaultdict(list)
        for t in train_ids:
            self.ids[level(t)].append(t)
        self.level = {t: name for name, ts in self.ids.items() for t in ts}
        self.names = sorted(self.ids)
        self.groups = dict.fromkeys(self.names, 0)
        self.informative = dict.fromkeys(self.names, 0)
        if self.log and self.log.exists():  # a resumed run replays the steps before `start`; a step logged
            # twice (played, crashed before its checkpoint, played again after a resume) counts as its last line
            rows = {}
            for line in self.log.read_text().splitlines():
                row = json.loads(line) if line.strip() else None
                if row and row["step"] < start:
                    rows[row["step"]] = row
            for row in rows.values():
                self._count(row["tasks"], row["informative"])

    def weights(self) -> list[float]:
        return [(self.informative[n] + 1) / (self.groups[n] + 2) for n in self.names]

    def tasks(self, step: int, count: int) -> list[int]:
        rng = random.Random(self.seed * 1_000_003 + step)
        out: list[int] = []
        for name in rng.choices(self.names, self.weights(), k=count):
            pool = self.ids[name]
            for _ in range(8):  # avoid spending two of the step's groups on one task
                task = rng.choice(pool)
                if task not in out:
                    break
            out.append(task)
        return out

    def observe(self, step: int, tasks: list[int], rows: list[tuple[int, float]], write: bool) -> float:
        """`rows`: (group, reward) of every episode of the step over all ranks. Returns the step's share of
        informative groups; `write` (rank 0) appends the step to the log."""
        informative = informative_groups(rows, len(tasks))
        self._count(tasks, informative)
        if write and self.log:
            with self.log.open("a") as f:
                f.write(json.dumps({"step": step, "tasks": tasks, "informative": informative}) + "\n")
        return sum(informative) / max(len(tasks), 1)

    def _count(self, tasks: list[int], informative: list[bool]) -> None:
        for t, flag in zip(tasks, informative):
            name = self.level.get(t)
            if name is not None:
                self.groups[name] += 1
                self.informative[name] += int(flag)

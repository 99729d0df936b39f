"""Which rank plays which of a training step's episodes (the step's tasks and seed: schedule.py).

`rank_share` splits the step's `tasks x samples` episodes over the ranks. When the group size divides
evenly, every rank plays an equal part of EVERY group. Why: the update skips a row whose advantage is
zero everywhere (a GRPO group whose rewards are all equal), so with whole groups per rank the ranks'
work follows how many informative groups each happened to draw. With a BabyAI warm start most groups
were constant and the few informative ones of a step often sat on one rank: that rank ran the whole
update while the other waited at the next collective (figures: docs/performance.md). Split groups keep the
ranks level, and each rank's part of a group still shares its prompt in the update (infra/prefix.py).

The studies' own draws and step timing are in studies/: --curriculum and --min-groups (curriculum.py),
--dynamic-sampling (dynamic.py), --sometimes-solved (solved.py).
"""
from __future__ import annotations


def per_rank(tasks: int, samples: int, world: int) -> int:
    """How many episodes of a step of `tasks` x `samples` each of `world` ranks plays (`rank_share`'s length)."""
    return tasks * samples // world


def rank_share(tasks: list[int], samples: int, rank: int, world: int) -> list[tuple[int, int]]:
    """This rank's (task, group) pairs, group = the task's slot in the step: `samples // world` of every
    group when `world` divides `samples`, else a contiguous slice of the task-major list of episodes."""
    if samples % world == 0:
        return [(t, g) for g, t in enumerate(tasks) for _ in range(samples // world)]
    plan, n = [(t, g) for g, t in enumerate(tasks) for _ in range(samples)], per_rank(len(tasks), samples, world)
    return plan[rank * n:(rank + 1) * n]

"""The project's own studies beside the paper's method: each off by default, named by its flag, and reached by
the training step through one object, `Studies`, whose hooks give back their input unchanged when every
study is off. train.py, rollout.py, algorithms.py and batch.py name none of them.

| flag | what it changes | hook | published |
|---|---|---|---|
| --curriculum | a step's tasks: levels weighed by how often their groups were informative (stepplan.py) | `tasks`, `observe` | docs/results.md (validation) |
| --min-groups | the optimizer steps only once enough informative groups were added up (stepplan.py) | `observe` | docs/results.md (validation) |
| --refusal-penalty | the training reward, less a penalty per turn the env refused | `rewards` | results/babyai-grpo-refusal-drgrpo |
| --positive-only | the advantages' positive part only: a filtered self-imitation of the policy's wins | `advantages` | docs/results.md (validation) |
| --bc-anchor | an imitation gradient beside RL's in every optimizer step (warmstart.Anchor) | `anchor` | results/babyai-grpo-anchor |

Tests: python -m pytest tests/test_studies.py (and each study's own tests, named in its docstring).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

import warmstart
from stepplan import Accumulation, Curriculum, informative_groups


class Studies:
    """The hooks of one run on rank `rank` of `world` (`make` builds them after the run's set-up)."""

    def __init__(self, cfg, curriculum: Curriculum | None = None, anchor=None, rank: int = 0, world: int = 1):
        self.cfg, self.curriculum, self.anchor, self.rank, self.world = cfg, curriculum, anchor, rank, world
        self.accumulation = Accumulation(cfg.min_groups)  # a checkpoint always steps: a resume has none pending

    @classmethod
    def make(cls, ground: warmstart.Playground, level_of, out: Path, start: int) -> "Studies":
        """The hooks the flags turn on: `level_of` task -> level (--curriculum, logged to out/curriculum.jsonl
        from step `start`), the imitation anchor's demonstrations played now (--bc-anchor)."""
        cfg = ground.cfg
        curriculum = Curriculum(ground.train_ids, level_of, cfg.seed, out / "curriculum.jsonl", start) \
            if cfg.curriculum else None
        anchor = warmstart.Anchor(ground) if cfg.bc_anchor else None
        return cls(cfg, curriculum, anchor, ground.rank, ground.world)

    def tasks(self, step: int) -> list[tuple[int, int]] | None:
        """--curriculum: the step's (task, group) draw; None: the method's uniform draw."""
        return self.curriculum.tasks(step, self.cfg.tasks_per_step) if self.curriculum else None

    def rewards(self, episodes, rewards: torch.Tensor) -> torch.Tensor:
        """--refusal-penalty: the training reward less the penalty per refused turn (Episode.refused)."""
        if not self.cfg.refusal_penalty:
            return rewards
        return rewards - self.cfg.refusal_penalty * torch.tensor([e.refused for e in episodes], dtype=rewards.dtype)

    def advantages(self, adv: torch.Tensor) -> torch.Tensor:
        """--positive-only: max(A, 0), episodes better than their group pushed up, worse ones not down."""
        return adv.clamp(min=0) if self.cfg.positive_only else adv

    def observe(self, step: int, tasks, mine, rewards: torch.Tensor, saves: bool) -> tuple[dict, bool]:
        """After the advantages: --curriculum weighs levels by how often their groups were informative;
        --min-groups holds the optimizer step back until enough were (a checkpoint step always steps).
        Returns (metrics, whether the optimizer steps)."""
        extra = {}
        if not (self.curriculum or self.cfg.min_groups):
            return extra, True
        rows = [None] * self.world  # every rank counts the same gathered (group, reward) rows
        dist.all_gather_object(rows, [(g, r) for (_, g), r in zip(mine, rewards.tolist())])
        rows = sum(rows, [])
        if self.curriculum:
            extra["curriculum/informative"] = self.curriculum.observe(step, tasks, rows, self.rank == 0)
        stepped = True
        if self.cfg.min_groups:
            stepped = self.accumulation.due(sum(informative_groups(rows, len(tasks))), must=saves)
            extra.update(pending_groups=self.accumulation.pending, stepped=float(stepped))
        return extra, stepped

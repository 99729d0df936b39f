"""The project's own studies beside the paper's method: each off by default, named by its flag, and reached by
the training step through one object, `Studies`, at two points: `tasks` before the rollout, `advantages`
around step (3). Both give back the method's own values when every study is off. train.py, rollout.py,
algorithms.py and batch.py name none of them.

| flag | what it changes | hook (its part) | published |
|---|---|---|---|
| --curriculum | a step's tasks: levels weighed by how often their groups were informative (curriculum.py) | `tasks`, `advantages` (`observe`) | docs/results.md (validation) |
| --min-groups | the optimizer steps only once enough informative groups were added up (curriculum.py) | `advantages` (`observe`) | docs/results.md (validation) |
| --refusal-penalty | the training reward, less a penalty per turn the env refused | `advantages` (`rewards`) | results/babyai-grpo-refusal-drgrpo |
| --positive-only | the advantages' positive part only: a filtered self-imitation of the policy's wins | `advantages` (`positive`) | docs/results.md (validation) |
| --bc-anchor | an imitation gradient beside RL's in every optimizer step (warmstart.Anchor) | `advantages` (`Shaped.anchor`) | results/babyai-grpo-anchor |

Tests: python -m pytest tests/test_studies.py (and each study's own tests, named in its docstring).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from studies import warmstart
from studies.curriculum import Accumulation, Curriculum, informative_groups


@dataclass
class Shaped:
    """A step's advantages as the studies leave them (`Studies.advantages`), and what they decide of its update."""
    adv: torch.Tensor                              # (B, T) this rank's advantages
    returns: torch.Tensor                          # (B, T) and returns
    stepped: bool = True                           # the optimizer steps (--min-groups may hold it back)
    metrics: dict = field(default_factory=dict)    # the studies' figures of the step, logged with it
    anchor: object = None                          # a gradient beside RL's in each optimizer step (--bc-anchor)


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

    def advantages(self, step: int, episodes, batch: dict, saves: bool,
                   compute: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> Shaped:
        """The second hook, around step (3): `compute()` is the trainer's advantages over all ranks, which
        read batch["rewards"]. --refusal-penalty lowers those rewards first; --positive-only keeps the
        advantages' positive part; --curriculum and --min-groups observe the step's gathered rewards
        (`observe`; `saves`: the step saves a checkpoint); --bc-anchor's gradient joins the update.
        With every study off: compute()'s own tensors, an optimizer step, no metrics, no anchor."""
        batch["rewards"] = self.rewards(episodes, batch["rewards"])
        adv, returns = compute()
        metrics, stepped = self.observe(step, batch["groups"], batch["rewards"], saves)
        return Shaped(self.positive(adv), returns, stepped, metrics, self.anchor)

    def rewards(self, episodes, rewards: torch.Tensor) -> torch.Tensor:
        """--refusal-penalty: the training reward less the penalty per refused turn (Episode.refused)."""
        if not self.cfg.refusal_penalty:
            return rewards
        return rewards - self.cfg.refusal_penalty * torch.tensor([e.refused for e in episodes], dtype=rewards.dtype)

    def positive(self, adv: torch.Tensor) -> torch.Tensor:
        """--positive-only: max(A, 0), episodes better than their group pushed up, worse ones not down."""
        return adv.clamp(min=0) if self.cfg.positive_only else adv

    def observe(self, step: int, groups: torch.Tensor, rewards: torch.Tensor, saves: bool) -> tuple[dict, bool]:
        """After the advantages: --curriculum weighs levels by how often their groups were informative;
        --min-groups holds the optimizer step back until enough were (a checkpoint step always steps).
        `groups`, `rewards`: this rank's episodes'. Returns (metrics, whether the optimizer steps)."""
        extra = {}
        if not (self.curriculum or self.cfg.min_groups):
            return extra, True
        rows = [None] * self.world  # every rank counts the same gathered (group, reward) rows
        dist.all_gather_object(rows, list(zip(groups.tolist(), rewards.tolist())))
        rows = sum(rows, [])
        if self.curriculum:  # its draw is a pure function of its counts and the step: the tasks `tasks` gave
            extra["curriculum/informative"] = self.curriculum.observe(step, self.tasks(step), rows, self.rank == 0)
        stepped = True
        if self.cfg.min_groups:
            stepped = self.accumulation.due(sum(informative_groups(rows, self.cfg.tasks_per_step)), must=saves)
            extra.update(pending_groups=self.accumulation.pending, stepped=float(stepped))
        return extra, stepped

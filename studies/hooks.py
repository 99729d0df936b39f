"""The one object through which the training step reaches the studies (studies/__init__.py lists them):
`Studies`, with its two hooks, `rollout` around step (1)'s rollout and `advantages` around step (3), and
`Shaped`, what the second hook gives back. Both hooks give back the method's own values when every study is off;
a run with every study off has no hooks at all (`Studies.make` gives None) and its step calls the method directly.

Tests: python -m pytest tests/test_studies.py
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from batch import training_reward
from rollout import Playground
from studies import dynamic, warmstart
from studies.curriculum import Accumulation, Curriculum, informative_groups
from studies.solved import SolveRates


class Shaped(NamedTuple):
    """A step's advantages as the studies leave them (`Studies.advantages`), and what they decide of its update;
    a tuple, so that train_step unpacks it beside the method's own `(adv, returns, True, {}, None)`."""
    adv: torch.Tensor                              # (B, T) this rank's advantages
    returns: torch.Tensor                          # (B, T) and returns
    stepped: bool                                  # the optimizer steps (--min-groups may hold it back)
    metrics: dict                                  # the studies' figures of the step, logged with it
    anchor: object = None                          # a gradient beside RL's in each optimizer step (--bc-anchor)


STUDY_FLAGS = ("curriculum", "sometimes_solved", "dynamic_sampling", "min_groups", "refusal_penalty",
               "positive_only", "bc_anchor")  # the config fields that turn a study of the hooks on


class Studies:
    """The hooks of one run on rank `rank` of `world` (`make` builds them after the run's set-up)."""

    def __init__(self, cfg, curriculum: Curriculum | None = None, anchor=None, rank: int = 0, world: int = 1, *,
                 solved: SolveRates | None = None, train_ids: list[int] = ()):
        self.cfg, self.curriculum, self.anchor, self.rank, self.world = cfg, curriculum, anchor, rank, world
        self.solved, self.train_ids = solved, list(train_ids)  # --sometimes-solved; --dynamic-sampling's draws
        self.accumulation = Accumulation(cfg.min_groups)  # a checkpoint always steps: a resume has none pending
        self.played: dict = {}  # what `rollout` measured of the step, logged with `advantages`' metrics

    @classmethod
    def make(cls, ground: Playground, level_of, out: Path, start: int) -> "Studies | None":
        """The hooks the flags turn on, None when they turn none on: `level_of` task -> level (--curriculum's
        levels, logged to out/curriculum.jsonl from step `start`; --sometimes-solved's priors, its outcomes
        logged to out/solved.jsonl), the imitation anchor's demonstrations played now (--bc-anchor)."""
        cfg = ground.cfg
        if not any(getattr(cfg, flag) for flag in STUDY_FLAGS):
            return None
        curriculum = Curriculum(ground.train_ids, level_of, cfg.seed, out / "curriculum.jsonl", start) \
            if cfg.curriculum else None
        solved = SolveRates(ground.train_ids, level_of, cfg.samples_per_task, cfg.sometimes_solved, cfg.seed,
                            out / "solved.jsonl", start) if cfg.sometimes_solved else None
        anchor = warmstart.Anchor(ground) if cfg.bc_anchor else None
        return cls(cfg, curriculum, anchor, ground.rank, ground.world, solved=solved, train_ids=ground.train_ids)

    def tasks(self, step: int) -> list[int] | None:
        """The step's tasks as --curriculum or --sometimes-solved draw them; None: the method's uniform draw."""
        if self.curriculum:
            return self.curriculum.tasks(step, self.cfg.tasks_per_step)
        return self.solved.tasks(step, self.cfg.tasks_per_step) if self.solved else None

    def rollout(self, step: int, tasks: list[int],
                play: Callable[[list[int], int], tuple[list, dict]]) -> tuple[list, dict]:
        """The first hook, step (1): `play(tasks, first)` is the trainer's rollout of this rank's share of the
        episodes of `tasks` (`first`: the index of their first episode among all the step plays), `tasks` its
        uniform draw. --curriculum and --sometimes-solved draw other tasks (`tasks`); --dynamic-sampling plays
        more rounds while too few groups had rewards that differ (dynamic.py); --sometimes-solved learns from
        every round's outcomes. Returns (this rank's episodes of the step's groups, the rollout's seconds).
        With every study off: play(tasks, 0), as it is."""
        tasks = self.tasks(step) or tasks
        episodes, timing = play(tasks, 0)
        if not (self.solved or self.cfg.dynamic_sampling):
            return episodes, timing
        want, size = self.cfg.tasks_per_step, len(tasks) * self.cfg.samples_per_task
        rounds, rows, used = [episodes], [self.outcomes(episodes)], set(tasks)
        informative = [informative_groups([(g, r) for g, r, _, _ in rows[0]], want)]
        while len(rounds) <= self.cfg.dynamic_sampling and sum(map(sum, informative)) < want:
            more = self.solved.tasks(step, want, len(rounds), used) if self.solved else \
                dynamic.fresh_tasks(self.train_ids, step, len(rounds), want, self.cfg.seed, used)
            used.update(more)
            episodes, seconds = play(more, len(rounds) * size)  # the seeds of episodes no earlier round played
            timing = {k: timing[k] + seconds[k] for k in timing}
            rounds.append(episodes)
            rows.append(self.outcomes(episodes))
            informative.append(informative_groups([(g, r) for g, r, _, _ in rows[-1]], want))
        if self.cfg.dynamic_sampling:
            self.played = {"dynamic/rounds": len(rounds), "dynamic/played": len(rounds) * size}
        if self.solved:  # mean chance of a mixed group of the step's first tasks, as drawn; then every outcome
            self.played["solved/mixed_chance"] = sum(self.solved.weight(t, step) for t in tasks) / len(tasks)
            self.solved.observe(step, [(t, s) for part in rows for _, _, t, s in part if t is not None],
                                self.rank == 0)
        return (dynamic.regroup(rounds, dynamic.keep(informative)) if len(rounds) > 1 else rounds[0]), timing

    def outcomes(self, episodes) -> list[tuple[int, float, int | None, bool]]:
        """(group, training reward, task, success) of one round's episodes over all ranks, the reward as the
        advantages will read it (batch.collate, then `rewards`); task None for an episode an env error ended
        (not the policy's outcome)."""
        rewards = torch.tensor([training_reward(e, self.cfg.reward, self.cfg.success_bonus) for e in episodes],
                               dtype=torch.float)
        mine = [(e.group, r, None if e.end == "env_error" else e.task_id, e.success)
                for e, r in zip(episodes, self.rewards(episodes, rewards).tolist())]
        rows = [None] * self.world
        dist.all_gather_object(rows, mine)
        return sum(rows, [])

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
        metrics, self.played = {**self.played, **metrics}, {}
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

"""Step-level credit without a critic: GiGPO's anchor-state groups (Feng et al., 2025, arXiv 2505.10978).

GRPO gives every token of an episode the same advantage, the episode's reward against its group's.
In a multi-turn episode that blames a failed episode's good turns as much as its bad ones: on BabyAI,
the turns that look around for a hidden object sit mostly in failed episodes (the object was hidden),
so GRPO learns to stop looking around and to walk to objects it cannot see (docs/results.md, "What
GRPO changes"). GiGPO adds a second comparison. The episodes of one group all start from the same
task, and in a deterministic environment they meet the same states again (the first observation
always; later ones whenever two samples took the same way). Turns taken from one state form a step
group; within it, each turn's discounted return is compared with the others', so an action is judged
against other actions from the very same situation:

    A_E(i)   = (R_i - mean_g R) / (std_g R + eps)                       episode level, GRPO's
    R_i,t    = gamma^(T_i - 1 - t) * R_i                                return from turn t (terminal reward)
    A_S(i,t) = (R_i,t - mean_s R) / (std_s R + eps)   over the step group s = (group, observation)
    A(i,t)   = A_E(i) + weight * A_S(i,t)                               on every token of turn t

A state is the exact observation text the turn answered (`state_key`), as the paper's anchor states
are; two states that render alike are merged, two that differ in any character are kept apart. A step
group of one turn, or one whose returns are equal, adds exactly 0 (algorithms.grpo), so a
group whose episodes all failed still trains nothing. Episode rewards here are terminal (the env's last
reward, `rollout.Episode`), so the return from turn t is the reward discounted by the turns still to
come: with gamma < 1, reaching the goal sooner from the same state counts as better. The paper's
settings: gamma 0.95, weight 1.

Turns are found on the token mask: turn t of a row is its t-th run of policy tokens (replies are
always separated by observation tokens), matched to the t-th key of `Episode.states`. This file holds
the bookkeeping (state keys, step groups, turns on the mask); the arithmetic is the estimator's own,
`algorithms.gigpo` (`--algo gigpo`), which applies GRPO's own function to the step groups.
Tests: python -m pytest tests/test_gigpo.py
"""
from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def state_key(observation: str) -> str:
    """A short stable key of an observation's exact text (16 hex digits)."""
    return hashlib.blake2b(observation.encode(), digest_size=8).hexdigest()


def turn_index(mask: Tensor) -> Tensor:
    """(B, T) long: t on the tokens of a row's t-th run of policy tokens (mask 1), -1 elsewhere."""
    m = mask.bool()
    starts = m & ~torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)
    return torch.where(m, starts.long().cumsum(1) - 1, torch.full_like(m, -1, dtype=torch.long))


def step_groups(rewards: Tensor, groups: Tensor, states: list[list[str]], gamma: float = 0.95
                ) -> tuple[Tensor, Tensor]:
    """Every turn of every episode as one row: (returns, ids), both (turns,), in episode order. returns
    float64, R_i,t = gamma^(T_i - 1 - t) R_i; ids the step group s = (group, state) of the turn, which
    `algorithms.step_advantages` hands to GRPO's function. `states[i]` are the keys of the
    observations episode i's turns answered, in order."""
    if len(states) != len(rewards) or len(groups) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards need as many group ids and state lists, "
                         f"got {len(groups)} and {len(states)}")
    ids: dict[tuple[int, str], int] = {}
    returns, where = [], []
    for r, g, keys in zip(rewards.double().tolist(), groups.tolist(), states):
        for t, key in enumerate(keys):
            where.append(ids.setdefault((g, key), len(ids)))
            returns.append(gamma ** (len(keys) - 1 - t) * r)
    return torch.tensor(returns, dtype=torch.float64), torch.tensor(where, dtype=torch.long)


def per_turn(episode: Tensor, steps: list[Tensor], mask: Tensor, weight: float) -> Tensor:
    """(b, T) float64 token advantages A_E + weight * A_S from the rows' episode terms (b,) and step terms
    (one (turns,) tensor a row). A row whose policy-token runs do not match its states (an episode cut
    short by a simulator failure has no policy tokens at all) gets A_E alone."""
    turns = turn_index(mask)
    adv = torch.zeros(mask.shape, dtype=torch.float64)
    for i, (a_e, a_s) in enumerate(zip(episode.tolist(), steps)):
        on = turns[i] >= 0
        runs = int(turns[i].max()) + 1
        if runs > 0:
            turn_adv = a_e + weight * a_s if runs == len(a_s) else torch.full((runs,), a_e, dtype=torch.float64)
            adv[i, on] = turn_adv[turns[i, on]]
    return adv


def shared_turns(groups: Tensor, states: list[list[str]]) -> float:
    """The share of turns whose state another turn of the same group also answered: the turns a step
    group can judge (the rest get their episode term alone)."""
    seen: dict[tuple[int, str], int] = {}
    for g, keys in zip(groups.tolist(), states):
        for key in keys:
            seen[(g, key)] = seen.get((g, key), 0) + 1
    total = sum(seen.values())
    return sum(n for n in seen.values() if n > 1) / total if total else 0.0

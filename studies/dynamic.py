"""DAPO's dynamic sampling within a step (`--dynamic-sampling N`), reached through `Studies.rollout`.

A group whose rewards are all equal has a GRPO/RLOO advantage of exactly 0: its rows train nothing
(train.update skips them), yet it cost its whole rollout. DAPO (Yu et al. 2025, section 3.2, "Dynamic
Sampling") over-samples and drops the groups whose accuracy is 0 or 1, sampling on until the batch is full
of groups with a signal. Here, after a step's rollout (round 0), while fewer than `tasks_per_step` of the
step's groups had rewards that differ and fewer than N extra rounds were played, the step plays another
round of `tasks_per_step` fresh tasks (`fresh_tasks`: a pure function of the seed, the step and the round,
so a resumed run plays the same ones), and `keep` puts each informative group of a later round in the
place of one of round 0's constant groups. A constant group leaves the batch only when an informative one
takes its place, so the step trains `tasks_per_step` groups as ever, and at the cap on what it has.

Departures from DAPO: the cap N (DAPO samples until the batch is full); DAPO tests a group's accuracy,
this its training reward (the reward the advantages read, --refusal-penalty included: the test of the
update's skipped rows). Every rank plays its share of every group of every round (stepplan.rank_share),
and whether to play another round is decided on the rewards gathered from all ranks, so the ranks agree;
keeping whole groups on every rank needs each rank to hold a part of each (launch/checks.py).
--min-groups (studies/curriculum.py) reaches the same end across steps, by adding up their gradients.

Tests: python -m pytest tests/test_studies.py -k dynamic
"""
from __future__ import annotations

import random


def fresh_tasks(train_ids: list[int], step: int, round_: int, count: int, seed: int, used: set[int]) -> list[int]:
    """Extra round `round_` (1, 2, ...) of step `step`: `count` train tasks drawn uniformly, none of `used`
    (the step's earlier rounds') while enough are left."""
    rng = random.Random((seed * 1_000_003 + step) * 1_009 + round_)
    pool = [t for t in train_ids if t not in used]
    pool = pool if len(pool) >= count else list(train_ids)
    return rng.sample(pool, count) if len(pool) >= count else rng.choices(pool, k=count)


def keep(informative: list[list[bool]]) -> list[tuple[int, int]]:
    """`informative[r][g]`: whether group g of round r (round 0 first) had rewards that differ. The step's
    groups slot by slot, as (round, group): round 0's own group, unless it was constant and a later round's
    informative group is left to take its place (those in the order they were played)."""
    spare = [(r, g) for r in range(1, len(informative)) for g, flag in enumerate(informative[r]) if flag]
    return [(0, g) if flag or not spare else spare.pop(0) for g, flag in enumerate(informative[0])]


def regroup(rounds: list[list], slots: list[tuple[int, int]]) -> list:
    """This rank's episodes of the kept groups (`rounds[r]`: its episodes of round r), slot by slot, each
    episode given its slot as its group: the batch the advantages read, laid out as one round's."""
    picked = [(slot, e) for slot, (r, g) in enumerate(slots) for e in rounds[r] if e.group == g]
    for slot, e in picked:  # after the selection: a moved group's new number must not be read as another's
        e.group = slot
    return [e for _, e in picked]

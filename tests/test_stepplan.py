"""schedule.py and infra/stepplan.py: the step's tasks are a pure function of the step, and every episode of every group is
played by exactly one rank, each rank holding an equal part of every group when the group size allows."""
from collections import Counter

import pytest

from infra.stepplan import rank_share
from schedule import play_seed, tasks_for_step


@pytest.mark.parametrize("tasks, samples, world", [(8, 8, 2), (8, 4, 2), (3, 6, 3), (4, 3, 2), (5, 2, 1)])
def test_every_episode_is_played_once_and_ranks_get_equal_shares(tasks, samples, world):
    step_tasks = tasks_for_step(list(range(100, 140)), 3, tasks, seed=0)
    shares = [rank_share(step_tasks, samples, r, world) for r in range(world)]
    assert len({len(s) for s in shares}) == 1  # the same number of episodes on every rank
    assert Counter(p for s in shares for p in s) == Counter({(t, g): samples for g, t in enumerate(step_tasks)})
    if samples % world == 0:  # every rank a part of every group: informative groups load ranks alike
        for s in shares:
            assert Counter(g for _, g in s) == Counter({g: samples // world for g in range(tasks)})


def test_tasks_are_a_pure_function_of_the_step_and_cover_an_epoch():
    ids = list(range(10))
    assert tasks_for_step(ids, 2, 4, 7) == tasks_for_step(ids, 2, 4, 7)
    first_epoch = tasks_for_step(ids, 0, 5, 7) + tasks_for_step(ids, 1, 5, 7)
    assert sorted(first_epoch) == ids


def test_each_step_samples_with_a_seed_of_its_own_and_the_published_runs_keep_theirs():
    seeds = [play_seed(seed, step) for seed in range(3) for step in range(-1, 500)]
    assert len(set(seeds)) == len(seeds)  # no two steps (nor the evaluation's "step -1") share a rollout seed
    assert play_seed(2, 7) == (2 * 7919 + 7) * 131  # the formula the committed results were sampled with


def test_curriculum_favours_levels_with_informative_groups_and_replays_on_resume(tmp_path):
    from studies.curriculum import Curriculum

    ids = list(range(400))
    level = lambda t: f"L{t % 4}"  # noqa: E731  four levels of 100 tasks
    log = tmp_path / "curriculum.jsonl"
    cur = Curriculum(ids, level, seed=0, log=log)
    first = cur.tasks(0, 8)
    assert len(set(first)) == 8 and cur.tasks(0, 8) == first  # a pure function of counts, step and seed
    for step in range(30):  # level L1's groups are informative, the others constant
        tasks = cur.tasks(step, 8)
        rows = [(g, float(step % 2 and j % 2)) if level(t) == "L1" else (g, 0.0)
                for g, t in enumerate(tasks) for j in range(4)]
        share = cur.observe(step, tasks, rows, write=True)
        assert share == (sum(level(t) == "L1" for t in tasks) / 8 if step % 2 else 0.0)
    w = dict(zip(cur.names, cur.weights()))
    assert w["L1"] > 0.4 and all(w[n] < 0.1 for n in ("L0", "L2", "L3")) and min(w.values()) > 0
    drawn = [level(t) for s in range(30, 40) for t in cur.tasks(s, 8)]
    assert drawn.count("L1") > 0.6 * len(drawn)
    # a resume from step 20 rebuilds the counts of steps 0-19 alone, even with steps 20-29 in the log
    again = Curriculum(ids, level, seed=0, log=log, start=20)
    replayed = Curriculum(ids, level, seed=0)
    for row in [__import__("json").loads(line) for line in log.read_text().splitlines()][:20]:
        replayed._count(row["tasks"], row["informative"])
    assert again.groups == replayed.groups and again.informative == replayed.informative
    assert again.tasks(20, 8) == replayed.tasks(20, 8)


def test_accumulation_steps_once_enough_groups_were_informative_and_always_at_a_checkpoint():
    from studies.curriculum import Accumulation, informative_groups

    rows = [(0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0), (2, 0.3), (2, 0.3 + 1e-6)]
    assert informative_groups(rows, 4) == [True, False, True, False]  # group 3 has no episode here
    acc = Accumulation(5)
    assert [acc.due(n, must=False) for n in (2, 2, 1, 0, 4)] == [False, False, True, False, False]
    assert acc.pending == 4 and acc.due(0, must=True) and acc.pending == 0  # a checkpoint flushes
    assert all(Accumulation(0).due(n, must=False) for n in (0, 1))  # --min-groups 0: every step

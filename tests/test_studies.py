"""studies/, the seam between the paper's method and the project's own studies: with every study off each
hook gives back its input unchanged, and no study is named in the method's files; each study's hook does
what its flag says."""
import ast
import json
from pathlib import Path

import pytest
import torch

import config as configs
from rollout import Episode
from studies import dynamic
from studies.hooks import STUDY_FLAGS, Studies
from studies.solved import SolveRates
from tests.support.one_rank import one_rank  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("curriculum", "min_groups", "refusal_penalty", "positive_only", "bc_anchor", "dynamic_sampling",
         "sometimes_solved")


def test_the_method_files_name_no_study():
    """The studies' flags appear nowhere in the code of the method's files (docstrings and comments aside)."""
    for name in ("train.py", "rollout.py", "algorithms.py", "losses.py", "batch.py"):
        tree = ast.parse((ROOT / name).read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
                {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
                {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        assert not names & set(FLAGS), (name, names & set(FLAGS))


def test_a_run_with_every_study_off_has_no_hooks_and_each_flag_builds_them():
    """Studies.make gives None with every flag off (train_step then calls the method itself) and the hooks as
    soon as one study's flag is on; STUDY_FLAGS names exactly the studies' flags."""
    from types import SimpleNamespace
    assert set(STUDY_FLAGS) == set(FLAGS)
    ground = SimpleNamespace(cfg=configs.Config(), train_ids=list(range(8)), rank=0, world=1)
    assert Studies.make(ground, lambda t: 0, Path("unused"), 0) is None
    for flag, value in (("refusal_penalty", 0.05), ("positive_only", True), ("min_groups", 2),
                        ("dynamic_sampling", 2)):
        ground.cfg = configs.Config(**{flag: value})
        assert isinstance(Studies.make(ground, lambda t: 0, Path("unused"), 0), Studies), flag


def test_both_hooks_give_the_method_its_own_values_by_default():
    studies = Studies(configs.Config())
    adv, returns = torch.tensor([[-1.0, 0.5], [2.0, 0.0]]), torch.tensor([[-1.0, 0.5], [2.0, 0.0]])
    eps = [Episode(0, 0, [1], 1, reward=0.5, refused=3), Episode(1, 0, [1], 1, reward=0.0)]
    rewards = torch.tensor([0.5, 0.0])
    batch = {"rewards": rewards, "groups": torch.tensor([0, 0])}
    assert studies.tasks(3) is None
    played, result = [], (eps, {"generate": 1.0, "env": 0.5, "other": 0.25})
    got = studies.rollout(3, [7, 9], lambda tasks, first: (played.append((tasks, first)), result)[1])
    assert played == [([7, 9], 0)] and got[0] is eps and got[1] is result[1]  # one call, the uniform draw, as is
    read = []  # the rewards the advantages were computed from
    shaped = studies.advantages(0, eps, batch, False, lambda: (read.append(batch["rewards"]), (adv, returns))[1])
    assert read == [rewards] and read[0] is rewards and batch["rewards"] is rewards
    assert shaped.adv is adv and shaped.returns is returns
    assert shaped.stepped and shaped.metrics == {} and shaped.anchor is None


def test_the_reward_study_changes_the_rewards_the_advantages_read():
    eps = [Episode(0, 0, [1], 1, reward=0.5, refused=3), Episode(1, 0, [1], 1, reward=0.0)]
    batch = {"rewards": torch.tensor([0.5, 0.0]), "groups": torch.tensor([0, 0])}
    read = []
    Studies(configs.Config(refusal_penalty=0.05)).advantages(
        0, eps, batch, False, lambda: (read.append(batch["rewards"].tolist()), (torch.zeros(2, 1),) * 2)[1])
    assert read == [pytest.approx([0.35, 0.0])]


def test_the_files_below_the_set_up_never_read_its_run():
    """studies/ (the warm start, the hooks, the curriculum) is given what it reads (warmstart.Playground, the
    models), never launch.startup.Run: the set-up depends on it, not it on the set-up."""
    for name in ("studies/warmstart.py", "studies/hooks.py", "studies/curriculum.py", "studies/dynamic.py",
                 "studies/solved.py"):
        tree = ast.parse((ROOT / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
                   {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"startup", "launch.startup"} & imported and "Run" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def test_refusal_penalty_lowers_the_training_reward_per_refused_turn():
    eps = [Episode(0, 0, [1, 2, 3], 1, mask=[1, 1], logprobs=[0.0, 0.0], reward=0.5, refused=3),
           Episode(1, 0, [1, 2, 3], 1, mask=[1, 1], logprobs=[0.0, 0.0], reward=0.0, refused=0)]
    rewards = torch.tensor([0.5, 0.0])
    got = Studies(configs.Config(refusal_penalty=0.05)).rewards(eps, rewards)
    assert got.tolist() == pytest.approx([0.35, 0.0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_positive_only_keeps_the_positive_part(dtype):
    adv = torch.tensor([[-1.0, 0.5], [2.0, -0.25]], dtype=dtype)
    got = Studies(configs.Config(positive_only=True)).positive(adv)
    assert got.dtype == dtype and got.tolist() == [[0.0, 0.5], [2.0, 0.0]]


# ------------------------------------------------------------------ --dynamic-sampling (studies/dynamic.py)

SAMPLES = 4


def scripted(mixed, calls: list):
    """The trainer's rollout as the first hook calls it, on one rank: `play(tasks, first)` -> (episodes,
    seconds). A task in `mixed` scores 0, 1, 0, 1 over its group's samples (a success each 1); any other
    scores 0 in all of them (a constant group)."""
    def play(tasks, first):
        calls.append((list(tasks), first))
        eps = [Episode(t, g, [1, 2], 1, mask=[1], logprobs=[0.0], reward=float(t in mixed and k % 2),
                       success=bool(t in mixed and k % 2)) for g, t in enumerate(tasks) for k in range(SAMPLES)]
        return eps, {"generate": 1.0, "env": 0.5, "other": 0.25}
    return play


def dynamic_studies(cap: int) -> Studies:
    cfg = configs.Config(tasks_per_step=4, samples_per_task=SAMPLES, dynamic_sampling=cap)
    return Studies(cfg, train_ids=list(range(64)))


def test_dynamic_sampling_plays_no_more_when_every_group_is_informative(one_rank):
    calls, studies = [], dynamic_studies(3)
    eps, seconds = studies.rollout(0, [0, 1, 2, 3], scripted(range(64), calls))
    assert calls == [([0, 1, 2, 3], 0)] and seconds["generate"] == 1.0
    assert [(e.task_id, e.group) for e in eps] == [(t, t) for t in range(4) for _ in range(SAMPLES)]
    assert studies.played == {"dynamic/rounds": 1, "dynamic/played": 16}


def test_dynamic_sampling_stops_at_its_cap_and_keeps_the_constant_groups_it_could_not_replace(one_rank):
    calls, studies = [], dynamic_studies(3)
    eps, seconds = studies.rollout(5, [0, 1, 2, 3], scripted(set(), calls))
    assert [first for _, first in calls] == [0, 16, 32, 48]  # 3 more rounds, each with seeds of its own
    played = [t for tasks, _ in calls for t in tasks]
    assert len(set(played)) == 16  # fresh tasks every round
    assert [(e.task_id, e.group) for e in eps] == [(t, t) for t in range(4) for _ in range(SAMPLES)]
    assert seconds == {"generate": 4.0, "env": 2.0, "other": 1.0}
    shaped = studies.advantages(5, eps, {"rewards": torch.zeros(16), "groups": torch.tensor([e.group for e in eps])},
                                False, lambda: (torch.zeros(16, 1),) * 2)
    assert shaped.metrics == {"dynamic/rounds": 4, "dynamic/played": 64} and studies.played == {}
    again = []  # a resumed run plays the same tasks
    dynamic_studies(3).rollout(5, [0, 1, 2, 3], scripted(set(), again))
    assert again == calls


def test_dynamic_sampling_replaces_constant_groups_with_informative_ones(one_rank):
    calls, studies = [], dynamic_studies(3)
    mixed = {1} | set(range(4, 64))  # of round 0 only task 1; every fresh task
    eps, _ = studies.rollout(2, [0, 1, 2, 3], scripted(mixed, calls))
    assert len(calls) == 2 and studies.played["dynamic/rounds"] == 2  # 1 + 4 informative groups: enough
    extra = calls[1][0]
    assert [e.task_id for e in eps[::SAMPLES]] == [extra[0], 1, extra[1], extra[2]]
    assert [e.group for e in eps] == [g for g in range(4) for _ in range(SAMPLES)]
    for g in range(4):  # every group the batch trains on now has rewards that differ
        assert len({e.reward for e in eps if e.group == g}) == 2


def test_dynamic_keep_replaces_only_constant_groups_and_only_while_informative_ones_are_left():
    assert dynamic.keep([[True, False, False, True], [False, True, True, True]]) == [(0, 0), (1, 1), (1, 2), (0, 3)]
    assert dynamic.keep([[False, False], [False, False], [False, True]]) == [(2, 1), (0, 1)]
    assert dynamic.keep([[False, True]]) == [(0, 0), (0, 1)]
    tasks = dynamic.fresh_tasks(list(range(10)), 3, 1, 4, 0, used={0, 1, 2, 3, 4, 5})
    assert sorted(tasks) == [6, 7, 8, 9] and tasks == dynamic.fresh_tasks(list(range(10)), 3, 1, 4, 0, {0, 1, 2, 3, 4, 5})


# ------------------------------------------------------------------ --sometimes-solved (studies/solved.py)

def outcome(task: int, k: int) -> bool:
    """Tasks 0, 4, 8, ... always solved, 1, 5, ... on every other sample, the rest never."""
    return task % 4 == 0 or (task % 4 == 1 and k % 2 == 0)


def test_solved_weights_move_toward_tasks_with_mixed_outcomes_and_fade_back():
    rates = SolveRates(range(12), lambda t: "one", samples=4, half_life=5, seed=0)
    assert len({rates.weight(t, 0) for t in range(12)}) == 1  # never played: the prior's weight
    rates.observe(0, [(t, outcome(t, k)) for t in range(8) for k in range(4)], write=False)
    always, mixed, never, unseen = (rates.weight(t, 1) for t in (0, 1, 2, 8))
    assert mixed > unseen > never and mixed > always
    counts = [0] * 12  # a draw of one task picks each in proportion to its weight
    for r in range(6000):
        counts[rates.tasks(1, 1, r)[0]] += 1
    total = sum(rates.weight(t, 1) for t in range(12))
    for t in range(12):
        assert counts[t] / 6000 == pytest.approx(rates.weight(t, 1) / total, abs=0.015)
    far = [rates.weight(t, 200) for t in (0, 1, 2, 8)]  # 40 half-lives later: back to the prior's weight
    assert max(far) - min(far) < 1e-6
    drawn = rates.tasks(1, 4)
    assert len(set(drawn)) == 4 and drawn == rates.tasks(1, 4) != rates.tasks(2, 4)


def test_solved_replays_its_log_on_resume_and_draws_the_same_tasks(tmp_path):
    log = tmp_path / "solved.jsonl"
    live = SolveRates(range(32), lambda t: t % 2, samples=4, half_life=3, seed=1, log=log)
    drawn = {}
    for step in range(6):
        drawn[step] = live.tasks(step, 4)
        live.observe(step, [(t, outcome(t, k)) for t in drawn[step] for k in range(4)], write=True)
    resumed = SolveRates(range(32), lambda t: t % 2, samples=4, half_life=3, seed=1, log=log, start=4)
    assert resumed.tasks(4, 4) == drawn[4]  # steps 4 and 5 of the log are not replayed
    resumed.observe(4, [(t, outcome(t, k)) for t in drawn[4] for k in range(4)], write=True)  # logged twice now
    assert resumed.tasks(5, 4) == drawn[5]
    again = SolveRates(range(32), lambda t: t % 2, samples=4, half_life=3, seed=1, log=log, start=6)
    assert [again.weight(t, 6) for t in range(32)] == [live.weight(t, 6) for t in range(32)]
    fresh = SolveRates(range(32), lambda t: t % 2, samples=4, half_life=3, seed=1)
    assert [fresh.weight(t, 6) for t in range(32)] != [live.weight(t, 6) for t in range(32)]


def test_sometimes_solved_draws_the_steps_tasks_and_learns_from_every_round(one_rank, tmp_path):
    cfg = configs.Config(tasks_per_step=4, samples_per_task=SAMPLES, sometimes_solved=4, dynamic_sampling=1)
    rates = SolveRates(range(64), lambda t: "one", SAMPLES, 4, cfg.seed, tmp_path / "solved.jsonl")
    studies = Studies(cfg, solved=rates, train_ids=list(range(64)))
    calls = []
    studies.rollout(0, [60, 61, 62, 63], scripted(set(), calls))
    assert calls[0] == (SolveRates(range(64), lambda t: "one", SAMPLES, 4, cfg.seed).tasks(0, 4), 0)
    assert len(calls) == 2 and calls[0][0] != [60, 61, 62, 63]
    line = json.loads((tmp_path / "solved.jsonl").read_text())
    assert line["step"] == 0 and sorted(t for t, _, _ in line["outcomes"]) == sorted(calls[0][0] + calls[1][0])
    assert all(n == SAMPLES and s == 0 for _, s, n in line["outcomes"])
    assert 0 < studies.played["solved/mixed_chance"] < 1

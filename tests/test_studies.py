"""studies/, the seam between the paper's method and the project's own studies: with every study off each
hook gives back its input unchanged, and no study is named in the method's files; each study's hook does
what its flag says."""
import ast
from pathlib import Path

import pytest
import torch

import config as configs
from rollout import Episode
from studies import Studies

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("curriculum", "min_groups", "refusal_penalty", "positive_only", "bc_anchor")


def test_the_method_files_name_no_study():
    """The studies' flags appear nowhere in the code of the method's files (docstrings and comments aside)."""
    for name in ("train.py", "rollout.py", "algorithms.py", "losses.py", "batch.py"):
        tree = ast.parse((ROOT / name).read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
                {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
                {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        assert not names & set(FLAGS), (name, names & set(FLAGS))


def test_both_hooks_give_the_method_its_own_values_by_default():
    studies = Studies(configs.Config())
    adv, returns = torch.tensor([[-1.0, 0.5], [2.0, 0.0]]), torch.tensor([[-1.0, 0.5], [2.0, 0.0]])
    eps = [Episode(0, 0, [1], 1, reward=0.5, refused=3), Episode(1, 0, [1], 1, reward=0.0)]
    rewards = torch.tensor([0.5, 0.0])
    batch = {"rewards": rewards, "groups": torch.tensor([0, 0])}
    assert studies.tasks(3) is None
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
    models), never startup.Run: the set-up depends on it, not it on the set-up."""
    for name in ("studies/warmstart.py", "studies/__init__.py", "studies/curriculum.py"):
        tree = ast.parse((ROOT / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
                   {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "startup" not in imported and "Run" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


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

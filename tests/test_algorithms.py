"""The masked reductions (losses.py, algorithms.py's whitening), and algorithms.py's terminal rewards and advantage estimators, against
hand-computed values (each worked out in a comment) and properties. The losses and the KL estimators
are in tests/test_losses.py.

Float64 throughout so that hand values can be compared tightly.
"""
import math
from dataclasses import replace

import pytest
import torch

import algorithms as A
import losses

from tests.support.float64 import NAN, close, float64_default, t  # noqa: F401 (an autouse fixture)


# ------------------------------------------------------------------ masked reductions

def test_masked_reductions_by_hand():
    x, m = t([1.0, 2.0, 3.0, 100.0]), t([1, 1, 1, 0])
    # sum 1+2+3 = 6, mean 2, unbiased var ((1-2)^2 + 0 + (3-2)^2) / (3-1) = 1, biased 2/3
    close(losses.masked_sum(x, m), 6.0)
    close(losses.masked_mean(x, m), 2.0)
    close(A.masked_var(x, m), 1.0)
    close(A.masked_var(x, m, unbiased=False), 2 / 3)
    # whiten: (x - 2) / sqrt(1 + 1e-8) = [-1, 0, 1], 0 where masked; shift_mean=False adds 2 back
    close(A.masked_whiten(x, m), t([-1.0, 0.0, 1.0, 0.0]) / math.sqrt(1 + 1e-8))
    close(A.masked_whiten(x, m, shift_mean=False), t([-1.0, 0.0, 1.0, 0.0]) / math.sqrt(1 + 1e-8) + t([2, 2, 2, 0]))
    # per-row mean: row 0 (1+3)/2 = 2, row 1 empty -> 0
    X, M = t([[1.0, 5.0, 3.0], [7.0, 8.0, 9.0]]), t([[1, 0, 1], [0, 0, 0]])
    close(losses.masked_mean(X, M, dim=1), t([2.0, 0.0]))


def test_masked_reductions_empty_and_single_and_nan():
    x = t([1.0, NAN, 3.0])
    for m in (t([0, 0, 0]), torch.zeros(3, dtype=torch.bool)):
        assert losses.masked_sum(x, m).item() == 0 and losses.masked_mean(x, m).item() == 0
        assert A.masked_var(x, m).item() == 0
        assert torch.equal(A.masked_whiten(x, m), torch.zeros(3))
    one = t([1, 0, 0])
    assert A.masked_var(x, one).item() == 0 and torch.equal(A.masked_whiten(x, one), torch.zeros(3))
    close(losses.masked_mean(x, t([1, 0, 1])), 2.0)  # the NaN sits under mask 0 and is never read


# ------------------------------------------------------------------ the terminal reward

def test_terminal_rewards_on_last_policy_token():
    mask = t([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    got = A.terminal_rewards(t([2.0, 3.0, 4.0]), mask)
    close(got, t([[0, 0, 0, 0, 2.0, 0], [0] * 6, [4.0, 0, 0, 0, 0, 0]]))
    assert torch.equal(A.terminal_rewards(t([2.0]), mask[:1].bool()), got[:1])  # bool mask too


# ------------------------------------------------------------------ estimators by hand

def test_grpo_by_hand():
    # groups: id 7 -> r [1, 2, 3]: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1 -> [-1, 0, 1] / (1 + eps)
    #         id 3 -> [4] alone -> 0;  id 9 -> [5, 5] all equal -> 0
    r, g = t([1.0, 2.0, 3.0, 4.0, 5.0, 5.0]), t([7, 7, 7, 3, 9, 9], torch.long)
    mask = t([[1, 1, 0]] * 6)
    adv, ret = A.advantages("grpo", A.Step(r, g, mask))
    per_row = t([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]) / (1 + 1e-6)
    close(adv, per_row[:, None] * mask)
    assert torch.equal(adv, ret)
    # Dr. GRPO: no division -> r - mean
    adv, _ = A.advantages("grpo", A.Step(r, g, mask), A.Options(norm_by_std=False))
    close(adv[:, 0], t([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))


def test_rloo_by_hand():
    # r [1, 2, 3]: 1 - (2+3)/2 = -1.5; 2 - (1+3)/2 = 0; 3 - (1+2)/2 = 1.5; singleton and [5, 5] -> 0
    r, g = t([1.0, 2.0, 3.0, 4.0, 5.0, 5.0]), t([7, 7, 7, 3, 9, 9], torch.long)
    mask = t([[0, 1, 1]] * 6)
    adv, ret = A.advantages("rloo", A.Step(r, g, mask))
    close(adv, t([-1.5, 0.0, 1.5, 0.0, 0.0, 0.0])[:, None] * mask)
    assert torch.equal(adv, ret)


MASK_RPP = t([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]])
KL_RPP = t([[9.0, 0.5, 1.0, 9.0, 2.0], [1.0, 1.0, 9.0, 9.0, 9.0]])
RAW = A.Options(whiten=False)  # the estimators before the batch whitening


def test_reinforce_pp_by_hand():
    # row 0 (reward 1): token rewards at pos 1, 2, 4 = -0.1*0.5, -0.1*1, 1 - 0.1*2 = -0.05, -0.1, 0.8
    #   return-to-go (gamma 1): pos4 0.8, pos2 0.7, pos1 0.65
    # row 1 (reward 0): pos 0, 1 = -0.1, -0.1 -> pos1 -0.1, pos0 -0.2
    r, g = t([1.0, 0.0]), t([0, 1], torch.long)
    raw, ret = A.advantages("reinforce++", A.Step(r, g, MASK_RPP, token_kl=KL_RPP), replace(RAW, kl_coef=0.1))
    expected = t([[0, 0.65, 0.7, 0, 0.8], [-0.2, -0.1, 0, 0, 0]])
    close(raw, expected)
    close(ret, expected)
    # whitened over the batch: mean (0.65+0.7+0.8-0.2-0.1)/5 = 0.37;
    # deviations .28 .33 .43 -.57 -.47, squares sum .918, unbiased var .918/4 = .2295
    adv, _ = A.advantages("reinforce++", A.Step(r, g, MASK_RPP, token_kl=KL_RPP), A.Options(kl_coef=0.1))
    close(adv, (expected - 0.37) / math.sqrt(0.2295 + 1e-8) * MASK_RPP)
    # gamma 0.5 discounts per POLICY token (pos 3 is an observation, not a step):
    #   pos4 0.8; pos2 -0.1 + 0.5*0.8 = 0.3; pos1 -0.05 + 0.5*0.3 = 0.1
    raw, _ = A.advantages("reinforce++", A.Step(r, g, MASK_RPP, token_kl=KL_RPP), replace(RAW, kl_coef=0.1, gamma=0.5))
    close(raw[0], t([0, 0.1, 0.3, 0, 0.8]))


def test_reinforce_pp_baseline_by_hand():
    # one group, rewards [1, 0] -> mean 0.5 -> [0.5, -0.5] on every policy token (gamma 1, no KL)
    # batch: [.5 .5 .5 -.5 -.5], mean .1, deviations .4 x3 and -.6 x2, ss 1.2, unbiased var .3
    r, g = t([1.0, 0.0]), t([4, 4], torch.long)
    raw, _ = A.advantages("reinforce++_baseline", A.Step(r, g, MASK_RPP), RAW)
    expected = t([[0, 0.5, 0.5, 0, 0.5], [-0.5, -0.5, 0, 0, 0]])
    close(raw, expected)
    adv, _ = A.advantages("reinforce++_baseline", A.Step(r, g, MASK_RPP))
    close(adv, (expected - 0.1) / math.sqrt(0.3 + 1e-8) * MASK_RPP)


def test_gae_by_hand():
    # policy tokens at positions 0, 1, 3 (pos 2 is an observation with a junk value 99), reward 1
    # gamma .9, lam .8:  delta(pos3) = 1 + .9*0 - .4 = .6                  A3 = .6
    #                    delta(pos1) = 0 + .9*.4 - .2 = .16                 A1 = .16 + .72*.6 = .592
    #                    delta(pos0) = 0 + .9*.2 - .5 = -.32                A0 = -.32 + .72*.592 = .10624
    # returns = A + V = [.60624, .792, 0, 1.0]
    mask, values = t([[1, 1, 0, 1]]), t([[0.5, 0.2, 99.0, 0.4]])
    adv, ret = A.advantages("gae", A.Step(t([1.0]), t([0], torch.long), mask, values=values),
                            replace(RAW, gamma=0.9, lam=0.8))
    close(adv, t([[0.10624, 0.592, 0.0, 0.6]]))
    close(ret, t([[0.60624, 0.792, 0.0, 1.0]]))
    # with KL in the reward, gamma = lam = 1, zero values: token rewards [-.1, -.2, _, 1 - .3]
    # -> advantages = return-to-go [.4, .5, 0, .7]
    adv, _ = A.advantages("gae", A.Step(t([1.0]), t([0], torch.long), mask, values=torch.zeros(1, 4),
                                        token_kl=t([[0.1, 0.2, 5.0, 0.3]])), replace(RAW, kl_coef=1.0))
    close(adv, t([[0.4, 0.5, 0.0, 0.7]]))


# ------------------------------------------------------------------ estimator properties

def random_batch(seed, B=12, T=9, groups=4):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=gen) < 0.6).double()
    mask[0] = 0  # one empty row
    rewards = torch.randn(B, generator=gen)
    group_ids = torch.arange(B) % groups
    values = torch.randn(B, T, generator=gen)
    token_kl = torch.rand(B, T, generator=gen)
    return rewards, mask, group_ids, values, token_kl


def test_grpo_zero_mean_and_unit_std_within_each_group():
    r, mask, g, _, _ = random_batch(1)
    mask[0] = 1
    adv, _ = A.advantages("grpo", A.Step(r, g, mask))
    per_row = adv[torch.arange(len(r)), mask.argmax(1)]
    for k in g.unique():
        rows = per_row[g == k]
        assert abs(rows.mean().item()) < 1e-12
        assert abs(rows.std().item() - 1) < 1e-5  # std / (std + 1e-6)


def test_rloo_equals_reward_minus_mean_of_the_others():
    r, mask, g, _, _ = random_batch(2)
    mask[0] = 1
    adv, _ = A.advantages("rloo", A.Step(r, g, mask))
    for i in range(len(r)):
        others = [r[j].item() for j in range(len(r)) if g[j] == g[i] and j != i]
        close(adv[i][mask[i].bool()], torch.full((int(mask[i].sum()),), r[i].item() - sum(others) / len(others)))


@pytest.mark.parametrize("name", A.ESTIMATORS)
def test_masked_out_entries_cannot_change_any_estimator(name):
    r, mask, g, values, token_kl = random_batch(3)
    opts = A.Options(gamma=0.95, lam=0.9, kl_coef=0.05 if name.startswith("reinforce") or name == "gae" else 0.0)
    states = [[f"s{i}"] for i in range(len(r))]  # gigpo: each episode's turns answered states of its own
    base = A.advantages(name, A.Step(r, g, mask, values, token_kl, states), opts)
    off = mask == 0
    for junk in (torch.randn_like(values) * 1e3, torch.full_like(values, NAN), torch.full_like(values, math.inf)):
        got = A.advantages(name, A.Step(r, g, mask, torch.where(off, junk, values), torch.where(off, junk, token_kl),
                                        states), opts)
        for a, b in zip(base, got):
            assert torch.equal(a, b)
    for out in base:
        assert torch.isfinite(out).all() and (out[off] == 0).all()


def test_gae_with_unit_gamma_lam_is_return_minus_value():
    r, mask, g, values, _ = random_batch(4)
    adv, ret = A.advantages("gae", A.Step(r, g, mask, values=values), RAW)
    close(adv, (r[:, None] - values) * mask)
    close(ret, r[:, None] * mask)
    whitened, _ = A.advantages("gae", A.Step(r, g, mask, values=values))
    close(whitened, A.masked_whiten(adv, mask))


@pytest.mark.parametrize("name", ["gae", "reinforce++", "reinforce++_baseline"])
def test_inserting_observation_tokens_leaves_policy_token_advantages_unchanged(name):
    gen = torch.Generator().manual_seed(5)
    turns = [3, 2, 4]                        # policy tokens per turn
    B, n = 3, sum(turns)
    values, kl = torch.randn(B, n, generator=gen), torch.rand(B, n, generator=gen)
    r, g = torch.randn(B, generator=gen), t([0, 0, 1], torch.long)
    opts = A.Options(gamma=0.9, lam=0.8, kl_coef=0.1)
    compact = A.advantages(name, A.Step(r, g, torch.ones(B, n), values, kl), opts)
    # interleave observations (mask 0, random values) between turns and as right padding
    cols = []
    start = 0
    for k, length in enumerate(turns):
        obs = 2 + k
        cols += [None] * obs + list(range(start, start + length))
        start += length
    cols += [None] * 3
    T = len(cols)
    mask = t([[0.0 if c is None else 1.0 for c in cols]] * B)
    idx = [j for j, c in enumerate(cols) if c is not None]
    wide_v, wide_kl = torch.randn(B, T, generator=gen) * 50, torch.randn(B, T, generator=gen) * 50
    wide_v[:, idx], wide_kl[:, idx] = values, kl
    wide = A.advantages(name, A.Step(r, g, mask, wide_v, wide_kl), opts)
    for a, b in zip(compact, wide):
        close(b[:, idx], a)
        assert (b[mask == 0] == 0).all()


def test_reinforce_pp_whitens_over_the_batch_not_per_group():
    # group 0 rewards [10, 12], group 1 rewards [0, 1]: batch whitening keeps group 0 above group 1
    r, g = t([10.0, 12.0, 0.0, 1.0]), t([0, 0, 1, 1], torch.long)
    mask = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    adv, _ = A.advantages("reinforce++", A.Step(r, g, mask))
    close(losses.masked_mean(adv, mask), 0.0)
    close(A.masked_var(adv, mask), 1.0, tol=1e-6)
    group0 = losses.masked_mean(adv[:2], mask[:2])
    assert group0 > 0.5 and losses.masked_mean(adv[2:], mask[2:]) < -0.5  # per-group whitening would give 0


def test_group_of_one_all_equal_and_empty_masks():
    mask = t([[1, 1], [1, 0], [0, 0], [1, 1]])
    r, g = t([3.0, 2.0, 2.0, 7.0]), t([0, 0, 0, 1], torch.long)   # group 1 is a singleton
    for name in ("grpo", "rloo"):
        adv, _ = A.advantages(name, A.Step(r, g, mask))
        assert (adv[3] == 0).all() and (adv[2] == 0).all() and torch.isfinite(adv).all()
    same = A.advantages("grpo", A.Step(t([1.0, 1.0, 1.0, 1.0]), t([0, 0, 0, 0], torch.long), mask))[0]
    assert torch.equal(same, torch.zeros(4, 2))
    for name in A.ESTIMATORS:  # an all-empty batch: zeros everywhere, never NaN
        empty = A.Step(r, g, torch.zeros(4, 2), values=torch.randn(4, 2), states=[["s"]] * 4)
        for out in A.advantages(name, empty):
            assert torch.equal(out, torch.zeros(4, 2))
        # a single policy token in the whole batch whitens to 0, not NaN
        one = torch.zeros(4, 2)
        one[1, 0] = 1
        assert torch.isfinite(A.advantages(name, replace(empty, mask=one))[0]).all()


def test_invalid_inputs_raise_clear_errors():
    mask, g = torch.ones(2, 3), t([0, 0], torch.long)
    with pytest.raises(ValueError, match=r"reward is NaN or infinite \(rows \[1\]\)"):
        A.advantages("grpo", A.Step(t([1.0, NAN]), g, mask))
    with pytest.raises(ValueError, match="reward is NaN or infinite"):
        A.advantages("gae", A.Step(t([math.inf, 0.0]), g, mask, values=torch.zeros(2, 3)))
    with pytest.raises(ValueError, match=r"value is NaN or infinite \(rows \[0\]\)"):
        A.advantages("gae", A.Step(t([1.0, 0.0]), g, mask, values=t([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]])))
    with pytest.raises(ValueError, match="gae needs critic values"):
        A.advantages("gae", A.Step(t([1.0, 0.0]), g, mask))
    with pytest.raises(ValueError, match="needs token_kl"):
        A.advantages("reinforce++", A.Step(t([1.0, 0.0]), g, mask), A.Options(kl_coef=0.1))
    with pytest.raises(ValueError, match="token_kl is NaN"):
        A.advantages("reinforce++", A.Step(t([1.0, 0.0]), g, mask, token_kl=torch.full((2, 3), NAN)),
                     A.Options(kl_coef=0.1))
    with pytest.raises(ValueError, match="grpo takes no KL in the reward"):
        A.advantages("grpo", A.Step(t([1.0, 0.0]), g, mask), A.Options(kl_coef=0.1))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        A.advantages("ppo", A.Step(t([1.0, 0.0]), g, mask))
    with pytest.raises(ValueError, match=r"must have shape \(2,\)"):
        A.advantages("grpo", A.Step(t([1.0, 0.0, 3.0]), g, mask))


def test_each_algo_is_one_record_that_config_and_the_trainer_read():
    from launch import checks
    import config
    assert {a.estimator for a in A.ALGOS.values()} == set(A.ESTIMATORS)
    assert [n for n, a in A.ALGOS.items() if a.critic] == ["ppo"]
    assert sorted(n for n, a in A.ALGOS.items() if a.kl == "reward") == ["reinforce++", "reinforce++_baseline"]
    assert [n for n, a in A.ALGOS.items() if a.states] == ["gigpo"]
    for name, algo in A.ALGOS.items():
        assert checks.derive(config.parse(["--algo", name])).algo is algo
        problem = checks.check(config.parse(["--algo", name, "--samples-per-task", "1"]), 1)
        assert ("--samples-per-task 2" in (problem or "")) == algo.grouped, (name, problem)

"""GiGPO's step-level groups (studies/gigpo.py, algorithms.advantages("gigpo")): exact values on a hand-made
step, the token layout, and the cases that must add nothing (a state seen once, equal returns, a group
whose episodes all failed)."""
import math

import pytest
import torch

import algorithms as A
from studies import gigpo

# Group 0: three episodes of one task that all start in state "s"; episodes 0 and 2 then meet "a".
# Group 1: one episode, whose first observation renders like group 0's (same key, another task).
STATES = [["s", "a"], ["s", "b", "c"], ["s", "a"], ["s"]]
GROUPS = torch.tensor([0, 0, 0, 1])
REWARDS = [1.0, 0.0, 0.5, 1.0]  # exact in bfloat16


def gigpo_adv(rewards, groups, states, masks, rows=None, gamma=0.95, weight=1.0, eps=1e-6):
    """The estimator's token advantages through the one entry point."""
    return A.advantages("gigpo", A.Step(rewards, groups, masks, states=states, rows=rows),
                        A.Options(gamma=gamma, eps=eps, step_weight=weight))[0]


def mask_of(turn_lengths, width=16, prompt=2):
    """A (1, width) mask: `prompt` zeros, then each turn's run of ones followed by one observation zero."""
    row, at = torch.zeros(1, width), prompt
    for n in turn_lengths:
        row[0, at:at + n] = 1
        at += n + 1
    return row


def test_turn_index_numbers_each_run_of_policy_tokens():
    mask = torch.cat([mask_of([2, 3]), mask_of([1, 1, 1]), torch.zeros(1, 16)])
    turns = gigpo.turn_index(mask)
    assert turns[0].tolist()[:9] == [-1, -1, 0, 0, -1, 1, 1, 1, -1]
    assert turns[1].tolist()[:8] == [-1, -1, 0, -1, 1, -1, 2, -1]
    assert (turns[2] == -1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_step_advantages_by_hand(dtype):
    """gamma 0.5: returns per turn [0.5, 1], [0, 0, 0], [0.25, 0.5], [1]. Step group (0, s) holds
    0.5, 0 and 0.25 (mean 0.25, std 0.25); (0, a) holds 1 and 0.5 (mean 0.75, std 0.3536); (0, b),
    (0, c) and (1, s) hold one turn each: 0."""
    steps = A.step_advantages(torch.tensor(REWARDS, dtype=dtype), GROUPS, STATES, gamma=0.5, eps=0.0)
    want = [[1.0, 1 / math.sqrt(2)], [-1.0, 0.0, 0.0], [0.0, -1 / math.sqrt(2)], [0.0]]
    for got, w in zip(steps, want):
        assert got.dtype == torch.float64
        assert got.tolist() == pytest.approx(w, abs=1e-12)


def test_token_advantages_are_episode_plus_weighted_step_terms():
    masks = torch.cat([mask_of([2, 3]), mask_of([1, 2, 1]), mask_of([3, 1]), mask_of([2])])
    adv = gigpo_adv(torch.tensor(REWARDS), GROUPS, STATES, masks, gamma=0.5, weight=0.5, eps=0.0)
    episode = [1.0, -1.0, 0.0, 0.0]  # GRPO's: group 0 rewards 1, 0, 0.5 (mean 0.5, std 0.5); group 1 alone
    step = [[1.0, 1 / math.sqrt(2)], [-1.0, 0.0, 0.0], [0.0, -1 / math.sqrt(2)], [0.0]]
    turns = gigpo.turn_index(masks)
    assert adv.dtype == torch.float32 and (adv[masks == 0] == 0).all()
    for i in range(4):
        for t, a_s in enumerate(step[i]):
            on = turns[i] == t
            assert on.any() and torch.allclose(adv[i, on], torch.tensor(episode[i] + 0.5 * a_s), atol=1e-6)


def test_weight_zero_is_grpo_and_rows_select_this_ranks_share():
    masks = torch.cat([mask_of([2, 3]), mask_of([1, 2, 1]), mask_of([3, 1]), mask_of([2])])
    rewards = torch.tensor(REWARDS)
    grpo, _ = A.advantages("grpo", A.Step(rewards, GROUPS, masks))
    assert torch.equal(gigpo_adv(rewards, GROUPS, STATES, masks, weight=0.0), grpo)
    full = gigpo_adv(rewards, GROUPS, STATES, masks, gamma=0.9)
    assert torch.equal(gigpo_adv(rewards, GROUPS, STATES, masks[2:], rows=slice(2, 4), gamma=0.9), full[2:])


def test_failed_group_equal_returns_and_unmatched_rows_add_nothing():
    masks = torch.cat([mask_of([2, 2])] * 3)
    failed = gigpo_adv(torch.zeros(3), torch.zeros(3, dtype=torch.long), [["s", "a"]] * 3, masks)
    assert (failed == 0).all()  # all failed: no episode term and every return 0
    same = A.step_advantages(torch.ones(3), torch.zeros(3, dtype=torch.long), [["s", "a"]] * 3, gamma=0.95)
    assert all((s == 0).all() for s in same)  # same states, same returns: exactly 0, not eps-sized noise
    # row 1 has two runs of tokens but three states: it gets its episode term alone, on every token
    adv = gigpo_adv(torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long),
                           [["s", "a"], ["s", "b", "c"], ["s", "a"]], masks, gamma=0.5, eps=0.0)
    episode, _ = A.grpo(A.Step(torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long)), A.Options(eps=0.0))
    episode = float(episode[1])  # without a mask, one value an episode
    assert torch.allclose(adv[1][masks[1] == 1], torch.tensor(episode))


def test_shared_turns_counts_states_met_twice_in_a_group():
    # group 0: "s" three times, "a" twice, "b" and "c" once; group 1's "s" is alone in its group
    assert gigpo.shared_turns(GROUPS, STATES) == pytest.approx(5 / 8)
    assert gigpo.shared_turns(torch.zeros(0, dtype=torch.long), []) == 0.0


def test_state_key_is_the_exact_text():
    assert gigpo.state_key("You see a red ball.") == gigpo.state_key("You see a red ball.")
    assert gigpo.state_key("You see a red ball.") != gigpo.state_key("You see a red ball. ")
    assert len(gigpo.state_key("")) == 16


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(ValueError, match="as many group ids and state lists"):
        A.step_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), [["s"]])
    with pytest.raises(ValueError, match="NaN"):
        A.step_advantages(torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long), [["s"], ["s"]])

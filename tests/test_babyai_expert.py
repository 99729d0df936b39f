"""Tests of envs/babyai_expert.py, the BabyAI expert for behaviour-cloning demonstrations.

- every expert reply parses, names a listed action and is executed by `BabyAI.step` (never refused);
- replies are deterministic per task id, whatever ran before, and the expert state resets with the env;
- it solves at least 90% of a sample of train tasks within a generous turn budget, and every level
  of the first 40 train ids except OpenDoorsOrderN4Debug, whose strict "after you"/"then" missions
  minigrid's verifier fails on the very toggle that completes the first part (shown below);
- it compresses the bot's walks into single "go to"/"pickup" actions, and thoughts are short and
  depend on the situation;
- it picks up again after other (non-expert) actions were taken in between.

Run: python -m pytest tests/test_babyai_expert.py   (about 15-30 s)
"""
from __future__ import annotations

import random
import re

import pytest

from envs import parse_action
from envs.babyai import LEVELS, BabyAI
from envs.babyai_expert import same_state

BUDGET = 150          # turns; generous: exploring a 3x3-room level one step per turn takes 50-90
UNSOLVABLE = {"BabyAI-OpenDoorsOrderN4Debug-v0"}  # see test_open_doors_order_fails_in_minigrids_verifier
REFUSED = re.compile(r"not a recognised action|Invalid (reply|action)|Choose one of the available actions")


def listed_actions(observation: str) -> list[str]:
    return re.findall(r'"([^"]+)"', observation.rsplit("Available actions:", 1)[-1])


def play(env: BabyAI, task: int, budget: int = BUDGET) -> list[tuple[str, str]]:
    """(reply, observation) per turn of the expert on `task`, checking each reply is accepted."""
    observation, transcript = env.reset(task), []
    for _ in range(budget):
        reply = env.expert()
        action, error = parse_action(reply)
        assert error is None and action in listed_actions(observation), (task, reply, observation)
        observation, reward, done = env.step(reply)
        assert not REFUSED.search(observation), (task, reply, observation)
        transcript.append((reply, observation))
        if done:
            break
    return transcript


@pytest.fixture(scope="module")
def env():
    env = BabyAI()
    yield env
    env.close()


@pytest.fixture(scope="module")
def first_40(env):
    """One task per level (train seed 0): task id -> (success, transcript)."""
    results = {}
    for task in range(len(LEVELS)):
        transcript = play(env, task)
        results[task] = (env.success, transcript)
    return results


def test_every_level_of_the_first_40_train_tasks(env, first_40):
    failed = sorted(env.level(task) for task, (success, _) in first_40.items() if not success)
    print("\nexpert fails on:", failed or "none")
    assert set(failed) <= UNSOLVABLE, failed
    turns = {env.level(task): len(transcript) for task, (_, transcript) in first_40.items()}
    # Bot blind spots handled by the expert: a key hidden in a box, an object already in hand.
    assert turns["BabyAI-KeyInBox-v0"] < 20 and turns["BabyAI-PutNextS7N4Carrying-v0"] < 20, turns


def test_solves_most_of_a_train_sample(env):
    tasks = env.tasks("train")[40:120]  # seeds 1 and 2 of every level
    failed = []
    for task in tasks:
        play(env, task)
        if not env.success:
            failed.append(env.level(task))
    assert len(failed) <= 0.1 * len(tasks), failed
    assert set(failed) <= UNSOLVABLE, failed


def test_open_doors_order_fails_in_minigrids_verifier(env):
    """The expert opens the first door of 'open the X door after you open the Y door' and the mission
    fails on that same toggle: AfterInstr re-verifies the toggle against the second, strict OpenInstr,
    which sees the wrong door in front. No agent can solve these missions in minigrid 3.x."""
    task = [name for name, _ in LEVELS].index("OpenDoorsOrderN4Debug-v0")  # seed 0: an "after you" mission
    transcript = play(env, task)
    first_door = re.search(r"after you open the (\w+) door", env.env.mission).group(1)
    reply, observation = transcript[-1]
    assert parse_action(reply)[0] == "toggle" and f"{first_door} open door 1 right in front" in observation
    assert observation.startswith("The mission failed.") and not env.success


def test_deterministic_per_task_id_and_reset_clears_state(env):
    tasks = [len(LEVELS) * 3 + i for i in (6, 25, 27, 38)]  # GoToImpUnlock, KeyInBox, BlockedUnlock, Boss
    first = [[reply for reply, _ in play(env, task)] for task in tasks]
    other = BabyAI()
    play(other, 0)  # a different history before each replay must not matter
    second = [[reply for reply, _ in play(other, task)] for task in reversed(tasks)][::-1]
    other.close()
    assert first == second
    env.reset(tasks[0])  # abandon an episode half-way: the next reset must start a fresh expert
    for _ in range(3):
        env.step(env.expert())
    assert [reply for reply, _ in play(env, tasks[0])] == first[0]


def test_walks_are_compressed_into_object_actions(env, first_40):
    # GoToRedBall seed 0: the ball is in view, the bot's whole walk is one "go to" action.
    (reply, observation), = first_40[[name for name, _ in LEVELS].index("GoToRedBall-v0")][1]
    assert parse_action(reply)[0] == "go to red ball 1" and "The task is completed" in observation
    actions = [parse_action(reply)[0] for _, transcript in first_40.values() for reply, _ in transcript]
    walks = [a for a in actions if a.startswith(("go to", "pickup", "go through", "toggle and go"))]
    assert len(walks) >= 0.15 * len(actions), len(walks) / len(actions)


def test_thoughts_are_short_and_situational(first_40):
    thoughts: dict[str, set[str]] = {}
    for _, transcript in first_40.values():
        for reply, _ in transcript:
            assert re.fullmatch(r"Thought:\n[^\n]+\n\nAction:\n[^\n]+", reply), reply
            thought, action = reply.split("\n")[1], parse_action(reply)[0]
            assert len(thought.split()) <= 15, thought
            thoughts.setdefault(action.split()[0], set()).add(thought)
            if action.startswith(("go to", "pickup")):  # an object action names its object
                assert action.split(" ", 1 + action.startswith("go to"))[-1] in thought, reply
    assert len(set().union(*thoughts.values())) >= 20, thoughts
    assert not thoughts["turn"] & thoughts["pickup"]  # a turn and a pickup are never explained alike


def test_takes_over_after_other_actions(env):
    rng, stale = random.Random(0), 0
    for task in [len(LEVELS) * 4 + i for i in (1, 5, 16, 23, 26, 33)]:
        observation = env.reset(task)
        env.expert()  # the expert plans once, then someone else acts: its shadow goes stale
        for _ in range(4):
            action = rng.choice([a for a in listed_actions(observation) if a in ("turn left", "turn right",
                                                                                  "move forward")])
            observation, _, done = env.step(f"Thought:\nx\n\nAction:\n{action}")
        stale += not same_state(env._expert.shadow.env, env.env)
        for _ in range(BUDGET):
            observation, _, done = env.step(env.expert())
            assert not REFUSED.search(observation), observation
            if done:
                break
        assert env.success, (env.level(task), observation)
    assert stale >= 4  # the rebuild path was exercised


def test_expert_refuses_a_finished_episode(env):
    play(env, 1)
    assert env.done
    with pytest.raises(RuntimeError):
        env.expert()

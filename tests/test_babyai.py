"""BabyAI env tests against the real minigrid levels.

- a scripted policy that reads only our text observations and answers with the listed action strings
  solves the single-room GoTo and Pickup levels on fixed seeds (so the text, the numbering and the BFS
  planner together are enough to act on);
- all 40 levels reset and step, deterministically per task id; splits are disjoint;
- the reward on success is minigrid's 1 - 0.9 * steps / max_steps;
- malformed and impossible actions say what is wrong and list what is allowed; "pick up" works;
- the BFS planner walks around walls and reports unreachable targets;
- every listed action is accepted and executes, over a long random walk through many levels;
- a few thousand adversarial replies never raise and always return (str, float, bool).
"""
from __future__ import annotations

import random
import re

import pytest

from envs import Env, make
from envs.babyai import LEVELS, TEST_SEEDS, plan_to_face
from tests.support.adversarial import adversarial_replies

COLORS = "red|green|blue|purple|yellow|grey"
REFUSED = re.compile(r"'.*' is not a recognised|You cannot (move|drop|pick|open|go|toggle)|You are already"
                     r"|There is nothing|The door in front of you is locked")  # the env's refusals
SOLVABLE = ["GoToRedBallGrey-v0", "GoToRedBall-v0", "GoToRedBallNoDists-v0", "GoToObjS4-v0",
            "GoToLocalS8N7-v0", "GoToRedBlueBall-v0", "GoToDoor-v0", "PickupDistDebug-v0"]


def listed_actions(observation: str) -> list[str]:
    return re.findall(r'"([^"]+)"', observation.rsplit("Available actions:", 1)[-1])


def scripted_policy(observation: str, mission: str, turns: int) -> str:
    """Take the mission's target when an action offers it; otherwise look around, then cross the room."""
    verb, color, kind = re.match(rf"(go to|pick up) (?:the|a) (?:({COLORS}) )?(\w+)", mission).groups()
    verb = "go to" if verb == "go to" else "pickup"
    color, kind = color or r"\w+", r"\w+" if kind == "object" else kind
    actions = listed_actions(observation)
    wanted = re.compile(rf"{verb} {color} (?:\w+ )?{kind} \d+$")  # doors carry a state word
    hits = [a for a in actions if wanted.match(a)]
    if hits:
        return hits[0]
    if turns % 4 != 3:  # three left turns show every side of the agent
        return "turn left"
    walks = [a for a in actions if a.startswith("go to")]  # the farthest object in view is listed last
    return walks[-1] if walks else ("move forward" if "move forward" in actions else "turn right")


def reply(action: str) -> str:
    return f"Thought:\nI will {action}.\n\nAction:\n{action}"


@pytest.fixture(scope="module")
def env():
    env = make("babyai")
    yield env
    env.close()


@pytest.mark.parametrize("level", SOLVABLE)
def test_scripted_policy_solves_goto_and_pickup(env, level):
    index = [name for name, _ in LEVELS].index(level)
    for seed in range(10):
        observation = env.reset(seed * len(LEVELS) + index)
        mission = observation.splitlines()[0].removeprefix("Your goal: ")
        for turn in range(20):
            observation, reward, done = env.step(reply(scripted_policy(observation, mission, turn)))
            if done:
                break
        assert env.success and done and 0.0 < reward <= 1.0, f"{level} seed {seed}: {observation}"


def test_all_levels_reset_and_step(env):
    assert isinstance(env, Env)
    for index, (name, family) in enumerate(LEVELS):
        task = TEST_SEEDS[0] * len(LEVELS) + index
        first = env.reset(task)
        assert first.startswith("Your goal: ") and "Available actions: [" in first, name
        assert env.subtask(task) == family and env.reset(task) == first  # deterministic per task id
        for action in ("turn left", "move forward", "turn right", "check available actions"):
            observation, reward, done = env.step(reply(action))
            assert isinstance(observation, str) and reward == 0.0 and not done, (name, action, observation)
        actions = [a for a in listed_actions(observation) if a.startswith(("go to", "pickup"))]
        if actions:
            observation, reward, done = env.step(reply(actions[0]))
            assert "not a recognised action" not in observation, (name, actions[0])


def test_splits_are_disjoint_and_cover_every_level(env):
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) == 40_000 and len(test) == 200 and not set(train) & set(test)
    assert {env.subtask(t) for t in test} == {family for _, family in LEVELS}
    with pytest.raises(ValueError):
        env.tasks("dev")


def test_reward_is_minigrid_time_discount(env):
    env.reset(1)  # GoToRedBall seed 0: the red ball is in view
    observation, reward, done = env.step(reply("go to red ball 1"))
    level = env.env
    assert done and env.success and "task is completed" in observation
    assert reward == pytest.approx(1 - 0.9 * level.step_count / level.max_steps)
    assert env.step(reply("turn left")) == ("The episode is over. Start a new one with reset().", reward, True)


def test_errors_explain_and_pick_up_is_accepted(env):
    first = env.reset(LEVELS.index(("PickupDistDebug-v0", "Pickup")))
    target = next(a for a in listed_actions(first) if a.startswith("pickup"))
    observation, reward, done = env.step("no action here")
    assert "Action:" in observation and "Available actions:" in observation and (reward, done) == (0.0, False)
    observation, reward, done = env.step(reply("drop"))
    assert "not carrying anything" in observation and (reward, done) == (0.0, False)
    observation, _, _ = env.step(reply("fly away"))
    assert "not a recognised action" in observation and "Available actions:" in observation
    observation, _, _ = env.step(reply("check available actions"))
    assert observation.startswith("You can take the following actions: turn left")
    observation, _, done = env.step(reply(target.replace("pickup", "Pick up").removesuffix(" 1") + "."))
    assert "You are carrying a" in observation or done


def test_planner_walks_around_obstacles():
    import numpy as np
    image = np.ones((7, 7, 3), dtype=np.uint8)  # every cell empty (type 1)
    image[:, :, 1:] = 0
    image[3, 5] = (2, 5, 0)                      # a wall right in front of the agent
    path = plan_to_face(image, (3, 3))           # face the cell two steps beyond the wall
    assert path is not None and len(path) == 7   # left, 3 steps up the side, right: 7 primitives
    image[:, 4] = (2, 5, 0)                      # a full row of wall cuts the view in two
    assert plan_to_face(image, (3, 2)) is None


def test_fuzz_replies_never_raise(env):
    words = ["turn", "left", "right", "move", "forward", "go", "to", "through", "pickup", "pick", "up",
             "toggle", "and", "drop", "check", "available", "actions", "red", "grey", "blue", "ball", "box",
             "key", "door", "open", "closed", "locked", "1", "2", "0", "-1", "turn left", "move forward"]
    task, resets = 0, 0
    env.reset(task)
    for text in adversarial_replies(3000, words, seed=2):
        out = env.step(text)
        assert isinstance(out, tuple) and len(out) == 3
        observation, reward, done = out
        assert isinstance(observation, str) and observation and type(reward) is float and type(done) is bool
        assert 0.0 <= reward <= 1.0
        if done:
            resets += 1
            env.reset(resets * 7)  # walk through many levels and seeds
    assert env.step(reply("turn left"))[0]


def test_random_walk_over_listed_actions(env):
    """Every listed action executes on every level (doors, keys, boxes, drops), never 'not recognised'."""
    rng = random.Random(3)
    observation, successes = env.reset(0), 0
    for step in range(2000):
        action = rng.choice(listed_actions(observation)[:-1])  # all but "check available actions"
        observation, reward, done = env.step(reply(action))
        assert not REFUSED.match(observation), (action, observation)
        assert 0.0 <= reward <= 1.0
        if done:
            successes += env.success
            observation = env.reset(rng.randrange(40 * 50))
    assert successes > 0  # random high-level actions finish some missions

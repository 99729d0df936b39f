"""AgentGym task ids (`--tasks-file`) and SciWorld's paper task set.

- every `sciworld_<n>` lands on the (task type, variation) of the original server's rule, recomputed
  here from the scienceworld package's own task list and the simulator's variation counts, for every n;
- the paper task set keeps the 23 task types and has no 'check valid actions'; AgentGym's action parsing;
- babyai ids play the level and seed of the original server's rule, written out here from its source
  (its 1-based level dict, `data_idx % 40 + 1`, seed `data_idx // 40`, a new env per reset, reset
  twice), grid for grid, on ids of every level; its level 3 built as minigrid <= 2.3.1 registered it;
  searchqa ids are data rows;
- textcraft and webarena ids are refused with the reason; malformed files give one-line errors.

Run: python -m pytest tests/test_agentgym_ids.py   (one ScienceWorld JVM, a few seconds)
"""
from __future__ import annotations

import json

import gymnasium as gym
import pytest

from envs import agentgym
from envs.babyai import LEVELS, BabyAI
from envs.sciworld import AGENTGYM_TYPES, OFFSETS, TASK_TYPES, SciWorld


def write(tmp_path, items, name="tasks.json"):
    path = tmp_path / name
    path.write_text(json.dumps(items))
    return str(path)


@pytest.fixture(scope="module")
def sciworld():
    env = SciWorld(task_set="agentgym", parser="agentgym")
    yield env
    env.close()


def test_every_sciworld_id_lands_where_the_original_server_put_it(sciworld, tmp_path):
    from scienceworld.constants import ID2TASK  # the package's task dict, in the simulator's order

    # The original rule: the task dict in order, without seven types, every variation of each.
    skipped = {"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"}
    games = [(name, v) for code, name in ID2TASK.items() if code not in skipped
             for v in range(sciworld._sim.getTaskMaxVariations(name))]
    assert len({name for name, _ in games}) == 23 and len(games) == 4639
    ours = [sciworld.locate(agentgym.task_id("sciworld", n, {})) for n in range(len(games))]
    assert ours == games
    with pytest.raises(ValueError, match="outside"):
        agentgym.task_id("sciworld", len(games), {})
    # through a file, in the file's order
    path = write(tmp_path, [{"item_id": "sciworld_17"}, "sciworld_3", 4000, "sciworld_17"])
    assert [sciworld.locate(t) for t in agentgym.task_ids(path, "sciworld", {})] == [games[17], games[3], games[4000]]


def test_paper_task_set(sciworld):
    kept = {TASK_TYPES[k][2] for k in AGENTGYM_TYPES}
    test = sciworld.tasks("test")
    assert {sciworld.locate(t)[0] for t in test} == kept and len(kept) == 23
    assert len(test) == sum(TASK_TYPES[k][5] for k in AGENTGYM_TYPES) == 1171
    assert "check valid actions" not in sciworld.instruction
    assert "check valid actions" in SciWorld.instruction  # the default set keeps it
    sciworld.reset(OFFSETS[11])  # find-living-thing
    obs, reward, done = sciworld.step("Thought:\nlist them\n\nAction:\ncheck valid actions")
    assert obs.strip() == "No known action matches that input." and reward == 0.0 and not done
    # AgentGym's parsing: the text after the first `Action:`, wherever it stands; no `Action:` at all
    # means the whole reply is the action
    obs, _, _ = sciworld.step("I will look. Action: look around")
    assert obs.startswith("This room is called")
    obs, _, _ = sciworld.step("look around")
    assert obs.startswith("This room is called")
    obs, _, done = sciworld.step("Thought:\n\nAction:\n   ")
    assert "no action" in obs and not done
    with pytest.raises(ValueError, match="task_set"):
        SciWorld(task_set="paper23")


# The original AgentGym BabyAI server's level dict (agentenv-babyai), 1-based as there.
ORIGINAL_LEVELS = dict(enumerate([
    "GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6", "GoToLocalS8N7", "GoToObjMazeS7",
    "GoToImpUnlock", "GoToSeqS5R2", "GoToRedBlueBall", "GoToDoor", "GoToObjDoor", "Open", "OpenRedDoor",
    "OpenDoorLoc", "OpenRedBlueDoorsDebug", "OpenDoorsOrderN4Debug", "Pickup", "UnblockPickup", "PickupLoc",
    "PickupDistDebug", "PickupAbove", "PutNextLocalS6N4", "PutNextS7N4Carrying", "Unlock", "UnlockLocalDist",
    "KeyInBox", "UnlockPickupDist", "BlockedUnlockPickup", "UnlockToUnlock", "ActionObjDoor", "FindObjS7",
    "KeyCorridorS6R3", "OneRoomS20", "MoveTwoAcrossS8N9", "SynthS5R2", "SynthLoc", "SynthSeq", "MiniBossLevel",
    "BossLevel", "BossLevelNoUnlock"], start=1))


def original_level(data_idx: int):
    """The level the original server plays for `babyai_<data_idx>`: `all_levels[data_idx % 40 + 1]`, seed
    `data_idx // 40`, a new gymnasium env reset in the wrapper's __init__ and again by the server."""
    name = f"BabyAI-{ORIGINAL_LEVELS[data_idx % 40 + 1]}-v0"
    if name == "BabyAI-GoToObjS6-v0":  # minigrid 2.1-2.3.1 registered it so; 3.x refuses -v0
        from minigrid.envs.babyai import GoToObj
        env = GoToObj(room_size=4)
    else:
        env = gym.make(name).unwrapped
    env.reset(seed=data_idx // 40)
    env.reset(seed=data_idx // 40)
    return env


def test_babyai_ids_play_the_original_level_and_seed(tmp_path):
    # every level at seeds 0, 1 and 3 and one more, up to the test seeds; 155, 156 and 90556 (Synth levels)
    # are draws that minigrid 3.2's changed mission sampling turned into other missions
    numbers = sorted({seed * 40 + level for level in range(40) for seed in (0, 1, 3, (level * 7919) % 3000)}
                     | {155, 156, 90556, 100_000 * 40 + 3, 49_999 * 40 + 38})
    items = [{"item_id": f"babyai_{n}"} for n in numbers]
    ids = agentgym.task_ids(write(tmp_path, items), "babyai", {})
    assert ids == numbers
    env = BabyAI(parser="agentgym")
    env.reset(ids[-1])  # a Boss level first: what a level played before leaves behind must not matter
    for n, task in zip(numbers, ids):
        first = env.reset(task)
        original = original_level(n)
        ours = env.env
        assert (ours.width, ours.height, ours.max_steps) == (original.width, original.height, original.max_steps), n
        assert (ours.grid.encode() == original.grid.encode()).all(), n
        assert (tuple(ours.agent_pos), ours.agent_dir) == (tuple(original.agent_pos), original.agent_dir), n
        assert ours.mission == original.mission and first.startswith(f"Your goal: {ours.mission}\n"), n
    # The missions the original's minigrid (2.3.1; 3.1.0 is the same here) gives these three, measured
    # there: 3.2.0 gives others ("go to a door on your right", ...), and the rule above cannot see that.
    for n, mission in [(155, "go to the red box"),
                       (156, "put the purple box next to the grey box and go to the door on your right"),
                       (90556, "go to a blue door and put the grey ball next to a door")]:
        assert env.reset(n).startswith(f"Your goal: {mission}\n"), n
    level3 = [env.reset(n) and env.env.width for n in (3, 43, 83)]
    assert level3 == [4, 4, 4]  # room size 4 (walls included), as the original's GoToObjS6-v0; -v1's is 6
    # AgentGym's parsing reaches the env: a reply without `Action:` is the action itself
    env.reset(ids[0])
    assert "not a recognised" not in env.step("turn left")[0]
    assert "not a recognised" in env.step("Action: fly")[0]


def test_searchqa_ids_are_rows_of_the_data(tmp_path):
    rows = lambda n, tag: "".join(json.dumps({"id": f"{tag}{i}", "question": f"q{i}?", "golden_answers": ["a"]}) + "\n"  # noqa: E731
                                  for i in range(n))
    (tmp_path / "train.jsonl").write_text(rows(5, "tr"))
    (tmp_path / "test.jsonl").write_text(rows(3, "te"))
    options = {"qa_train": str(tmp_path / "train.jsonl"), "qa_test": str(tmp_path / "test.jsonl")}
    assert agentgym.task_ids(write(tmp_path, ["searchqa_6", "searchqa_0"]), "searchqa", options) == [6, 0]
    with pytest.raises(ValueError, match="past the 8 rows"):
        agentgym.task_ids(write(tmp_path, ["searchqa_8"]), "searchqa", options)
    with pytest.raises(ValueError, match="qa_train / qa_test"):
        agentgym.task_ids(write(tmp_path, ["searchqa_1"]), "searchqa", {})


@pytest.mark.parametrize("content, message", [
    ([{"item_id": "textcraft_3"}], "file system's listing"),
    ([{"item_id": "sciworld_3"}], "names 'sciworld'"),
    ([], "non-empty JSON list"),
    ({"item_id": "textcraft_3"}, "non-empty JSON list"),
    ([{"id": 3}], "entry 0"),
    (["textcraft_x"], "entry 0"),
    ([-1], "entry 0"),
])
def test_textcraft_and_malformed_files_are_refused(tmp_path, content, message):
    with pytest.raises(ValueError, match=message):
        agentgym.task_ids(write(tmp_path, content), "textcraft", {})


def test_webarena_and_unreadable_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="812"):
        agentgym.task_ids(write(tmp_path, ["webarena_24"]), "webarena", {})
    with pytest.raises(ValueError, match="cannot read"):
        agentgym.task_ids(str(tmp_path / "missing.json"), "babyai", {})
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(ValueError, match="not JSON"):
        agentgym.task_ids(str(tmp_path / "bad.json"), "babyai", {})

"""SciWorld env tests against the real simulator (one shared JVM, plus one short-lived JVM for crashes).

- the simulator's own gold action sequence, replayed through our step(), reaches score 100 on
  variation 0 of every task type (the two Mendelian genetics types are marked slow: building and
  replaying their gold paths costs ~40 s of CPU each);
- the hard-coded split table agrees with the simulator's official train/dev/test variations, and the
  `task_types` option keeps exactly the chosen types' variations of each split;
- a few thousand adversarial replies never raise, always return (str, float, bool), leave the JVM alive;
- a hung JVM (SIGSTOP) and a killed JVM end the episode with the `crashed` flag; after a kill the
  next reset starts a fresh JVM and works;
- missing Java is reported at construction with what to install;
- the SmolLM2 recipe (`config.preset("smollm2", "sciworld")`): valid, its env options keep the seven short task
  types' splits, and the longest expert episodes of those types fit its turns, context and reply cap;
- the expert (`SciWorld.expert()`): its replies parse with the env's parsers and, stepped, reach success
  on train variations of short task types; a plain reset builds no gold path; asked mid-episode it keeps
  the episode's state; `warmstart.expert_episodes` records it token-exactly; a gold path the simulator
  cannot deliver is one failed demonstration.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time

import psutil
import pytest
from py4j.protocol import Py4JError
from transformers import AutoTokenizer

import config
import schedule as schedules
from models import tiny
from studies import warmstart
from launch.checks import check
from config import Config
from envs import Env, agentgym_action, make, parse_action
from envs.sciworld import CODES, NUM_TASKS, OFFSETS, TASK_TYPES, SciWorld, chosen_kinds, split_ids
from rollout import ChatFormat
from models.smollm2 import smollm2_dir
from tests.support.adversarial import adversarial_replies
from tests.support.faulty import JVMKilledAtExpert

SLOW = {"mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant"}


@pytest.fixture(scope="module")
def env():
    # Gold paths run up to ~180 moves (friction, genetics), beyond the default move limit of 100;
    # building one with the gold path can take ~20 s, hence the generous timeout.
    env = make("sciworld", step_limit=1000, timeout=300)
    yield env
    env.close()


def test_protocol_and_splits(env):
    assert isinstance(env, Env)
    train, dev, test = env.tasks("train"), env.tasks("dev"), env.tasks("test")
    assert len(train) + len(dev) + len(test) == NUM_TASKS == 7207
    assert not (set(train) & set(dev) or set(train) & set(test) or set(dev) & set(test))
    assert env.subtask(0) == "Matter/boil" and env.subtask(NUM_TASKS - 1).endswith("mendelian-genetics-unknown-plant")
    assert env.locate(OFFSETS[4] + 3) == ("use-thermometer", 3)
    with pytest.raises(ValueError):
        env.tasks("validation")


def test_task_types_keep_their_official_splits():
    """`task_types` narrows tasks(split) to the official variations of the chosen types, counted as in
    TASK_TYPES, within the task set; an unknown code (or one the task set leaves out) is refused in one line."""
    codes = ["7-3", "4-1", "3-1"]
    kinds = chosen_kinds(codes)
    assert [CODES[k] for k in kinds] == ["3-1", "4-1", "7-3"]  # the simulator's order, whatever the order given
    assert chosen_kinds("4-1, 7-3,3-1") == kinds == chosen_kinds(codes, "agentgym")
    for column, split in enumerate(("train", "val", "test")):
        ids = split_ids(split, kinds)
        assert len(ids) == sum(TASK_TYPES[k][3 + column] for k in kinds) == len(set(ids))
        assert [sum(kind_of(t) == k for t in ids) for k in kinds] == [TASK_TYPES[k][3 + column] for k in kinds]
    assert split_ids("dev", kinds) == split_ids("val", kinds)
    mixed = split_ids("test", kinds, interleave=True)  # what tasks(split) returns when task_types is given
    assert sorted(mixed) == split_ids("test", kinds)
    assert [kind_of(t) for t in mixed[:6]] == [7, 11, 22] * 2  # round-robin: any prefix holds every type
    assert len(split_ids("test", chosen_kinds(None, "agentgym"))) == 1171  # the paper's 23 types, as before
    for bad, needle in ((["4-9"], "unknown SciWorld task_types ['4-9']; valid codes: 1-1, 1-2"),
                        ("4-1,41", "unknown SciWorld task_types ['41']"), ([], "task_types is empty")):
        with pytest.raises(ValueError, match=re.escape(needle)) as info:
            chosen_kinds(bad)
        assert "\n" not in str(info.value) and "10-2" in str(info.value)
    with pytest.raises(ValueError, match=r"\['5-1'\] are not in task_set 'agentgym'"):
        chosen_kinds(["4-1", "5-1"], "agentgym")
    problem = check(Config(env="sciworld", env_options='{"task_types": ["4-1", "4-5"]}'), 1)
    assert problem.startswith("--env-options: unknown SciWorld task_types ['4-5']; valid codes:")


def kind_of(task_id: int) -> int:
    return max(k for k, offset in enumerate(OFFSETS) if offset <= task_id)


def test_first_observation_and_bad_replies(env):
    first = env.reset(env.tasks("test")[0])
    assert first.startswith("Your task is to boil") and "This room is called" in first
    obs, reward, done = env.step("no action here")
    assert "Action:" in obs and reward == 0.0 and not done
    obs, reward, done = env.step("Thought:\nhm\n\nAction:\nfly to the moon")
    assert "No known action" in obs and "check valid actions" in obs and not done
    obs, _, _ = env.step("Thought:\nwhat can I do?\n\nAction:\ncheck valid actions")
    assert obs.startswith("Valid actions:") and "look around" in obs


@pytest.mark.parametrize("kind", [
    pytest.param(k, marks=pytest.mark.slow) if row[2] in SLOW else k for k, row in enumerate(TASK_TYPES)])
def test_gold_path_reaches_success(env, kind):
    name, n_train, n_dev, n_test = TASK_TYPES[kind][2:]
    if name in SLOW:
        # Pollination in these tasks also depends on JVM-internal hash order, so whether the gold path
        # succeeds depends on the JVM's history; in a fresh JVM it is reproducible (and succeeds).
        env = SciWorld(step_limit=1000, timeout=300)
    try:
        env.reset(OFFSETS[kind], gold=True)
        # The split table must match the simulator's official variation splits (of the loaded task).
        sim = env._sim  # the Scala interface; the only place tests look inside
        assert list(sim.getVariationsTrain()) == list(range(n_train))
        assert list(sim.getVariationsDev()) == list(range(n_train, n_train + n_dev))
        assert list(sim.getVariationsTest()) == list(range(n_train + n_dev, n_train + n_dev + n_test))
        reward, done = 0.0, False
        for action in env.gold_actions():
            _, reward, done = env.step(f"Thought:\nfollow the gold path\n\nAction:\n{action}")
            if done:
                break
        assert env.success and reward == 1.0 and done, f"{name}: gold path ended with reward {reward}"
    finally:
        if name in SLOW:
            env.close()


def test_fuzz_replies_never_raise(env):
    tasks = [OFFSETS[11] + v for v in range(20)]  # find-living-thing: quick to load
    env.reset(tasks[0])
    valid = env.valid_actions()  # whole valid actions too, so some replies change the world or end it
    words = sorted({w for a in valid for w in a.split()}) + valid + ["check valid actions", "wait", "1"]
    resets = 0
    for reply in adversarial_replies(2000, words, seed=1):
        out = env.step(reply)
        assert isinstance(out, tuple) and len(out) == 3
        obs, reward, done = out
        assert isinstance(obs, str) and obs and type(reward) is float and type(done) is bool
        assert -1.0 <= reward <= 1.0
        if done:
            assert not env.crashed, env.error
            resets += 1
            env.reset(tasks[resets % len(tasks)])
    assert psutil.pid_exists(env.jvm_pid) and not env.crashed
    assert env.step("Action:\nlook around")[0].startswith("This room is called")


def test_a_slow_jvm_start_up_is_not_a_hung_call():
    """The simulator's construction gets its own STARTUP_TIMEOUT; the call timeout starts after it. With one
    call timeout for both, a new JVM on loaded cores (seconds of class loading) failed at construction with
    py4j's "scienceworld does not exist in the JVM"; the hung-JVM test below failed so under a loaded suite."""
    env = SciWorld(timeout=0.05)  # constructs: no call yet
    try:
        with pytest.raises(Py4JError):  # the first simulator call has only the 0.05 s it was given
            env.reset(OFFSETS[11])
    finally:
        env.close()


def test_hung_jvm_times_out_and_is_flagged():
    env = SciWorld(timeout=5)  # a JVM of its own: this test freezes it
    try:
        env.reset(OFFSETS[11])
        _signal_and_wait(env.jvm_pid, signal.SIGSTOP, psutil.STATUS_STOPPED)
        obs, reward, done = env.step("Thought:\nlook\n\nAction:\nlook around")  # returns after ~5 s
        assert done and env.crashed and "crashed" in obs and env.error and reward == 0.0
    finally:
        env.close()  # kills the stopped JVM


def test_killed_jvm_is_flagged_and_next_reset_works(env):  # leaves a fresh, working JVM behind
    env.reset(OFFSETS[11] + 1)
    assert not env.step("Action:\nlook around")[2]
    old = env.jvm_pid
    _signal_and_wait(old, signal.SIGKILL, psutil.STATUS_ZOMBIE)
    obs, reward, done = env.step("Thought:\nlook\n\nAction:\nlook around")
    assert done and env.crashed and "crashed" in obs and isinstance(reward, float) and env.error
    assert env.step("Action:\nlook around")[2]  # still over until the next reset
    assert env.reset(OFFSETS[11] + 2).startswith("Your task is to find")
    assert env.jvm_pid != old and not env.crashed and env.error is None
    obs, reward, done = env.step("Action:\nlook around")
    assert obs.startswith("This room is called") and not done


def _signal_and_wait(pid: int, sig: int, status: str) -> None:
    """Send `sig` and wait until the kernel has applied it (delivery is asynchronous)."""
    os.kill(pid, sig)
    for _ in range(1000):
        try:
            if psutil.Process(pid).status() == status:
                return
        except psutil.NoSuchProcess:  # py4j's process-watcher thread reaps a dead JVM at once
            if status == psutil.STATUS_ZOMBIE:
                return
            raise
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached status {status}")


def test_missing_java_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java on PATH
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(RuntimeError, match="needs a Java runtime.*install"):
        SciWorld()
    with pytest.raises(RuntimeError, match="Java"):
        SciWorld(java=str(tmp_path / "java"))


# -- the expert (SciWorld.expert): the simulator's gold path, one action per reply

# Train variations of short task types (gold paths of about 5-20 actions).
EXPERT_TASKS = [("find-living-thing", 7), ("find-non-living-thing", 9), ("find-animal", 4), ("use-thermometer", 11),
                ("lifespan-longest-lived", 5)]


def _task(name: str, variation: int) -> int:
    kind = next(k for k, row in enumerate(TASK_TYPES) if row[2] == name)
    assert variation < TASK_TYPES[kind][3]  # a train variation
    return OFFSETS[kind] + variation


def test_config_accepts_a_sciworld_warm_start():
    assert check(Config(env="sciworld", bc_episodes=4), 1) is None
    assert check(Config(env="sciworld", bc_anchor=4), 1) is None


@pytest.mark.parametrize("name,variation", EXPERT_TASKS)
def test_expert_replies_parse_and_reach_success(env, name, variation):
    task = _task(name, variation)
    env.reset(task)
    assert env.gold_actions() == []  # a plain reset has the simulator build no gold path
    turns, done = 0, False
    while not done:
        reply = env.expert()
        assert reply.startswith("Thought:\n") and "\n\nAction:\n" in reply
        action, error = parse_action(reply)
        assert error is None and (action, None) == agentgym_action(reply) and reply.endswith("\n" + action)
        assert action == env.gold_actions()[turns]  # the simulator's own gold path, in order
        _, reward, done = env.step(reply)
        turns += 1
        assert turns <= len(env.gold_actions())
    assert env.success and reward == 1.0 and not env.crashed
    env.reset(task)  # the next plain reset drops the gold path the expert had the simulator build
    assert env.gold_actions() == []


def test_expert_asked_mid_episode_keeps_the_episode(env):
    """Building the gold path reloads the task; the episode's own actions are replayed, and the cursor
    starts after those that follow the path. (The gold agent's route here goes through the kitchen or
    the greenhouse, depending on the JVM's history: both doors are opened first.)"""
    env.reset(_task("find-living-thing", 7))
    for room in ("kitchen", "greenhouse"):
        assert env.step(f"Action:\nopen door to {room}")[0] == "The door is now open."
    reply = env.expert()
    gold = env.gold_actions()
    assert len(gold) > 2 and gold[0] in ("open door to kitchen", "open door to greenhouse")
    k = 2 if gold[0] == "open door to kitchen" else 1  # the first agent action follows the path or not
    assert reply == f"Thought:\nStep {k} of {len(gold)} of the plan.\n\nAction:\n{gold[k - 1]}"
    look, _, _ = env.step("Action:\nlook around")  # the replayed actions left both doors open
    assert "door to the kitchen (that is open)" in look and "door to the greenhouse (that is open)" in look
    _, reward, done = env.step(reply)
    while not done:
        _, reward, done = env.step(env.expert())
    assert env.success and reward == 1.0


def test_expert_episode_is_a_successful_token_exact_demonstration(env):
    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny.tiny_model_dir()))
    ep = warmstart.expert_episodes(chat, [env], type(env), [_task("find-animal", 4)],
                                   warmstart.expert_play(30, 16384))[0]
    assert ep.success and ep.end == "done" and ep.reward == 1.0 and not ep.error
    replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    assert ep.turns == len(replies) <= len(env.gold_actions())
    assert ep.messages[0] == {"role": "system", "content": env.instruction}
    expected = [t for r in replies for t in chat.encode(r) + list(chat.stop_ids[:1])]
    generated = ep.ids[ep.prompt_len:]
    assert len(ep.mask) == len(generated)
    assert [t for t, m in zip(generated, ep.mask) if m] == expected  # exactly the expert's tokens are trained
    assert 0 < sum(ep.mask) < len(ep.mask)  # the observations in between are not
    observations = chat.tok.decode([t for t, m in zip(generated, ep.mask) if not m])
    assert "You move to the" in observations


# -- the SmolLM2 recipe (config.preset("smollm2", "sciworld")): the seven short task types

# The longest expert episodes with SmolLM2's template among all 786 train variations of the recipe's
# types (measured by playing every one: 590-1,462 tokens, 1-16 turns, all successful): find-plant 40 is
# the longest (1,462 tokens), find-living-thing 141 one of the 16-turn ones, find-non-living-thing 82 the
# longest of its type, lifespan 7-3 variation 42 the longest lifespan one.
LONGEST_EXPERT = [("find-plant", 40), ("find-living-thing", 141), ("find-non-living-thing", 82),
                  ("lifespan-longest-lived-then-shortest-lived", 42)]
RECIPE_TYPES = {"find-living-thing", "find-non-living-thing", "find-plant", "find-animal", "lifespan-longest-lived",
                "lifespan-shortest-lived", "lifespan-longest-lived-then-shortest-lived"}


@pytest.fixture(scope="module")
def recipe():
    cfg = config.parse(["--env", "sciworld", "--model", "smollm2"])  # --model smollm2 picks the preset
    env = make("sciworld", **json.loads(cfg.env_options))  # a JVM with the recipe's own heap options
    yield cfg, env
    env.close()


def test_smollm2_recipe_is_valid_and_restricts_the_tasks(recipe):
    cfg, env = recipe
    assert cfg.preset == "smollm2" and dataclasses.replace(cfg, preset="") == config.preset("smollm2", "sciworld")
    assert check(cfg, 2) is None and cfg.model == "smollm2" and cfg.bc_episodes > 0 and cfg.eval_every > 0
    assert [len(env.tasks(split)) for split in ("train", "val", "test")] == [786, 393, 396]  # test: >= 200 tasks
    for split in ("train", "val", "test"):
        assert {env.subtask(t).split("/")[1] for t in env.tasks(split)} == RECIPE_TYPES
    # in-training evaluation plays the first eval_tasks validation tasks: every type is among them
    assert {env.subtask(t).split("/")[1] for t in env.tasks("val")[:cfg.eval_tasks]} == RECIPE_TYPES


@pytest.mark.parametrize("name,variation", LONGEST_EXPERT)
def test_smollm2_recipe_holds_the_longest_expert_episodes(recipe, name, variation):
    """The warm start's demonstrations fit the recipe: the expert succeeds within the schedule's largest
    turn budget (the warm start's), the whole episode within max_context, every reply within max_tokens."""
    cfg, env = recipe
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    chat = ChatFormat(tok)
    turns = max(schedules.parse(cfg.horizon).budgets)
    ep = warmstart.expert_episodes(chat, [env], type(env), [_task(name, variation)],
                                   warmstart.expert_play(turns, cfg.max_context))[0]
    assert ep.success and ep.end == "done" and len(ep.ids) <= cfg.max_context, (ep.end, ep.turns, len(ep.ids))
    replies = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    assert max(len(chat.encode(r)) + 1 for r in replies) <= cfg.max_tokens  # + its end-of-turn token


def test_a_gold_path_the_simulator_cannot_build_is_one_failed_demonstration():
    """The JVM dies when the expert is first asked, before the simulator has built the gold path (tests/
    faulty.py kills it for real): one failed demonstration (end "expert_error"), never an exception out of
    the episode; the next episode on the same instance starts a fresh JVM and its expert succeeds."""
    env = JVMKilledAtExpert(timeout=60)
    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny.tiny_model_dir()))
    task = _task("find-non-living-thing", 9)
    try:
        ep = warmstart.expert_episodes(chat, [env], type(env), [task], warmstart.expert_play(30, 16384))[0]
        assert ep.end == "expert_error" and not ep.success and ep.turns == sum(ep.mask) == 0
        assert ep.error.startswith("RuntimeError: no gold path for find-non-living-thing variation 9: "
                                   "the simulator crashed or stopped responding")
        assert env.crashed and env.done
        with pytest.raises(RuntimeError, match="the episode is over"):
            env.expert()
        first_jvm = env.jvm_pid
        ok = warmstart.expert_episodes(chat, [env], type(env), [task], warmstart.expert_play(30, 16384))[0]
        assert ok.success and ok.end == "done" and not env.crashed and env.jvm_pid != first_jvm
    finally:
        env.close()

"""OpenEnv out (envs/openenv_serve.py): one of our envs served by `python -m envs.openenv_serve`, driven
with OpenEnv's own client (reset, step, state), answers as the same env in-process does."""
import json
import subprocess
import sys
import time

import pytest
import requests

from envs.babyai import BabyAI
from tests.test_openenv import ROOT, free_port


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "envs.openenv_serve", "--env", "babyai", "--port", str(port),
                             "--env-options", '{"brief": true}'], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # importing openenv's server takes a while on a busy machine
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(f"{url}/health", timeout=1).ok:
                break
        except requests.ConnectionError:
            time.sleep(0.2)
    yield url
    proc.kill()
    proc.wait()


def test_openenv_client_sees_what_the_env_in_process_says(server):
    from openenv.core import GenericEnvClient

    local = BabyAI(brief=True)
    task = local.tasks("val")[3]
    with GenericEnvClient(base_url=server).sync() as client:
        first = client.reset(task_id=task)
        assert first.observation["text"] == local.reset(task) and first.observation["task_id"] == task
        assert first.observation["instruction"] == local.instruction and first.done is False
        assert first.observation["subtask"] == local.subtask(task)
        replies = ["Thought:\nI fly.\n\nAction:\nfly away"]  # refused by the env: said so, on both sides
        local.step(replies[0])
        for _ in range(30):
            replies.append(local.expert())  # a whole reply: Thought, then Action
            obs, reward, done = local.step(replies[-1])
            if done:
                break
        local.reset(task)
        for k, reply in enumerate(replies):
            obs, reward, done = local.step(reply)
            result = client.step({"text": reply})
            assert (result.observation["text"], result.reward, result.done) == (obs, reward, done)
            assert result.observation["refused"] == local.refused and (k > 0 or local.refused)
            assert result.observation["score"] == reward and result.observation["success"] == local.success
        assert done and local.success and reward > 0, "the expert solves the task"
        state = client.state()
        assert state["step_count"] == len(replies) and state["task_id"] == task
        again = client.reset(seed=task)  # a seed is read as the task id
        assert again.observation["text"] == first.observation["text"]


def test_our_openenv_client_plays_a_served_env_of_ours_on_its_own_tasks(server):
    """envs/openenv_in.py against envs/openenv_serve.py: the env's own splits and subtasks (GET /tasks),
    its running score as the reward, the same observations as in-process."""
    import envs

    local, remote = BabyAI(brief=True), envs.make(f"openenv+{server}")
    try:
        assert remote.tasks("val") == local.tasks("val") and remote.tasks("test") == local.tasks("test")
        task = local.tasks("test")[5]
        assert remote.subtask(task) == local.subtask(task)
        assert remote.reset(task) == local.reset(task) and remote.instruction == local.instruction
        replies = ["Thought:\nI fly.\n\nAction:\nfly away"] + [None] * 3
        for reply in replies:
            reply = reply or local.expert()
            obs, reward, done = local.step(reply)
            assert remote.step(reply) == (obs, reward, done) and remote.refused == local.refused
        assert remote.refused is False and replies[0] and local.success == remote.success
    finally:
        remote.close()


def test_a_bad_env_name_is_refused_in_one_line():
    out = subprocess.run([sys.executable, "-m", "envs.openenv_serve", "--env", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "unknown env 'nope'" in out.stderr.strip().splitlines()[-1]

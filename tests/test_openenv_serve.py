"""OpenEnv out (envs/openenv_serve.py): one of our envs served by `python -m envs.openenv_serve`, driven
with OpenEnv's own client (reset, step, state), answers as the same env in-process does; a client's bad
input (HTTP and WebSocket, and a seeded fuzz of them) is a 4xx or an error message with its reason, never a
5xx, and the server goes on serving."""
import json
import random
import subprocess
import sys
import time

import pytest
import requests

from envs.babyai import BabyAI
from tests.test_openenv import ROOT, free_port

SESSIONS, MAX_BYTES = 4, 65536


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "envs.openenv_serve", "--env", "babyai", "--port", str(port),
                                 "--env-options", '{"brief": true}', "--sessions", str(SESSIONS),
                                 "--max-bytes", str(MAX_BYTES)], cwd=ROOT, stderr=err)
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
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]  # nothing a client sent broke a handler


def ws(url: str):
    from websockets.sync.client import connect
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=30, close_timeout=5)


def ask(conn, message) -> dict:
    """One WebSocket exchange: a message (a dict as JSON, or raw text / bytes) and the server's answer."""
    conn.send(json.dumps(message) if isinstance(message, dict) else message)
    return json.loads(conn.recv(timeout=60))


def expert_episode(url: str, task: int) -> None:
    """A whole episode played over OpenEnv's client, the expert's replies, against the env in-process."""
    from openenv.core import GenericEnvClient

    local = BabyAI(brief=True)
    with GenericEnvClient(base_url=url).sync() as client:
        assert client.reset(task_id=task).observation["text"] == local.reset(task)
        for _ in range(30):
            reply = local.expert()
            obs, reward, done = local.step(reply)
            result = client.step({"text": reply})
            assert (result.observation["text"], result.reward, result.done) == (obs, reward, done)
            if done:
                break
        assert done and local.success and result.observation["success"]


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


def test_bad_input_over_http_is_a_4xx_with_its_reason(server):
    post = lambda path, body: requests.post(f"{server}{path}", data=body if isinstance(body, (str, bytes)) else json.dumps(body),  # noqa: E731
                                            headers={"content-type": "application/json"}, timeout=60)
    for bad in (-1, 10**18, "abc", [3], True, 2.0):
        answer = post("/reset", {"task_id": bad})
        assert answer.status_code == 400, (bad, answer.text)
        assert "GET /tasks" in answer.json()["detail"] and "train 40000 ids in 0..39999" in answer.json()["detail"]
    assert "not an integer" in post("/reset", {"task_id": "abc"}).json()["detail"]
    assert post("/reset", {"seed": 10**18}).status_code == 400  # a seed is read as the task id
    assert post("/reset", {"seed": "x"}).status_code == 422 and post("/reset", "{not json").status_code == 422
    assert post("/reset", {"task_id": 7}).json()["observation"]["text"] == BabyAI(brief=True).reset(7)
    before = post("/step", {"action": {"text": "Thought:\nI go.\n\nAction:\nmove forward"}})
    assert before.status_code == 409 and "reset first" in before.json()["detail"]
    assert "/ws" in before.json()["detail"]  # where an episode is played
    for action in ({}, {"text": 5}, {"reply": "move forward"}):
        assert post("/step", {"action": action}).status_code == 422, action
    big = post("/step", {"action": {"text": "a" * MAX_BYTES}})
    assert big.status_code == 413 and f"cap of {MAX_BYTES}" in big.json()["detail"] and "--max-bytes" in big.json()["detail"]
    tasks = requests.get(f"{server}/tasks", timeout=60).json()
    assert set(tasks["splits"]) == {"train", "val", "test", "fresh"} and tasks["reward"] == "last"


def test_bad_input_over_the_websocket_is_an_error_and_the_session_goes_on(server):
    with ws(server) as conn:
        early = ask(conn, {"type": "step", "data": {"text": "move forward"}})
        assert early["type"] == "error" and "reset first" in early["data"]["message"]
        for bad in (-1, 10**18, "5", [5], {"a": 1}):
            answer = ask(conn, {"type": "reset", "data": {"task_id": bad}})
            assert answer["type"] == "error" and "GET /tasks" in answer["data"]["message"], (bad, answer)
        assert ask(conn, "{not json")["data"]["code"] == "INVALID_JSON"
        assert ask(conn, b"\xff\xfe")["data"]["code"] == "INVALID_JSON"
        assert ask(conn, {"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        big = ask(conn, {"type": "step", "data": {"text": "a" * MAX_BYTES}})
        assert big["data"]["code"] == "MESSAGE_TOO_LARGE" and f"cap of {MAX_BYTES}" in big["data"]["message"]
        local = BabyAI(brief=True)
        assert ask(conn, {"type": "reset", "data": {"task_id": 11}})["data"]["observation"]["text"] == local.reset(11)
        for action in ({}, {"text": 5}, {"text": "x", "extra": 1}):
            assert ask(conn, {"type": "step", "data": action})["data"]["code"] == "VALIDATION_ERROR", action
        reply = local.expert()  # the episode is intact after all of that
        obs, reward, done = local.step(reply)
        step = ask(conn, {"type": "step", "data": {"text": reply}})["data"]
        assert (step["observation"]["text"], step["reward"], step["done"]) == (obs, reward, done)


def test_the_session_cap_holds_and_dropped_sessions_are_freed(server):
    conns = [ws(server) for _ in range(SESSIONS)]
    try:
        for conn in conns:  # each holds a session once its first message is answered
            assert ask(conn, {"type": "reset", "data": {"task_id": 1}})["type"] == "observation"
        with ws(server) as extra:
            assert json.loads(extra.recv(timeout=60))["data"]["code"] == "CAPACITY_REACHED"
    finally:
        for conn in conns:  # dropped mid-episode, no close message
            conn.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a session is freed when the server sees its connection gone
        with ws(server) as conns[0]:
            if ask(conns[0], {"type": "reset", "data": {"task_id": 1}})["type"] == "observation":
                break
        time.sleep(0.2)
    with ws(server) as a, ws(server) as b, ws(server) as c, ws(server) as d:
        assert all(ask(x, {"type": "reset", "data": {"task_id": 2}})["type"] == "observation" for x in (a, b, c, d))


def junk(rng: random.Random, depth: int = 0):
    """A random JSON value: the kinds a careless or hostile client sends."""
    kinds = ["int", "big", "neg", "float", "str", "bool", "none"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    return {"int": lambda: rng.randrange(50_000), "big": lambda: rng.randrange(10**30), "neg": lambda: -rng.randrange(1, 10**6),
            "float": lambda: rng.uniform(-1e6, 1e6), "str": lambda: "".join(rng.choice("ab01 {}\"\\\x00\u00e9\U0001f600") for _ in range(rng.randrange(12))),
            "bool": lambda: rng.random() < 0.5, "none": lambda: None,
            "list": lambda: [junk(rng, depth + 1) for _ in range(rng.randrange(3))],
            "dict": lambda: {rng.choice(["text", "task_id", "seed", "type", "data", "x"]): junk(rng, depth + 1)
                             for _ in range(rng.randrange(3))}}[kind]()


def fuzz_message(rng: random.Random):
    """A random WebSocket message: a plausible one with junk in it, or none at all."""
    roll = rng.random()
    if roll < 0.1:
        return rng.choice(["", "{", "[]", "null", "42", '"reset"', "{\"type\": "]) + json.dumps(junk(rng))[:20]
    if roll < 0.15:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    kind = rng.choice(["reset", "step", "state", "mcp", "dance", None])
    data = rng.choice([{"task_id": junk(rng)}, {"seed": junk(rng)}, {"text": junk(rng)}, junk(rng), {}])
    return {k: v for k, v in (("type", kind), ("data", data)) if v is not None or k == "data"}


def test_a_seeded_fuzz_leaves_the_server_serving(server):
    """300 random requests over HTTP and the WebSocket: every answer a 2xx or 4xx (the fixture checks that
    the server logged no traceback); then a normal episode plays as in-process."""
    rng = random.Random(87)
    statuses, codes = set(), set()
    conn = ws(server)
    try:
        for _ in range(300):
            if rng.random() < 0.5:
                path = rng.choice(["/reset", "/step", "/state", "/tasks", "/schema", "/health", "/metadata", "/mcp", "/nope"])
                body = rng.choice([json.dumps(junk(rng)), json.dumps({"action": junk(rng)}), json.dumps({"task_id": junk(rng)}),
                                   bytes(rng.randrange(256) for _ in range(8))])
                method = rng.choice(["POST", "POST", "GET", "PUT"])
                answer = requests.request(method, f"{server}{path}", data=body, timeout=60,
                                          headers={"content-type": "application/json"})
                statuses.add(answer.status_code)
            else:
                answer = ask(conn, fuzz_message(rng))
                assert answer["type"] in ("observation", "state", "error", "mcp"), answer
                codes.add(answer["data"].get("code", answer["type"]) if answer["type"] == "error" else answer["type"])
    finally:
        conn.close()
    assert max(statuses) < 500 and {200, 400, 422} <= statuses, statuses
    assert {"observation", "INVALID_JSON", "VALIDATION_ERROR", "EXECUTION_ERROR"} <= codes, codes
    expert_episode(server, BabyAI(brief=True).tasks("val")[2])


def test_a_run_probes_a_served_env_before_it_starts(server):
    """train.py as a client (checks.check): a server that is up and takes the run's tasks passes; one that refuses a
    reset is one line with the server's reason; no server at all is one line saying how to start one."""
    from launch import checks
    import config
    from envs.openenv_in import probe
    from tests.test_openenv import free_port
    assert probe(server) is None
    refused = probe(server, task=10**9)
    assert refused.startswith(f"the served env at {server} refused a reset of task {10**9}: 400") and "/tasks" in refused
    invalid = probe(server, task=-1)  # OpenEnv's own validation of the request: its field and message
    assert invalid.startswith(f"the served env at {server} refused a reset of task -1: 422 body.seed: ")
    assert "\n" not in refused + invalid
    nobody = f"http://127.0.0.1:{free_port()}"
    cfg = config.parse(["--env", f"openenv+{nobody}", "--env-timeout", "1"])
    problem = checks.check(cfg, 2)
    assert problem.startswith(f"no OpenEnv server answers at {nobody} after 1 s") and "openenv_serve" in problem
    assert checks.check(config.parse(["--env", f"openenv+{server}"]), 2) is None

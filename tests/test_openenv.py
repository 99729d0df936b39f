"""OpenEnv in (envs/openenv_in.py): an OpenEnv environment played by the rollout in-process and through
its server on 127.0.0.1, started here. The echo environment is the one OpenEnv's own CLI generates
(`openenv init`, from the openenv-core package, offline); tests/support/openenv_toy.py adds JSON actions,
an end, and a server that dies or hangs mid-episode."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

import engine as engines
import envs
from models import tiny
from rollout import ChatFormat, Play, rollout

ROOT = Path(__file__).resolve().parent.parent
ECHO = "openenv:echo_probe.server.echo_probe_environment:EchoProbeEnvironment"


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory):
    """The echo environment of `openenv init` (the package's template), importable as echo_probe."""
    out = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_probe", "-o", str(out)], check=True,
                   capture_output=True, timeout=120)
    sys.path.insert(0, str(out))
    yield out
    sys.path.remove(str(out))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An OpenEnv app under uvicorn on 127.0.0.1, as its users run it."""

    def __init__(self, app: str, cwd: Path, env: dict | None = None, factory: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning"] + (["--factory"] if factory else [])
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": f"{cwd}:{ROOT}", **(env or {})})
        deadline = time.monotonic() + 300  # importing openenv's server takes a while on a busy machine
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if requests.get(f"{self.url}/health", timeout=1).ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{app} did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def chat():
    from transformers import AutoTokenizer
    return ChatFormat(AutoTokenizer.from_pretrained(tiny.tiny_model_dir()))


@pytest.fixture(scope="module")
def engine():
    return engines.make_engine(tiny.tiny_model_dir(), "hf", max_model_len=2048)


def play(engine, chat, name, tasks, turns=3, **play):
    make = lambda: envs.make(name)  # noqa: E731
    pool = [make() for _ in tasks]
    try:
        return rollout(engine, chat, pool, make, tasks, Play(turns, max_tokens=12, seed=7, **play))[0]
    finally:
        for env in pool:
            env.close()


def test_echo_in_process_maps_replies_rewards_and_metadata(echo_dir, engine, chat):
    cls = envs.env_class(ECHO)
    assert cls().text_field == "message" and "sent to it as its message" in cls().instruction
    episodes = play(engine, chat, ECHO, [(0, 0), (1, 1)])
    for ep in episodes:
        replies = [m for m in ep.messages if m["role"] == "assistant"]
        observations = [m["content"] for m in ep.messages if m["role"] == "user"]
        assert ep.end == "horizon" and ep.turns == 3 and len(replies) == 3
        total = 0.0
        for k, reply in enumerate(replies):
            sent = cls().action(reply["content"])[0]["message"]
            if k + 1 < len(observations):  # the last step's observation ends no turn: not in the transcript
                assert observations[k + 1] == f'{{"echoed_message": {json_str(sent)}, "message_length": {len(sent)}}}'
            assert reply["info"] == {"original_message": sent, "step": k + 1}  # the observation's metadata
            total += 0.1 * len(sent)
        assert ep.reward == pytest.approx(total) and not ep.success


def json_str(text):
    import json
    return json.dumps(text)


def test_echo_server_plays_as_in_process(echo_dir, engine, chat):
    server = Server("echo_probe.server.app:app", echo_dir)  # its app takes one session at a time
    try:
        local = play(engine, chat, ECHO, [(3, 0)]) + play(engine, chat, ECHO, [(4, 1)])
        remote = play(engine, chat, f"openenv+{server.url}", [(3, 0)]) + play(engine, chat, f"openenv+{server.url}", [(4, 1)])
    finally:
        server.stop()
    for a, b in zip(local, remote):  # the same seeds: the same replies, so the same env answers
        assert a.ids == b.ids and a.mask == b.mask and a.reward == b.reward and a.end == b.end == "horizon"
        assert [m["content"] for m in a.messages] == [m["content"] for m in b.messages]
        assert all("info" not in m for m in b.messages)  # OpenEnv's server sends no metadata


def test_json_actions_parse_or_are_refused_in_process_and_served(chat):
    served = Server("tests.support.openenv_toy:app", ROOT, factory=True)
    try:
        for name in ("openenv:tests.support.openenv_toy:Count", f"openenv+{served.url}"):
            env = envs.make(name)
            assert env.reset(5) == '{"last": 5, "prompt": "Count up from 5."}'  # a server's schema is read here
            assert env.text_field is None and '"number"' in env.instruction
            obs, reward, done = env.step("Thought:\nnext\n\nAction:\nsix")
            assert obs.startswith("Invalid reply: no JSON object found") and '"number"' in obs
            assert (reward, done, env.refused) == (0.0, False, True)
            obs, reward, done = env.step('```json\n{"number": "six?"}\n```')
            assert obs.startswith("Invalid action") and env.refused and not done
            assert env.step('I say {"number": 6}')[1:] == (1.0, False) and not env.refused
            assert env.step('{"number": 7, "note": "x"}') == ('{"last": 7, "prompt": "Right."}', 2.0, False)
            assert env.step('{"number": 8}')[1:] == (3.0, True)
            assert env.success is True  # the metadata's success in-process; done with a positive return served
            env.close()
    finally:
        served.stop()


@pytest.mark.parametrize("fail", ["die:2", "hang:2"])
def test_a_server_that_dies_or_hangs_mid_episode_is_an_env_error(engine, chat, fail):
    served = Server("tests.support.openenv_toy:say_app", ROOT, env={"OPENENV_TOY_FAIL": fail}, factory=True)
    try:
        start = time.monotonic()
        episodes = play(engine, chat, f"openenv+{served.url}", [(0, 0), (1, 1)], env_timeout=10)
        assert time.monotonic() - start < 120
    finally:
        served.stop()
    for ep in episodes:
        assert ep.end == "env_error" and ep.turns == 2, (ep.end, ep.error)
        assert ("TimeoutError" in ep.error) == (fail == "hang:2")


def test_bad_env_names_are_refused_in_one_line():
    for name, says in (("openenv+ftp//x", "openenv+http://HOST:PORT"), ("openenv:justamodule", "openenv:<module>:<Class>"),
                       ("openenv:tests.support.toy:Digits", "not an OpenEnv Environment")):
        with pytest.raises(ValueError, match="") as err:
            envs.env_class(name)
        assert says in str(err.value) and "\n" not in str(err.value)

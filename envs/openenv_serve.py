"""Any of this project's environments served as an OpenEnv environment, for TRL, SkyRL, Unsloth,
verifiers or any other OpenEnv client:

    python -m envs.openenv_serve --env babyai --port 8000 [--env-options '{"brief": true}'] [--sessions 64]

OpenEnv's `create_app` serves it (POST /reset, /step, GET /state, /schema, WS /ws: one env instance per
WebSocket session). What crosses the wire:
  - reset(task_id=..., seed=...): the task to play; `seed` is read as the task id when no task_id is given
    (our tasks are deterministic in their id); neither: the first task of the train split;
  - Action `{"text": <the whole reply>}`: the env parses its action itself, as under our Env protocol;
  - Observation: `text` (the observation), `instruction` (the env's system text: what the task is and the
    reply format), `task_id`, `subtask`, `refused` (the env did not carry the action out), `score` (its
    running score, also OpenEnv's `reward`), `success`, and `done`. Everything sits in fields, not in
    metadata, because OpenEnv's server does not send metadata;
  - State: episode_id, step_count, task_id;
  - GET /tasks (ours, beside OpenEnv's routes): {"splits": {split: task ids}, "subtasks": {id: name},
    "reward": "last"}.
The rewards are ours: the episode's reward is the last step's (a running score, scaled to [-1, 1]).
"""
from __future__ import annotations

import argparse
import json

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

import envs


class ReplyAction(Action):
    text: str = Field(..., description="the agent's whole reply; the environment parses its action from it")


class TextObservation(Observation):
    text: str = Field("", description="the observation")
    instruction: str = Field("", description="the environment's instruction: the task and the reply format")
    task_id: int = Field(0, description="the task being played")
    subtask: str = Field("", description="the task's category")
    refused: bool = Field(False, description="the environment did not carry the last action out")
    score: float = Field(0.0, description="the running score (the episode's reward is the last one)")
    success: bool = Field(False, description="the environment's own success criterion is met")


class Served(Environment):
    """One of our envs behind OpenEnv's Environment interface; `name` and `options` set by `served()`."""
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own env instance
    name: str = ""
    options: dict = {}

    def __init__(self):
        super().__init__()
        self.env = envs.make(self.name, **self.options)
        self._state = State(step_count=0)
        self.task_id, self.score = 0, 0.0

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: int | None = None,
              **kw) -> TextObservation:
        self.task_id = task_id if task_id is not None else seed if seed is not None else self.env.tasks("train")[0]
        self._state = State(episode_id=episode_id, step_count=0, task_id=self.task_id)
        self.score = 0.0
        return self.observe(self.env.reset(self.task_id), False)

    def step(self, action: ReplyAction, timeout_s: float | None = None, **kw) -> TextObservation:
        self._state.step_count += 1
        text, self.score, done = self.env.step(action.text)
        return self.observe(text, done)

    def observe(self, text: str, done: bool) -> TextObservation:
        return TextObservation(text=text, instruction=self.env.instruction, task_id=self.task_id,
                               subtask=self.env.subtask(self.task_id), refused=bool(getattr(self.env, "refused", False)),
                               score=self.score, success=bool(getattr(self.env, "success", False)),
                               reward=self.score, done=done)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.env.close()


def served(name: str, options: dict | None = None) -> type:
    """The OpenEnv Environment class of env `name` (a registered one or package.module:Class)."""
    envs.env_class(name)  # an unknown name fails here, in one line
    return type(f"Served[{name}]", (Served,), {"name": name, "options": dict(options or {})})


def app(name: str, options: dict | None = None, sessions: int = 64):
    """OpenEnv's app, plus GET /tasks: the task ids of each split and their subtasks, which OpenEnv has no
    word for (envs/openenv_in.py reads them, so a client plays this env's own splits)."""
    server = create_app(served(name, options), ReplyAction, TextObservation, env_name=name,
                        max_concurrent_envs=sessions)
    listing: dict = {}

    @server.get("/tasks")
    def tasks() -> dict:
        if not listing:  # once, on first request: one env instance lists them
            env = envs.make(name, **(options or {}))
            try:
                listing["splits"] = {split: env.tasks(split) for split in ("train", "val", "test")}
                listing["subtasks"] = {t: env.subtask(t) for ids in listing["splits"].values() for t in ids}
                listing["reward"] = "last"  # ours report a running score: the episode's reward is the last one
            finally:
                env.close()
        return listing

    return server


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="an env name (babyai, textcraft, ...) or package.module:Class")
    parser.add_argument("--env-options", default="{}", help="JSON object of keyword options for the env constructor")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sessions", type=int, default=64, help="concurrent WebSocket sessions (env instances)")
    args = parser.parse_args(argv)
    try:
        options = json.loads(args.env_options)
        served(args.env, options)
    except (ValueError, ImportError, AttributeError) as exc:
        parser.error(f"--env {args.env} --env-options {args.env_options}: {exc}")
    import uvicorn
    uvicorn.run(app(args.env, options, args.sessions), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

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

A server is an interface to code we do not control, so bad input is answered with its reason and never
a 5xx, and every other session goes on (tests/test_openenv_serve.py plays each case and a seeded fuzz):
  - a task id that is no task of the env (or not an integer): HTTP 400, naming the splits' id ranges and
    GET /tasks; over the WebSocket an error message (OpenEnv's `EXECUTION_ERROR`) with the same words;
  - a step before any reset: HTTP 409 (OpenEnv's HTTP routes build a fresh env for every request, so an
    episode is played over the WebSocket); a wrong type or a missing field: OpenEnv's own 422 (WebSocket:
    `VALIDATION_ERROR`); JSON that does not parse: 422 (WebSocket: `INVALID_JSON`);
  - an HTTP body or a WebSocket message over `--max-bytes` (default 1 MiB): HTTP 413, or on the WebSocket
    an error message `MESSAGE_TOO_LARGE`, the session kept. A reply (the action's text) travels inside one,
    so this caps it too.
Load (concurrent sessions, step latency, memory over many episodes, dropped clients): bench/serve_load.py.
"""
from __future__ import annotations

import argparse
import bisect
import json

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

import envs

SPLITS = ("train", "val", "test", "fresh")  # those an env has are listed (BabyAI has a "fresh" one)
MAX_BYTES = 1 << 20


class BadRequest(ValueError):
    """Input a client sent that the env cannot play: HTTP `status` with the reason, or over the WebSocket
    OpenEnv's error message carrying the same reason."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.status = status


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


class Catalogue:
    """An env's task ids per split, kept as runs of consecutive ids (MiniWoB's splits are near a million
    ids: a run each), so that a task id is checked with a bisection and a refusal can say what exists."""

    def __init__(self, env):
        self.splits: dict[str, list[int]] = {}
        for split in SPLITS:
            try:
                self.splits[split] = list(env.tasks(split))
            except ValueError:  # a split this env does not have
                continue
        self.runs = sorted(run for ids in self.splits.values() for run in _runs(ids))
        self.starts = [lo for lo, _ in self.runs]

    def __contains__(self, task_id: int) -> bool:
        k = bisect.bisect_right(self.starts, task_id) - 1
        return k >= 0 and self.runs[k][0] <= task_id <= self.runs[k][1]

    def listing(self, env) -> dict:
        """GET /tasks's answer (envs/openenv_in.py reads it, so a client plays this env's own splits)."""
        return {"splits": self.splits,
                "subtasks": {t: env.subtask(t) for ids in self.splits.values() for t in ids},
                "reward": "last"}  # ours report a running score: the episode's reward is the last one

    def refusal(self, name: str, task_id) -> str:
        what = f"task_id {json.dumps(task_id)[:40]}"
        splits = "; ".join(f"{split} {len(ids)} ids in {min(ids)}..{max(ids)}" for split, ids in self.splits.items() if ids)
        kind = "is not an integer" if type(task_id) is not int else f"is not a task of {name}"
        return f"{what} {kind} (its splits: {splits}); GET /tasks lists every task id of each split"


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as (first, last) runs of consecutive ids."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [(lo, hi) for lo, hi in out]


class Served(Environment):
    """One of our envs behind OpenEnv's Environment interface; `name` and `options` set by `served()`."""
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session builds its own env instance
    name: str = ""
    options: dict = {}
    catalogue: Catalogue | None = None  # the env's task ids, read from the first instance (one per server)

    def __init__(self):
        super().__init__()
        self.env = envs.make(self.name, **self.options)
        self._state = State(step_count=0)
        self.task_id, self.score, self.started = 0, 0.0, False
        if type(self).catalogue is None:  # task ids are metadata: any instance reads them
            type(self).catalogue = Catalogue(self.env)

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: int | None = None,
              **kw) -> TextObservation:
        task = task_id if task_id is not None else seed if seed is not None else self.catalogue.splits["train"][0]
        if type(task) is not int or task not in self.catalogue:  # bool is no task id either
            raise BadRequest(self.catalogue.refusal(self.name, task))
        if episode_id is not None and not isinstance(episode_id, str):
            raise BadRequest(f"episode_id must be a string, got {json.dumps(episode_id)[:40]}")
        self.task_id, self.score, self.started = task, 0.0, True
        self._state = State(episode_id=episode_id, step_count=0, task_id=task)
        return self.observe(self.env.reset(task), False)

    def step(self, action: ReplyAction, timeout_s: float | None = None, **kw) -> TextObservation:
        if not self.started:
            raise BadRequest("no episode to step: reset first. OpenEnv's HTTP routes build a fresh env for every "
                             "request; play an episode over the WebSocket /ws (OpenEnv's clients do)", 409)
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


class Guard:
    """ASGI middleware for what OpenEnv's app does not check itself. An HTTP body or a WebSocket message over
    `limit` bytes is refused before the app reads it (HTTP 413; on a WebSocket an error message, the session
    kept). A WebSocket message must be a JSON object as text: OpenEnv's endpoint ends the session on a JSON
    array or number and on a binary frame, so those are answered with an error here and the session goes on.
    A client gone mid-episode: OpenEnv frees its session, then closes a socket that is already closed, which
    would log a traceback; that close is let go."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def reason(self, size: int) -> str:
        return f"the request is {size} bytes, over this server's cap of {self.limit} (openenv_serve --max-bytes)"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            return await self.http(scope, receive, send)
        if scope["type"] == "websocket":
            return await self.websocket(scope, receive, send)
        return await self.app(scope, receive, send)

    async def http(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                payload = json.dumps({"detail": self.reason(len(body))}).encode()
                await send({"type": "http.response.start", "status": 413,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
                return await send({"type": "http.response.body", "body": payload})
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def websocket(self, scope, receive, send):
        async def error(message: str, code: str):
            await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {"message": message, "code": code}})})

        async def checked():
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                text = message.get("text")
                if text is None:
                    try:
                        text = (message.get("bytes") or b"").decode()
                    except UnicodeDecodeError:
                        await error("a binary message that is not UTF-8 text; send a JSON object as text", "INVALID_JSON")
                        continue
                size = len(text.encode())
                if size > self.limit:
                    await error(self.reason(size), "MESSAGE_TOO_LARGE")
                    continue
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = {}  # OpenEnv's endpoint answers unparsable JSON itself (INVALID_JSON)
                if not isinstance(parsed, dict):
                    await error('a message is one JSON object, {"type": "reset" | "step" | "state" | "close", "data": {...}}',
                                "INVALID_JSON")
                    continue
                return {"type": "websocket.receive", "text": text}

        async def guarded(message):
            try:
                await send(message)
            except OSError:  # uvicorn's ClientDisconnected: the client is gone
                if message["type"] != "websocket.close":
                    raise

        await self.app(scope, checked, guarded)


def app(name: str, options: dict | None = None, sessions: int = 64, max_bytes: int = MAX_BYTES):
    """OpenEnv's app, plus GET /tasks (the task ids of each split and their subtasks, which OpenEnv has no
    word for), bad input answered with its reason (HTTP 4xx), and `Guard` in front."""
    from fastapi.responses import JSONResponse

    env_class = served(name, options)
    server = create_app(env_class, ReplyAction, TextObservation, env_name=name, max_concurrent_envs=sessions)

    @server.exception_handler(BadRequest)
    async def refused(request, exc: BadRequest):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    listing: dict = {}

    @server.get("/tasks")
    def tasks() -> dict:
        if not listing:  # once, on first request: one env instance lists them
            env = env_class()
            try:
                listing.update(env.catalogue.listing(env.env))
            finally:
                env.close()
        return listing

    server.add_middleware(Guard, limit=max_bytes)
    return server


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="an env name (babyai, textcraft, ...) or package.module:Class")
    parser.add_argument("--env-options", default="{}", help="JSON object of keyword options for the env constructor")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sessions", type=int, default=64, help="concurrent WebSocket sessions (env instances)")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES,
                        help=f"largest HTTP body or WebSocket message accepted, in bytes (default {MAX_BYTES}); "
                             "a larger one is refused with its reason (HTTP 413), the session kept")
    args = parser.parse_args(argv)
    try:
        options = json.loads(args.env_options)
        if not isinstance(options, dict):
            raise ValueError("not a JSON object")
        served(args.env, options)
    except (ValueError, ImportError, AttributeError) as exc:
        parser.error(f"--env {args.env} --env-options {args.env_options}: {exc}")
    if args.sessions < 1 or args.max_bytes < 1024:
        parser.error("--sessions must be at least 1 and --max-bytes at least 1024")
    import uvicorn
    # the WebSocket protocol's own cap sits above ours, so that ours answers with the reason and keeps the session
    uvicorn.run(app(args.env, options, args.sessions, args.max_bytes), host=args.host, port=args.port,
                log_level="warning", ws_max_size=max(16 << 20, 4 * args.max_bytes))


if __name__ == "__main__":
    main()

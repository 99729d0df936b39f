"""OpenEnv environments played through this project's Env protocol (envs/__init__.py).

OpenEnv (PyPI `openenv-core`) is the environment protocol TRL, SkyRL, Unsloth and verifiers speak: an
`Environment` class with `reset(seed=..., episode_id=...) -> Observation`, `step(Action) -> Observation`
and a `state` property, Action and Observation being pydantic models; `create_app` serves one over HTTP
and a WebSocket session per client. Two ways in, both for train.py and evaluate.py:

    --env openenv:<module>:<Class>      an `Environment` subclass, imported and played in-process
    --env openenv+http://HOST:PORT      a running OpenEnv server, through OpenEnv's own client (one
                                        WebSocket session per env instance, kept across episodes)

How a reply becomes the env's Action (the rule the instruction states to the model):
  - text mode, when the Action model has exactly one required string field (or `--env-options
    '{"text_field": "<name>"}'` names one): the whole reply goes into that field (the env parses it, as
    ours do: a server of ours, envs/openenv_serve.py, is played this way);
  - JSON mode, for any other Action: the reply (or its text after its one `Action:` line, or its last
    ```json block) must be one JSON object of the Action's fields. One that does not parse, or that the Action model
    (in-process) or the server refuses as invalid, is not sent: the step answers with an observation
    saying why and which fields are expected, reward unchanged, not done, and `refused` set.

The observation's text is its `text` field when it has one (a server of ours: its `instruction`,
`refused` and `success` fields are read too), else its one string field when it has exactly one, else
every field but done, reward and metadata as JSON. Task id = the seed given to `reset` (a server of ours, envs/openenv_serve.py,
lists its env's own task ids and subtasks, and reads the seed as the task id). Reward: OpenEnv rewards are per
step, while our episodes score the last step's reward (a running score), so an episode's reward here is
the sum of its step rewards (`{"reward": "last"}`: the env's own value, for envs that already report a
running score); used as the env gives it, not rescaled. Success: the observation metadata's `success`
when the env reports one, else done with a positive reward. The metadata of every observation (in-process
only: OpenEnv's server does not send metadata) is kept in the transcript (`info`, read by rollout.py).

A server that dies or hangs mid-episode raises (or times out) in the call: the rollout flags the episode
`env_error` and replaces the env, as for our own envs. Connecting happens at `reset`, inside that boundary.
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import time
import typing

from envs import _ACTION

_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
IDS = {"train": range(0, 10_000), "val": range(10_000, 10_200), "test": range(20_000, 20_500)}


def bind(target: str) -> type:
    """The Env class for `openenv:<module>:<Class>` or `openenv+http://...`, checked without starting
    anything heavy: the class is imported (in-process), the URL is only parsed (a server)."""
    if target.startswith("openenv+"):
        url = target[len("openenv+"):]
        if not re.match(r"^(http|https|ws|wss)://[^/\s]+", url):
            raise ValueError(f"{target!r} is no server address; write openenv+http://HOST:PORT")
        return type("OpenEnvServer", (OpenEnv,), {"url": url.replace("ws://", "http://").replace("wss://", "https://")})
    try:
        _, module, name = target.split(":")
    except ValueError:
        raise ValueError(f"{target!r}: write openenv:<module>:<Class>, e.g. openenv:my_env.server.env:MyEnvironment")
    from openenv.core.env_server.interfaces import Environment
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"{module}:{name} is not an OpenEnv Environment subclass")
    return type(f"OpenEnv[{name}]", (OpenEnv,), {"env_class": cls})


class OpenEnv:
    """One OpenEnv environment (in-process or behind a server) behind our Env protocol."""
    env_class: type | None = None  # set by bind(): the in-process Environment
    url: str | None = None         # set by bind(): the server
    success = refused = False

    def __init__(self, text_field: str | None = None, reward: str | None = None, instruction: str | None = None,
                 timeout: float = 300.0):
        if reward not in (None, "sum", "last"):
            raise ValueError(f"reward {reward!r}: choose sum (the episode's return) or last (the env's own value)")
        self.reward_mode, self.timeout, self.custom = reward, timeout, instruction
        self.env = self.client = None
        self.info: dict = {}
        self.text_field, self.fields = text_field, None
        if self.env_class is not None:
            self.env = self.env_class()
            self.action_cls = typing.get_type_hints(self.env_class.step).get("action")
            if not (isinstance(self.action_cls, type) and hasattr(self.action_cls, "model_json_schema")):
                raise ValueError(f"{self.env_class.__name__}.step has no Action type annotation to build actions from")
            self._read_schema(self.action_cls.model_json_schema())
        else:  # a server is asked for its schema at the first reset, inside the rollout's env-call boundary
            from openenv.core import GenericEnvClient  # a slow import: here, not inside a timed env call
            self.client_class, self.action_cls = GenericEnvClient, None

    def _read_schema(self, schema: dict) -> None:
        """The Action's fields, and the text field: the one required string field, or the one named."""
        self.fields = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        required = [k for k in schema.get("required", []) if k in self.fields]
        texts = [k for k in required if self.fields[k].get("type") == "string"]
        if self.text_field is not None and self.text_field not in self.fields:
            raise ValueError(f"text_field {self.text_field!r} is not a field of the Action; it has: {', '.join(self.fields)}")
        self.text_field = self.text_field or (texts[0] if len(texts) == 1 and len(required) == 1 else None)

    @property
    def instruction(self) -> str:
        if self.custom or getattr(self, "served_instruction", None):
            return self.custom or self.served_instruction
        if self.text_field:
            return f"Act in this environment, one action per reply: each reply is sent to it as its {self.text_field}."
        return ("Act in this environment, one action per reply. End each reply with one JSON object of the action's "
                f"fields: {json.dumps(self.fields)}")

    # -- the Env protocol --------------------------------------------------------------------------
    def reset(self, task_id: int) -> str:
        self.total, self.success, self.refused = 0.0, False, False
        if self.env is not None:
            accepted = inspect.signature(self.env.reset).parameters
            kwargs = {"seed": task_id} if "seed" in accepted or any(
                p.kind is p.VAR_KEYWORD for p in accepted.values()) else {}
            return self._read(self.env.reset(**kwargs))[0]
        if self.fields is None:
            import requests
            self._read_schema(requests.get(f"{self.url}/schema", timeout=min(30.0, self.timeout)).json()["action"])
        if self.client is None:  # connect here, inside the rollout's env-call boundary
            self.client = self.client_class(base_url=self.url, connect_timeout_s=min(30.0, self.timeout),
                                           message_timeout_s=self.timeout).sync()
            self.client.connect()
        return self._read(self.client.reset(seed=task_id))[0]

    def step(self, text: str) -> tuple[str, float, bool]:
        action, error = self.action(text)
        if error is None and self.env is not None:
            from pydantic import ValidationError
            try:
                action = self.action_cls.model_validate(action)
            except ValidationError as exc:
                error = f"Invalid action: {_first_error(exc)}."
            else:
                obs, reward, done = self._read(self.env.step(action))
        elif error is None:
            try:
                obs, reward, done = self._read(self.client.step(action))
            except RuntimeError as exc:  # the server answered; a refused action keeps the session
                if "VALIDATION_ERROR" not in str(exc):
                    raise
                error = "Invalid action: the environment refused its fields."
        if error is not None:
            self.refused = True
            return f"{error} {self.expected()}", self.score(), False
        return obs, reward, done

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.env is not None:
            self.env.close()

    def tasks(self, split: str) -> list[int]:
        """A server of ours (envs/openenv_serve.py) lists its env's splits (GET /tasks); any other OpenEnv
        env has no task ids of its own: seeds, disjoint ranges per split."""
        listing = self.listing()
        return list(listing["splits"][split]) if listing else list(IDS[split])

    def subtask(self, task_id: int) -> str:
        listing = self.listing()
        return listing["subtasks"].get(str(task_id), "all") if listing else "all"

    def listing(self) -> dict:
        if self.url is None:
            return {}
        if not hasattr(self, "_listing"):
            import requests
            answer = requests.get(f"{self.url}/tasks", timeout=min(60.0, self.timeout))
            self._listing = answer.json() if answer.ok else {}
        return self._listing

    # -- the mapping ---------------------------------------------------------------------------------
    def action(self, text: str) -> tuple[dict, str | None]:
        """The reply as the Action's fields, or ({}, the reason it is refused)."""
        if self.text_field:
            return ({self.text_field: text.strip()}, None) if text.strip() else ({}, "Invalid reply: it is empty.")
        starts = [m.end() for m in _ACTION.finditer(text)]
        if len(starts) > 1:
            return {}, f"Invalid reply: found {len(starts)} 'Action:' lines. Give exactly one action per reply."
        body = text[starts[0]:].strip() if starts else text.strip()
        fenced = _FENCE.findall(body)
        candidate = fenced[-1] if fenced else body[body.find("{"):body.rfind("}") + 1]
        try:
            fields = json.loads(candidate)
        except json.JSONDecodeError as exc:
            return {}, f"Invalid reply: no JSON object found ({exc.msg})."
        if not isinstance(fields, dict):
            return {}, "Invalid reply: the action must be one JSON object."
        return fields, None

    def expected(self) -> str:
        if self.text_field:
            return f"Each reply is sent as the action's {self.text_field}; write one."
        return f"Reply with one JSON object of the fields {json.dumps(self.fields)}."

    def score(self) -> float:
        """The episode's reward so far: the sum of step rewards, or the last one (`reward`; default: what a
        server of ours says its rewards are, else the sum)."""
        mode = self.reward_mode or self.listing().get("reward", "sum")
        return self.total if mode == "sum" else self.last

    def _read(self, result) -> tuple[str, float, bool]:
        """(text, reward, done) from an in-process Observation or the client's StepResult."""
        self.refused = False
        if self.env is not None:
            fields = result.model_dump(exclude={"done", "reward", "metadata"})
            reward, done, self.info = result.reward, result.done, _plain(result.metadata)
        else:
            fields, reward, done, self.info = dict(result.observation), result.reward, result.done, {}
        self.last = float(reward or 0.0)
        self.total += self.last
        strings = [v for v in fields.values() if isinstance(v, str)]
        if isinstance(fields.get("text"), str):  # a server of ours (envs/openenv_serve.py) or alike
            text, self.served_instruction = fields["text"], fields.get("instruction")
            self.refused = bool(fields.get("refused", False))
        else:
            text = strings[0] if len(strings) == 1 and len(fields) == 1 else json.dumps(fields, sort_keys=True, default=str)
        reported = self.info.get("success", fields.get("success"))
        self.success = bool(reported) if isinstance(reported, bool) else bool(done and self.score() > 0)
        return text, self.score(), bool(done)


def probe(url: str, wait: float = 30.0, task: int | None = None) -> str | None:
    """Before a run starts: None when the OpenEnv server at `url` answers and accepts a reset of the first train
    task (or of `task`), else one line saying what it answered and what to do. Waits up to `wait` seconds for a
    server that is still starting (the README starts one in the background just before training)."""
    import requests

    deadline = time.monotonic() + wait
    while True:
        try:
            schema = requests.get(f"{url}/schema", timeout=min(10.0, wait))
            break
        except requests.RequestException as exc:
            if time.monotonic() >= deadline:
                return (f"no OpenEnv server answers at {url} after {wait:g} s ({type(exc).__name__}); start it first, "
                        f"e.g. bash run.sh python -m envs.openenv_serve --env textcraft --port 8000 &")
            time.sleep(0.5)
    if not schema.ok:
        return f"the server at {url} answered GET /schema with {schema.status_code} {_reason(schema)}; is it an OpenEnv server?"
    listing = requests.get(f"{url}/tasks", timeout=min(10.0, wait))
    ids = listing.json().get("splits", {}).get("train") if listing.ok else None
    first = task if task is not None else ids[0] if ids else IDS["train"][0]
    answer = requests.post(f"{url}/reset", json={"seed": first}, timeout=min(60.0, max(wait, 10.0)))
    if 400 <= answer.status_code < 500:
        return f"the served env at {url} refused a reset of task {first}: {answer.status_code} {_reason(answer)}"
    if not answer.ok:
        return f"the served env at {url} failed a reset of task {first} ({answer.status_code}); see the server's log"
    return None


def _reason(answer) -> str:
    """A server's answer in one line: its JSON `detail` (FastAPI's errors) or the start of its text."""
    try:
        detail = answer.json().get("detail", answer.text)
    except ValueError:
        detail = answer.text
    if isinstance(detail, list):  # pydantic's validation errors: where, and what
        detail = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" if isinstance(e, dict) else str(e)
                           for e in detail)
    return " ".join(str(detail).split())[:300]


def _first_error(exc) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(map(str, err['loc'])) or 'action'}: {err['msg']}"


def _plain(meta: dict) -> dict:
    """The metadata as JSON values (a transcript is written as JSON)."""
    return json.loads(json.dumps(meta or {}, default=str))

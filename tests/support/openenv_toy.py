"""Small OpenEnv environments for the OpenEnv tests. `Count`: JSON actions and an episode that ends.
`Say`: a text action, and a server that can be told to die or hang at a given step
(OPENENV_TOY_FAIL=die:2 or hang:2), for the env_error path. Serve them:
`python -m uvicorn tests.support.openenv_toy:app --factory --port 8000` (say_app for Say)."""
from __future__ import annotations

import os
import time

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CountAction(Action):
    number: int = Field(..., description="the next number")
    note: str = Field("", description="anything")


class CountObservation(Observation):
    prompt: str = ""
    last: int = 0


class Count(Environment):
    """Count up from the seed: each step rewards 1 when the number is the next one; done after 3 steps."""
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kw) -> CountObservation:
        self.next, self.hits, self._state = (seed or 0) + 1, 0, State(episode_id=episode_id, step_count=0)
        return CountObservation(prompt=f"Count up from {seed or 0}.", last=seed or 0, metadata={"start": seed or 0})

    def step(self, action: CountAction, timeout_s: float | None = None, **kw) -> CountObservation:
        self._state.step_count += 1
        fail = os.environ.get("OPENENV_TOY_FAIL", "")
        if fail == f"die:{self._state.step_count}":
            os._exit(1)
        if fail == f"hang:{self._state.step_count}":
            time.sleep(3600)
        right = action.number == self.next
        self.next, self.hits = self.next + right, self.hits + right
        done = self._state.step_count >= 3
        return CountObservation(prompt="Right." if right else f"Wrong, say {self.next}.", last=self.next - 1,
                                reward=float(right), done=done,
                                metadata={"step": self._state.step_count, "success": done and self.hits == 3})

    @property
    def state(self) -> State:
        return self._state


class SayAction(Action):
    text: str = Field(..., description="what to say")


class SayObservation(Observation):
    heard: str = ""


class Say(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, **kw) -> SayObservation:
        self.steps = 0
        return SayObservation(heard=f"Say something ({seed}).")

    def step(self, action: SayAction, **kw) -> SayObservation:
        self.steps += 1
        fail = os.environ.get("OPENENV_TOY_FAIL", "")
        if fail == f"die:{self.steps}":
            os._exit(1)
        if fail == f"hang:{self.steps}":
            time.sleep(3600)
        return SayObservation(heard=action.text[:20], reward=0.5)

    @property
    def state(self) -> State:
        return State(step_count=self.steps)


def say_app():
    return create_app(Say, SayAction, SayObservation, env_name="say", max_concurrent_envs=16)


def app():
    return create_app(Count, CountAction, CountObservation, env_name="count", max_concurrent_envs=16)

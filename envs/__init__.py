"""The environment contract: a small Protocol over plain strings, and `make(name)`.

Every environment family lives in one file of this package and runs in-process. OpenEnv environments
(in-process or behind a server) come in through envs/openenv_in.py, and envs/openenv_serve.py serves ours.
An environment instance plays one episode at a time; the rollout keeps a pool of instances and
reuses them across episodes (a SciWorld instance is a JVM, so reuse matters).

The contract, shown by a toy environment (a guessing game):

    class Guess:
        instruction = "Guess the number from 0 to 9. Reply with 'Thought:\\n...\\n\\nAction:\\n<digit>'."
        def reset(self, task_id):
            self.target, self.success = task_id % 10, False
            return "I am thinking of a number."
        def step(self, text):
            action, error = parse_action(text)
            if error:                       # malformed: say why, reward unchanged, not done
                return error, 0.0, False
            if not action.isdigit():
                return f"'{action}' is not a digit. Reply with one digit from 0 to 9.", 0.0, False
            self.success = int(action) == self.target
            return ("Correct." if self.success else "Wrong."), float(self.success), self.success
        def close(self): pass
        def tasks(self, split): return list(range(10)) if split == "train" else list(range(10, 20))
        def subtask(self, task_id): return "even" if task_id % 2 == 0 else "odd"

Optional: `agentgym_instruction`, the wording used under `--prompt-style agentgym` when it differs
(TextCraft's, without the worked example the original lacked); infra/framing.py says how episodes open.

Reward semantics (docs/design.md): environments report a running score, so the episode's reward is the
reward of its last step, scaled to [-1, 1]. `success` says whether the current episode met the
environment's own success criterion (SciWorld: score 100; TextCraft: goal crafted; ...).
"""
from __future__ import annotations

import importlib
import re
from typing import Protocol, runtime_checkable


@runtime_checkable
class Env(Protocol):
    instruction: str  # the system text: what the task is and the exact reply/action format
    success: bool     # whether the current episode has met the env's success criterion

    def reset(self, task_id: int) -> str:
        """Start task `task_id` (deterministic for a given id); return the first observation."""

    def step(self, text: str) -> tuple[str, float, bool]:
        """Take the whole assistant message; return (observation, reward, done). Never raises on bad input."""

    def close(self) -> None:
        """Release simulator resources (JVMs, files)."""

    def tasks(self, split: str) -> list[int]:
        """Task ids of a split: "train", "val" (validation: in-training evaluation, recipe choices) and
        "test" (final tables only), disjoint (tests/test_splits.py)."""

    def subtask(self, task_id: int) -> str:
        """Category name of a task, for per-subtask evaluation tables."""


# name -> "module:Class". Modules are imported lazily so that a missing simulator package only
# matters for the environment that needs it.
REGISTRY = {
    "textcraft": "envs.textcraft:TextCraft",
    "sciworld": "envs.sciworld:SciWorld",
    "babyai": "envs.babyai:BabyAI",
    "webarena": "envs.webarena:WebArena",
    "miniwob": "envs.miniwob:MiniWoB",
    "searchqa": "envs.searchqa:SearchQA",
}


def env_class(name: str) -> type:
    """The class of a registered env, or of any importable "package.module:Class" (your own env), or an
    OpenEnv environment: "openenv:module:Class" in-process, "openenv+http://HOST:PORT" a server
    (envs/openenv_in.py)."""
    if name.startswith(("openenv:", "openenv+")):
        return importlib.import_module("envs.openenv_in").bind(name)
    if name not in REGISTRY and ":" not in name:
        raise ValueError(f"unknown env {name!r}; choose one of: {', '.join(sorted(REGISTRY))}, "
                         "or give your own as package.module:Class, openenv:module:Class or openenv+http://HOST:PORT")
    module, cls = REGISTRY.get(name, name).split(":")
    return getattr(importlib.import_module(module), cls)


def make(name: str, **options) -> Env:
    """Build one instance of environment `name` (see REGISTRY), passing `options` to its constructor."""
    return env_class(name)(**options)


_ACTION = re.compile(r"^\s*Action\s*:", re.IGNORECASE | re.MULTILINE)


def parse_action(text: str, max_chars: int = 300) -> tuple[str, str | None]:
    """Extract the action from a ReAct reply `Thought:\\n...\\n\\nAction:\\n<action>`.

    Returns (action, None) on success, or ("", error observation) when the reply has no `Action:`,
    more than one (the original answered these with an error asking for exactly one), or an empty
    or overlong action. The action is the first non-empty line after `Action:`.
    """
    starts = [m.end() for m in _ACTION.finditer(text)]
    if not starts:
        return "", ("Invalid reply: no 'Action:' found. Reply as 'Thought:\\n<your reasoning>\\n\\n"
                    "Action:\\n<one action>'.")
    if len(starts) > 1:
        return "", (f"Invalid reply: found {len(starts)} 'Action:' lines. Give exactly one action per reply.")
    lines = [line.strip() for line in text[starts[0]:].splitlines()]
    action = next((line for line in lines if line), "")
    if not action:
        return "", "Invalid reply: 'Action:' is followed by nothing. Write one action on the line after it."
    if len(action) > max_chars:
        return "", f"Invalid action: longer than {max_chars} characters. Write one short action."
    return action, None


def has_action(text: str) -> bool:
    """Whether a reply holds an `Action:` line, the line `parse_action` reads the action after."""
    return _ACTION.search(text) is not None


def agentgym_action(text: str, max_chars: int = 300) -> tuple[str, str | None]:
    """Extract the action as AgentGym's SciWorld and BabyAI clients did: drop a trailing `</s>`, split
    the reply on `Action:` (case-sensitive, anywhere) and take the text between the first and the second
    split (to the end when there is one), stripped; a reply without `Action:` is the action as a whole.
    So a second `Action:` is not an error here, and a multi-line remainder goes to the env as it is.

    Departures, to keep the never-raise contract cheap: an empty action, or one longer than `max_chars`,
    returns ("", error observation) instead of being sent to the simulator.
    """
    text = text[:-len("</s>")] if text.endswith("</s>") else text
    parts = text.split("Action:")
    action = (parts[1] if len(parts) > 1 else parts[0]).strip()
    if not action:
        return "", "Invalid reply: no action found. Reply as 'Thought:\\n<your reasoning>\\n\\nAction:\\n<one action>'."
    if len(action) > max_chars:
        return "", f"Invalid action: longer than {max_chars} characters. Write one short action."
    return action, None

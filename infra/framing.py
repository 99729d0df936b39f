"""How an episode opens: the conversation framing of its first prompt (`--prompt-style`).

Two styles, both rendered through the model's own chat template (rollout.ChatFormat):

- `ours` (the default): the env's instruction as the system message, the first observation as the
  first user turn;
- `agentgym`: the framing of AgentGym's env clients, which the paper's agents and AgentGym's
  trajectories (AgentTraj-L) were made with: the instruction as a user turn, a canned assistant
  acknowledgement, then the first observation as the next user turn. The acknowledgement is the
  original's text per env: "OK. I'll follow your instructions and try my best to solve the task." for
  SciWorld, BabyAI and TextCraft, "Ok." for WebArena and search. No system message is given, so a
  template that adds a default one (Qwen2.5) adds it, as it did in the original. The style also
  selects the original clients' action parsing where it differs from ours (SciWorld and BabyAI take
  the text after the first `Action:`; `env_options`), and drops TextCraft's worked example, which the
  original instruction did not have.

The acknowledgement is part of the prompt: the policy never samples it, so its loss mask is 0 like
every other prompt token, and the token-exact rule holds in both styles (docs/design.md).

Instruction texts: the env's own wording by default. `--instructions-file F` names a JSON object
{env name: instruction text} whose entry for the env replaces it, in either style, so the exact
original prompts can be used without this project shipping them.

Test: `python -m pytest tests/test_framing.py`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STYLES = ("ours", "agentgym")
ACKNOWLEDGEMENT = "OK. I'll follow your instructions and try my best to solve the task."
SHORT_ACKNOWLEDGEMENT = {"webarena": "Ok.", "searchqa": "Ok."}  # what those clients' assistant turn said
AGENTGYM_PARSING = ("sciworld", "babyai")  # envs whose original client extracted the action differently


@dataclass(frozen=True)
class Framing:
    style: str = "ours"                 # "ours" or "agentgym"
    acknowledgement: str = ACKNOWLEDGEMENT  # the canned assistant turn of the agentgym style
    instruction: str | None = None      # replaces the env's instruction (from --instructions-file)

    def opening(self, env) -> tuple[str, str | None]:
        """(instruction, acknowledgement) for an episode of `env`; the acknowledgement is None in our style,
        where the instruction is the system message."""
        if self.style == "ours":
            return self.instruction or env.instruction, None
        # an env may keep a zero-shot wording for this style (TextCraft: no worked example)
        text = self.instruction or getattr(env, "agentgym_instruction", env.instruction)
        return text, self.acknowledgement


def make(style: str, env: str, instructions_file: str = "") -> Framing:
    """The framing of `style` for env `env`, reading its instruction from `instructions_file` if given.
    ValueError (one line) for an unknown style or a file without a usable entry for the env."""
    if style not in STYLES:
        raise ValueError(f"unknown --prompt-style {style!r}; choose {' or '.join(STYLES)}")
    instruction = load_instruction(instructions_file, env) if instructions_file else None
    return Framing(style, SHORT_ACKNOWLEDGEMENT.get(env, ACKNOWLEDGEMENT), instruction)


def load_instruction(path: str, env: str) -> str:
    """The instruction text for `env` in a JSON file {env: text}; ValueError (one line) otherwise."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--instructions-file {path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--instructions-file {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(table, dict):
        raise ValueError(f'--instructions-file {path}: expected a JSON object {{"{env}": "instruction text"}}')
    text = table.get(env)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--instructions-file {path} has no instruction text for {env!r} "
                         f"(keys: {', '.join(map(str, table)) or 'none'})")
    return text


def env_options(style: str, env: str, options: dict) -> dict:
    """The env's constructor options under `style`: the agentgym style adds the original clients' action
    parsing to the envs where it differs, unless the options already choose a parser."""
    if style == "agentgym" and env in AGENTGYM_PARSING:
        return {"parser": "agentgym", **options}
    return dict(options)

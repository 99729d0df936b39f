"""Toy environments for the rollout and training tests: tiny, deterministic, no simulator.

`Digits`: the reward is the share of digit characters in the replies so far (a running score in
[0, 1]); a random tiny model starts near 0 and GRPO can raise it within a minute or two of CPU.
`Exploding`: like Digits but raises from `step` at a chosen turn, to test that a failing env is
flagged without stopping the other episodes.
`ByTask`: one turn, solved (reward 1) on odd tasks and failed (0) on even ones whatever the reply: every
group is constant (studies/: --dynamic-sampling, --sometimes-solved).
"""
from __future__ import annotations


class Digits:
    instruction = "Reply with digits only."

    def __init__(self, turns: int = 2, obs_words: int = 3):
        self.turns, self.obs_words = turns, obs_words
        self.success = False

    def reset(self, task_id: int) -> str:
        self.task_id, self.t, self.scores, self.success = task_id, 0, [], False
        return f"Task {task_id}: " + " ".join(["digits"] * (1 + task_id % self.obs_words))

    def step(self, text: str) -> tuple[str, float, bool]:
        self.t += 1
        self.scores.append(sum(c.isdigit() for c in text) / max(1, len(text)))
        reward = sum(self.scores) / self.turns
        self.success = reward > 0.9
        return f"Turn {self.t} scored {self.scores[-1]:.2f}. More digits.", reward, self.t >= self.turns

    def close(self) -> None:
        pass

    def tasks(self, split: str) -> list[int]:
        return list(range(64)) if split == "train" else list(range(80, 96)) if split == "val" else list(range(64, 80))

    def subtask(self, task_id: int) -> str:
        return f"len{1 + task_id % self.obs_words}"


class Exploding(Digits):
    def __init__(self, explode_at: int = 2, **kw):
        super().__init__(**kw)
        self.explode_at = explode_at

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.task_id % 2 == 1 and self.t + 1 == self.explode_at:
            raise RuntimeError("simulator fell over")
        return super().step(text)


class ByTask(Digits):
    def step(self, text: str) -> tuple[str, float, bool]:
        self.t += 1
        self.success = self.task_id % 2 == 1
        return "Done.", float(self.success), True

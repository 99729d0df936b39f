"""The generator's contract, shared by every engine (engine.py: vLLM and transformers; infra/decode.py: the
project's own decode loop): what to sample (`Sampling`), what came back (`Sample`), and the weight copy of
the engines that hold a transformers model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass
class Sampling:
    max_tokens: list[int] | int = 256  # per prompt, or one for all
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | list[int] | None = None  # None: nondeterministic; a list: one per prompt; an int s: prompt i uses s + i
    stop_ids: tuple[int, ...] = ()     # end-of-turn token ids; a stop token is kept in the output

    def caps(self, n: int) -> list[int]:
        return list(self.max_tokens) if isinstance(self.max_tokens, (list, tuple)) else [self.max_tokens] * n

    def seeds(self, n: int) -> list[int | None]:
        """The seed of each of `n` prompts (vLLM seeds every request on its own)."""
        if isinstance(self.seed, (list, tuple)):
            return list(self.seed)
        return [None if self.seed is None else self.seed + i for i in range(n)]


@dataclass
class Sample:
    ids: list[int]                # sampled token ids, the stop token included when generation stopped on it
    logprobs: list[float] | None  # logprob of each sampled id under the generating weights (None: an expert's)
    text: str | None = None       # the reply as written, when the actor writes text (the expert); else decoded
    end: str = ""                 # set when the actor could not reply: the episode ends so ("expert_error", ...)
    error: str = ""


def copy_weights(model, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """(name, full tensor) pairs in HF naming copied into a transformers model's parameters, cast to theirs."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name in params:  # tied embeddings appear once in the model, maybe twice in the stream
                params[name].copy_(tensor.to(params[name].dtype))

"""Sampling inside the decode step (infra/decode.py), seeded per request: one uniform per row from a
counter-based hash of (the request's seed, the token's position) (`uniform`, splitmix64), turned into a
token by the inverse CDF of softmax(logits / T), top-p applied first when < 1 (`sample`).

Why: a request's sample then does not depend on the batch it ran in, and no per-row torch.Generator is
needed (a CUDA graph cannot take one): the whole draw is tensor arithmetic on int64 seeds and positions. The
logprob returned is the raw model's (before temperature and top-p), as the trainer scores it (engine.py's
contract).

Tests: python -m pytest tests/test_decode.py -k "splitmix or sampler"; on CUDA, bench/gpu_check.py
"""
from __future__ import annotations

import hashlib

import torch

_MASK64 = (1 << 64) - 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic on signed integers)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def uniform(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """(R,) float32 in [0, 1): splitmix64's output for state seed + position * golden ratio, 24 bits of it.
    int64 arithmetic wraps on overflow, as the 64-bit original does (`splitmix64`: the same in Python's integers)."""
    x = seed + position * _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return _shr(x, 40).float() * 2.0**-24


def splitmix64(seed: int, position: int) -> float:
    """`uniform` of one row in Python's exact integers: the reference the tests (tests/test_decode.py) and the
    device check (bench/gpu_check.py) compare the tensor version with, on the CPU and on CUDA."""
    x = (seed + position * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return (x >> 40) / 2**24


def request_seed(seed: int | None, gen: torch.Generator) -> int:
    """A request's 63-bit seed: its own, or (None) one drawn from the engine's generator."""
    if seed is None:
        return int(torch.randint(0, 2**62, (), generator=gen))
    return int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little") >> 1


def sample(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of (R, V) float32 logits, by the inverse CDF at the row's uniform u (R,); and its
    raw logprob, log_softmax(logits) (no temperature, no top-p: what the trainer recomputes)."""
    if temperature == 0:
        token = logits.argmax(-1)
    else:
        probs = torch.softmax(logits / temperature, -1)                       # (R, V)
        order = None
        if top_p < 1:  # nucleus: the smallest set of likeliest tokens whose mass reaches top_p
            probs, order = probs.sort(-1, descending=True)
            before = probs.cumsum(-1) - probs
            probs = probs.masked_fill(before >= top_p, 0.0)  # the first token always stays (before = 0)
        cdf = probs.cumsum(-1)                                                  # (R, V)
        total = cdf[:, -1:]
        # strictly below the total: a right-sided search then lands on a token of positive probability
        value = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
        token = torch.searchsorted(cdf, value, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
        if order is not None:
            token = order.gather(-1, token[:, None]).squeeze(-1)
    logprob = logits.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    return token, logprob


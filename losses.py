"""The update's losses on padded (B, T) token tensors: PPO's clipped policy surrogate, the clipped value
loss, the KL to the reference model (three per-token estimators and the loss term), and the one
aggregation they all share.

The mask is 1 exactly on tokens the policy sampled and 0 on the prompt, role headers, observations and
padding. Entries at mask 0 are never read, not by the result, not by the gradient, even if NaN (`_keep`
selects with `torch.where`, since NaN * 0 is NaN); the masked reductions here are the ones the advantage
estimators (algorithms.py) use too. Departures from common implementations, each repeated in the docstring concerned:
  * losses divide by a normaliser the trainer passes (the global token or sequence count across ranks
    and micro-batches), so the gradient does not depend on how a batch was split;
  * the KL term is aggregated exactly like the policy loss (same `agg`, same normaliser), so its weight
    relative to the policy loss does not change with the aggregation.

Numerical choices: inputs are upcast to at least float32 before exp() (bf16 log-probs included), and every
log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exp(), as verl does.

Dimension legend:  B episodes (rows)  T token positions
Tests: python -m pytest tests/test_losses.py
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-sum-norm")
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps exp() finite so backward never meets inf * 0 = NaN


def _float(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in: at least float32 (int rewards, bf16 log-probs)."""
    return torch.promote_types(dtype, torch.float32)


def _keep(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask is 1, exactly 0 elsewhere. `torch.where`, not `x * mask`: NaN * 0 is NaN."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim=None) -> Tensor:
    """sum_t m_t x_t over `dim` (all dims if None). Entries with mask 0 are never read."""
    kept = _keep(x, mask)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim=None) -> Tensor:
    """sum_t m_t x_t / max(sum_t m_t, 1): an empty mask gives 0, not NaN."""
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token estimators of KL(pi || ref) from tokens sampled by pi, d = logp - ref_logp:

        k1 = d        k2 = d^2 / 2        k3 = exp(-d) + d - 1  (>= 0, unbiased, low variance)

    k3 follows common implementations (verl's "low_var_kl"): -d is clamped to [-20, 20] before exp()
    so exp() never overflows into an inf * 0 = NaN gradient, and the result is clamped to [-10, 10]
    (so above 10 it carries no gradient). k1 and k2 are not clamped.
    """
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        neg = (-d).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(neg) - neg - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind {kind!r}; use one of 'k1', 'k2', 'k3'")


def _denominator(normalizer, default: Tensor) -> Tensor | float:
    """The normaliser, or `default` (a local count) if None; a count of 0 is read as 1, so a batch
    with no policy token gives loss 0. A given normaliser must be finite and >= 0."""
    if normalizer is None:
        return default.clamp(min=1)
    value = float(normalizer)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"normalizer must be a finite number >= 0 (a global token or sequence count), got {value}")
    return value if value > 0 else 1.0


def aggregate(loss_tok: Tensor, mask: Tensor, agg: str, normalizer) -> Tensor:
    """Per-token terms -> one loss, by `agg` (see `policy_loss`). Used for the policy, KL and entropy
    terms alike, so their relative weights do not depend on the aggregation."""
    count = mask.bool().sum().to(loss_tok.dtype)
    if agg == "token-mean":
        return masked_sum(loss_tok, mask) / _denominator(normalizer, count)
    if agg == "seq-mean-token-mean":
        seq = masked_mean(loss_tok, mask, dim=-1)                 # (B,) 0 for an empty row
        return seq.sum() / _denominator(normalizer, count.new_tensor(float(seq.numel())))
    if agg == "seq-sum-norm":
        if normalizer is None:
            raise ValueError("agg='seq-sum-norm' needs a constant normalizer, e.g. max response "
                             "length * number of sequences (Dr. GRPO)")
        return masked_sum(loss_tok, mask) / _denominator(normalizer, count)
    raise ValueError(f"unknown agg {agg!r}; use one of {', '.join(AGGREGATIONS)}")


class Clip(NamedTuple):
    """PPO's ratio clip: rho kept within [1 - low, 1 + high] (DAPO's clip-higher: high > low), and the dual clip
    c > 1 on negative advantages (None: off)."""
    low: float = 0.2
    high: float = 0.2
    dual: float | None = None


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip: Clip = Clip(),
                agg: str = "token-mean", normalizer=None) -> tuple[Tensor, dict]:
    """PPO clipped surrogate, per token, with rho = exp(logp - old_logp) and advantage A:

        l_t = max(-A rho, -A clip(rho, 1 - clip.low, 1 + clip.high))
        dual clip (c = clip.dual > 1, only where A < 0):   l_t = min(l_t, -c A)

    then aggregated (see `agg`):
        token-mean           sum_t m_t l_t / normalizer    (default: this batch's mask.sum();
                             the trainer passes the GLOBAL masked-token count over ranks and
                             micro-batches so splitting a batch does not change the gradient)
        seq-mean-token-mean  sum_i (token mean of row i) / normalizer  (default B, the row count)
        seq-sum-norm         sum_t m_t l_t / normalizer, a constant that must be given (Dr. GRPO:
                             max response length * number of sequences)

    Inputs are upcast to at least float32; logp - old_logp is clamped to [-20, 20] before exp(), as
    in verl. Entries at mask 0 (even NaN) affect neither loss nor gradient; NaN at mask 1
    propagates, since it means the model diverged and the trainer must see it.
    Metrics (detached 0-d tensors over this batch's masked tokens): clip_frac (the clipped branch is
    active), clip_frac_low / clip_frac_high, dual_clip_frac, approx_kl = mean k3 estimate of
    KL(old || new) = rho - 1 - log rho, ratio_min / ratio_max / ratio_mean (1 if the mask is empty).
    """
    clip_low, clip_high, dual_clip = clip
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None, got {dual_clip}")
    m = mask.bool()
    # at least float32: near 1 a bf16 ratio moves in steps of 0.4-0.8%, too coarse for clip metrics
    logp, old_logp, advantages = (x.to(_float(x.dtype)) for x in (logp, old_logp, advantages))
    log_ratio = (_keep(logp, m) - _keep(old_logp, m).detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    adv = _keep(advantages, m).detach()
    ratio = torch.exp(log_ratio)                                                # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_tok = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (loss_tok > bound)
        loss_tok = torch.where(adv < 0, torch.minimum(loss_tok, bound), loss_tok)
    loss = aggregate(loss_tok, mask, agg, normalizer)

    with torch.no_grad():
        r, lr = ratio.detach(), log_ratio.detach()
        any_tok = m.any()
        metrics = {
            "clip_frac": masked_mean((clipped > unclipped).to(r.dtype), m),
            "clip_frac_low": masked_mean(((r < 1 - clip_low) & (adv < 0)).to(r.dtype), m),
            "clip_frac_high": masked_mean(((r > 1 + clip_high) & (adv > 0)).to(r.dtype), m),
            "dual_clip_frac": masked_mean(dual_active.to(r.dtype), m),
            "approx_kl": masked_mean(r - 1 - lr, m),
            "ratio_min": torch.where(any_tok, torch.where(m, r, torch.inf).min(), 1.0),
            "ratio_max": torch.where(any_tok, torch.where(m, r, -torch.inf).max(), 1.0),
            "ratio_mean": torch.where(any_tok, masked_mean(r, m), 1.0),
        }
    return loss, metrics


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2,
               normalizer=None) -> tuple[Tensor, dict]:
    """Clipped value loss, token-mean with the same normaliser semantics as `policy_loss`:

        v_clip = old + clip(v - old, -clip, clip)
        l_t    = 0.5 * max((v - R)^2, (v_clip - R)^2)          (clip=None: 0.5 (v - R)^2)

    Metrics: clip_frac (the clipped error is the larger one), value_mean, return_mean (masked).
    """
    m = mask.bool()
    values, old_values, returns = (x.to(_float(x.dtype)) for x in (values, old_values, returns))
    v, old, ret = _keep(values, m), _keep(old_values, m).detach(), _keep(returns, m).detach()
    err = (v - ret) ** 2
    err_clip = err if clip is None else (old + (v - old).clamp(-clip, clip) - ret) ** 2
    loss = aggregate(0.5 * torch.maximum(err, err_clip), mask, "token-mean", normalizer)
    with torch.no_grad():
        metrics = {"clip_frac": masked_mean((err_clip > err).to(v.dtype), m), "value_mean": masked_mean(v.detach(), m),
                   "return_mean": masked_mean(ret, m)}
    return loss, metrics


def kl_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, kind: str = "k3", agg: str = "token-mean",
            normalizer=None) -> Tensor:
    """kl_penalty(logp, ref_logp, kind) aggregated exactly like the policy loss (same `agg` and
    normaliser, as verl does), so the KL's weight relative to the policy loss does not change with
    the aggregation: the GRPO-style KL term (paper: coefficient 0.001, k3). Mask-0 entries are never read."""
    m = mask.bool()
    logp, ref_logp = logp.to(_float(logp.dtype)), ref_logp.to(_float(ref_logp.dtype))
    k = kl_penalty(_keep(logp, m), _keep(ref_logp, m).detach(), kind)
    return aggregate(k, mask, agg, normalizer)

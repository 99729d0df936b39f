"""Masked reductions over padded (B, T) token tensors: the floor the advantage estimators (algorithms.py)
and the losses (losses.py) stand on.

The mask is 1 exactly on tokens the policy sampled (assistant content and its end-of-turn token) and 0 on
the prompt, role headers, observations and padding. Entries at mask 0 are never read: not by the result,
not by the gradient, even if NaN (`_keep` selects with `torch.where`, since NaN * 0 is NaN).

Numerical choices:
  * statistics (the batch mean and variance of whitening) are float64, whatever the input dtype: a
    float32 mean of eight rewards of 0.97 is one rounding unit off, its "std" is then about 1e-7, and
    dividing by it turns equal values into advantages of 0.1;
  * a constant batch gets exactly 0, by an explicit max == min test, not by hoping the rounding cancels;
  * masked variance of fewer than 2 elements is 0 rather than an error or NaN;
  * whitening multiplies by rsqrt(var + eps) (eps 1e-8); one whitening function serves the single-process
    and the cross-rank trainer paths (`masked_whiten` with reductions passed in);
  * results are at least float32.

Dimension legend:  B episodes (rows)  T token positions
Tests: python -m pytest tests/test_algorithms.py -k "masked or whiten"
"""
from __future__ import annotations

import torch
from torch import Tensor


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


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked entries: sum m (x - mean)^2 / (n - 1) (or / n if not unbiased). Departure:
    fewer than 2 masked entries give 0, where verl raises on n == 1 (a single token carries no spread)."""
    n = masked_sum(torch.ones_like(x), mask)
    dev2 = masked_sum((x - masked_mean(x, mask)) ** 2, mask)
    denom = n - 1 if unbiased else n
    return torch.where(n >= 2, dev2 / denom.clamp(min=1), torch.zeros_like(dev2))


def _identity(t: Tensor) -> Tensor:
    return t


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  reduce_sum=None, reduce_max=None) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased var); mean added back if not
    shift_mean. The one whitening of the project: `advantages` uses it on a local batch and the trainer
    on a batch spread over ranks, passing `reduce_sum` / `reduce_max` (float64 tensor -> the same
    tensor summed / maxed over ranks; identity by default), so both give the same numbers.

    Statistics are float64 (see the module docstring). A constant batch gives exactly 0: its max
    equals its min, which is checked explicitly rather than trusted to rounding. Fewer than two
    masked entries also give 0. Departure from verl: the result is 0 at mask-0 positions instead of
    garbage there. Returns at least float32, in x's dtype when wider.
    """
    reduce_sum, reduce_max = reduce_sum or _identity, reduce_max or _identity
    m = mask.bool()
    x64 = _keep(x.double(), m)
    n, total = reduce_sum(torch.stack([m.sum().double(), x64.sum()])).unbind()
    mean = total / n.clamp(min=1)
    ss = reduce_sum(_keep((x64 - mean) ** 2, m).sum())
    var = torch.where(n >= 2, ss / (n - 1).clamp(min=1), torch.zeros_like(ss))
    low = torch.tensor(-float("inf"), dtype=torch.float64, device=x.device)
    extremes = [torch.where(m, v, low).amax() if v.numel() else low for v in (x64, -x64)]
    hi, neg_lo = reduce_max(torch.stack(extremes)).unbind()   # max and -min over all ranks
    constant = (hi <= -neg_lo) | (n < 2)
    out = torch.where(constant, torch.zeros_like(x64), (x64 - mean) * torch.rsqrt(var + eps))
    out = out if shift_mean else out + mean
    return _keep(out, m).to(_float(x.dtype))

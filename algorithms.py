"""The --algo records and the advantage estimators: what each algorithm means to the trainer, and how
episode rewards become per-token advantages and returns.

Everything here is model-free and works on padded (B, T) token tensors plus a loss mask that is 1
exactly on tokens the policy sampled (assistant content and its end-of-turn token) and 0 on the
prompt, role headers, observations and padding (losses.py: the masked reductions, and entries at mask 0
never read). Estimators (AgentGym-RL trains with all four):

    grpo / rloo          group baselines on the scalar episode reward, broadcast to policy tokens
    reinforce++(_baseline)  token rewards, return-to-go over policy tokens, batch whitening
    gae                  PPO with a critic; TD errors and GAE run over policy tokens only
    gigpo                GRPO's episode term plus step groups of turns from one state (gigpo.py)

`advantages` is the one entry point: the trainer gives it the whole step's rewards and groups (every
rank's), its own rows' tokens, and cross-rank reductions for the batch whitening. The losses the
advantages then feed (policy, value, KL) are in losses.py.

Departures from the paper's code (verl-based) and from common implementations, each repeated in the
docstring concerned:
  * the terminal reward sits on the last policy token (`terminal_rewards`); the original wrote it on
    an observation token that the mask excluded, so only GRPO/RLOO-style sums saw it;
  * multi-turn time runs over policy tokens only: an observation between two turns is not a time
    step, so inserting observation tokens never changes GAE or return-to-go;
  * a group of size 1 gets advantage 0 for GRPO and RLOO (verl's GRPO hands it the raw reward);
  * non-finite rewards, or non-finite values/KL on policy tokens, raise ValueError in `advantages`.

Numerical choices:
  * group statistics (means and stds) are float64, whatever the input dtype: a float32 mean of eight
    rewards of 0.97 is one rounding unit off, its "std" is then about 1e-7, and (r - mean) / (std + 1e-6)
    turned an all-equal group into advantages of 0.1;
  * a constant group (GRPO, RLOO, the reinforce++_baseline centring) gets exactly 0, by an explicit
    max == min test, not by hoping the rounding cancels;
  * eps sits where it bounds the division: GRPO divides by std + eps (eps 1e-6, as verl); whitening
    multiplies by rsqrt(var + eps) (eps 1e-8), one function (`masked_whiten`, reductions passed in) for
    the single-process and the cross-rank paths; masked variance of fewer than 2 elements is 0;
  * results are at least float32.

Dimension legend:  B episodes (rows)  T token positions  G groups (tasks)
Tests: python -m pytest tests/test_algorithms.py tests/test_gigpo.py
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import gigpo
# the losses too, under the names train.py and config.py read them by (A.policy_loss, algorithms.AGGREGATIONS)
from losses import AGGREGATIONS, aggregate, kl_loss, kl_penalty, policy_loss, value_loss  # noqa: F401
from losses import _float, _keep, masked_mean, masked_sum

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


ESTIMATORS = ("grpo", "rloo", "reinforce++", "reinforce++_baseline", "gae", "gigpo")


@dataclass(frozen=True)
class Algo:
    """What one --algo means to the trainer, read wherever the choice matters (never its name tested)."""
    name: str
    estimator: str   # the `advantages` estimator it runs
    critic: bool     # a learned value model (PPO's GAE needs one)
    kl: str          # where the KL to the reference goes when --kl-coef > 0: "loss" (a loss term) or "reward"
    grouped: bool    # its baseline compares the samples of one task: it needs 2 or more a task
    states: bool     # it needs each turn's state key (GiGPO's step groups): the rollout records them only then


ALGOS = {a.name: a for a in (
    Algo("grpo", "grpo", critic=False, kl="loss", grouped=True, states=False),
    Algo("rloo", "rloo", critic=False, kl="loss", grouped=True, states=False),
    Algo("reinforce++", "reinforce++", critic=False, kl="reward", grouped=False, states=False),
    Algo("reinforce++_baseline", "reinforce++_baseline", critic=False, kl="reward", grouped=False, states=False),
    Algo("ppo", "gae", critic=True, kl="loss", grouped=False, states=False),
    Algo("gigpo", "gigpo", critic=False, kl="loss", grouped=True, states=True),
)}


# ---------------------------------------------------------------- the terminal reward

def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """(B,) episode rewards -> (B, T) with r_i on the LAST policy token (mask 1) of row i, 0 elsewhere.

    Rows whose mask is empty get nothing (their reward cannot be trained on). Placing the reward on a
    policy token is the fix for the original code, which wrote it on an observation token.
    """
    B, T = mask.shape
    m = mask.bool()
    pos = torch.arange(1, T + 1, device=mask.device).expand(B, T)   # (B, T), 1-based so 0 = none
    last = torch.where(m, pos, 0).argmax(dim=1)                      # (B,) last policy position
    out = torch.zeros(B, T, dtype=_float(rewards.dtype), device=mask.device)
    vals = torch.where(m.any(dim=1), rewards.to(out.dtype), 0.0)
    return out.scatter(1, last[:, None], vals[:, None])


# ---------------------------------------------------------------- advantage estimators

def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row group mean, unbiased group std (0 for a group of one), group size, and whether the
    row's group is constant (all rewards equal, or a group of one), each (B,), all float64 but the flag.

    float64 because a float32 mean of equal rewards can be one rounding unit off, which made the std
    about 1e-7 and (r - mean) / (std + eps) about 0.1 for an all-equal group. The constant flag
    compares group max and min, so an all-equal group is recognised exactly whatever the dtype."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    r = rewards.double()
    n = counts.double()                                                            # (G,)
    mean = torch.zeros_like(n).index_add_(0, inv, r) / n                           # (G,)
    dev = r - mean[inv]                                                            # (B,)
    ss = torch.zeros_like(n).index_add_(0, inv, dev * dev)                         # (G,)
    std = torch.where(counts > 1, (ss / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(n))
    hi = torch.full_like(n, -float("inf")).scatter_reduce(0, inv, r, "amax")
    lo = torch.full_like(n, float("inf")).scatter_reduce(0, inv, r, "amin")
    return mean[inv], std[inv], n[inv], (hi <= lo)[inv]


def _gae_over_mask(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """GAE where time runs over policy tokens only.  For the policy tokens t_1 < ... < t_k of a row:

        delta_j = r_{t_j} + gamma * V_{t_{j+1}} - V_{t_j}      (V_{t_{k+1}} = 0)
        A_{t_j} = delta_j + gamma * lam * A_{t_{j+1}}          (A_{t_{k+1}} = 0)

    With values = 0 and lam = 1 this is the discounted return-to-go. Implementation: a per-row sort
    moves policy tokens to the front in time order, the usual backward recursion runs on the packed
    (B, L) block, and a scatter puts results back; mask-0 entries are zeroed before use.
    """
    B, T = mask.shape
    m = mask.bool()
    pos = torch.arange(T, device=mask.device).expand(B, T)
    order = torch.where(m, pos, pos + T).argsort(dim=1)       # (B, T) policy positions first
    L = int(m.sum(dim=1).max()) if B else 0
    idx = order[:, :L]                                         # (B, L)
    keep = m.gather(1, idx)                                    # (B, L) False on each row's tail
    r = _keep(token_rewards.gather(1, idx), keep)
    v = _keep(values.gather(1, idx), keep)
    packed = torch.zeros_like(r)
    next_v = last = torch.zeros(B, dtype=r.dtype, device=r.device)
    for j in reversed(range(L)):           # a tail entry has r = v = 0, so it leaves last = 0
        last = r[:, j] + gamma * next_v - v[:, j] + gamma * lam * last
        packed[:, j] = last
        next_v = v[:, j]
    return torch.zeros_like(token_rewards).scatter(1, idx, packed)


def _require_finite(name: str, x: Tensor, mask: Tensor | None = None) -> None:
    bad = ~torch.isfinite(x) if mask is None else ~torch.isfinite(x) & mask.bool()
    if bad.any():
        rows = sorted({int(i) for i in bad.nonzero()[:, 0][:10]})
        raise ValueError(f"{name} is NaN or infinite (rows {rows}); drop or flag those episodes "
                         "before computing advantages")


def group_baseline(kind: str, rewards: Tensor, group_ids: Tensor, norm_by_std: bool = True,
                   eps: float = 1e-6) -> Tensor:
    """(B,) float64 per-episode advantage from group statistics; exactly 0 for a constant group.

        grpo    (r_i - mean_g) / (std_g + eps)     (norm_by_std=False: r_i - mean_g, Dr. GRPO)
        rloo    r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean_g)
        center  r_i - mean_g                       (the reinforce++_baseline centring)
    """
    mean, std, n, constant = _group_stats(rewards, group_ids)
    centred = rewards.double() - mean
    if kind == "grpo":
        adv = centred / (std + eps) if norm_by_std else centred
    elif kind == "rloo":
        adv = centred * n / (n - 1).clamp(min=1)
    elif kind == "center":
        adv = centred
    else:
        raise ValueError(f"unknown group baseline {kind!r}; use grpo, rloo or center")
    return torch.where(constant, torch.zeros_like(adv), adv)


def step_advantages(rewards: Tensor, groups: Tensor, states: list[list[str]], gamma: float = 0.95,
                    norm_by_std: bool = True, eps: float = 1e-6) -> list[Tensor]:
    """GiGPO's step term A_S: per episode a (turns,) float64 tensor, each turn's discounted return against
    the other turns taken from the same state in the same group (gigpo.step_groups)."""
    _require_finite("reward", rewards)
    returns, ids = gigpo.step_groups(rewards, groups, states, gamma)
    flat = group_baseline("grpo", returns, ids, norm_by_std, eps) if len(returns) else torch.zeros(0)
    ends = torch.tensor([0, *map(len, states)]).cumsum(0).tolist()
    return [flat[a:b].double() for a, b in zip(ends, ends[1:])]


@dataclass(frozen=True)
class Options:
    """`advantages`' settings beyond each estimator's own hyperparameters, and how a step spans processes."""
    norm_by_std: bool = True               # grpo and gigpo divide by the group's std; False: Dr. GRPO
    eps: float = 1e-6                      # added to that std
    whiten: bool = True                    # reinforce++ and gae whiten over the batch; False: raw values
    step_weight: float = 1.0               # gigpo: the weight of the step-level term
    states: list[list[str]] | None = None  # gigpo: per episode of the step, its turns' observation keys
    rows: slice | None = None              # this process's rows of the step's episodes (default all)
    reduce_sum: object = None              # t -> t summed over processes (masked_whiten); identity if None
    reduce_max: object = None              # t -> t maxed over processes


def _group_relative(name: str, rewards: Tensor, mask: Tensor, group_ids: Tensor, rows, gamma: float,
                    opts: Options) -> Tensor:
    """`advantages` of the group-relative estimators (grpo, rloo, gigpo) on this process's rows: the episode's
    score against its group, broadcast to its policy tokens (gigpo adds each turn's step advantage)."""
    B, T = mask.shape
    m, eps = mask.bool(), opts.eps
    scalar = group_baseline("rloo" if name == "rloo" else "grpo", rewards, group_ids, opts.norm_by_std, eps)
    if name != "gigpo":
        return _keep(scalar[rows].to(rewards.dtype)[:, None].expand(B, T), m)
    if opts.states is None or len(opts.states) != len(rewards):
        raise ValueError("gigpo needs states: per episode of the step, the keys of the observations its "
                         "turns answered (rollout.Episode.states)")
    steps = step_advantages(rewards, group_ids, opts.states, gamma, opts.norm_by_std, eps)[rows]
    return _keep(gigpo.per_turn(scalar[rows], steps, mask, opts.step_weight), m).float()


def advantages(name: str, rewards: Tensor, mask: Tensor, group_ids: Tensor, values: Tensor | None = None,
               token_kl: Tensor | None = None, gamma: float = 1.0, lam: float = 1.0, kl_coef: float = 0.0,
               opts: Options = Options()) -> tuple[Tensor, Tensor]:
    """Advantages and returns, both (B, T) and 0 wherever mask is 0.

    rewards (B,) episode rewards r_i; mask (B, T); group_ids (B,) long, equal for episodes sampled for
    the same task; values (B, T) critic values (gae only); token_kl (B, T) e.g. kl_penalty(old, ref).

    grpo    A_i = (r_i - mean_g) / (std_g + eps), std unbiased as torch.std; opts.norm_by_std=False drops
            the division (Dr. GRPO). A group of one gets 0 (verl uses mean 0, std 1, i.e. A_i = r_i;
            with no sibling there is no baseline, so no signal). All-equal groups get 0. returns = A.
    rloo    A_i = r_i - mean_{j in g, j != i} r_j = n/(n-1) (r_i - mean_g); a group of one gets 0.
    reinforce++   token rewards r_t = r_i on the last policy token - kl_coef * token_kl_t on every
            policy token; A_t = G_t = sum_{s >= t, policy} gamma^k(t,s) r_s, k(t,s) = number of
            policy tokens after t up to s (observation tokens are not time steps);
            returns = G; A whitened over the whole batch (masked mean/var), NOT per group.
    reinforce++_baseline   as reinforce++ with r_i - mean_g in place of r_i.
    gae     PPO: token rewards as reinforce++ (no KL when kl_coef=0); GAE over policy tokens
            (see `_gae_over_mask`); returns = A + V (before whitening); A whitened over the batch.
    gigpo   A_E(i) + step_weight * A_S(i, t) on the tokens of turn t (gigpo.py): A_E is grpo's, A_S
            compares turn t's return gamma^(T_i-1-t) r_i with the other turns from the same state
            (`states[i]`, the keys of the observations episode i's turns answered). returns = A.
    opts.whiten=False skips the batch whitening (reinforce++ variants and gae) e.g. to inspect raw values.

    Statistics (group and batch) cover the whole step: `rewards`, `group_ids` (and `opts.states`) are the
    step's N episodes (all ranks), `mask` (and `values`, `token_kl`) this process's rows `opts.rows` of
    them (default all N), and `opts.reduce_sum` / `reduce_max` combine the whitening statistics over
    processes (see `masked_whiten`; identity by default). Rows with an empty mask count in their group's reward
    statistics but get no tokens. Raises ValueError on an unknown name, shape mismatch, non-finite
    rewards, or non-finite values/token_kl on policy tokens (non-finite entries at mask 0 are ignored).
    """
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; use one of {', '.join(ESTIMATORS)}")
    B, T = mask.shape
    rows = opts.rows or slice(0, len(rewards))
    if rewards.shape != group_ids.shape or rewards[rows].shape != (B,):
        raise ValueError(f"rewards and group_ids must have shape ({B},) to match mask {tuple(mask.shape)} (or "
                         f"hold the whole step, of which `rows` selects these {B}), got {tuple(rewards.shape)} "
                         f"and {tuple(group_ids.shape)}")
    rewards = rewards.detach().to(_float(rewards.dtype))
    _require_finite("reward", rewards)
    if name in ("grpo", "rloo", "gigpo"):
        if kl_coef != 0.0:  # silently ignoring a hyperparameter hides a misconfigured run
            raise ValueError(f"{name} takes no KL in the reward; use kl_loss(...) or set kl_coef=0")
        adv = _group_relative(name, rewards, mask, group_ids, rows, gamma, opts)
        return adv, adv.clone()

    if name == "reinforce++_baseline":
        rewards = group_baseline("center", rewards, group_ids).to(rewards.dtype)
    return _token_level(name, rewards[rows], mask, values, token_kl, gamma, lam, kl_coef, opts)


def _token_level(name: str, rewards: Tensor, mask: Tensor, values: Tensor | None, token_kl: Tensor | None,
                 gamma: float, lam: float, kl_coef: float, opts: Options) -> tuple[Tensor, Tensor]:
    """`advantages` of the token-level estimators (reinforce++ and its baseline, gae) from this process's
    episode rewards (B,): token rewards, return-to-go or GAE over policy tokens, whitened over the batch."""
    B, T = mask.shape
    m = mask.bool()
    token_r = terminal_rewards(rewards, mask)                    # (B, T)
    if kl_coef != 0.0:
        if token_kl is None:
            raise ValueError(f"kl_coef={kl_coef} needs token_kl, e.g. kl_penalty(old_logp, ref_logp, 'k1')")
        if token_kl.shape != (B, T):
            raise ValueError(f"token_kl must have shape {(B, T)}, got {tuple(token_kl.shape)}")
        _require_finite("token_kl", token_kl, m)
        token_r = token_r - kl_coef * _keep(token_kl.detach().to(token_r.dtype), m)

    if name == "gae":
        if values is None or values.shape != (B, T):
            raise ValueError(f"gae needs critic values of shape {(B, T)}, got "
                             f"{None if values is None else tuple(values.shape)}")
        _require_finite("value", values, m)
        v = _keep(values.detach().to(token_r.dtype), m)
        adv = _gae_over_mask(token_r, v, mask, gamma, lam)
        returns = _keep(adv + v, m)
    else:
        adv = _gae_over_mask(token_r, torch.zeros_like(token_r), mask, gamma, 1.0)
        returns = adv.clone()
    adv = masked_whiten(adv, mask, reduce_sum=opts.reduce_sum, reduce_max=opts.reduce_max) if opts.whiten else adv
    return adv, returns


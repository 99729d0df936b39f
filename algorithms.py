"""The --algo records and the advantage estimators: what each algorithm means to the trainer, and how
episode rewards become per-token advantages and returns.

Everything here is model-free and works on padded (B, T) token tensors plus a loss mask that is 1
exactly on tokens the policy sampled (assistant content and its end-of-turn token) and 0 on the
prompt, role headers, observations and padding (losses.py: the masked reductions, and entries at mask 0
never read). Estimators (AgentGym-RL trains with all four):

    grpo / rloo          group baselines on the scalar episode reward, broadcast to policy tokens
    reinforce++(_baseline)  token rewards, return-to-go over policy tokens, batch whitening
    gae                  PPO with a critic; TD errors and GAE run over policy tokens only
    gigpo                GRPO's episode term plus step groups of turns from one state (studies/gigpo.py)

One function per estimator, each taking a `Step` (the step's rewards and groups, already gathered over
ranks, and this rank's token tensors) and the `Options`, returning (advantages, returns); `ESTIMATORS`
is their table and `advantages(name, step, options)` the one entry point, which checks the inputs and
looks the estimator up. Which rows are this rank's and how the whitening's statistics cross ranks is
the `Step`'s (`mine`, `spread`, `whiten`), not the estimators'. The losses the advantages then feed
(policy, value, KL) are in losses.py.

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

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from studies.gigpo import per_turn, step_groups
# the losses too, under the names train.py and config.py read them by (A.policy_loss, algorithms.AGGREGATIONS)
from losses import AGGREGATIONS, Clip, aggregate, kl_loss, kl_penalty, policy_loss, value_loss  # noqa: F401
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


# ---------------------------------------------------------------- one step, as the estimators read it

@dataclass(frozen=True)
class Step:
    """One step's episodes as every estimator reads them. The reward statistics cover the whole step:
    `rewards`, `groups` and `states` are its N episodes (every rank's, gathered by the trainer,
    train.global_advantages); the token tensors are this process's rows `rows` of them. That is all an
    estimator knows of processes: it takes its rows with `mine`, broadcasts a per-episode value with
    `spread` and whitens over the batch with `whiten`, whose statistics `reduce` combines over processes."""
    rewards: Tensor                       # (N,) episode rewards r_i
    groups: Tensor                        # (N,) long, equal for the episodes sampled for one task
    mask: Tensor | None = None            # (B, T) 1 on this process's rows' policy tokens
    values: Tensor | None = None          # (B, T) the critic's values (gae)
    token_kl: Tensor | None = None        # (B, T) the KL to the reference a token, for a KL in the reward
    states: list[list[str]] | None = None  # gigpo: per episode, the keys of the observations its turns answered
    rows: slice | None = None             # this process's rows of the N (default all)
    reduce: tuple | None = None           # (sum, max): float64 tensor -> the same over processes (masked_whiten)

    def mine(self, x: Tensor) -> Tensor:
        """(N, ...) -> this process's (B, ...)."""
        return x if self.rows is None else x[self.rows]

    def spread(self, per_episode: Tensor) -> Tensor:
        """(N,) -> (B, T): this process's rows, each row's value on its policy tokens and 0 elsewhere. A
        step without a mask (GiGPO's step groups, `step_advantages`) keeps the (N,) values."""
        if self.mask is None:
            return per_episode
        x = self.mine(per_episode).to(self.rewards.dtype)
        return _keep(x[:, None].expand(self.mask.shape), self.mask.bool())

    def whiten(self, adv: Tensor, o: Options) -> Tensor:
        """(B, T) -> whitened over the masked tokens of every process's rows (o.whiten False: unchanged)."""
        reduce_sum, reduce_max = self.reduce or (None, None)
        return masked_whiten(adv, self.mask, reduce_sum=reduce_sum, reduce_max=reduce_max) if o.whiten else adv


@dataclass(frozen=True)
class Options:
    """The estimators' hyperparameters (config.py: --gamma, --lam, --kl-coef, --grpo-std, --step-weight)."""
    gamma: float = 1.0         # discount a policy token (reinforce++, gae), a turn (gigpo's step returns)
    lam: float = 1.0           # GAE's lambda
    kl_coef: float = 0.0       # the KL in the reward (reinforce++, gae): r_t -= kl_coef * token_kl_t
    norm_by_std: bool = True   # grpo and gigpo divide by the group's std; False: Dr. GRPO
    eps: float = 1e-6          # added to that std
    whiten: bool = True        # reinforce++ and gae whiten over the batch; False: raw values
    step_weight: float = 1.0   # gigpo: the weight of the step-level term


def group_stats(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row group mean, unbiased group std (0 for a group of one), group size, and whether the
    row's group is constant (all rewards equal, or a group of one), each (N,), all float64 but the flag.

    float64 because a float32 mean of equal rewards can be one rounding unit off, which made the std
    about 1e-7 and (r - mean) / (std + eps) about 0.1 for an all-equal group. The constant flag
    compares group max and min, so an all-equal group is recognised exactly whatever the dtype."""
    _, inv, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    r = rewards.double()
    n = counts.double()                                                            # (G,)
    mean = torch.zeros_like(n).index_add_(0, inv, r) / n                           # (G,)
    dev = r - mean[inv]                                                            # (N,)
    ss = torch.zeros_like(n).index_add_(0, inv, dev * dev)                         # (G,)
    std = torch.where(counts > 1, (ss / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(n))
    hi = torch.full_like(n, -float("inf")).scatter_reduce(0, inv, r, "amax")
    lo = torch.full_like(n, float("inf")).scatter_reduce(0, inv, r, "amin")
    return mean[inv], std[inv], n[inv], (hi <= lo)[inv]


def _no_kl_in_reward(name: str, o: Options) -> None:
    if o.kl_coef != 0.0:  # silently ignoring a hyperparameter hides a misconfigured run
        raise ValueError(f"{name} takes no KL in the reward; use kl_loss(...) or set kl_coef=0")


# ---------------------------------------------------------------- the estimators, one function each

def grpo(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al., 2024, DeepSeekMath 4.1.2, outcome supervision): A_i = (r_i - mean_g) / (std_g + eps)
    on every policy token of episode i, std unbiased as torch.std; o.norm_by_std False drops the division
    (Dr. GRPO, Liu et al., 2025). A group of one gets 0 (verl uses mean 0, std 1, i.e. A_i = r_i; with no
    sibling there is no baseline), an all-equal group exactly 0 (float64, by max == min). returns = A."""
    _no_kl_in_reward("grpo", o)
    mean, std, _, constant = group_stats(s.rewards, s.groups)
    centred = s.rewards.double() - mean
    adv = centred / (std + o.eps) if o.norm_by_std else centred
    adv = s.spread(torch.where(constant, torch.zeros_like(adv), adv))
    return adv, adv.clone()


def rloo(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al., 2024): A_i = r_i - mean_{j in g, j != i} r_j = n/(n-1) (r_i - mean_g) on every
    policy token of episode i; a group of one, or an all-equal group, gets 0. returns = A."""
    _no_kl_in_reward("rloo", o)
    mean, _, n, constant = group_stats(s.rewards, s.groups)
    adv = (s.rewards.double() - mean) * n / (n - 1).clamp(min=1)
    adv = s.spread(torch.where(constant, torch.zeros_like(adv), adv))
    return adv, adv.clone()


def token_rewards(s: Step, o: Options) -> Tensor:
    """(B, T) this process's token rewards: r_i on the last policy token of row i (`terminal_rewards`), minus
    o.kl_coef * token_kl_t on every policy token when the KL goes into the reward (REINFORCE++'s)."""
    token_r = terminal_rewards(s.mine(s.rewards), s.mask)          # (B, T)
    if o.kl_coef != 0.0:
        if s.token_kl is None:
            raise ValueError(f"kl_coef={o.kl_coef} needs token_kl, e.g. kl_penalty(old_logp, ref_logp, 'k1')")
        if s.token_kl.shape != s.mask.shape:
            raise ValueError(f"token_kl must have shape {tuple(s.mask.shape)}, got {tuple(s.token_kl.shape)}")
        _require_finite("token_kl", s.token_kl, s.mask)
        token_r = token_r - o.kl_coef * _keep(s.token_kl.detach().to(token_r.dtype), s.mask.bool())
    return token_r


def reinforce_pp(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu, 2025): A_t = G_t = sum_{s >= t, policy} gamma^k(t,s) r_s over the token rewards
    (`token_rewards`), k(t,s) the number of policy tokens after t up to s (observation tokens are not time
    steps: return-to-go is GAE with no critic and lambda 1); returns = G; A whitened over the whole batch
    (masked mean/var over every process's rows), NOT per group."""
    token_r = token_rewards(s, o)
    adv = _gae_over_mask(token_r, torch.zeros_like(token_r), s.mask, o.gamma, 1.0)
    return s.whiten(adv, o), adv.clone()


def reinforce_pp_baseline(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a baseline: as `reinforce_pp` with r_i - mean_g (0 for a constant group) in place of r_i."""
    mean, _, _, constant = group_stats(s.rewards, s.groups)
    centred = s.rewards.double() - mean
    centred = torch.where(constant, torch.zeros_like(centred), centred).to(s.rewards.dtype)
    return reinforce_pp(replace(s, rewards=centred), o)


def gae(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """PPO's GAE (Schulman et al., 2016) with the critic's values: token rewards as REINFORCE++'s (no KL when
    o.kl_coef is 0), TD errors and the recursion over policy tokens only (`_gae_over_mask`);
    returns = A + V (before whitening); A whitened over the batch."""
    token_r = token_rewards(s, o)
    if s.values is None or s.values.shape != s.mask.shape:
        raise ValueError(f"gae needs critic values of shape {tuple(s.mask.shape)}, got "
                         f"{None if s.values is None else tuple(s.values.shape)}")
    m = s.mask.bool()
    _require_finite("value", s.values, m)
    v = _keep(s.values.detach().to(token_r.dtype), m)
    adv = _gae_over_mask(token_r, v, s.mask, o.gamma, o.lam)
    return s.whiten(adv, o), _keep(adv + v, m)


def step_advantages(rewards: Tensor, groups: Tensor, states: list[list[str]], gamma: float = 0.95,
                    norm_by_std: bool = True, eps: float = 1e-6) -> list[Tensor]:
    """GiGPO's step term A_S: per episode a (turns,) float64 tensor, each turn's discounted return against
    the other turns taken from the same state in the same group (gigpo.step_groups): GRPO on step groups."""
    _require_finite("reward", rewards)
    returns, ids = step_groups(rewards, groups, states, gamma)
    o = Options(norm_by_std=norm_by_std, eps=eps)
    flat = grpo(Step(returns, ids), o)[0] if len(returns) else torch.zeros(0)
    ends = torch.tensor([0, *map(len, states)]).cumsum(0).tolist()
    return [flat[a:b].double() for a, b in zip(ends, ends[1:])]


def gigpo(s: Step, o: Options) -> tuple[Tensor, Tensor]:
    """GiGPO (Feng et al., 2025; studies/gigpo.py): A_E(i) + o.step_weight * A_S(i, t) on the tokens of turn t. A_E is
    GRPO's; A_S compares turn t's return gamma^(T_i-1-t) r_i with the other turns from the same state
    (`s.states[i]`, the keys of the observations episode i's turns answered). returns = A."""
    _no_kl_in_reward("gigpo", o)
    if s.states is None or len(s.states) != len(s.rewards):
        raise ValueError("gigpo needs states: per episode of the step, the keys of the observations its "
                         "turns answered (rollout.Episode.states)")
    episode, _ = grpo(replace(s, mask=None), o)                      # (N,) A_E
    steps = s.mine(step_advantages(s.rewards, s.groups, s.states, o.gamma, o.norm_by_std, o.eps))
    adv = _keep(per_turn(s.mine(episode), steps, s.mask, o.step_weight), s.mask.bool()).float()
    return adv, adv.clone()


ESTIMATORS = {"grpo": grpo, "rloo": rloo, "reinforce++": reinforce_pp, "reinforce++_baseline": reinforce_pp_baseline,
              "gae": gae, "gigpo": gigpo}


def advantages(name: str, s: Step, o: Options = Options()) -> tuple[Tensor, Tensor]:
    """Advantages and returns of estimator `name` (ESTIMATORS: each function's docstring gives its formula),
    both (B, T) and 0 wherever s.mask is 0. Rows with an empty mask count in their group's reward statistics
    but get no tokens. Raises ValueError on an unknown name, shape mismatch, non-finite rewards, or
    non-finite values/token_kl on policy tokens (non-finite entries at mask 0 are ignored)."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; use one of {', '.join(ESTIMATORS)}")
    B = s.mask.shape[0]
    if s.rewards.shape != s.groups.shape or s.mine(s.rewards).shape != (B,):
        raise ValueError(f"rewards and group_ids must have shape ({B},) to match mask {tuple(s.mask.shape)} (or "
                         f"hold the whole step, of which `rows` selects these {B}), got {tuple(s.rewards.shape)} "
                         f"and {tuple(s.groups.shape)}")
    s = replace(s, rewards=s.rewards.detach().to(_float(s.rewards.dtype)))
    _require_finite("reward", s.rewards)
    return ESTIMATORS[name](s, o)

"""Episodes as training tensors: right-padded batches, micro-batches under a token budget, and
per-token logprobs (or critic values) computed micro-batch by micro-batch.

Alignment used everywhere: entry t of `mask`, `sampler_logp` and every score belongs to token t and
is computed from the logits at position t-1 (0 on the prompt and on padding).

The plain path (the default): the model's own forward, then its LM head, a log-softmax and a gather of
the sampled ids (`token_logprobs`), in slices of tokens where tokens x vocabulary is large. Two fast
paths give the same values and gradients (tests/test_batch.py, tests/test_prefix.py) and are opt-in,
turned on by the presets that need them (infra/recipes.py): `--fused-head`, an LM head with its own backward
(`_Head`), and `--shared-prefix`, a group's common prompt run once (infra/prefix.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from infra import prefix
from infra.passes import DUMMY_WIDTH, logit_elements


# --reward: the scalar an episode is trained on. The env's own reward and success are what every log and
# evaluation records, whatever this is. SciWorld's score is -100 on a wrong `focus on` and 0 for running out
# of turns, so under "env" a weak policy gains most by never answering (docs/results.md); the others do not
# reward that.
REWARDS = {
    "env": lambda e: e.reward,               # the env's last reward: the paper's and AgentGym's
    "progress": lambda e: max(e.reward, 0.0),  # a failure counted as 0: the progress figure of SciWorld's tables
    "best": lambda e: max(e.best, 0.0),      # the best score the episode reached: a failed end does not erase it
}


def training_reward(e, reward: str = "env", success_bonus: float = 0.0) -> float:
    """An episode's training reward: REWARDS[reward], plus `success_bonus` when it succeeded (finishing then
    outweighs any partial credit)."""
    return REWARDS[reward](e) + success_bonus * e.success


def collate(episodes, pad_id: int, reward: str = "env", success_bonus: float = 0.0) -> dict:
    """Right-padded (B, L) tensors of whole episodes. mask/sampler_logp are aligned with `ids`: entry t
    belongs to token t (0 on the prompt and padding). Every row attends to at least one token, so a
    row with no tokens cannot produce NaN activations (NaN * 0 is NaN in the weight gradient).
    An episode cut short by a simulator failure keeps its reward in its group's statistics but gets
    an all-zero mask: the crash was not the policy's doing, so none of its tokens are trained.
    `rewards` are each episode's `training_reward`."""
    L = max(1, max(len(e.ids) for e in episodes))
    B = len(episodes)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L)
    sampler = torch.zeros(B, L)
    for i, e in enumerate(episodes):
        n, p = len(e.ids), e.prompt_len
        ids[i, :n] = torch.tensor(e.ids, dtype=torch.long) if n else ids[i, :n]
        attn[i, :max(n, 1)] = 1
        if e.end != "env_error":
            mask[i, p:n] = torch.tensor(e.mask, dtype=torch.float)
        sampler[i, p:n] = torch.tensor(e.logprobs)
    return {"ids": ids, "attn": attn, "mask": mask, "sampler_logp": sampler,
            "rewards": torch.tensor([training_reward(e, reward, success_bonus) for e in episodes], dtype=torch.float),
            "groups": torch.tensor([e.group for e in episodes], dtype=torch.long),
            "states": [list(e.states) for e in episodes]}


class _Head(torch.autograd.Function):
    """(N, H) hidden, (V, H) weight, (N,) targets -> (N,) logprobs and (N,) entropies at `temperature`,
    through the head `n` tokens at a time (never more than one (n, V) slice of logits alive).

    Backward needs, per token, d logp / d logits = (onehot - p) / T and d entropy / d logits =
    -p (s + entropy) / T (s the log-softmax of the tempered logits). A frozen head (a tied embedding under --train-layers)
    needs no weight gradient: forward then also computes each token's gradient with respect to its
    hidden state, (n, V) @ (V, H), and backward only scales it, so the logits are never recomputed. A
    trained head is recomputed slice by slice in backward, and its weight gradient is summed in
    float32 over the slices (under bf16 a slice's product is bf16, but the sum of ~150 of them is not).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, n: int, entropy_grad: bool):
        N, frozen = hidden.shape[0], not ctx.needs_input_grad[1]
        logp, ent = hidden.new_empty(N, dtype=torch.float32), hidden.new_empty(N, dtype=torch.float32)
        keep = frozen and ctx.needs_input_grad[0]
        d_lp = hidden.new_empty(hidden.shape) if keep else None                            # (N, H)
        d_ent = hidden.new_empty(hidden.shape) if keep and entropy_grad else None
        for i in range(0, N, n):
            t = targets[i:i + n]
            s, p, e = _tempered(hidden[i:i + n], weight, temperature)                      # (n, V) x2
            logp[i:i + n], ent[i:i + n] = s.gather(-1, t[:, None]).squeeze(-1), e
            if d_ent is not None:
                d_ent[i:i + n] = s.add_(e[:, None]).mul_(p).div_(-temperature).to(weight.dtype) @ weight
            if d_lp is not None:
                d_lp[i:i + n] = _onehot_minus(p, t).div_(temperature).to(weight.dtype) @ weight
        ctx.temperature, ctx.n, ctx.frozen = temperature, n, frozen
        ctx.save_for_backward(*((d_lp, d_ent) if frozen else (hidden, weight, targets)))
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        if ctx.frozen:
            d_lp, d_ent = ctx.saved_tensors
            if d_lp is None:
                return None, None, None, None, None, None
            grad = d_lp.float() * g_lp[:, None]
            if d_ent is not None and g_ent is not None:
                grad += d_ent.float() * g_ent[:, None]
            return grad.to(d_lp.dtype), None, None, None, None, None
        hidden, weight, targets = ctx.saved_tensors
        T, n = ctx.temperature, ctx.n
        g_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        g_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for i in range(0, hidden.shape[0], n):
            h, t = hidden[i:i + n], targets[i:i + n]
            s, p, e = _tempered(h, weight, T)
            dz = s.add_(e[:, None]).mul_(p).mul_(-g_ent[i:i + n, None]) if g_ent is not None else None
            dz = _onehot_minus(p, t).mul_(g_lp[i:i + n, None]).add_(0 if dz is None else dz).div_(T)
            dz = dz.to(weight.dtype)                                                        # (n, V)
            if g_hidden is not None:
                g_hidden[i:i + n] = dz @ weight
            g_weight += (dz.T @ h).float()
        return g_hidden, g_weight.to(weight.dtype), None, None, None, None


def _tempered(hidden, weight, temperature: float):
    """One slice: log-softmax s of the tempered logits z = (h W^T) / T, in float32 from the head's own
    matmul (bf16 for bf16 weights, as vLLM computes them), its softmax p and entropy -sum p s;
    (n, V), (n, V), (n,). The entropy from s, not as logsumexp(z) - E_p[z], which cancels digits."""
    z = (hidden @ weight.T).float().div_(temperature)
    s = z.sub_(z.logsumexp(-1, keepdim=True))
    p = s.exp()
    return s, p, -torch.einsum("nv,nv->n", p, s)


def _onehot_minus(p, targets):
    """onehot(targets) - p, in place over p."""
    return p.neg_().scatter_add_(1, targets[:, None], torch.ones_like(p[:, :1]))


def token_logprobs(hidden, head, targets, temperature: float, entropy: bool = True, entropy_grad: bool = False,
                   slice_tokens: int | None = None):
    """The plain path: (N, H) final hidden states through the model's own LM head `head`, then a log-softmax
    of the tempered logits and a gather of the sampled ids `targets` (N,): (N,) logprobs and (N,) entropies,
    float32. Where N x V is large the tokens go in slices (logit_elements(device) // V of them), each
    recomputed in backward (torch.utils.checkpoint), so one slice of logits is alive at a time. The entropy
    carries a gradient only when `entropy_grad` (an entropy bonus)."""
    n = slice_tokens or max(1, logit_elements(hidden.device) // head.weight.shape[0])
    grad = torch.is_grad_enabled() and (hidden.requires_grad or head.weight.requires_grad)

    def one(h, t):
        s = torch.log_softmax(head(h).float() / temperature, dim=-1)                     # (n, V)
        with torch.set_grad_enabled(grad and entropy_grad):
            ent = -(s.exp() * s).sum(-1) if entropy else s.new_zeros(s.shape[0])
        return s.gather(-1, t[:, None]).squeeze(-1), ent

    parts = [checkpoint(one, hidden[i:i + n], targets[i:i + n], use_reentrant=False) if grad and len(hidden) > n
             else one(hidden[i:i + n], targets[i:i + n]) for i in range(0, len(hidden), n)]
    if not parts:
        empty = hidden.new_empty(0, dtype=torch.float32)
        return empty, empty
    return torch.cat([lp for lp, _ in parts]), torch.cat([e for _, e in parts])


def head_logprobs(hidden, weight, targets, temperature: float, entropy: bool = False, entropy_grad: bool = False,
                  slice_tokens: int | None = None):
    """(N, H) final hidden states, (V, H) LM-head weight, (N,) targets -> (N,) logprobs, (N,) entropy.

    Never holds more than one slice of (tokens x vocabulary) logits: slices of `slice_tokens` tokens
    (default logit_elements(device) // V) go through the head one at a time, forward and backward (`_Head`, the
    idea of Liger's fused linear cross-entropy and torchtune's chunked output, with plain torch ops).
    A (16k x 49k) float32 logits tensor is 3.2 GB, and the naive path held several per micro-batch.
    The entropy carries a gradient only when `entropy_grad` (an entropy bonus); otherwise it is a
    detached metric from the same slice (zeros when not `entropy`).
    """
    n = slice_tokens or max(1, logit_elements(hidden.device) // weight.shape[0])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        lp, ent = _Head.apply(hidden, weight, targets, temperature, n, entropy and entropy_grad)
    else:
        lp, ent = hidden.new_empty(0, dtype=torch.float32), hidden.new_empty(0, dtype=torch.float32)
        parts = []
        for i in range(0, hidden.shape[0], n):
            s, _, e = _tempered(hidden[i:i + n], weight, temperature)
            parts.append((s.gather(-1, targets[i:i + n, None]).squeeze(-1), e))
        if parts:
            lp, ent = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
    return lp, (ent if entropy_grad and entropy else ent.detach() if entropy else torch.zeros_like(lp))


def _final_hidden(model, call):
    """The decoder's last hidden states (after its final norm), without computing full logits: a
    forward hook on the decoder keeps its output while `call` runs the model (its head on one position)."""
    kept = {}
    hook = model.get_decoder().register_forward_hook(lambda mod, args, out: kept.update(h=out[0]))
    try:
        call(logits_to_keep=1)
    finally:
        hook.remove()
    return kept["h"]


@dataclass(frozen=True)
class Fast:
    """The opt-in fast paths of a forward, each with the same values and gradients as the plain one (the module's
    docstring): `shared_prefix`, a group's common prompt run once; `fused_head`, the LM head's own backward."""
    shared_prefix: bool = False
    fused_head: bool = False

    @classmethod
    def of(cls, cfg) -> "Fast":
        return cls(cfg.shared_prefix, cfg.fused_head)


def forward(model, batch: dict, rows: list[int], temperature: float, width: int | None = None,
            entropy: str | None = None, policy_only: bool = False, fast: Fast = Fast()):
    """Per-token logprobs of rows, aligned with ids: out[:, t] scores token t from position t-1; and the
    per-token entropy when `entropy` is "detached" or "grad" (its gradient kept), else None. Logprobs and
    entropy are float32 whatever the model's dtype; the logits are never materialised whole (`token_logprobs`,
    or `head_logprobs` with `fast.fused_head`).
    `width` caps the positions (a padding micro-batch's dummy row needs 2, not a whole episode).
    `policy_only`: only positions where batch["mask"] is set are scored, the rest are 0 (the head is about a
    fifth of a small model's forward, and most of an episode is prompt and observations)."""
    if entropy not in (None, "detached", "grad"):
        raise ValueError(f"entropy={entropy!r}: None, 'detached' (a metric) or 'grad' (a loss term)")
    ids, rr, tt, src, call = _positions(model, batch, rows, width, policy_only, fast.shared_prefix)
    hidden = _final_hidden(model, call)                                                # (b, w, H) or (1, S, H)
    hidden, targets, head = hidden.flatten(0, 1)[src], ids.to(model.device)[rr, tt], model.get_output_embeddings()
    want, grad = entropy is not None, entropy == "grad"
    if fast.fused_head:
        lp, ent = head_logprobs(hidden, head.weight, targets, temperature, want, grad)
    else:
        lp, ent = token_logprobs(hidden, head, targets, temperature, want, grad)
    result = torch.zeros(ids.shape, device=model.device).index_put((rr, tt), lp)
    return result, (torch.zeros_like(result).index_put((rr, tt), ent) if want else None)


def values(critic, batch: dict, rows: list[int], width: int | None = None, fast: Fast = Fast()) -> torch.Tensor:
    """The critic's per-token values of rows, aligned as `forward`'s logprobs (PPO)."""
    ids, rr, tt, src, call = _positions(critic, batch, rows, width, False, fast.shared_prefix)
    out = call().logits                                                                # (b, w, 1) or (1, S, 1)
    return torch.zeros(ids.shape, device=critic.device).index_put((rr, tt), out.flatten(0, 1)[src, 0].float())


def _positions(model, batch: dict, rows: list[int], width: int | None, policy_only: bool, shared_prefix: bool):
    """What a forward of rows reads: (ids (b, w), row and position of every scored token, where its hidden state
    sits in the model's output, a call of the model). Scored: every position after the first (up to each row's
    length with the shared prefix or `policy_only`), only the policy's tokens with `policy_only`."""
    width = width or int(batch["attn"][rows].sum(1).max())
    ids, attn = batch["ids"][rows, :width], batch["attn"][rows, :width]
    lengths = attn.sum(1)
    limit = lengths if shared_prefix or policy_only else torch.full_like(lengths, width)
    need = torch.arange(width)[None, :] < limit[:, None]
    need[:, 0] = False                                                                 # (b, w)
    if policy_only:
        chosen = need & (batch["mask"][rows, :width] != 0)
        need = chosen if chosen.any() else need & (torch.arange(width) == lengths[:, None] - 1)  # keep one
    rr, tt = need.nonzero(as_tuple=True)
    if shared_prefix and prefix.enable(model):
        lay = prefix.layout(ids, lengths, batch["groups"][rows])
        where = torch.zeros(len(rows), width, dtype=torch.long)
        for i, w in enumerate(lay.where):
            where[i, :len(w)] = w
        src, lay = where[rr, tt - 1], lay.to(model.device)
        call = lambda **kw: prefix.run(model, lay, **kw)  # noqa: E731
    else:
        src = rr * width + tt - 1
        call = lambda **kw: model(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),  # noqa: E731
                                  use_cache=False, **kw)
    return ids, rr.to(model.device), tt.to(model.device), src.to(model.device), call


@torch.no_grad()
def score(model, batch: dict, micro: list[list[int]], temperature: float, value: bool = False,
          fast: Fast = Fast()) -> torch.Tensor:
    """(B, L) logprobs (or the critic's values) of the whole batch, micro-batch by micro-batch."""
    out = torch.zeros_like(batch["mask"])
    for mb in micro:
        width, on = (None, fast) if mb else (DUMMY_WIDTH, Fast(False, fast.fused_head))
        res = values(model, batch, mb or [0], width, on) if value else \
            forward(model, batch, mb or [0], temperature, width, fast=on)[0]
        if mb:
            out[mb, :res.shape[1]] = res.float().cpu()
    return out

"""Episodes as training tensors: right-padded batches, micro-batches under a token budget, and
per-token logprobs (or critic values) computed micro-batch by micro-batch.

Alignment used everywhere: entry t of `mask`, `sampler_logp` and every score belongs to token t and
is computed from the logits at position t-1 (0 on the prompt and on padding).
"""
from __future__ import annotations

import torch

import algorithms as A


def collate(episodes, pad_id: int) -> dict:
    """Right-padded (B, L) tensors of whole episodes. mask/sampler_logp are aligned with `ids`: entry t
    belongs to token t (0 on the prompt and padding). Every row attends to at least one token, so a
    row with no tokens cannot produce NaN activations (NaN * 0 is NaN in the weight gradient).
    An episode cut short by a simulator failure keeps its reward in its group's statistics but gets
    an all-zero mask: the crash was not the policy's doing, so none of its tokens are trained."""
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
            "rewards": torch.tensor([e.reward for e in episodes], dtype=torch.float),
            "groups": torch.tensor([e.group for e in episodes], dtype=torch.long)}


def micro_batches(rows: list[int], lengths: torch.Tensor, budget: int) -> list[list[int]]:
    """Greedy packing of rows (longest first) so that rows x padded length stays within `budget`."""
    out, cur, width = [], [], 0
    for r in sorted(rows, key=lambda r: -int(lengths[r])):
        w = max(width, int(lengths[r]))
        if cur and w * (len(cur) + 1) > budget:
            out.append(cur)
            cur, w = [], int(lengths[r])
        cur.append(r)
        width = w
    return out + ([cur] if cur else [])


def forward(model, batch: dict, rows: list[int], temperature: float, value: bool = False, entropy: bool = False):
    """Per-token logprobs (or values) of rows, aligned with ids: out[:, t] scores token t from position t-1."""
    width = int(batch["attn"][rows].sum(1).max())
    ids, attn = batch["ids"][rows, :width], batch["attn"][rows, :width]
    out = model(input_ids=ids.to(model.device), attention_mask=attn.to(model.device)).logits
    result = torch.zeros(len(rows), width, device=out.device)
    if value:
        result[:, 1:] = out[:, :-1, 0].float()
        return result, None
    logits = out[:, :-1].float() / temperature                                    # (b, w-1, V)
    result[:, 1:] = logits.gather(-1, ids[:, 1:, None].to(out.device)).squeeze(-1) - logits.logsumexp(-1)
    ent = None
    if entropy:
        ent = torch.zeros_like(result)
        ent[:, 1:] = A.entropy_from_logits(logits)
    return result, ent


@torch.no_grad()
def score(model, batch: dict, micro: list[list[int]], temperature: float, value: bool = False) -> torch.Tensor:
    """(B, L) logprobs (or values) of the whole batch, micro-batch by micro-batch."""
    out = torch.zeros_like(batch["mask"])
    for mb in micro:
        res, _ = forward(model, batch, mb or [0], temperature, value=value)
        if mb:
            out[mb, :res.shape[1]] = res.float().cpu()
    return out


def pad(mbs: list[list[int]], n: int) -> list[list[int]]:
    """FSDP2 forward/backward are collectives: every rank must run the same number of micro-batches.
    Ranks with fewer run empty ones (a dummy row with an all-zero mask, so they add nothing)."""
    return mbs + [[] for _ in range(n - len(mbs))]

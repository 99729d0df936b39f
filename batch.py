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


LOGIT_ELEMENTS = 1 << 24  # tokens x vocabulary of one head slice: 64 MB in float32 (341 tokens at 49k)


def _head_slice(hidden, weight, targets, temperature: float, entropy: bool, entropy_grad: bool, once: dict):
    """One slice of tokens through the LM head: logprob of each target (and the entropy) at this
    temperature, in float32 from the head's output (a bf16 matmul for bf16 weights, as vLLM does).
    Few (n, V) temporaries: the division is in place (mm's backward needs its inputs, not its output).
    A metric entropy (no gradient) is computed on the first call only: backward's recomputation of a
    checkpointed slice skips it (it saves no tensor, so the recomputation stays consistent)."""
    logits = (hidden @ weight.T).float()                                      # (n, V)
    logits.div_(temperature)
    lse = logits.logsumexp(-1)                                                # (n,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if entropy and entropy_grad:
        return logp, lse - torch.einsum("nv,nv->n", torch.softmax(logits, -1), logits)
    if entropy and once.pop("first", False):
        with torch.no_grad():
            return logp, lse - torch.einsum("nv,nv->n", torch.softmax(logits, -1), logits)
    return logp, torch.zeros_like(logp)


def head_logprobs(hidden, weight, targets, temperature: float, entropy: bool = False, entropy_grad: bool = False,
                  slice_tokens: int | None = None):
    """(N, H) final hidden states, (V, H) LM-head weight, (N,) targets -> (N,) logprobs, (N,) entropy.

    Never holds more than one slice of (tokens x vocabulary) logits: slices of `slice_tokens` tokens
    (default LOGIT_ELEMENTS // V) go through the head one at a time, and when gradients are needed each
    slice is checkpointed, so backward recomputes its logits instead of keeping them (the idea of
    Liger's fused linear cross-entropy and torchtune's chunked output, with plain torch ops). A
    (16k x 49k) float32 logits tensor is 3.2 GB, and the naive path held several per micro-batch.
    The entropy carries a gradient only when `entropy_grad` (an entropy bonus); otherwise it is a
    detached metric computed from the same slice, at no extra matmul.
    """
    from torch.utils.checkpoint import checkpoint

    n = slice_tokens or max(1, LOGIT_ELEMENTS // weight.shape[0])
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for i in range(0, hidden.shape[0], n):
        args = (hidden[i:i + n], weight, targets[i:i + n], temperature, entropy, entropy_grad, {"first": True})
        if grad:
            lp, ent = checkpoint(_head_slice, *args, use_reentrant=False)
        else:
            lp, ent = _head_slice(*args)
        logps.append(lp)
        ents.append(ent if entropy_grad else ent.detach())
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(ents)


def _final_hidden(model, ids, attn):
    """The decoder's last hidden states (after its final norm), without computing full logits: a
    forward hook on the decoder keeps its output, and the head runs on one position only."""
    kept = {}
    hook = model.get_decoder().register_forward_hook(lambda mod, args, out: kept.update(h=out[0]))
    try:
        model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    return kept["h"]


def forward(model, batch: dict, rows: list[int], temperature: float, value: bool = False, entropy: bool = False,
            entropy_grad: bool = False, width: int | None = None):
    """Per-token logprobs (or critic values) of rows, aligned with ids: out[:, t] scores token t from
    position t-1; and the per-token entropy when `entropy` (else None). Logprobs and entropy are
    float32 whatever the model's dtype; the logits are never materialised whole (`head_logprobs`).
    `width` caps the positions (a padding micro-batch's dummy row needs 2, not a whole episode)."""
    width = width or int(batch["attn"][rows].sum(1).max())
    ids, attn = batch["ids"][rows, :width].to(model.device), batch["attn"][rows, :width].to(model.device)
    if value:
        out = model(input_ids=ids, attention_mask=attn, use_cache=False).logits       # (b, w, 1)
        result = torch.zeros(len(rows), width, device=out.device)
        result[:, 1:] = out[:, :-1, 0].float()
        return result, None
    hidden = _final_hidden(model, ids, attn)[:, :-1]                                   # (b, w-1, H)
    weight = model.get_output_embeddings().weight                                      # (V, H)
    b, w1, h = hidden.shape
    lp, ent = head_logprobs(hidden.reshape(b * w1, h), weight, ids[:, 1:].reshape(-1), temperature,
                            entropy, entropy_grad)
    zero = torch.zeros(b, 1, device=lp.device)
    result = torch.cat([zero, lp.view(b, w1)], dim=1)                                  # (b, w)
    return result, (torch.cat([zero, ent.view(b, w1)], dim=1) if entropy else None)


@torch.no_grad()
def score(model, batch: dict, micro: list[list[int]], temperature: float, value: bool = False) -> torch.Tensor:
    """(B, L) logprobs (or values) of the whole batch, micro-batch by micro-batch."""
    out = torch.zeros_like(batch["mask"])
    for mb in micro:
        res, _ = forward(model, batch, mb or [0], temperature, value=value, width=None if mb else DUMMY_WIDTH)
        if mb:
            out[mb, :res.shape[1]] = res.float().cpu()
    return out


DUMMY_WIDTH = 2  # positions a padding micro-batch runs: one scored token keeps every parameter in the graph


def pad(mbs: list[list[int]], n: int) -> list[list[int]]:
    """FSDP2 forward/backward are collectives: every rank must run the same number of micro-batches.
    Ranks with fewer run empty ones (a dummy row with an all-zero mask, so they add nothing)."""
    return mbs + [[] for _ in range(n - len(mbs))]

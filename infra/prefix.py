"""Shared-prefix forward of a group's episodes: the prompt that the samples of one task share, token for
token, runs through the model once; each sample's continuation attends to that one computation's keys
and values, and the gradient of every sample flows back into it (the idea of "Prefix Grouper", 2025).

Why: the `samples_per_task` episodes of a GRPO group start with the same prompt (the instruction and
the first observation). A plain padded batch pushes that prompt through forward, recomputation and
backward once per sample; here it runs once per group in a micro-batch. Exact: causal attention makes
a prefix token's keys, values and hidden states independent of what follows it, so the one prefix
computation equals each row's own; the continuation's queries see exactly the keys a full row would
(the prefix's, then its own, causally), at the same positions (explicit RoPE position ids).

Layout of one micro-batch (`Layout`): its tokens packed into one row of S tokens, no padding:
`[prefix of group 1][continuation of row a][continuation of row b]...[prefix of group 2]...`, with
position ids restarting at P for every continuation. Only attention sees the grouping: `_attention`
(registered with transformers as the attention implementation NAME) gathers the prefixes into a (G, P)
batch run causally, and the continuations into an (R, C) batch whose keys are [its prefix's, its own],
then scatters the outputs back to the packed row. Every other layer (norms, MLPs, RoPE) is per token.
A call without a layout is plain SDPA (the same kernel and masks as transformers' "sdpa").

Dimension legend: S packed tokens; G prefix groups, P longest prefix; R rows, C longest continuation;
h query heads, k key/value heads, d head size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "shared_prefix"


def common_prefix(ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Length of the longest prefix all rows of `ids` (n, w) share, capped so that every row keeps at
    least one token of its own (the continuation's first token is scored from the prefix's last)."""
    cap = int(lengths.min()) - 1
    if cap <= 0:
        return 0
    same = (ids[:, :cap] == ids[:1, :cap]).all(0)                      # (cap,)
    return int(same.int().cumprod(0).sum())


def groups_of(rows: list[int], groups: torch.Tensor) -> list[list[int]]:
    """Rows split by group id, in order of first appearance."""
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(int(groups[r]), []).append(r)
    return list(out.values())


def cost(batch: dict, rows: list[int]) -> int:
    """Tokens the shared-prefix forward runs for `rows` of one group: the prefix once, then each tail."""
    lengths = batch["attn"][rows].sum(1)
    p = common_prefix(batch["ids"][rows, :int(lengths.max())], lengths)
    return int(lengths.sum()) - p * (len(rows) - 1)


def micro_batches(rows: list[int], batch: dict, budget: int) -> list[list[int]]:
    """Micro-batches that keep each group's rows together where the budget allows: the unit is a group
    (split into parts when its shared-prefix cost exceeds `budget`), packed first-fit, largest first,
    so that the tokens the forward runs (`cost`) stay within `budget` per micro-batch."""
    lengths = batch["attn"].sum(1)
    units = []
    for group in groups_of(rows, batch["groups"]):
        part: list[int] = []
        for r in sorted(group, key=lambda r: -int(lengths[r])):
            if part and cost(batch, part + [r]) > budget:
                units.append(part)
                part = []
            part.append(r)
        units.append(part)
    bins: list[tuple[int, list[int]]] = []
    for unit in sorted(units, key=lambda u: -cost(batch, u)):
        c = cost(batch, unit)
        for i, (used, members) in enumerate(bins):
            if used + c <= budget:
                bins[i] = (used + c, members + unit)
                break
        else:
            bins.append((c, list(unit)))
    return [members for _, members in bins]


@dataclass
class Layout:
    """Where every token of a micro-batch sits in the packed row, and how attention regroups it."""
    ids: torch.Tensor        # (1, S) packed token ids
    positions: torch.Tensor  # (1, S) position ids: a row's own positions, the prefix's for shared tokens
    prefix: torch.Tensor     # (G, P) packed index of each prefix token (padding repeats a valid index)
    tail: torch.Tensor       # (R, C) packed index of each continuation token (padding likewise)
    owner: torch.Tensor      # (R,) the prefix group of each continuation row
    mask: torch.Tensor       # (R, 1, C, P + C) bool: a continuation query may see this key
    back: torch.Tensor       # (S,) index of each packed token in [prefix outputs (G*P), tail outputs (R*C)]
    where: list              # per row of the micro-batch, (length,) packed index of each of its positions
    parts: list              # per group with a prefix: (its rows (n,), group, prefix length), for TailAttention

    def to(self, device) -> "Layout":
        move = lambda t: t.to(device) if torch.is_tensor(t) else t  # noqa: E731
        return Layout(*(move(getattr(self, f)) for f in ("ids", "positions", "prefix", "tail", "owner", "mask",
                                                          "back")), self.where, self.parts)


def layout(ids: torch.Tensor, lengths: torch.Tensor, groups: torch.Tensor) -> Layout:
    """The packed layout of rows `ids` (b, w) with `lengths` (b,) and group ids `groups` (b,): rows of
    one group share their longest common prefix (`common_prefix`), every other row stands alone (its
    own prefix, one continuation token)."""
    packed, pos, where = [], [], [None] * len(ids)
    prefix_rows, tail_rows, owner, starts = [], [], [], []
    cursor = 0
    for g, members in enumerate(groups_of(list(range(len(ids))), groups)):
        n = lengths[members]
        p = common_prefix(ids[members, :int(n.max())], n)
        packed.append(ids[members[0], :p])
        pos.append(torch.arange(p))
        prefix_rows.append(torch.arange(cursor, cursor + p))
        starts.append(p)
        shared, cursor = prefix_rows[-1], cursor + p
        for r in members:
            c = int(lengths[r]) - p
            packed.append(ids[r, p:p + c])
            pos.append(torch.arange(p, p + c))
            tail_rows.append(torch.arange(cursor, cursor + c))
            owner.append(g)
            where[r] = torch.cat([shared, tail_rows[-1]])
            cursor += c
    P, C = max(1, max(starts)), max(len(t) for t in tail_rows)  # P >= 1: no empty attention batch
    prefix = _pad(prefix_rows, P)                                                      # (G, P)
    tail = _pad(tail_rows, C)                                                          # (R, C)
    owner_t = torch.tensor(owner)
    seen = torch.arange(P)[None, :] < torch.tensor(starts)[owner_t][:, None]           # (R, P)
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    mask = torch.cat([seen[:, None, None, :].expand(-1, 1, C, P), causal.expand(len(owner), 1, C, C)], dim=-1)
    back = torch.empty(cursor, dtype=torch.long)
    for g, idx in enumerate(prefix_rows):
        back[idx] = g * P + torch.arange(len(idx))
    for r, idx in enumerate(tail_rows):
        back[idx] = len(prefix_rows) * P + r * C + torch.arange(len(idx))
    parts = [(torch.tensor(rows), g, starts[g]) for g, rows in enumerate(groups_of(list(range(len(owner))), owner_t))
             if starts[g] > 0]
    return Layout(torch.cat(packed)[None], torch.cat(pos)[None], prefix, tail, owner_t, mask, back, where, parts)


def _pad(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Index rows right-padded to `width` by repeating their first index (0 for an empty row): the padded
    queries compute something harmless, and their outputs are never read."""
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i] = r[0] if len(r) else 0
        out[i, :len(r)] = r
    return out


def _attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
               shared_prefix: Layout | None = None, **kwargs):
    """transformers' attention interface: query (1, h, S, d), key/value (1, k, S, d), after RoPE ->
    (1, S, h, d). Without a layout, plain SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    lay, rep = shared_prefix, query.shape[1] // key.shape[1]

    def take(x, index):  # (1, heads, S, d) -> (rows, heads, n, d)
        return x[0].index_select(1, index.flatten()).unflatten(1, index.shape).transpose(0, 1)

    def heads(x):  # grouped key/value heads repeated for their queries (as transformers' repeat_kv)
        return x.repeat_interleave(rep, dim=1) if rep > 1 else x

    kp, vp = take(key, lay.prefix), take(value, lay.prefix)                                   # (G, k, P, d)
    out_p = F.scaled_dot_product_attention(take(query, lay.prefix), heads(kp), heads(vp), is_causal=True,
                                           scale=scaling)                                      # (G, h, P, d)
    qt, kt, vt = take(query, lay.tail), take(key, lay.tail), take(value, lay.tail)            # (R, ., C, d)
    if query.device.type == "cpu":
        out_t = TailAttention.apply(qt, heads(kp), heads(vp), heads(kt), heads(vt), lay.parts, scaling)  # (R, h, C, d)
    else:
        keys, values = torch.cat([kp[lay.owner], kt], dim=2), torch.cat([vp[lay.owner], vt], dim=2)  # (R, k, P+C, d)
        out_t = F.scaled_dot_product_attention(qt, heads(keys), heads(values), attn_mask=lay.mask, scale=scaling)
    out = torch.cat([out_p.transpose(1, 2).flatten(0, 1), out_t.transpose(1, 2).flatten(0, 1)])  # (G*P+R*C, h, d)
    return out.index_select(0, lay.back)[None], None


class TailAttention(torch.autograd.Function):
    """The continuations' attention on CPU without a mask: each query sees its group's whole prefix and
    its own row causally, so it is two flash-attention calls, one over the prefix's keys (no mask) and
    one over its own (`is_causal`), merged by their log-sum-exps. PyTorch's CPU flash kernel runs an
    explicit mask slower than `is_causal` over the same keys (figures: docs/performance.md) and cannot skip a
    masked block, so the one masked call over [prefix, own] keys paid for C x (P + C) scores where
    C x P + C^2 / 2 are seen.

    Backward (as in blockwise "ring" attention): with the merged output O and log-sum-exp L, each part's
    probabilities are exp(s - L), and dS = P * (dP - rowsum(dO * O)) needs nothing else, so the kernel's
    own backward run on each part with (O, L) gives that part's exact gradients.
    q, kt, vt: (R, h, C, d); kp, vp: (G, h, P, d); parts: `Layout.parts`, (rows, group, prefix length)."""

    @staticmethod
    def forward(ctx, q, kp, vp, kt, vt, parts, scale):
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        own, lse_own = flash(q, kt, vt, 0.0, True, scale=scale)                    # (R, h, C, d), (R, h, C)
        acc = torch.promote_types(q.dtype, torch.float32)                          # the merge's precision
        pre = torch.zeros_like(own, dtype=acc)
        lse_pre = torch.full_like(lse_own, float("-inf"))
        for rows, g, p in parts:
            k, v = (x[g:g + 1, :, :p].expand(len(rows), -1, -1, -1) for x in (kp, vp))
            o, lse = flash(q[rows], k, v, 0.0, False, scale=scale)
            pre[rows], lse_pre[rows] = o.to(acc), lse
        lse = torch.logaddexp(lse_pre, lse_own)
        out = (torch.exp(lse_pre - lse)[..., None] * pre + torch.exp(lse_own - lse)[..., None] * own.to(acc))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, kp, vp, kt, vt, out, lse)
        ctx.parts, ctx.scale = parts, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        q, kp, vp, kt, vt, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dkt, dvt = backward(grad, q, kt, vt, out, lse, 0.0, True, scale=ctx.scale)
        acc = torch.promote_types(q.dtype, torch.float32)      # the parts' sums in float32 at least
        dq = dq.to(acc)
        dkp, dvp = (torch.zeros_like(x, dtype=acc) for x in (kp, vp))
        for rows, g, p in ctx.parts:
            k, v = (x[g:g + 1, :, :p].expand(len(rows), -1, -1, -1) for x in (kp, vp))
            gq, gk, gv = backward(grad[rows], q[rows], k, v, out[rows], lse[rows], 0.0, False, scale=ctx.scale)
            dq[rows] += gq.to(acc)
            dkp[g, :, :p] += gk.to(acc).sum(0)
            dvp[g, :, :p] += gv.to(acc).sum(0)
        return dq.to(q.dtype), dkp.to(kp.dtype), dvp.to(vp.dtype), dkt, dvt, None, None


def enable(model) -> bool:
    """Route the model's attention through `_attention` (plain SDPA when no layout is passed). True if
    the model can run the shared-prefix forward: its attention was SDPA (or already this)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(NAME, _attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)  # plain calls build SDPA's masks
    if model.config._attn_implementation == "sdpa":
        model.config._attn_implementation = NAME
    return model.config._attn_implementation == NAME


def run(model, lay: Layout, **kwargs):
    """The model on a packed layout. A 4D placeholder mask makes transformers skip its own mask
    building (which would turn the restarting position ids into an S x S packed-sequence mask)."""
    placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=model.device)
    return model(input_ids=lay.ids, position_ids=lay.positions, attention_mask=placeholder, use_cache=False,
                 shared_prefix=lay, **kwargs)

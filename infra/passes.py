"""The machinery under train.update, as small named helpers, so that `update` itself reads as the method:

- **Silent rows** (`silent_rows`). A row whose advantage is 0 on every token adds exactly 0 to the policy
  gradient (the loss is -A x ratio); when no other term touches it (no KL, no entropy bonus, no critic) its
  forward and backward are skipped. It still counts in the normaliser, so the gradient is unchanged. GRPO
  makes many: every group whose rewards are all equal.
- **Micro-batches** (`micro_batches`, `pad`, `Micro`): rows packed within `--micro-tokens`, padded to the
  same count on every rank with dummy micro-batches (a 2-token row, mask 0), so every rank makes the same
  collectives.
- **Deferred gradient reduction on CPU** (`defers`, `gradient_sync`). FSDP2 reduce-scatters every
  backward's gradients. On CPU (gloo, one thread a rank) they can accumulate unsharded and be reduced once,
  in the mini-batch's last backward, at the cost of a whole fp32 gradient held per rank; `--grad-reduce
  auto` takes it only where the memory plan has room (memplan.fit). GPUs, and an imitation anchor (whose
  backward follows), reduce every backward. Measured: docs/performance.md, "When to reduce gradients".
- **The statistics** (`Stats`): each per-token figure summed with the count of tokens it was computed
  on, so a logged mean is over exactly those tokens (a skipped row adds neither), and the sampler probe
  (the mean |trainer - sampler| logprob of the first epoch: a weight sync that failed shows up there,
  train.GAP_ALARM).
- **The optimizer step** (`optimizer_step`): clipping, and no step at all when the gradient is exactly 0.
- **The LM head's slice** (`logit_elements`): tokens x vocabulary of one slice of batch.token_logprobs on a
  device; the memory plan (memplan.py) counts the same slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from infra import prefix

# tokens x vocabulary of one LM-head slice (batch.token_logprobs); on CPU 64 MB in float32 (341 tokens at 49k)
LOGIT_ELEMENTS = 1 << 24
LOGIT_ELEMENTS_CUDA = 1 << 27  # on a GPU: 2,730 tokens at 49k (3.6 GiB at a slice's 28 bytes an element), 8x
                               # fewer slices: each one is a few kernel launches, and a GPU has the memory


def logit_elements(device) -> int:
    """tokens x vocabulary of one LM-head slice on `device`."""
    return LOGIT_ELEMENTS_CUDA if torch.device(device).type == "cuda" else LOGIT_ELEMENTS


def micro_batches(rows: list[int], lengths: torch.Tensor, budget: int, shared: dict | None = None) -> list[list[int]]:
    """Greedy packing of rows (longest first) so that rows x padded length stays within `budget`. With
    `shared` (the batch), for the shared-prefix forward: groups kept together, the tokens it runs within
    `budget` (prefix.micro_batches)."""
    if shared is not None:
        return prefix.micro_batches(rows, shared, budget)
    out, cur, width = [], [], 0
    for r in sorted(rows, key=lambda r: -int(lengths[r])):
        w = max(width, int(lengths[r]))
        if cur and w * (len(cur) + 1) > budget:
            out.append(cur)
            cur, w = [], int(lengths[r])
        cur.append(r)
        width = w
    return out + ([cur] if cur else [])


DUMMY_WIDTH = 2  # positions a padding micro-batch runs: one scored token keeps every parameter in the graph


def pad(mbs: list[list[int]], n: int) -> list[list[int]]:
    """FSDP2 forward/backward are collectives: every rank must run the same number of micro-batches.
    Ranks with fewer run empty ones (a dummy row with an all-zero mask, so they add nothing)."""
    return mbs + [[] for _ in range(n - len(mbs))]


@dataclass
class Micro:
    rows: list[int]        # the batch rows it runs (a padding micro-batch runs row 0, masked out)
    width: int | None      # positions to run: None for the rows' own length
    real: bool             # False for a padding micro-batch
    last: bool             # the mini-batch's last micro-batch (where deferred gradients are reduced)


def silent_rows(cfg, models: dict, scored) -> set[int]:
    """Rows whose every term is exactly 0: zero advantage everywhere, and no KL, entropy bonus or critic."""
    if scored.ref is not None or cfg.entropy_coef or "critic" in models:
        return set()
    return set(((scored.adv * scored.batch["mask"]) == 0).all(1).nonzero().flatten().tolist())


def packed(rows: list[int], batch: dict, cfg, reduce_max) -> list[Micro]:
    """`rows` in micro-batches within cfg.micro_tokens (group by group under --shared-prefix), padded to the
    largest rank's count."""
    mbs = micro_batches(rows, batch["attn"].sum(1), cfg.micro_tokens, batch if cfg.shared_prefix else None)
    mbs = pad(mbs, reduce_max(len(mbs)))
    return [Micro(mb or [0], None if mb else DUMMY_WIDTH, bool(mb), i == len(mbs) - 1) for i, mb in enumerate(mbs)]


def defers(cfg, models: dict, world: int, anchor) -> bool:
    """Whether this update holds its gradients until each mini-batch's last backward (CPU, several ranks)."""
    cpu = next(models["policy"].parameters()).device.type == "cpu"
    return cpu and world > 1 and anchor is None and cfg.grad_reduce != "micro-batch"


def gradient_sync(models: dict, on: bool) -> None:
    """Whether the next backward reduces the FSDP2 models' gradients over ranks (a model that is not
    FSDP2's, as in one process, has nothing to reduce)."""
    for model in models.values():
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(on)


class Stats:
    """What an update logs. Loss terms: each micro-batch's share of its mini-batch's global mean, summed,
    then averaged over optimizer steps. Per-token figures (entropy, KL, clip_frac, the sampler gap): sums
    with the count of tokens they were computed on, divided at the end, in float64."""

    def __init__(self):
        self.sums = dict.fromkeys(("loss", "value_loss", "bc_nll", "entropy", "kl", "clipped", "tokens",
                                   "sampler_gap", "gap_tokens", "skipped_rows"), 0.0)
        self.grad_norm, self.updates, self.idle_steps = 0.0, 0, 0

    def micro_batch(self, m, loss, value_loss, ent, kl_tok, clip_frac) -> None:
        """One micro-batch's terms; `m` its (b, w) mask; `ent`, `kl_tok` per token (kl_tok None without a KL)."""
        n = float(m.sum())
        self.sums["loss"] += float(loss.detach())
        self.sums["value_loss"] += float(value_loss.detach())
        on = m != 0
        self.sums["entropy"] += float(torch.where(on, ent.detach().double(), 0.0).sum())
        self.sums["kl"] += 0.0 if kl_tok is None else float(torch.where(on, kl_tok.detach().double(), 0.0).sum())
        self.sums["clipped"] += float(clip_frac) * n
        self.sums["tokens"] += n

    def probe(self, lp, sampler, m) -> None:
        """The sampler probe: |trainer - sampler| logprob summed over the micro-batch's policy tokens."""
        self.sums["sampler_gap"] += float(((lp.detach().double() - sampler).abs() * m).sum())
        self.sums["gap_tokens"] += float(m.sum())

    def result(self, reduce_sum) -> dict:
        """The update's figures over all ranks (a collective)."""
        s = dict(zip(self.sums, reduce_sum(*self.sums.values())))
        steps, tokens = max(self.updates, 1), max(s["tokens"], 1.0)
        return {"loss": s["loss"] / steps, "value_loss": s["value_loss"] / steps, "bc_nll": s["bc_nll"] / steps,
                "entropy": s["entropy"] / tokens, "kl": s["kl"] / tokens, "clip_frac": s["clipped"] / tokens,
                "sampler_gap": s["sampler_gap"] / max(s["gap_tokens"], 1.0), "gap_tokens": s["gap_tokens"],
                "grad_norm": self.grad_norm / steps, "updates": self.updates, "idle_steps": self.idle_steps,
                "skipped_rows": s["skipped_rows"]}


def optimizer_step(model, opt, scheduler, grad_clip: float) -> float:
    """Clip the gradient and step; returns its norm before clipping. Every group of the batch constant (or
    every row masked) makes the gradient exactly 0, yet Adam would still move each weight by its momentum
    (and weight decay): such a step leaves the model, the optimizer's state and the schedule as they were.
    The norm is global over ranks (FSDP2), so every rank makes the same choice."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if norm != 0.0:
        opt.step()
        if scheduler is not None:
            scheduler.step()
    opt.zero_grad(set_to_none=True)
    return norm

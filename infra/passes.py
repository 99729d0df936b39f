"""How train.update's passes run on the machinery, so that `update` itself reads as the method: which rows
run, how they are packed, when gradients are reduced, what is probed and counted.

    passes = Passes(cfg, models, scored, reduce, anchor)
    norm = passes.mini_batch(rows)                   # the rows of one optimizer step; the loss normaliser
    for mb in passes.micro_batches():                # each micro-batch: rows, mask, width
        ...forward, the loss...
        passes.backward(mb, loss, terms)             # backward, the statistics, the sampler probe
    passes.step(optimizers, schedulers, apply)       # imitation anchor, clipping, the optimizer step

- **Silent rows.** A row whose advantage is 0 on every token adds exactly 0 to the policy gradient (the loss
  is -A x ratio); when no other term touches it (no KL, no entropy bonus, no critic) its forward and backward
  are skipped. It still counts in the normaliser, so the gradient is unchanged. GRPO makes many: every group
  whose rewards are all equal.
- **Micro-batches** within `--micro-tokens` (`micro_batches`), padded to the same count on every rank
  with dummy micro-batches (a 2-token row, mask 0), so every rank makes the same collectives.
- **Deferred gradient reduction on CPU.** FSDP2 reduce-scatters every backward's gradients. On CPU (gloo,
  one thread a rank) they accumulate unsharded and are reduced once, in the mini-batch's last backward:
  0.95x the update's time (bench/results/update_epyc.md), at the cost of a whole fp32 gradient held per rank
  (memplan's "unsharded fp32 gradients, accumulated (CPU)"). `--grad-reduce auto` takes it only where the
  memory plan has room for that gradient (memplan.fit), else reduces every backward; one rank has nothing to
  reduce (deferring saved 1% of a step and cost 454 MB: bench/results/trl_peer_grad_reduce.json). GPUs, and
  an imitation anchor (whose backward follows), reduce every backward.
- **The sampler probe.** In the first epoch, the mean |trainer - sampler| logprob over the policy tokens:
  a weight sync that failed shows up here (train.GAP_ALARM).
- **The optimizer step**: the imitation anchor's gradient (--bc-anchor), the test-only fault point
  (infra/faults.py), gradient clipping, and no step at all when the gradient is exactly 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from infra import faults, prefix
from infra.distributed import all_max, all_sum


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


class Passes:
    def __init__(self, cfg, models: dict, scored, reduce=None, anchor=None):
        self.cfg, self.models, self.s, self.anchor = cfg, models, scored, anchor
        self.reduce_sum, self.reduce_max = reduce or (all_sum, all_max)
        self.world = dist.get_world_size() if reduce is None else 1
        batch = scored.batch
        self.lengths = batch["attn"].sum(1)
        idle = scored.ref is None and not cfg.entropy_coef and "critic" not in models
        self.silent = set(((scored.adv * batch["mask"]) == 0).all(1).nonzero().flatten().tolist()) if idle else set()
        self.defer = next(models["policy"].parameters()).device.type == "cpu" and anchor is None and \
            cfg.grad_reduce != "micro-batch" and self.world > 1  # --grad-reduce (memplan.fit chooses under auto)
        self.stats = dict.fromkeys(("loss", "clip_frac", "kl", "entropy", "grad_norm", "value_loss", "updates",
                                    "skipped_rows", "sampler_gap", "gap_tokens", "bc_nll", "idle_steps"), 0.0)
        self.first_epoch, self.rows, self.tokens = True, [], 0

    def mini_batch(self, rows: list[int]):
        """Start an optimizer step over `rows`; returns the normaliser of cfg.agg over all ranks' rows."""
        mask = self.s.batch["mask"]
        self.tokens, seqs = self.reduce_sum(mask[rows].sum(), len(rows))
        self.rows = rows
        return {"token-mean": self.tokens, "seq-mean-token-mean": seqs,
                "seq-sum-norm": seqs * self.cfg.max_context}[self.cfg.agg]

    def micro_batches(self):
        live = [r for r in self.rows if r not in self.silent]
        self.stats["skipped_rows"] += len(self.rows) - len(live)
        micro = micro_batches(live, self.lengths, self.cfg.micro_tokens, self.s.batch if self.cfg.shared_prefix else None)
        micro = pad(micro, self.reduce_max(len(micro)))
        for i, mb in enumerate(micro):
            self._gradient_sync(not self.defer or i == len(micro) - 1)
            yield Micro(mb or [0], None if mb else DUMMY_WIDTH, bool(mb))

    def take(self, t: torch.Tensor | None, mb: Micro, width: int, device) -> torch.Tensor | None:
        """`t`'s rows of the micro-batch, `width` positions wide, on `device` (None stays None)."""
        return None if t is None else t[mb.rows, :width].to(device)

    def mask(self, mb: Micro, width: int, device) -> torch.Tensor:
        return self.s.batch["mask"][mb.rows, :width].to(device) * mb.real

    def backward(self, mb: Micro, loss: torch.Tensor, lp: torch.Tensor, m: torch.Tensor, terms: dict) -> None:
        """The micro-batch's backward (x world: FSDP2 averages gradients over ranks, and the loss is already a
        mean over all ranks' tokens), its statistics, and in the first epoch the sampler probe."""
        if self.first_epoch and "sampler_logp" in self.s.batch:
            sampler = self.take(self.s.batch["sampler_logp"], mb, lp.shape[1], lp.device)
            self.stats["sampler_gap"] += float(((lp.detach() - sampler).abs() * m).sum())
            self.stats["gap_tokens"] += float(m.sum())
        (loss * self.world).backward()
        for key in ("loss", "kl", "entropy", "value_loss"):
            self.stats[key] += float(terms[key].detach())
        self.stats["clip_frac"] += float(terms["clip_frac"]) * float(m.sum()) / max(self.tokens, 1)

    def step(self, optimizers: dict, schedulers: dict | None, apply: bool = True) -> None:
        """End the mini-batch: the anchor's imitation gradient, then (unless `apply` is False: --min-groups
        keeps the gradients for a later step) clip and step each optimizer."""
        if self.anchor is not None:
            self.stats["bc_nll"] += self.anchor.backward(self.models["policy"]) / self.world  # the global mean
        faults.point("update")  # test-only: gradients made, optimizer not stepped (faults.py)
        if apply:
            for key, opt in optimizers.items():
                self._optimizer_step(key, opt, schedulers)
        self.stats["updates"] += 1

    def end_epoch(self) -> None:
        self.first_epoch = False

    def _gradient_sync(self, on: bool) -> None:
        """Whether the next backward reduces the FSDP2 models' gradients over ranks (a model that is not
        FSDP2's, as in one process, has nothing to reduce)."""
        for model in self.models.values():
            if hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(on)

    def _optimizer_step(self, key: str, opt, schedulers) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.models[key].parameters(), self.cfg.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if key == "policy":
            self.stats["grad_norm"] += float(norm)
        if float(norm) == 0.0:
            # Every group of the batch was constant (or every row masked): the gradient is exactly 0, yet
            # Adam would still move each weight by its momentum (and weight decay). A step with nothing to
            # learn leaves the model, the optimizer's state and the schedule as they were. The norm is
            # global over ranks (FSDP2), so every rank makes the same choice.
            opt.zero_grad(set_to_none=True)
            self.stats["idle_steps"] += key == "policy"
            return
        opt.step()
        opt.zero_grad(set_to_none=True)
        if schedulers:
            schedulers[key].step()

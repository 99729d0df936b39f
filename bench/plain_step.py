"""The baseline of bench/train_step.py: a plain single-process transformers training step over the same
tokens as our FSDP2 update (train.update), as a user without this project would write it, and the
comparison of the two that train_step.py prints.

The plain step: forward with `labels` (full logits, HF's loss), backward and an AdamW step over rank
0's share in one process, micro-batches split as ours; for bfloat16 it keeps fp32 parameters and AdamW
and runs the forward under torch.autocast(cpu, bfloat16), the same precision split as FSDP2's policy
(bf16 compute, fp32 masters). It runs on rank 0 after each step's phases while the other ranks wait,
so load changes hit both; under torchrun each process runs one torch thread (torchrun sets
OMP_NUM_THREADS=1), so the plain step uses as many threads as one rank. Printed: seconds, tokens/s
per process, the ratio of our update's tokens/s per process to it, by wall time and by CPU time
(process_time: the plain step runs while the other ranks idle, so on a shared machine it meets less
contention; CPU time, the slowest rank's for ours, is the fairer figure there), and the plain step's
peak memory above what rank 0 held before it (its full logits included).

    torchrun --standalone --nproc_per_node 2 bench/train_step.py          # the comparison is its last table
    torchrun --standalone --nproc_per_node 2 bench/train_step.py --no-plain   # without the baseline
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch as batch_  # noqa: E402
from infra import passes  # noqa: E402


def load(path: str, checkpointing: bool, cfg) -> list:
    """[model, AdamW] of the plain step: fp32 weights from `path`, in training mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return [model, torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)]


def plain_update(model, opt, batch, cfg, dtype: str) -> None:
    """A plain transformers training step over every row of `batch`, as a user without this project
    would write it: HF's causal-LM loss on the policy tokens (labels -100 elsewhere; full logits,
    upcast to fp32 by HF), summed and divided by the share's policy-token count, one backward per
    micro-batch of the same token budget, gradient clipping, one AdamW step. bfloat16: fp32 parameters
    and optimizer, forward under torch.autocast(cpu, bfloat16)."""
    lengths, mask = batch["attn"].sum(1), batch["mask"]
    items = max(1, int(mask.sum()))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()
    for mb in passes.micro_batches(list(range(len(lengths))), lengths, cfg.micro_tokens):
        w = int(lengths[mb].max())
        ids, attn = batch["ids"][mb, :w], batch["attn"][mb, :w]
        labels = ids.masked_fill(mask[mb, :w] == 0, -100)
        with amp:
            loss = model(input_ids=ids, attention_mask=attn, labels=labels, num_items_in_batch=items,
                         use_cache=False).loss
        loss.backward()
        del loss
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def tensors_mb(model, opt) -> float:
    """Resident size of a model's parameters, gradients and optimizer state."""
    ts = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    ts += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in ts}.values()) / 2**20


def comparison(args, f) -> tuple[str, list[tuple], str]:
    """(heading, table rows, verdict) of our update against the plain step, from train_step.py's figures
    `f`: seconds, tokens/s per process, CPU seconds and tokens per CPU second of each, and their ratio."""
    s, world, total = f["phases"], f["world"], f["total"]
    total0, masked0 = f["total0"], f["masked0"]
    ours = total / world / s["update"]
    theirs = total0 / s["plain_update"]
    how = ("fp32 weights and AdamW, forward under torch.autocast(cpu, bfloat16)" if args.dtype == "bfloat16"
           else "fp32")
    heading = (f"\n# our update vs a plain transformers step (model(ids, attention_mask, labels) forward, backward, "
               f"AdamW; {how}{', activation checkpointing' if args.checkpointing else ''}) on rank 0's share in one "
               f"process: {total0} tokens, {masked0} policy tokens, the same micro-batch split")
    ours_cpu, theirs_cpu = total / world / s["update_cpu"], total0 / s["plain_cpu"]
    rows = [("update", "s", "tokens/s per process", "CPU s", "tokens per CPU s"),
            ("plain transformers, 1 process", f"{s['plain_update']:.3f}", f"{theirs:.0f}",
             f"{s['plain_cpu']:.3f}", f"{theirs_cpu:.0f}"),
            (f"ours: train.update, FSDP2 world {world}", f"{s['update']:.3f}", f"{ours:.0f}",
             f"{s['update_cpu']:.3f}", f"{ours_cpu:.0f}")]
    verdict = (f"our update's tokens/s per process / plain transformers': {ours / theirs:.2f} (wall time), "
               f"{ours_cpu / theirs_cpu:.2f} (CPU time; the plain step runs while the other ranks idle, so it meets "
               f"less contention for the cores)")
    return heading, rows, verdict

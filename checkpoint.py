"""Checkpoints: the model(s) in HF format, optimizer, step and RNG state, written atomically.

Layout of `<out>/checkpoints/`:

    step_000010/policy/       config.json, model.safetensors, tokenizer: loadable by transformers and vLLM
    step_000010/critic/       (PPO) the value model, same format
    step_000010/optim_*.pt    full optimizer state of each model (rank 0 writes, all ranks read it back)
    step_000010/rng_rank*.pt  torch and python RNG state of each rank
    step_000010/state.json    {"step": 10, "world": 2}
    latest                    the name of the newest complete checkpoint

A checkpoint is built in a hidden temporary directory and renamed into place only when every rank
has written its part; `latest` is then replaced atomically. A crash at any point leaves the previous
`latest` intact. Data order and horizon are pure functions of the step (see train.py, schedule.py),
so the step is all a resumed run needs to take up exactly where it left off.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_optimizer_state_dict)

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def latest(root: str | Path) -> Path | None:
    pointer = Path(root) / "latest"
    return Path(root) / pointer.read_text().strip() if pointer.exists() else None


def save(root: str | Path, step: int, models: dict, optimizers: dict, tokenizer, rank: int, world: int,
         keep: int = 2) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory."""
    root = Path(root)
    name = f"step_{step:06d}"
    tmp = root / f".{name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    for key, model in models.items():
        state = get_model_state_dict(model, options=FULL)          # gathered on rank 0 only
        optim = get_optimizer_state_dict(model, optimizers[key], options=FULL)
        if rank == 0:
            model.save_pretrained(tmp / key, state_dict=state)
            torch.save(optim, tmp / f"optim_{key}.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / f"rng_rank{rank}.pt")
    if rank == 0:
        tokenizer.save_pretrained(tmp / "policy")
        (tmp / "state.json").write_text(json.dumps({"step": step, "world": world}))
    _barrier()
    if rank == 0:
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = root / ".latest.tmp"
        pointer.write_text(name)
        os.replace(pointer, root / "latest")
        old = sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
    _barrier()
    return root / name


def save_model(directory: str | Path, model, tokenizer, rank: int) -> None:
    """Collective: the full model (and tokenizer) as a plain HF directory, written by rank 0 into a
    temporary directory and renamed into place, e.g. the warm-started policy."""
    directory = Path(directory)
    state = get_model_state_dict(model, options=FULL)  # gathered on rank 0 only
    if rank == 0:
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
    _barrier()


def load_training_state(ckpt: Path, models: dict, optimizers: dict, rank: int, world: int) -> int:
    """Restore optimizer and RNG state into freshly built (sharded) models; returns the saved step.
    The model weights themselves are loaded by building the models from `ckpt/<key>/`."""
    for key, model in models.items():
        state = torch.load(ckpt / f"optim_{key}.pt", weights_only=False) if rank == 0 else {}
        set_optimizer_state_dict(model, optimizers[key], optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    meta = json.loads((ckpt / "state.json").read_text())
    rng = ckpt / f"rng_rank{rank}.pt"
    if meta["world"] == world and rng.exists():  # RNG streams only line up with the same world size
        saved = torch.load(rng, weights_only=False)
        torch.set_rng_state(saved["torch"])
        random.setstate(saved["python"])
    return meta["step"]

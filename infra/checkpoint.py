"""Checkpoints: the model(s) in HF format, optimizer, step and RNG state; atomic, durable, verified.

Layout of `<out>/checkpoints/`:

    step_000010/policy/       config.json, model.safetensors, tokenizer: loadable by transformers and vLLM
    step_000010/critic/       (PPO) the value model, same format
    step_000010/optim_*.pt    format "full": each model's whole optimizer state (rank 0 gathers and writes it)
    step_000010/dcp_*/        format "sharded": each model's fp32 weights and optimizer state, one file per
                              rank (torch.distributed.checkpoint; no gather, and it reloads on any world size)
    step_000010/rng_rank*.pt  torch and python RNG state of each rank
    step_000010/state.json    {"step": 10, "world": 2, "format": "full", "files": {path: [bytes, crc32]}}
    latest                    the name of the newest checkpoint

Write order, so that a crash or a power cut at any point leaves a loadable checkpoint behind:
  1. everything is written into a hidden `.step_000010.tmp/`;
  2. every file is fsynced and its size and CRC-32 recorded (each rank takes a share of the files);
  3. `state.json`, holding that list, is written and fsynced last, then every directory;
  4. the directory is renamed into place and the parent fsynced (a rename is atomic, but only durable
     once its directory is on disk), then `latest` is replaced the same way; older ones are deleted.
`--resume` (`resumable`) takes the newest `step_*` whose files all match their recorded size and
CRC (a truncated or corrupted one is skipped with a one-line warning), whatever `latest` says, so a
crash between step 4's rename and `latest` loses nothing (`latest` is then moved to it). Data order
and horizon are pure functions of the step (train.py, schedule.py), so the step is all a resumed run
needs to continue exactly (tests/test_resume.py kills a run at four moments and checks just that).

Loading never runs code from the checkpoint: weights are safetensors, and optimizer and RNG state are
read with `torch.load(weights_only=True)` (tensors and plain containers only), so a checkpoint
directory from someone else is data, not a program.
"""
from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import random
import shutil
import sys
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from infra import faults, lora

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _barrier():
    if dist.is_initialized():
        dist.barrier()


def _all_gather(obj) -> list:
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (a full disk, a directory that is not writable). Raised on every
    rank alike, after the half-written directory is removed; the previous checkpoint is untouched."""


class _Writes:
    """One rank's file writes during a save. The first failure is kept and this rank's later writes are
    skipped, but the rank still joins every collective of the save, and `_agree` then raises on every rank
    at once: a full disk on rank 0 must not leave the other ranks in a barrier until the collective timeout
    (an hour, distributed.COLLECTIVE_TIMEOUT_MIN) while rank 0 dies with a traceback from deep in safetensors."""

    def __init__(self):
        self.error: str | None = None

    def __call__(self, fn, *args, collective: bool = False, **kwargs) -> None:
        """Run a write; `collective`: every rank must call it, so it runs even after a failure."""
        if self.error is None or collective:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - OSError, safetensors' and torch's own write errors, DCP's
                self.error = self.error or f"{type(exc).__name__}: {exc}".splitlines()[0]


def _agree(writes: _Writes, tmp: Path, rank: int) -> None:
    """Collective, in place of a barrier: if any rank's writes failed, remove the half-written directory
    and raise CheckpointError on every rank, naming the first failure."""
    errors = _all_gather(writes.error)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        r, error = failed[0]
        raise CheckpointError(f"checkpoint {tmp.name.strip('.').removesuffix('.tmp')} not written (rank {r}: {error})")


def latest(root: str | Path) -> Path | None:
    pointer = Path(root) / "latest"
    return Path(root) / pointer.read_text().strip() if pointer.exists() else None


# ------------------------------------------------------------------ durability

def fsync(path: Path) -> None:
    """Flush a file's or a directory's entries to the disk (a directory's fsync makes the names in
    it, e.g. a rename, survive a power cut; a process crash alone never loses written data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def digest(path: Path) -> tuple[int, int]:
    """(size, CRC-32) of a file, read in 16 MB blocks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return size, crc


def _seal_files(directory: Path, rank: int, world: int, writes: _Writes) -> dict:
    """Collective: fsync and digest every file under `directory`, each rank a share; the whole list."""
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    mine = {}

    def seal():
        for rel in files[rank::world]:
            fsync(directory / rel)
            mine[rel] = list(digest(directory / rel))
    writes(seal)
    return {k: v for part in _all_gather(mine) for k, v in part.items()}


def _publish(root: Path, tmp: Path, name: str, meta: dict, keep: int) -> None:
    """Rank 0: state.json last, everything fsynced, the rename into place, then `latest`, then pruning."""
    with open(tmp / "state.json", "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dirs(tmp)
    final = root / name
    shutil.rmtree(final, ignore_errors=True)  # a step redone after resuming from an older checkpoint
    tmp.rename(final)
    fsync(root)
    faults.point("before_latest")
    _replace_pointer(root, name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dirs(directory: Path) -> None:
    for d in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        fsync(d)
    fsync(directory)


def _replace_pointer(root: Path, name: str) -> None:
    pointer = root / ".latest.tmp"
    with open(pointer, "w") as f:
        f.write(name)
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer, root / "latest")
    fsync(root)


# ------------------------------------------------------------------ save

def _gathered(model, dtype: torch.dtype, rank: int) -> dict:
    """The full model on rank 0 in `dtype`, gathered one tensor at a time (all ranks take part); the
    HF directory of a sharded checkpoint. Rank 0's peak is the model in `dtype`, not fp32 + Adam. Under
    LoRA, the merged model in the base's names (lora.hf_tensors)."""
    out = {}
    tensors = lora.hf_tensors(model, dtype) if lora.active(model) else get_model_state_dict(model).items()
    for name, t in tensors:
        t = t.detach().to(dtype)
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        if rank == 0:
            out[name] = t.cpu()
    return out


def _hf_state(model, rank: int) -> dict:
    """The full fp32 model for an HF directory, on rank 0 (a collective)."""
    return _gathered(model, torch.float32, rank) if lora.active(model) else get_model_state_dict(model, options=FULL)


def save(root: str | Path, step: int, models: dict, optimizers: dict, tokenizer, keep: int = 2, sharded: bool = False,
         dtype: torch.dtype = torch.float32) -> Path:
    """Collective: every rank of the process group calls it. Returns the checkpoint directory. `sharded`: model
    and optimizer state through torch.distributed.checkpoint (each rank writes its shard), the HF directories in
    `dtype`. A policy with LoRA adapters (infra/lora.py) also writes them to `adapter/` in PEFT's format."""
    grouped = dist.is_initialized()  # one process without a group is rank 0 of 1
    root, rank, world = Path(root), dist.get_rank() if grouped else 0, dist.get_world_size() if grouped else 1
    name = f"step_{step:06d}"
    tmp = root / f".{name}.tmp"
    writes = _Writes()
    if rank == 0:
        for stale in root.glob(".step_*.tmp"):  # left by a crash during an earlier save
            shutil.rmtree(stale, ignore_errors=True)
        writes(tmp.mkdir, parents=True)
    _agree(writes, tmp, rank)
    faults.point("disk_full")
    for key, model in models.items():
        if sharded:
            state = _gathered(model, dtype, rank)
            if rank == 0:
                writes(model.save_pretrained, tmp / key, state_dict=state)
            del state
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizers[key])}
            writes(dcp.save, state, checkpoint_id=tmp / f"dcp_{key}", collective=True)
        else:
            state = _hf_state(model, rank)                              # gathered on rank 0 only
            optim = get_optimizer_state_dict(model, optimizers[key], options=FULL)
            if rank == 0:
                writes(model.save_pretrained, tmp / key, state_dict=state)
                writes(torch.save, optim, tmp / f"optim_{key}.pt")
            del state, optim
        if key == "policy" and lora.active(model):  # what a resume loads onto the base (policy/ is merged)
            writes(lora.save_adapter, tmp / "adapter", model, rank, collective=True)
    faults.point("checkpoint_write")
    writes(torch.save, {"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / f"rng_rank{rank}.pt")
    if rank == 0:
        writes(tokenizer.save_pretrained, tmp / "policy")
    _agree(writes, tmp, rank)
    files = _seal_files(tmp, rank, world, writes)
    _agree(writes, tmp, rank)
    if rank == 0:
        writes(_publish, root, tmp, name, {"step": step, "world": world, "format": "sharded" if sharded else "full",
                                           "files": files}, keep)
    _agree(writes, tmp, rank)
    return root / name


def save_model(directory: str | Path, model, tokenizer, rank: int) -> None:
    """Collective: the full model (and tokenizer) as a plain HF directory, written by rank 0 into a
    temporary directory, fsynced and renamed into place, e.g. the warm-started policy."""
    directory = Path(directory)
    state = _hf_state(model, rank)  # gathered on rank 0 only
    if rank == 0:
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        for path in tmp.rglob("*"):  # not _seal_files: a collective, and only rank 0 is here
            if path.is_file():
                fsync(path)
        _fsync_dirs(tmp)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        fsync(directory.parent)
    _barrier()


# ------------------------------------------------------------------ verify and load

def verify(ckpt: Path, rank: int, world: int) -> str | None:
    """Collective: None if every file of `ckpt` has its recorded size and CRC-32, else what is wrong
    (the same answer on every rank; each rank reads a share of the files)."""
    try:
        files = json.loads((ckpt / "state.json").read_text())["files"]
        problem = None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        files, problem = {}, f"state.json unreadable ({type(exc).__name__})"
    for rel in sorted(files)[rank::world]:
        path = ckpt / rel
        if not path.is_file():
            problem = f"{rel} is missing"
        elif tuple(files[rel]) != digest(path):
            size, expected = path.stat().st_size, files[rel][0]
            problem = f"{rel} is {'truncated' if size < expected else 'corrupted'} ({size} of {expected} bytes)"
        if problem:
            break
    return next((p for p in _all_gather(problem) if p), None)


def resumable(root: str | Path, rank: int, world: int) -> Path | None:
    """Collective: the newest complete checkpoint under `root` (None if there is none at all); every
    newer broken one is skipped with a one-line warning and renamed `broken_step_*`. Exits with a one-line
    error if all are broken (then nothing is renamed)."""
    candidates = sorted((p for p in Path(root).glob("step_*") if p.is_dir()), reverse=True)
    for i, ckpt in enumerate(candidates):
        problem = verify(ckpt, rank, world)
        if problem is None:
            if rank == 0 and latest(root) != ckpt:  # a crash between the rename and `latest`, or a broken newest
                _replace_pointer(Path(root), ckpt.name)
            if rank == 0:
                # Broken newer ones are renamed out of the `step_*` set (kept for a look, never loaded): left
                # there, they would count among the `keep` newest and let pruning delete this good one.
                for broken in candidates[:i]:
                    aside = broken.with_name("broken_" + broken.name)
                    shutil.rmtree(aside, ignore_errors=True)  # the same step broken twice: keep the newer
                    broken.rename(aside)
            return ckpt
        if rank == 0:
            print(f"warning: checkpoint {ckpt} is unusable ({problem}); trying the previous one", file=sys.stderr,
                  flush=True)
    if candidates:
        if rank == 0:
            print(f"error: no complete checkpoint in {root} to resume from; drop --resume to start over",
                  file=sys.stderr, flush=True)
        raise SystemExit(2)
    return None


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's `.metadata` file is a pickle that torch reads with plain `pickle.load`, which runs any code a
    crafted file names. This one builds only DCP's own metadata classes, torch sizes, dtypes and layouts,
    and the checkpoint's path (DCP stores it). Python 3.13 names that path `pathlib._local.PosixPath` (3.11
    and 3.12: `pathlib.PosixPath`): both names load as this Python's own class, on any Python, so a
    checkpoint written under one Python version resumes under another."""

    PATHS = {"Path", "PosixPath", "PurePath", "PurePosixPath"}

    def find_class(self, module, name):
        if module in ("pathlib", "pathlib._local") and name in self.PATHS:
            return getattr(pathlib, name)  # before any import: 3.11 has no module pathlib._local
        known = module.startswith("torch.distributed.checkpoint.") or module in ("torch", "torch.serialization",
                                                                                "collections")
        found = super().find_class(module, name) if known else None  # no other module is even imported
        if ((module.startswith("torch.distributed.checkpoint.") and isinstance(found, type))
                or (module == "torch" and (name == "Size" or isinstance(found, torch.dtype)))
                or (module, name) in {("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}):
            return found
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which a checkpoint never needs")


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP stores non-tensor values (the optimizer's param_groups) as pickles and torch's planner
    reads them with weights_only=False: the same, with weights_only=True (plain containers only)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_training_state(ckpt: Path, models: dict, optimizers: dict, rank: int, world: int) -> int:
    """Restore optimizer (and, for a sharded checkpoint, exact fp32 model) state into freshly built
    sharded models; returns the saved step. The models were built from `ckpt/<key>/`; the RNG state
    is `restore_rng`'s."""
    meta = json.loads((ckpt / "state.json").read_text())
    for key, model in models.items():
        if meta.get("format") == "sharded":
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizers[key])}
            # in place, and resharded if this run has a different number of ranks than the one that saved
            dcp.load(state, storage_reader=_SafeReader(ckpt / f"dcp_{key}"), planner=_SafePlanner())
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, optimizers[key], optim_state_dict=state["optim"])
            continue
        if lora.active(model):  # the model was built from the base RL started from
            lora.load_adapter(ckpt / "adapter", model)
        state = torch.load(ckpt / f"optim_{key}.pt", weights_only=True) if rank == 0 else {}
        set_optimizer_state_dict(model, optimizers[key], optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return meta["step"]


def restore_rng(ckpt: Path, rank: int, world: int) -> None:
    """This rank's torch and python RNG state as saved. Call it after the generator has started: vLLM
    seeds torch's global generator at start-up, and its CPU sampler (in-process) draws from it."""
    meta = json.loads((ckpt / "state.json").read_text())
    rng = ckpt / f"rng_rank{rank}.pt"
    if meta["world"] == world and rng.exists():  # RNG streams only line up with the same world size
        saved = torch.load(rng, weights_only=True)
        torch.set_rng_state(saved["torch"])
        random.setstate(saved["python"])

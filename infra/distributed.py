"""The distributed side of training: the process group, loading a model once per job into FSDP2 shards,
the weight stream into each rank's generator, and the small collectives the trainer runs on host
numbers. train.py, evaluate.py and the benchmarks share them. Test: tests/test_distributed.py."""
from __future__ import annotations

import datetime
import os
import socket
from contextlib import closing

import torch
import torch.distributed as dist

from infra.lora import active as lora_active, hf_tensors, inject, train_only_adapters

RANK = int(os.environ.get("RANK", 0))


def print0(*args):
    """print, on rank 0 only."""
    if RANK == 0:
        print(*args, flush=True)


COLLECTIVE_TIMEOUT_MIN = 60  # a rank-0 checkpoint gather of a 7B model can outlast the 10-minute default


def setup_distributed(device: str) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1 and "MASTER_PORT" not in os.environ:  # plain `python train.py`: a one-rank group
        with closing(socket.socket()) as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]), RANK="0", WORLD_SIZE="1")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend(device), timeout=datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MIN))
    return dist.get_rank(), dist.get_world_size()


def backend(device: str) -> str:
    """The process-group backend. On GPUs NCCL carries the CUDA tensors (FSDP2), but the trainer also
    reduces small host tensors (token counts, rewards, advantage statistics), which an NCCL-only group
    cannot do ("No backend type associated with device type cpu"): gloo serves the CPU side."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def shard(model, mesh, dtype: str, checkpointing: bool, trainable: bool = True, train_layers: int = 0,
          lora: bool = False):
    """FSDP2: each decoder block is its own shard group, then the root (embeddings, norm, head).
    In bf16 parameters compute in bf16 with fp32 gradient reduction; the trained ones' fp32 masters stay
    sharded, and frozen ones are kept in bf16 (a LoRA base, --train-layers' lower blocks, the reference).
    `train_layers` N > 0 trains only the top N decoder blocks and the final norm (see `freeze_below`);
    `lora`: only the adapters infra/lora.py injected train (a block shards its base weights and adapters together)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if checkpointing and trainable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.requires_grad_(trainable)
    if trainable and lora:
        train_only_adapters(model)
    if trainable and train_layers:
        freeze_below(model, train_layers)
    if dtype == "bfloat16":
        # A frozen weight is only ever read in bf16 (the all-gather casts every parameter to it), so it is kept
        # in bf16: half the bytes of a LoRA base, of --train-layers' frozen blocks and of the KL reference, with
        # the same forward. FSDP2 needs one dtype among a group's trained parameters only, which stay fp32.
        for p in model.parameters():
            if not p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == "bfloat16" else None
    kw = {"mesh": mesh, **({"mp_policy": mp} if mp else {})}
    for block in model.model.layers:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    # from_pretrained returns eval mode, in which transformers skips activation checkpointing: the
    # trained models run in train mode (their dropout rates are 0), the frozen reference in eval mode.
    model.train(trainable)
    return model


def load(cls, path: str, mesh, dtype: str, checkpointing: bool, trainable: bool = True, train_layers: int = 0,
         lora=None, **kwargs):
    """`cls.from_pretrained(path, **kwargs)` in fp32, sharded by `shard`, with one full copy in host memory
    per job instead of one per rank (a 7B model is about 30 GB in fp32: 8 ranks loading it each would need
    240 GB). Rank 0 alone reads the weights; every rank builds the model on the meta device (no memory),
    shards it, allocates only its own shards on the mesh's device (`to_empty`), and receives each tensor
    from rank 0 in turn, keeping its slice (`set_model_state_dict(broadcast_from_rank0=True)`). A head
    that the checkpoint lacks (the critic's) is initialised on rank 0 and so is the same on every rank.
    Buffers outside the state dict (rotary frequencies) come from rank 0 as well: `to_empty` leaves them
    uninitialised. The meta-device build followed by loading shards is torchtitan's way; here the shards
    come over the process group instead of from a converted checkpoint. `lora` (a peft.LoraConfig): adapters
    injected into both copies before sharding, rank 0's initial adapters sent like every weight."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = cls.from_pretrained(path, dtype=torch.float32, **kwargs) if dist.get_rank() == 0 else None
    if full is not None and lora is not None:
        inject(full, lora)
    box = [(full.config, getattr(full, "generation_config", None)) if full is not None else None]
    dist.broadcast_object_list(box, src=0)  # every rank builds exactly rank 0's model (attention, labels)
    config, generation_config = box[0]
    with torch.device("meta"):
        model = cls.from_config(config, dtype=torch.float32)
        if lora is not None:
            inject(model, lora)
    if generation_config is not None:  # save_pretrained writes it into checkpoints (their eos ids)
        model.generation_config = generation_config
    shard(model, mesh, dtype, checkpointing, trainable, train_layers, lora is not None)
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    model.to_empty(device=device)
    set_model_state_dict(model, full.state_dict() if full is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    sources = dict(full.named_buffers()) if full is not None else {}
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if full is not None:
                buffer.copy_(sources[name])
            dist.broadcast(buffer, src=0)
    return model


def freeze_below(model, train_layers: int) -> None:
    """Freeze the embeddings (and with them a tied LM head) and every decoder block below the top
    `train_layers`. Backward then stops at the lowest trained block: no gradient flows into the frozen
    blocks, and the head computes no weight gradient (a 49k x 576 matmul per token for SmolLM2). With
    half of SmolLM2's 30 blocks trained, a forward+backward costs about two forwards instead of three.
    A departure from the paper, which trains every parameter; opt-in (`--train-layers`)."""
    layers = model.model.layers
    if not 0 < train_layers <= len(layers):
        raise ValueError(f"--train-layers must be in 1..{len(layers)} for this model, got {train_layers}")
    model.model.embed_tokens.requires_grad_(False)
    for block in layers[:len(layers) - train_layers]:
        block.requires_grad_(False)


def full_tensors(model, dtype):
    """(name, full tensor) pairs of a sharded model, gathered one at a time (a collective: every rank
    iterates the same names in the same order); under LoRA the base's names with the adapters merged."""
    from torch.distributed.tensor import DTensor

    if lora_active(model):
        yield from hf_tensors(model, dtype)
        return
    for name, t in model.state_dict().items():
        t = t.detach().to(dtype)  # cast before gathering: a bf16 all-gather moves half the bytes of fp32
        yield name, t.full_tensor() if isinstance(t, DTensor) else t


def sync(engine, model, dtype) -> None:
    """Step (5) of training: stream the full parameters into this rank's generator. Every rank drains the
    stream, so all run the same gathers even if the engine stops reading early."""
    weights = full_tensors(model, dtype)
    engine.sync_weights(weights)
    for _ in weights:
        pass


def all_sum(*xs: float) -> list[float]:
    t = torch.tensor([float(x) for x in xs], dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_max(x: int) -> int:
    t = torch.tensor([x])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)

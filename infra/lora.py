"""LoRA through PEFT (`--lora-rank R`): the policy's linear layers get low-rank adapters, W x + s B A x with
s = alpha / R (Hu et al., 2021), and only A and B train. Everything else about training stays as it is:

- **Build.** PEFT injects the adapters into the transformers model itself (`inject_adapter_in_model`, no
  PeftModel wrapper), so FSDP2 shards each block's base weights and adapters together and the model keeps
  its class, its `model.layers` and its forward. B starts at 0 (the model is exactly the base); A at
  PEFT's Kaiming-uniform bounds, drawn from a generator seeded by the layer's name, so that every rank,
  every world size and a reset after the warm start all give the same A.
- **Train.** Base weights are frozen; the optimizer holds only the adapters (its moments are 2 x 4 bytes
  per adapter parameter, not per model parameter), and gradients exist only for them.
- **Generate.** The generator gets merged weights W + s B A under the base's own names (`hf_tensors`), so
  it runs the plain model at full speed and samples what the trainer then scores: the on-policy check
  (train.GAP_ALARM, the sampler gap) holds as for the full model. Adapter dropout defaults to 0 for that
  reason: with dropout the trainer's forward is not the sampler's distribution.
- **Reference.** The KL's reference is the same model with its adapters switched off (`Base`), not a
  second copy. After a warm start the adapters are folded into the base weights and reset
  (`fold_into_base`), so "adapters off" is the warm start, the model RL starts from, as for the full model.
- **Checkpoints.** `policy/` holds the merged model (evaluate.py and vLLM load it as any checkpoint), and
  `adapter/` the adapters in PEFT's own format (`PeftModel.from_pretrained(base, adapter)` loads them);
  a resumed run rebuilds the base and loads the adapters, exactly.

Test: tests/test_lora.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # every linear layer of a Llama/Qwen2 block
ADAPTER_FILE = "adapter_model.safetensors"


def config(rank: int, alpha: float, dropout: float, targets: str, base: str = ""):
    """PEFT's LoraConfig (peft is imported here, where LoRA is used: it adds 2 s to every process's start);
    `base`: the model the adapters apply to, written into a saved adapter's config."""
    import peft
    return peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, bias="none", base_model_name_or_path=base,
                           target_modules=[t.strip() for t in targets.split(",") if t.strip()])


def inject(model, lora) -> None:
    """Adapters into `model`'s target layers, in place (on the meta device too), A seeded by name, B = 0.
    PEFT keeps `lora` on the model (`config_of`): the one record of the adapters from then on."""
    import peft
    peft.inject_adapter_in_model(lora, model)
    if next(model.parameters()).device.type != "meta":
        reset(model)


def _adapted(module) -> bool:
    """A PEFT LoRA layer (told by its parts, so that this module imports without peft)."""
    return isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict) and hasattr(module, "base_layer")


def layers(model) -> list:
    """(module name, layer) of every adapted layer, in the model's order (the same on every rank)."""
    return [(n, m) for n, m in model.named_modules() if _adapted(m)]


def active(model) -> bool:
    return any(_adapted(m) for m in model.modules())


def config_of(model):
    """The peft.LoraConfig of `model`'s adapters, as PEFT's injection left it on the model (`peft_config`)."""
    return model.peft_config["default"]


def train_only_adapters(model) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assign(param: torch.Tensor, full: torch.Tensor) -> None:
    """Write a full tensor into a parameter, into this rank's shard when it is FSDP2's (every rank holds the
    same `full`, so no communication: src_data_rank None)."""
    with torch.no_grad():
        if isinstance(param, DTensor):
            part = distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(part.to_local())
        else:
            param.copy_(full.to(param.dtype))


def _seeded_a(name: str, shape: torch.Size) -> torch.Tensor:
    """PEFT's default A: kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a generator
    seeded by the layer's name (blake2b: Python's hash() differs between processes)."""
    seed = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1
    u = torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    return (2 * u - 1) / math.sqrt(shape[1])


def reset(model) -> None:
    """Every adapter back to its start: B = 0 (the layer is exactly its base) and the seeded A."""
    for name, layer in layers(model):
        for key in layer.lora_A:
            a, b = layer.lora_A[key].weight, layer.lora_B[key].weight
            _assign(a, _seeded_a(name, a.shape))
            _assign(b, torch.zeros(b.shape))


def _delta(layer) -> torch.Tensor:
    """s B A of one layer in fp32, whole (a collective under FSDP2: B and A are gathered)."""
    out = 0.0
    for key in layer.active_adapters:
        b, a = _full(layer.lora_B[key].weight).float(), _full(layer.lora_A[key].weight).float()
        out = out + layer.scaling[key] * (b @ a)
    return out


def hf_tensors(model, dtype: torch.dtype):
    """(name, full tensor) in the base model's own names, each adapted weight merged (W + s B A, in fp32, then
    cast), the adapters themselves left out: what the generator loads and `policy/` holds. A collective:
    every rank iterates the same names in the same order."""
    adapted = dict(layers(model))
    for name, t in model.state_dict().items():
        if ".lora_" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if owner is not None and name.endswith(".base_layer.weight"):  # merged in fp32, then cast
            yield plain, (_full(t.detach()).float() + _delta(adapted[owner])).to(dtype)
        else:  # cast before gathering: a bf16 all-gather moves half the bytes (distributed.full_tensors)
            yield plain, _full(t.detach().to(dtype))


def fold_into_base(model, base: str) -> None:
    """W <- W + s B A in every adapted layer, then the adapters reset: the model computes the same function,
    and switching the adapters off now gives this model (after the warm start: the KL's reference, RL's start).
    The adapters' config names `base` (where this model is saved) as their base from now on: a new config
    replaces the old one, which is left as it was."""
    with torch.no_grad():
        for _, layer in layers(model):
            w = layer.get_base_layer().weight
            _assign(w, _full(w).float() + _delta(layer))
    reset(model)
    model.peft_config = {**model.peft_config, "default": dataclasses.replace(config_of(model), base_model_name_or_path=base)}


@contextlib.contextmanager
def adapters_off(model):
    """The base model inside the block (PEFT's layers skip their adapters while disabled). The flag is set
    directly: PEFT's `enable_adapters` also flips the adapters' requires_grad, which the optimizer and FSDP2
    were set up with."""
    adapted = [m for _, m in layers(model)]
    for m in adapted:
        m._disable_adapters = True
    try:
        yield model
    finally:
        for m in adapted:
            m._disable_adapters = False


class Base:
    """The KL's reference under LoRA: the policy with its adapters off for each call (no second model). It
    answers what batch.score asks of a model (`__call__`, `device`, `get_decoder`, ...) by the policy's own."""

    def __init__(self, policy):
        self.policy = policy

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def __call__(self, *args, **kwargs):
        with adapters_off(self.policy):
            return self.policy(*args, **kwargs)


def adapter_state(model) -> dict:
    """The adapters' full tensors in PEFT's saved names (`base_model.model.<module>.lora_A.weight`): a collective."""
    return {"base_model.model." + name.replace(".default.", "."): _full(t.detach()).float().cpu()
            for name, t in model.state_dict().items() if ".lora_" in name}


def save_adapter(directory: Path, model, rank: int) -> None:
    """Collective: the adapters as PEFT saves them (adapter_config.json and adapter_model.safetensors), by rank 0."""
    from safetensors.torch import save_file

    state, lora = adapter_state(model), config_of(model)
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        save_file(state, str(directory / ADAPTER_FILE))
        saved = dict(lora.to_dict(), target_modules=sorted(lora.target_modules))
        (directory / "adapter_config.json").write_text(json.dumps(saved, indent=2, default=str))


def load_adapter(directory: Path, model) -> None:
    """The adapters of `save_adapter` into a model built with the same LoRA config; every rank reads the small
    file itself. A missing or extra adapter is an error naming it (a checkpoint of another --lora-rank/targets)."""
    from safetensors.torch import load_file

    saved = load_file(str(directory / ADAPTER_FILE))
    params = {"base_model.model." + n.replace(".default.", "."): p for n, p in model.named_parameters() if ".lora_" in n}
    if saved.keys() != params.keys() or any(saved[k].shape != params[k].shape for k in saved):
        raise ValueError(f"{directory} holds other adapters than this run's (--lora-rank, --lora-targets)")
    for key, p in params.items():
        _assign(p, saved[key])


def param_count(shape, rank: int, targets: str) -> int:
    """Adapter parameters for a memplan.Shape: R x (in + out) per adapted layer, over every block."""
    q = shape.heads * shape.head_dim
    dims = {"q_proj": (shape.H, q), "k_proj": (shape.H, shape.kv), "v_proj": (shape.H, shape.kv),
            "o_proj": (q, shape.H), "gate_proj": (shape.H, shape.I), "up_proj": (shape.H, shape.I),
            "down_proj": (shape.I, shape.H)}
    names = [t.strip() for t in targets.split(",") if t.strip()]
    return shape.L * rank * sum(sum(dims[n]) for n in names if n in dims)

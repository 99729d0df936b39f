"""The memory plan: a rank's peak from the model's shape and the run's settings, checked against the
memory this machine can give each rank, before any model loads.

    plan = memplan.rank_plan(cfg, world, local_world, device, dtype)   # bytes per row, two phases
    cfg, note = memplan.fit(cfg, world, local_world, device, dtype)     # adapt or stop (MemoryPlanError)
    memplan.changes(asked, cfg)                                         # what it adapted: {field: [asked, used]}

Why: a micro-batch budget made for a 0.2M-parameter model, given to a 135M one, grew a rank to 13 GB in
its first update and the kernel killed it; nothing said why. The arithmetic below predicts a rank's peak
within about 10% on this machine (bench/memory_plan.py --compare; with vLLM's CPU engine beside the
trainer it errs high: 5.0 GB planned for the SmolLM2 recipe, 4.45 measured), so train.py, evaluate.py and
bench/train_step.py consult it first: a plan that does not fit either shrinks the micro-batch budget
(checkpointing on first) and says so in one line, or stops with one line naming the flag and the figure.

Dimensions: P parameters, L layers, H hidden, I intermediate, V vocabulary, kv = key/value heads x
head_dim, W ranks, T tokens of the largest micro-batch (rows x padded width: the budget, or one whole
episode of `max_context` tokens when that is longer), c bytes of the compute dtype (2 bf16, 4 fp32).
The rows, as train.py's step (FSDP2, `distributed.shard`) holds them:

  sharded parameters       4P/W   the fp32 masters: FSDP2 keeps no other fp32 copy (MixedPrecisionPolicy
                                  casts them to bf16 at each all-gather); in bf16 a frozen parameter (a
                                  LoRA base, --train-layers' frozen blocks) is kept in bf16: c per frozen one
  sharded fp32 gradients   4P/W   reduce_dtype float32, kept from the first backward to zero_grad
  AdamW moments            8P/W   exp_avg and exp_avg_sq, fp32, sharded
  unsharded compute copies c x (root + 2 blocks): the root group (embeddings, untied head, final norm)
                                  stays all-gathered from its forward to its post-backward; the blocks
                                  one at a time, plus the next one prefetched
  unsharded gradients      root x (c + 4 if bf16), + V x H x c if the head is tied (its two
                                  contributions exist apart before they are summed); on CPU also 4P,
                                  the fp32 gradients accumulated between a mini-batch's reductions, where
                                  the plan has room for them (--grad-reduce auto; `fit` drops them first)
  reference model          cP/W sharded, frozen (train.main reshards it after scoring)
  critic                   the policy's first five rows again (PPO only; its head is one output)
  LoRA (--lora-rank)       gradients, moments and the CPU's accumulated gradients count the adapters'
                                  parameters only (infra/lora.py), the root has none, and there is no
                                  reference model (the policy with its adapters off)
  --train-layers N         gradients, moments and accumulated gradients count the top N blocks, the
                                  final norm and an untied head (distributed.freeze_below); a tied head
                                  (the frozen embedding) has no gradient; activations are kept for the N
                                  blocks backward runs through, not for all L
  LM-head slice            28 x n x V bytes, n = min(T, logit_elements // V) (the LM-head slices of batch.py): logits in c
                                  and fp32, logsumexp and softmax temporaries and their gradients
                                  (measured 29 bytes per slice element in bf16, 26 in fp32)
  activations              checkpointing: L x T x H x c (each block's input) + 2 x T x A (the block
                                  being recomputed, and its gradients); without: L x T x A + T x A,
                                  A = c(8H + 3kv + 5I) + 16H bytes a token; plus 3 x T x H x c
  generator                GPU vLLM: VLLM_GPU_ASLEEP while training (sleep level 2 frees weights and
                                  KV cache; CUDA graphs and runtime buffers stay), `gpu_util` x GPU during
                                  rollouts; CPU vLLM: its embedding (V x H x c) while training (sleep()
                                  frees its packed weights and KV cache by hand), P x c + its KV cache
                                  during rollouts (engine.kv_cache_bytes); HF engine: P x c always
  runtime                  on CPU the process's resident size now, what it imports after the plan
                                  (IMPORTS_AFTER_PLAN), and what vLLM's engine holds besides weights and
                                  cache (VLLM_RUNTIME); on GPU the CUDA context and allocator slack (1 GB)

Rollout phase: the sharded state, the reference and the critic stay; the gradients too when
`--min-groups` adds them up over several rollouts (they live from one step's backward to the optimizer
step of a later one).

Loading: rank 0 reads the whole model in fp32 (4P) before sharding it; the plan's third phase. On CPU
that copy is the rank's own memory; on GPU it is host memory (the `host` phase, not part of the GPU's
peak), and the GPU holds only the arriving shards.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from infra import lora
from infra.engines import engine_kind
from infra.passes import logit_elements
from infra.stepplan import per_rank
from models import tiny

GB, MB = 2**30, 2**20
SLICE_BYTES = 28      # bytes per element of one LM-head slice at its peak (see the docstring)
# What vLLM's CPU engine holds beyond its weights and KV cache (imports, its LLM class, worker buffers), the
# same asleep and awake: 0.80-0.92 GB measured with SmolLM2 in bf16 at 16 and 32 sequences (VmRSS of one
# process before the engine and after it, weights and cache subtracted). 300 MB, the imports alone, left a
# 32-sequence run 0.55 GB over its plan.
VLLM_RUNTIME = 900 * MB
# What a sleeping vLLM keeps on a GPU: sleep(level=2) frees its weights and KV cache, but not the memory
# of its captured CUDA graphs, the sampler's and the runner's persistent buffers, nor its allocator's
# cache. Read from vLLM's sources as 1-4 GB by batch size and model; 2 GB is the middle for the small
# models here. Not yet measured on a GPU (vLLM's GPU build is not in the GPU run's image).
VLLM_GPU_ASLEEP = 2 * GB
# What a rank imports after its plan is made (the plan reads the process's resident size first): transformers'
# model classes and the tokenizer, peft, the process group. 150 MB measured with SmolLM2 (280 MB resident at
# the plan in train.py, 439 MB when the model starts loading); without it a LoRA run's warm start peaked 6%
# over its plan (bench/phase_peaks.py, docs/performance.md).
IMPORTS_AFTER_PLAN = 150 * MB
HEADROOM = 0.9        # share of the memory a rank can have that the plan may fill (page cache, allocator slack)
BUILTIN = {  # HF config.json fields of the built-in models
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2"),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, model_type="llama"),
}
class MemoryPlanError(ValueError):
    """The plan does not fit and cannot be adapted: the message is the one line to print."""


@dataclass
class Shape:
    H: int
    I: int
    L: int
    heads: int
    kv_heads: int
    head_dim: int
    V: int
    tied: bool
    bias: bool  # q/k/v projection biases (Qwen2)

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block(self) -> int:
        """Parameters of one decoder block."""
        q, o = self.H * self.heads * self.head_dim, self.heads * self.head_dim * self.H
        bias = (self.heads * self.head_dim + 2 * self.kv) if self.bias else 0
        return q + 2 * self.H * self.kv + o + bias + 3 * self.H * self.I + 2 * self.H

    @property
    def root(self) -> int:
        """Parameters of the root FSDP group: embeddings, the untied head, the final norm."""
        return self.V * self.H * (1 if self.tied else 2) + self.H

    @property
    def params(self) -> int:
        return self.L * self.block + self.root


def shape(config: dict) -> Shape:
    heads = config["num_attention_heads"]
    return Shape(H=config["hidden_size"], I=config["intermediate_size"], L=config["num_hidden_layers"], heads=heads,
                 kv_heads=config.get("num_key_value_heads") or heads,
                 head_dim=config.get("head_dim") or config["hidden_size"] // heads, V=config["vocab_size"],
                 tied=bool(config.get("tie_word_embeddings", False)),
                 bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)))


def model_config(name: str) -> dict:
    """The config.json fields of a model, without loading (or building) it: the built-in shapes, 'tiny'
    and 'smollm2' from their recipes, a directory or config.json path, or an HF name in the local cache."""
    if name in BUILTIN:
        return BUILTIN[name]
    if name == "smollm2":
        return BUILTIN["smollm2-135m"]
    if name == "tiny":
        return dict(tiny.MODEL, vocab_size=tiny.VOCAB_SIZE, model_type="qwen2")
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(name).to_dict()


def vllm_cpu_kv_gib(s: Shape, dtype: str, max_context: int, seqs: int, cap: int = 8) -> float:
    """engine.kv_cache_bytes's sizing of vLLM's CPU KV cache, in GiB: `seqs` sequences of `max_context`
    tokens plus a quarter for prefix caching, at most `cap` (VLLM_CPU_KVCACHE_SPACE, whole GiB, overrides it)."""
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]))
    return min(cap, 2 * s.L * s.kv * (4 if dtype == "float32" else 2) * max_context * seqs * 1.25 / GB)


def plan(s: Shape, world: int, dtype: str, checkpointing: bool, tokens: int, kl: bool, engine: str, device: str,
         gpu_gb: float = 80.0, gpu_util: float = 0.5, runtime: float = 0.0, max_context: int = 3072,
         seqs: int = 16, critic: bool = False, grads_resident: bool = False, adapters: int = 0,
         deferred: bool = True, train_layers: int = 0) -> dict:
    """Bytes per rank of each row, for the training phase, the rollout phase and loading (and, on GPU,
    rank 0's host memory while it loads). `grads_resident`: gradients live through rollouts (--min-groups).
    `adapters`: LoRA's trained parameters (infra/lora.py): gradients and moments only for them, the root
    frozen, the KL's reference the policy itself. `deferred`: a CPU run reduces gradients once a mini-batch
    (--grad-reduce), holding them unsharded in fp32 until then. `train_layers`: only the top N blocks, the
    final norm and an untied head train, and backward stops at the lowest of them."""
    c = 2 if dtype == "bfloat16" else 4
    P, W, T = s.params, world, tokens
    head = 0 if s.tied else s.V * s.H  # an untied head trains under --train-layers; a tied one is the embedding
    # the parameters that get gradients and AdamW moments, and those of the root among them
    G, root = (adapters, 0) if adapters else (train_layers * s.block + s.H + head, s.H + head) if train_layers \
        else (P, s.root)
    A = c * (8 * s.H + 3 * s.kv + 5 * s.I) + 16 * s.H           # activation bytes of one block, per token
    n = min(T, max(1, logit_elements(device) // s.V))
    blocks = train_layers or s.L  # the blocks backward runs through, whose activations are kept
    acts = (blocks * T * s.H * c + 2 * T * A) if checkpointing else (blocks * T * A + T * A)
    frozen = P - G + adapters  # distributed.shard keeps them in the compute dtype (LoRA: the whole base)
    state = {
        "sharded parameters (fp32 masters, frozen in c)": (4 * G + c * frozen) / W,
        "sharded fp32 gradients": 4 * G / W,
        "AdamW moments (fp32)": 8 * G / W,
    }
    train = {
        **state,
        "unsharded compute copies (root + 2 blocks)": c * (s.root + 2 * s.block),
        "unsharded root gradients (+ fp32 for reduce)":
            root * (c + (4 if c != 4 else 0)) + (s.V * s.H * c if s.tied and root == s.root else 0),
        # on CPU, train.update reduces gradients once a mini-batch: until then each rank accumulates them
        # unsharded, in fp32 (every trained parameter: an upper bound)
        "unsharded fp32 gradients, accumulated (CPU)": 4 * G if device == "cpu" and deferred else 0.0,
        "reference model (sharded)": (c * P / W) if kl and not adapters else 0.0,
        "critic (sharded state)": 16 * P / W if critic else 0.0,  # masters, gradients, moments: never LoRA
        f"LM-head slice ({n} tokens x {s.V})": SLICE_BYTES * n * s.V,
        f"activations ({T} tokens, {'checkpointing' if checkpointing else 'no checkpointing'})":
            acts + 3 * T * s.H * c,
    }
    engine_bytes = {"none": 0.0, "hf": P * c, "torch": P * c,
                    "vllm": (P * c + vllm_cpu_kv_gib(s, dtype, max_context, seqs) * GB) if device == "cpu" else 0.0
                    }[engine]
    # vLLM sleeps through the update (engine.py): on GPU it keeps its graphs and buffers (VLLM_GPU_ASLEEP);
    # on CPU only the embedding, which vLLM's CPU layers do not pack (a tied head is packed again at the sync)
    train["generator (" + ("asleep" if engine == "vllm" else engine) + ")"] = (
        engine_bytes if engine != "vllm" else s.V * s.H * c if device == "cpu" else VLLM_GPU_ASLEEP)
    train["runtime"] = runtime
    kept = ("sharded par", "AdamW", "reference", "critic", "runtime") + (("sharded fp32 grad",) if grads_resident
                                                                             else ())
    rollout = {k: v for k, v in train.items() if k.startswith(kept)}
    gen = engine_bytes if not (engine == "vllm" and device == "cuda") else gpu_util * gpu_gb * GB
    rollout["generator (awake)"] = gen
    if engine == "torch":  # infra/decode.py: its sleep() drops the KV rows, so they count only while it generates
        rollout.update(torch_engine_rows(s, c, max_context, seqs, device))
    kv_tokens = None
    if engine == "vllm" and device == "cuda":
        kv_tokens = max(0.0, gen - P * c - 0.05 * gen) / (2 * s.L * s.kv * c)  # ~5% for vLLM's activations
    if device == "cuda":  # rank 0's full copy is in host memory; the GPU receives shards (distributed.load)
        load = {"runtime": runtime, "sharded fp32 parameters (arriving)": 4 * P / W}
        host = {"the whole model in fp32 (rank 0)": 4 * P}
    else:
        load, host = {"runtime": runtime, "the whole model in fp32": 4 * P}, {}
    return {"train": train, "rollout": rollout, "load": load, "host": host, "params": P, "kv_tokens": kv_tokens}


def torch_engine_rows(s: Shape, c: int, max_context: int, seqs: int, device: str) -> dict:
    """decode.TorchEngine's memory while it generates, beside its weights: the KV rows of `seqs` episodes at
    `max_context` tokens (plus one layer while a turn's rows are rebuilt from the last turn's), the sampler's
    (rows x V) temporaries (logits in c, then float32 logits, probabilities, CDF, top-p's sort), and one
    prefill chunk (decode.TorchEngine.prefill_tokens): its activations and its attention mask (bool, and
    SDPA's float bias), per query head group (G = heads / kv heads) and cached position."""
    chunk = 16384 if device == "cuda" else 2048
    g = s.heads // s.kv_heads
    rows = {f"KV rows ({seqs} x {max_context} tokens)": 2 * s.L * s.kv * c * max_context * seqs * (1 + 1 / s.L),
            f"sampler ({seqs} x {s.V})": seqs * s.V * (c + 5 * 4),
            f"prefill chunk ({chunk} tokens)": chunk * (c * (6 * s.H + 3 * s.I) + g * max_context * 5)}
    if device == "cpu":  # decode.PackedLinears: every linear layer and the LM head packed again (dropped by sleep);
        rows["packed weights (oneDNN)"] = s.params * c  # counted in bf16 too, where a CPU without bf16 packs none
    return rows


def peak(p: dict) -> float:
    """A rank's planned peak in bytes: the largest of its phases."""
    return max(sum(p[phase].values()) for phase in ("train", "rollout", "load"))


# ------------------------------------------------------------------ what a rank can have

def _cgroup_limit() -> float | None:
    """This process's cgroup memory limit minus what the cgroup uses now, in bytes (v2 or v1); None if none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            root, limit, usage = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # v1
            root, limit, usage = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "memory.limit_in_bytes", \
                "memory.usage_in_bytes"
        else:
            continue
        try:
            text = (root / limit).read_text().strip()
            used = float((root / usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if text != "max" and float(text) < 2**60:
            return float(text) - used
    return None


def _proc_kib(path: str, field: str) -> float | None:
    """A `field:  N kB` line of a /proc file, in bytes (None off Linux or when absent)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


def _mem_available() -> float | None:
    return _proc_kib("/proc/meminfo", "MemAvailable")


def rss_bytes() -> float:
    """This process's resident size now (0 off Linux)."""
    return _proc_kib("/proc/self/status", "VmRSS") or 0.0


def available(local_world: int, device: str = "cpu") -> tuple[float, str]:
    """Bytes one rank may fill and where the figure comes from. CPU: the smaller of the cgroup's free limit
    and MemAvailable, shared by this node's ranks (each keeps what it holds now: the plan counts it).
    GPU: the device's memory. AGENTGYM_MEMORY_GB (the node's memory for the ranks) overrides the readings."""
    if os.environ.get("AGENTGYM_MEMORY_GB"):
        total, source = float(os.environ["AGENTGYM_MEMORY_GB"]) * GB, "AGENTGYM_MEMORY_GB"
    elif device == "cuda":
        return float(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory), "the GPU"
    else:
        readings = {k: v for k, v in (("the cgroup limit", _cgroup_limit()), ("MemAvailable", _mem_available()))
                    if v is not None}
        if not readings:
            return float("inf"), "no reading"
        source = min(readings, key=readings.get)
        total = readings[source] + local_world * rss_bytes()
    return total / local_world, source


# ------------------------------------------------------------------ the plan of a run

def rank_plan(cfg, world: int, device: str, dtype: str, micro_tokens: int | None = None,
              checkpointing: bool | None = None, deferred: bool | None = None, critic: bool = False) -> dict:
    """`plan` for a train.py Config (or anything with its fields) at this world size; `critic`: the algorithm
    trains a value model (algorithms.Algo.critic: the caller reads it, this file never names an algorithm)."""
    s = shape(model_config(cfg.model))
    engine = _engine(cfg.engine, device)
    tokens = max(micro_tokens or cfg.micro_tokens, cfg.max_context)  # one long episode fills a micro-batch alone
    runtime = (rss_bytes() + IMPORTS_AFTER_PLAN + (VLLM_RUNTIME if engine == "vllm" else 0)) if device == "cpu" \
        else 1.0 * GB
    gpu_gb = available(1, "cuda")[0] / GB if device == "cuda" else 80.0
    seqs = max(1, per_rank(cfg.tasks_per_step, cfg.samples_per_task, world))
    return plan(s, world, dtype, cfg.checkpointing if checkpointing is None else checkpointing, tokens,
                cfg.kl_coef > 0, engine, device, gpu_gb=gpu_gb, gpu_util=getattr(cfg, "gpu_memory_utilization", 0.5),
                runtime=runtime, max_context=cfg.max_context, seqs=seqs, critic=critic,
                grads_resident=getattr(cfg, "min_groups", 0) > 0,
                deferred=defers(cfg) if deferred is None else deferred,
                adapters=lora.param_count(s, cfg.lora_rank, cfg.lora_targets) if getattr(cfg, "lora_rank", 0) else 0,
                train_layers=getattr(cfg, "train_layers", 0))


def defers(cfg) -> bool:
    """Whether a CPU run holds its gradients until a mini-batch's last backward (infra/passes.py): not under
    --grad-reduce micro-batch, nor with an imitation anchor (whose own backward follows the mini-batch's)."""
    return getattr(cfg, "grad_reduce", "auto") != "micro-batch" and not getattr(cfg, "bc_anchor", 0)


def _engine(kind: str, device: str) -> str:
    return engine_kind(kind, device)


FLAG_OF_ROW = (("activations", "--micro-tokens (or --checkpointing)"), ("LM-head", "--micro-tokens"),
               ("reference", "--kl-coef 0"), ("critic", "--algo grpo"), ("generator", "--max-context or --tasks-per-step"),
               ("whole model", "a smaller --model"), ("", "more ranks or a smaller --model"))


def fit(cfg, world: int, local_world: int, device: str, dtype: str, mode: str = "adapt", critic: bool = False):
    """(cfg, info): `cfg` unchanged when its plan fits, else with a smaller
    `micro_tokens` (checkpointing on first) when `mode` is adapt and that fits. Raises MemoryPlanError with
    one line naming the flag to change and the figure it needs when nothing fits (or mode is stop). `info`:
    the line to print (note), the planned peak (plan) and the bytes a rank can have (share)."""
    budget, source = available(local_world, device)
    ceiling = HEADROOM * budget
    p = rank_plan(cfg, world, device, dtype, critic=critic)
    need = peak(p)
    where = f"{budget / GB:.1f} GB a rank can have ({source}, {local_world} rank{'s' if local_world > 1 else ''} here)"
    auto = device == "cpu" and getattr(cfg, "grad_reduce", "auto") == "auto" and defers(cfg)
    if auto and world == 1:  # one rank reduces nothing: holding the gradient saved 1% of a step and cost 454 MB
        cfg, auto = replace(cfg, grad_reduce="micro-batch"), False  # (bench/results/trl_peer_grad_reduce.json)
    if need <= ceiling:  # --grad-reduce auto: the deferred reduction, which the plan has room for
        return replace(cfg, grad_reduce="mini-batch") if auto else cfg, {
            "note": f"memory plan: {need / GB:.2f} GB per rank at peak, of {where}", "plan": need, "share": budget}
    if auto:  # first give up holding a whole fp32 gradient per rank (a little more time: infra/passes.py)
        cfg = replace(cfg, grad_reduce="micro-batch")
        trial = peak(rank_plan(cfg, world, device, dtype, critic=critic))
        if trial <= ceiling:
            return cfg, {"note": f"memory plan: {need / GB:.1f} GB per rank would not fit the {where}; reducing "
                                 f"gradients every micro-batch instead (--grad-reduce micro-batch, plan "
                                 f"{trial / GB:.2f} GB)", "plan": trial, "share": budget}
    tokens, ckpt = cfg.micro_tokens, True  # checkpointing first, then halve the budget down to one episode
    while True:
        trial = rank_plan(cfg, world, device, dtype, micro_tokens=tokens, checkpointing=ckpt, critic=critic)
        if peak(trial) <= ceiling or tokens <= cfg.max_context:
            break
        tokens = max(cfg.max_context, tokens // 2)
    change = f"--micro-tokens {tokens}{'' if cfg.checkpointing else ' --checkpointing'}"
    if peak(trial) <= ceiling:
        if mode == "adapt":
            return replace(cfg, micro_tokens=tokens, checkpointing=True), {
                "note": f"memory plan: {need / GB:.1f} GB per rank would not fit the {where}; training with "
                        f"{change} instead (plan {peak(trial) / GB:.2f} GB)", "plan": peak(trial), "share": budget}
        raise MemoryPlanError(f"memory plan: a rank needs {need / GB:.1f} GB but has {where}; run with {change} "
                              f"(plan {peak(trial) / GB:.2f} GB, under {ceiling / GB:.1f} GB)")
    phase = max(("train", "rollout", "load"), key=lambda k: sum(trial[k].values()))
    row, size = max(trial[phase].items(), key=lambda kv: kv[1])
    flag = next(f for key, f in FLAG_OF_ROW if key in row)
    raise MemoryPlanError(f"memory plan: even with {change} a rank needs {peak(trial) / GB:.1f} GB (largest row: "
                          f"{row} {size / GB:.1f} GB, {phase}) but has {where}; change {flag} so that it needs "
                          f"under {ceiling / GB:.1f} GB, or set AGENTGYM_MEMORY_GB if the reading is wrong")


def check_run(cfg, world: int, device: str, dtype: str, critic: bool = False):
    """train.py's use of `fit` under `cfg.memory_check`: (cfg, info, problem), problem a one-line error.
    The config returned is a new one when the plan adapted it (`changes` lists what differs; launch/startup.py
    records it in config.json). The node's rank count comes from torchrun (LOCAL_WORLD_SIZE)."""
    if cfg.memory_check == "off":
        return cfg, {}, None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        new, info = fit(cfg, world, local, device, dtype, cfg.memory_check, critic)
    except MemoryPlanError as exc:
        return cfg, {}, str(exc)
    return new, info, None


def changes(asked, used) -> dict:
    """{field: [asked, used]} for every setting of dataclass `asked` that the plan changed in `used`."""
    return {f.name: [getattr(asked, f.name), getattr(used, f.name)] for f in fields(asked)
            if getattr(asked, f.name) != getattr(used, f.name)}


def check_generation(model: str, engine: str, device: str, dtype: str, max_context: int, seqs: int) -> str | None:
    """evaluate.py's plan: a rank holds only the generator (weights, and vLLM's KV cache for `seqs`
    sequences of `max_context` tokens on CPU). None when it fits, else the one-line error."""
    if device == "cuda":  # vLLM takes its share of the GPU (gpu_memory_utilization) and sizes the cache itself
        return None
    s = shape(model_config(model))
    engine = _engine(engine, device)
    c = 2 if dtype == "bfloat16" else 4
    kv = vllm_cpu_kv_gib(s, dtype, max_context, seqs) * GB if engine == "vllm" else \
        sum(torch_engine_rows(s, c, max_context, seqs, device).values()) if engine == "torch" else 0.0
    need = rss_bytes() + IMPORTS_AFTER_PLAN + (VLLM_RUNTIME if engine == "vllm" else 0) + \
        max(4 * s.params, s.params * c + kv)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    budget, source = available(local, device)
    if need <= HEADROOM * budget:
        return None
    return (f"memory plan: a rank needs {need / GB:.1f} GB to generate ({kv / GB:.0f} GB of it KV cache for {seqs} "
            f"sequences of {max_context} tokens) but has {budget / GB:.1f} GB ({source}, {local} ranks here); "
            f"lower --chunk or --max-context, or use fewer ranks")

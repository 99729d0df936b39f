"""The generators behind engine.make_engine: vLLM (GPU or CPU build) and transformers' generate.

All vLLM specifics live here. vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and, under
torchrun, with the `external_launcher` executor, so each rank owns one engine in its own process and
`collective_rpc("reload_weights", ...)` can be handed a Python iterator of tensors (passing tensors as
RPC arguments across processes does not work). On GPU, `sleep()` discards weights and KV cache
(level 2); `sync_weights` brings back the weight memory only and reloads it, `wake()` then brings back
the KV cache, so the KV cache is never resident while the trainer streams full tensors in. vLLM's CPU
build has no sleep mode, so on CPU `sleep()` frees the same two things by hand (`release_cpu`): it
drops every linear layer's packed weight (vLLM's CPU layers multiply with a oneDNN or SGL copy of the
weight, held by the layer's `cpu_linear` closure) and shrinks the KV cache's storage to nothing. The
next `sync_weights` packs new weights (the reload repacks every layer it loads; `restore_cpu` packs the
rest, i.e. an LM head tied to the embedding) and `wake()` gives the KV cache its storage back, zeroed
(the CPU attention kernel reads masked slots too, so garbage there would be NaN). Every rank then holds
neither the KV cache nor the packed copies while the trainer updates (figures: docs/performance.md).

Test: tests/test_engine.py.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from pathlib import Path
from typing import Iterable

import torch

from infra.samples import Sample, Sampling, copy_weights
from infra.vllm_cpu import guard_llvmlite, release_cpu, restore_cpu

# oneDNN keeps every GEMM primitive (JIT-compiled kernel) it creates in a process-wide cache, 1024 entries by
# default. vLLM's CPU linear layers create one per distinct number of tokens in a forward pass, and
# multi-turn rollouts with prefix caching make almost every prefill's token count new: the cache filled
# with one-off kernels, which showed up as a steady growth of every rank's heap over a long run
# (bench/soak.py; figures: docs/reliability.md). A small cap bounds it: vLLM's per-layer handlers keep
# their own small cache of the shapes that recur (decode batch sizes), and a shape seen again after its
# eviction is only compiled again. Set before any primitive is created: oneDNN reads it once.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")



def cpu_supports_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 natively (AMX-BF16 or AVX512-BF16 in /proc/cpuinfo's flags). With
    them bf16 generates several times faster than fp32 (figures: docs/performance.md); without them oneDNN
    emulates bf16 and it gains little. False off Linux/x86. `torch.backends.cpu.get_cpu_capability()`
    cannot tell: it says "AVX512" with or without the bf16 extensions."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return bool({"amx_bf16", "avx512_bf16"} & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def vllm_available() -> bool:
    # find_spec, not import: importing vLLM here would fix its log level before VLLMEngine sets it
    return importlib.util.find_spec("vllm") is not None


def engine_kind(kind: str, device: str) -> str:
    """auto, by what was measured on each kind of machine (docs/performance.md):
    - a GPU: vLLM where installed, else the project's own decode loop (infra/decode.py; far faster there than
      transformers' generate by design, docs/gpu.md);
    - a CPU without native bf16 (AVX2 only: the model runs in float32): the project's decode loop, whose packed
      weights and one-pass attention loop decode a batch of 16 faster there than vLLM's CPU build, compiled or
      not (bench/generate.py --engine torch --levers --vllm compiled);
    - a CPU with native bf16 (AVX512-BF16, AMX): vLLM's CPU build where installed (its bf16 kernels; the decode
      loop is not measured there yet), else transformers' generate."""
    if kind != "auto":
        return kind
    if device.startswith("cuda"):
        return "vllm" if vllm_available() else "torch"
    if not cpu_supports_bf16():
        return "torch"
    return "vllm" if vllm_available() else "hf"


COMPILE_PARAMETERS = 50_000_000  # auto compiles from here up: SmolLM2-135M yes, the 1M-parameter test model no


def compiles(choice: str, model_dir: str, device: str) -> bool:
    """Whether vLLM runs the model through torch.compile. On GPU, auto is vLLM's own default (compiled,
    with CUDA graphs). On CPU the model otherwise runs eagerly, one kernel call per op: at SmolLM2's size a
    decode step is then well above what its memory traffic needs, and inductor's fused kernels bring it
    closer (bench/generate.py --compare; figures: docs/performance.md). Compiling lengthens start-up even
    with vLLM's compile cache filled, so auto leaves models under COMPILE_PARAMETERS eager: there the
    start-up would cost more than the decode it saves."""
    if choice not in ("auto", "on", "off"):
        raise ValueError(f"unknown compile choice {choice!r}; use auto, on or off")
    if choice != "auto":
        return choice == "on"
    return device != "cpu" or parameter_count(model_dir) >= COMPILE_PARAMETERS


def parameter_count(model_dir: str) -> int:
    """Parameters in a model directory's safetensors files, from their headers (no tensor is read)."""
    from safetensors import safe_open

    total = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                total += math.prod(st.get_slice(name).get_shape())
    return total


def kv_cache_bytes(model_dir: str, dtype: str, max_model_len: int, max_seqs: int, cap_gib: int = 8) -> int:
    """Bytes of KV cache for `max_seqs` sequences of `max_model_len` tokens, plus a quarter for prefix
    caching, at most `cap_gib` GiB: what the step's episodes need, to the byte (VLLM_CPU_KVCACHE_SPACE
    counts whole GiB: a 16-episode SmolLM2 batch of 660 tokens needs 0.15 GB, and would get 1 GiB). Too
    small a cache thrashes: preempted requests recompute (figures: docs/performance.md)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per_token = 2 * c.num_hidden_layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)  # K and V
    return int(min(cap_gib * 2**30, per_token * max_model_len * max_seqs * 1.25))


def vllm_environment(device: str, kv_cache_bytes: int | None = None) -> None:
    """The environment vLLM reads at start-up. The engine core must run in this process: sync_weights hands
    `reload_weights` an iterator over the trainer's tensors (CUDA tensors on a GPU), which cannot follow
    the engine into a child process. So VLLM_ENABLE_V1_MULTIPROCESSING is forced to 0, not defaulted: a
    preset `=1` would move a one-rank engine into a child (under torchrun the external launcher already
    keeps it here). In-process also starts several times sooner on a CPU (figures: docs/performance.md)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if device == "cpu" and kv_cache_bytes is None:  # vLLM's CPU default otherwise takes what it finds
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # ERROR only on CPU: the CPU build warns on every generate call ("doesn't allow to use
    # torch.set_num_threads after the thread binding") and about LD_PRELOAD allocators. On GPU keep
    # warnings: "Following weights were not loaded from checkpoint" is how a weight stream whose
    # names do not match shows up, and the generator would otherwise go on sampling from old weights.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR" if device == "cpu" else "WARNING")


class VLLMEngine:
    def __init__(self, model_dir, device, dtype, max_model_len, seed, gpu_memory_utilization,
                 kv_cache_bytes: int | None = None, compiled: bool = False, kv_cache_dtype: str = "auto"):
        vllm_environment(device, kv_cache_bytes)
        from vllm import LLM

        guard_llvmlite()
        options = dict(model=model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                       enforce_eager=not compiled,
                       enable_prefix_caching=True,      # each turn's prompt extends the last one
                       kv_cache_dtype=kv_cache_dtype)   # vLLM's own default is "auto" too
        if kv_cache_bytes is not None:  # the KV cache sized to the batch (make_engine), not in whole GiB
            options.update(kv_cache_memory_bytes=kv_cache_bytes)
        if device == "cuda":
            options.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # One engine per torchrun rank, in the rank's own process (no extra workers, no NCCL group).
            options.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        self.llm = LLM(**options)
        self.device, self.compiled = device, compiled
        self.released: set[str] = set()  # vLLM memory tags freed by sleep(): "weights", "kv_cache"

    def generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        if self.released:
            # A paused vLLM queues requests and never runs them: generate would hang, not fail.
            raise RuntimeError("engine is asleep: call sync_weights (the weights were discarded) and wake() first"
                               if "weights" in self.released else "engine is asleep: call wake() first")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        caps = params.caps(len(prompts))
        # Per-request seeds only on GPU: vLLM's CPU build rewinds a seeded request's generator when its
        # prefill is split into chunks, which CPU generators cannot do ("does not use offset"). On CPU
        # the engine-wide seed given at start-up keeps runs reproducible: the in-process sampler draws
        # from torch's global generator, whose state a checkpoint saves (checkpoint.restore_rng).
        seeds = params.seeds(len(prompts)) if self.device == "cuda" else [None] * len(prompts)
        # Explicit SamplingParams: vLLM applies generation_config.json's sampling defaults (top_k,
        # repetition_penalty, ...) only to requests that come without them.
        sps = [SamplingParams(max_tokens=cap, temperature=params.temperature, top_p=params.top_p, logprobs=0,
                              seed=seed, stop_token_ids=list(params.stop_ids), skip_special_tokens=False,
                              detokenize=False) for cap, seed in zip(caps, seeds)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
        samples = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            # With logprobs=0 each position holds the sampled token's entry.
            samples.append(Sample(ids, [pos[t].logprob for t, pos in zip(ids, o.logprobs)]))
        return samples

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if "weights" in self.released and self.device == "cuda":
            # Weight memory only: the KV cache stays free while the trainer's full tensors stream in;
            # wake() restores it. The woken weights are garbage until the reload below overwrites them.
            self.llm.wake_up(tags=["weights"])
        # `reload_weights` runs the model's own `load_weights` (which fuses q/k/v and gate/up) over the
        # iterator in place; it works only with the in-process executors chosen above.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        if "weights" in self.released and self.device != "cuda":
            self.llm.collective_rpc(restore_cpu, kwargs={"kv": False})  # pack what the reload did not
        self.released.discard("weights")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def close(self) -> None:
        """Shut vLLM down before the trainer's process group goes (its shutdown tears down groups)."""
        engine_core = getattr(self.llm.llm_engine, "engine_core", None)  # private: vLLM V1's in-process core
        if engine_core is not None:
            engine_core.shutdown()

    def sleep(self) -> None:
        """Free the memory of weights and KV cache. On GPU level 2 discards the weights instead of copying
        them to host memory (level 1): the next sync_weights overwrites them anyway. On CPU, by hand
        (module docstring)."""
        if not self.released:
            if self.device == "cuda":
                self.llm.sleep(level=2)
            else:
                self.llm.collective_rpc(release_cpu)
            self.released = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Restore the KV cache once the weights are back. After sleep() the weights come back only
        through sync_weights, so before it this does nothing (train.py calls `wake(); sync(...)`, then
        `wake()` before the next rollout); generate refuses to run on discarded weights."""
        if self.released == {"kv_cache"}:
            if self.device == "cuda":
                self.llm.wake_up(tags=["kv_cache"])  # vLLM resumes scheduling once nothing is left asleep
            else:
                self.llm.collective_rpc(restore_cpu, kwargs={"kv": True})
            self.released.clear()


class HFEngine:
    """transformers generation with left padding: slower than vLLM, needs nothing but torch."""

    def __init__(self, model_dir, device, dtype):
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        # Pitfall: `generate` fills every field left unset (None) in the config it is given from the
        # model's generation_config.json (repetition_penalty, top_k, min_p, suppress_tokens, ...), which
        # would sample off the distribution the trainer scores. A blank model config leaves only
        # transformers' global defaults to fill in, and `_generation_config` overrides the one of those
        # that is not neutral (top_k=50).
        self.model.generation_config = GenerationConfig()
        self.device = device
        self.pad = self.model.config.pad_token_id or 0

    def _generation_config(self, params: Sampling, max_new_tokens: int):
        from transformers import GenerationConfig

        sampling = {} if params.temperature == 0 else dict(  # greedy ignores these, and warns if given
            temperature=params.temperature, top_p=params.top_p, top_k=0)  # top_k=0: off (None means "default 50")
        return GenerationConfig(
            do_sample=params.temperature != 0, **sampling, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
            eos_token_id=list(params.stop_ids) or None, pad_token_id=self.pad,
            return_dict_in_generate=True, output_logits=True)  # logits: raw, before any processor

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        caps = params.caps(len(prompts))
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        # Fork the RNG of the device that samples, so a seeded call leaves the caller's RNG state alone.
        cuda = self.device.startswith("cuda")
        index = torch.device(self.device).index if cuda else None
        devices = [torch.cuda.current_device() if index is None else index] if cuda else []
        seed = params.seeds(len(prompts))[0]  # one generator for the whole batch: the first prompt's seed
        rng = torch.random.fork_rng(devices=devices) if seed is not None else contextlib.nullcontext()
        with rng:
            if seed is not None:
                torch.manual_seed(seed)
            out = self.model.generate(input_ids=ids, attention_mask=attn,
                                      generation_config=self._generation_config(params, max(caps)))
        new = out.sequences[:, width:]                                        # (B, N)
        # one step's raw logits (B, V) at a time: stacking all N steps in float32 cost 8 GB at 512 x 40 tokens
        # of a 49,152-token vocabulary (the GPU's peak it was measured in: docs/gpu.md)
        logp = torch.stack([torch.log_softmax(step.float(), -1).gather(-1, new[:, t, None]).squeeze(-1)
                            for t, step in enumerate(out.logits)], dim=1)     # (B, N)
        samples = []
        stops = set(params.stop_ids)
        for row, lp, cap in zip(new.tolist(), logp.tolist(), caps):
            n = 0
            while n < min(cap, len(row)):
                n += 1
                if row[n - 1] in stops:
                    break
            samples.append(Sample(row[:n], lp[:n]))
        return samples

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, named_tensors)

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass

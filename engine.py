"""The one boundary to the generator: vLLM (GPU build or CPU build) or a transformers fallback.

Both engines take token ids in and give token ids and their logprobs out, so the rollout never
decodes and re-encodes a history (DESIGN.md, token-exact rule):

    engine.generate(prompts: list[list[int]], params: Sampling) -> list[Sample(ids, logprobs)]
    engine.sync_weights(named_tensors)   # (name, full tensor) pairs in HF naming
    engine.sleep() / engine.wake()       # free / restore generation memory between rollouts

Logprobs are of the raw model distribution (before temperature and top-p), the same for both
engines, which is what the policy loss compares against at temperature 1.

All vLLM specifics live here. vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and, under
torchrun, with the `external_launcher` executor, so each rank owns one engine in its own process and
`collective_rpc("reload_weights", ...)` can be handed a Python iterator of tensors (passing tensors as
RPC arguments across processes does not work).

Pick one with `make_engine(model_dir, kind="auto"|"vllm"|"hf", ...)`: auto takes vLLM when it imports.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass
class Sampling:
    max_tokens: list[int] | int = 256  # per prompt, or one for all
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None            # None: nondeterministic; else each prompt i uses seed + i
    stop_ids: tuple[int, ...] = ()     # end-of-turn token ids; a stop token is kept in the output

    def caps(self, n: int) -> list[int]:
        return list(self.max_tokens) if isinstance(self.max_tokens, (list, tuple)) else [self.max_tokens] * n


@dataclass
class Sample:
    ids: list[int]         # sampled token ids, the stop token included when generation stopped on it
    logprobs: list[float]  # logprob of each sampled id under the generating weights


def vllm_available() -> bool:
    # find_spec, not import: importing vLLM here would fix its log level before VLLMEngine sets it
    return importlib.util.find_spec("vllm") is not None


def make_engine(model_dir: str, kind: str = "auto", device: str = "cpu", dtype: str = "float32",
                max_model_len: int = 4096, seed: int = 0, gpu_memory_utilization: float = 0.5):
    if kind == "auto":
        kind = "vllm" if vllm_available() else "hf"
    if kind == "vllm":
        return VLLMEngine(model_dir, device, dtype, max_model_len, seed, gpu_memory_utilization)
    if kind == "hf":
        return HFEngine(model_dir, device, dtype)
    raise ValueError(f"unknown engine {kind!r}; use auto, vllm or hf")


class VLLMEngine:
    def __init__(self, model_dir, device, dtype, max_model_len, seed, gpu_memory_utilization):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: 2 s start, not 12 s
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")          # GiB of KV cache on CPU
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its CPU-build warnings are noise here
        from vllm import LLM

        _guard_llvmlite()
        options = dict(model=model_dir, dtype=dtype, max_model_len=max_model_len, seed=seed,
                       enforce_eager=device == "cpu",  # the CPU backend has no graph capture
                       enable_prefix_caching=True)      # each turn's prompt extends the last one
        if device == "cuda":
            options.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # One engine per torchrun rank, in the rank's own process (no extra workers, no NCCL group).
            options.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        self.llm = LLM(**options)
        self.device = device
        self.asleep = False

    def generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        caps = params.caps(len(prompts))
        # Per-request seeds only on GPU: vLLM's CPU build rewinds a seeded request's generator when its
        # prefill is split into chunks, which CPU generators cannot do ("does not use offset"). On CPU
        # the engine-wide seed given at start-up keeps runs reproducible.
        per_request = params.seed is not None and self.device == "cuda"
        sps = [SamplingParams(max_tokens=cap, temperature=params.temperature, top_p=params.top_p, logprobs=0,
                              seed=params.seed + i if per_request else None,
                              stop_token_ids=list(params.stop_ids), skip_special_tokens=False,
                              detokenize=False) for i, cap in enumerate(caps)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
        samples = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            # With logprobs=0 each position holds the sampled token's entry.
            samples.append(Sample(ids, [pos[t].logprob for t, pos in zip(ids, o.logprobs)]))
        return samples

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # `reload_weights` runs the model's own `load_weights` (which fuses q/k/v and gate/up) over the
        # iterator in place; it works only with the in-process executors chosen above.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def close(self) -> None:
        """Shut vLLM down before the trainer's process group goes (its shutdown tears down groups)."""
        engine_core = getattr(self.llm.llm_engine, "engine_core", None)  # private: vLLM V1's in-process core
        if engine_core is not None:
            engine_core.shutdown()

    def sleep(self) -> None:
        if self.device == "cuda" and not self.asleep:
            self.llm.sleep(level=1)  # level 1 keeps weights in CPU memory, drops the KV cache
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _guard_llvmlite() -> None:
    """vLLM's start-up scan over every module attribute calls `vars(value)`. llvmlite's lazy library
    wrapper (loaded whenever numba is, e.g. by bm25s in the search env) answers any attribute, `__dict__`
    included, with a wrapped C function, and the scan dies on it ("'_lib_fn_wrapper' object has no
    attribute 'get'"). Pre-seed its lookup table so `__dict__` is a plain empty dict."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    fntab = getattr(getattr(ffi, "lib", None), "_fntab", None)  # private: llvmlite's cache of wrapped functions
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})


class HFEngine:
    """transformers generation with left padding: slower than vLLM, needs nothing but torch."""

    def __init__(self, model_dir, device, dtype):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        self.device = device
        self.pad = self.model.config.pad_token_id or 0

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        caps = params.caps(len(prompts))
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        greedy = params.temperature == 0
        rng = torch.random.fork_rng(devices=[]) if params.seed is not None else contextlib.nullcontext()
        with rng:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(
                input_ids=ids, attention_mask=attn, max_new_tokens=max(caps), do_sample=not greedy,
                temperature=None if greedy else params.temperature, top_p=None if greedy else params.top_p,
                top_k=None, eos_token_id=list(params.stop_ids) or None, pad_token_id=self.pad,
                return_dict_in_generate=True, output_logits=True)
        new = out.sequences[:, width:]                                        # (B, N)
        logits = torch.stack(out.logits, dim=1).float()                       # (B, N, V) raw logits
        logp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
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
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name in params:  # tied embeddings appear once in the model, maybe twice in the stream
                    params[name].copy_(tensor.to(params[name].dtype))

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass

"""The one boundary to the generator: vLLM (GPU build or CPU build), the project's decode loop, or transformers.

Every engine takes token ids in and gives token ids and their logprobs out, so the rollout never
decodes and re-encodes a history (docs/design.md, the token-exact rule):

    engine.generate(prompts: list[list[int]], params: Sampling) -> list[Sample(ids, logprobs)]
    engine.sync_weights(named_tensors)   # (name, full tensor) pairs in HF naming
    engine.sleep() / engine.wake()       # free / restore generation memory between rollouts

All sample from the raw model distribution with only temperature and top-p applied, the
distribution the trainer scores: no top-k, no repetition penalty, nothing else a model's
generation_config.json may ask for. Logprobs are of the raw model distribution (before temperature
and top-p), which is what the policy loss compares against at temperature 1. Generation stops on
`Sampling.stop_ids`; vLLM also stops on every eos id its model declares, so pass `stop_ids(model_dir)`
to get the same stops from every engine.

Pick one with `make_engine(model_dir, kind="auto"|"vllm"|"torch"|"hf", ...)`. auto, by what was measured on
each kind of machine (infra/engines.engine_kind; figures: docs/performance.md): on a GPU, vLLM when it imports,
else the project's own decode loop (`torch`, infra/decode.py: KV kept across turns, CUDA graphs); on a CPU that
multiplies bf16 natively, vLLM's CPU build when it imports, else transformers' generate (`hf`); on a CPU without
(AVX2 only, float32), the project's decode loop, which decodes there faster than vLLM's CPU build.
`cpu_supports_bf16()` says whether bfloat16 is the faster dtype on this CPU. The engines themselves are
machinery: infra/engines.py (vLLM, transformers) and infra/decode.py (the decode loop).
"""
from __future__ import annotations

import os

from infra.decode import TorchEngine
from infra.engines import (HFEngine, VLLMEngine, compiles, cpu_supports_bf16, engine_kind,  # noqa: F401
                           kv_cache_bytes, vllm_available, vllm_environment)
from infra.samples import Sample, Sampling, copy_weights  # noqa: F401  (the contract, re-exported)


def stop_ids(tokenizer_or_dir, model_dir: str | None = None) -> tuple[int, ...]:
    """Every end-of-generation id a model declares: the tokenizer's eos, then generation_config.json's
    `eos_token_id` (an int or a list; e.g. Qwen2.5-Instruct lists <|im_end|> and <|endoftext|>).
    Give a model directory, or a tokenizer plus optionally the directory holding generation_config.json.
    vLLM stops on all of these whatever it is asked; the HF engine and the rollout's "did it stop" test
    only know the ids they are given, so hand them this tuple (as `Sampling.stop_ids`)."""
    from transformers import AutoTokenizer, GenerationConfig

    if isinstance(tokenizer_or_dir, (str, os.PathLike)):
        model_dir = model_dir or str(tokenizer_or_dir)
        tokenizer_or_dir = AutoTokenizer.from_pretrained(tokenizer_or_dir)
    ids = [tokenizer_or_dir.eos_token_id]
    if model_dir is not None:
        try:
            eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        except OSError:  # no generation_config.json
            eos = None
        ids += [eos] if isinstance(eos, int) else list(eos or ())
    return tuple(dict.fromkeys(i for i in ids if i is not None))  # deduplicated, tokenizer's eos first


VLLM_OPTIONS = {"gpu_memory_utilization": 0.5, "compile": "auto", "kv_cache_dtype": "auto"}


def make_engine(model_dir: str, kind: str = "auto", device: str = "cpu", dtype: str = "float32",
                max_model_len: int = 4096, seed: int = 0, max_seqs: int = 32, vllm: dict | None = None):
    """`max_seqs`: how many episodes one generate call carries (this rank's batch); on CPU the KV cache
    is sized to hold them all at full context (`kv_cache_bytes`), unless VLLM_CPU_KVCACHE_SPACE is set.
    `vllm`: vLLM's own options over VLLM_OPTIONS: `gpu_memory_utilization`; `compile`: on, off, or auto
    (`compiles`); `kv_cache_dtype`: auto (the model's dtype) or one of vLLM's, e.g. fp8_e4m3, which
    `bench/generate.py --kv-cache-dtype` measures."""
    kind = engine_kind(kind, device)
    if vllm and set(vllm) - set(VLLM_OPTIONS):
        raise ValueError(f"unknown vLLM options {sorted(set(vllm) - set(VLLM_OPTIONS))}; known: {sorted(VLLM_OPTIONS)}")
    if kind == "vllm":
        opts = {**VLLM_OPTIONS, **(vllm or {})}
        gpu_memory_utilization, compile, kv_cache_dtype = (opts[k] for k in VLLM_OPTIONS)
        kv = None
        if device == "cpu" and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kv = kv_cache_bytes(model_dir, dtype, max_model_len, max_seqs)
        return VLLMEngine(model_dir, device, dtype, max_model_len, seed, gpu_memory_utilization, kv_cache_bytes=kv,
                          compiled=compiles(compile, model_dir, device), kv_cache_dtype=kv_cache_dtype)
    if kind == "hf":
        return HFEngine(model_dir, device, dtype)
    if kind == "torch":
        return TorchEngine(model_dir, device, dtype, seed)
    raise ValueError(f"unknown engine {kind!r}; use auto, vllm, torch or hf")

"""vLLM's CPU build, where it lacks what the GPU build has: sleep mode, and a start-up that survives numba.

The CPU build packs each linear layer's weight into a second, kernel-friendly copy, and has no sleep
mode; engine.VLLMEngine's `sleep()` frees the packed copies and the KV cache's storage by hand
(`release_cpu`, run inside the in-process worker), and `restore_cpu` packs the reloaded weights and gives
the KV cache its storage back. `guard_llvmlite` keeps vLLM's start-up scan from dying on llvmlite.
"""
from __future__ import annotations

import sys

import torch


def release_cpu(worker) -> None:
    """Runs in the (in-process) CPU worker: drop every packed linear weight, shrink the KV cache's
    storage to 0 bytes (its layers' tensors are views of one storage; they stay valid objects)."""
    runner = worker.model_runner
    for module in runner.get_model().modules():
        if getattr(module, "cpu_linear", None) is not None:
            module.cpu_linear = None  # the closure held the packed copy; a generate now fails loudly
    storages = {}
    for t in runner.kv_caches:
        storage = t.untyped_storage()
        storages.setdefault(storage.data_ptr(), (storage, storage.nbytes()))
    runner.released_kv = list(storages.values())
    for storage, _ in runner.released_kv:
        storage.resize_(0)


def restore_cpu(worker, kv: bool) -> None:
    """Runs in the CPU worker after a weight reload: pack the linear layers the reload left without a
    packed weight (kv False), or give the KV cache its storage back, zeroed (kv True; the prefix cache
    was reset by the reload)."""
    runner = worker.model_runner
    if kv:
        for storage, size in getattr(runner, "released_kv", []):
            storage.resize_(size)
            # Zeroed, not merely stale: the CPU attention kernel reads whole blocks, masked slots included,
            # and a NaN left there by the allocator's last user turns every softmax into NaN.
            torch.empty(0, dtype=torch.uint8).set_(storage).zero_()
        runner.released_kv = []
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in runner.get_model().modules():
        if hasattr(module, "cpu_linear") and module.cpu_linear is None:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # e.g. a head tied to the embedding


def guard_llvmlite() -> None:
    """vLLM's start-up scan over every module attribute calls `vars(value)`. llvmlite's lazy library
    wrapper (loaded whenever numba is, e.g. by bm25s in the search env) answers any attribute, `__dict__`
    included, with a wrapped C function, and the scan dies on it ("'_lib_fn_wrapper' object has no
    attribute 'get'"). Pre-seed its lookup table so `__dict__` is a plain empty dict."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    fntab = getattr(getattr(ffi, "lib", None), "_fntab", None)  # private: llvmlite's cache of wrapped functions
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})

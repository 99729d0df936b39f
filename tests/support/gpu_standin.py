"""A CPU stand-in for vLLM on a GPU, to run train.py's GPU call sequence on this machine.

`StandInLLM` offers the part of `vllm.LLM` that `engine.VLLMEngine` calls (generate, sleep, wake_up,
collective_rpc("reload_weights"), reset_prefix_cache) over a real transformers model (`engine.HFEngine`),
with vLLM's GPU sleep mode as read in the vllm 0.33 sources: `sleep(level=2)` discards the weights (here
they become NaN) and the KV cache, `wake_up(tags)` maps the named ones back, and nothing can generate
while any of them sleeps (vLLM itself would queue the requests and never run them: here it raises).
Every call is appended to `$GPU_STANDIN_LOG/rank<r>.jsonl`, and rank 0 also prints it as a
`[stand-in] ...` line, so a test sees it in order with train.py's own output.

`tests/support/gpu_run.py` runs train.py with every rank's generator a `VLLMEngine` in GPU mode (per-request
seeds, sleep and wake active) around this stand-in; the trainer itself runs on the CPU.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from engine import HFEngine, Sampling, VLLMEngine


def _request_types() -> None:
    """Where vLLM is not installed (the GPU image: its wheel is too large to carry there), stand in for
    the two request types `VLLMEngine.generate` builds, `vllm.SamplingParams` and
    `vllm.inputs.TokensPrompt`, as plain records of their keyword arguments: StandInLLM reads them back."""
    try:
        import vllm  # noqa: F401
        return
    except ImportError:
        pass
    import importlib.machinery
    import sys
    import types

    module, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs.TokensPrompt = dict
    module.inputs = inputs
    sys.modules.update({"vllm": module, "vllm.inputs": inputs})


_request_types()


class StandInLLM:
    def __init__(self, model_dir: str, dtype: str):
        self.hf = HFEngine(model_dir, "cpu", dtype)
        self.asleep: set[str] = set()
        self.rank = int(os.environ.get("RANK", 0))
        self.log = Path(os.environ["GPU_STANDIN_LOG"]) / f"rank{self.rank}.jsonl" if "GPU_STANDIN_LOG" in os.environ \
            else None
        self.llm_engine = SimpleNamespace(engine_core=None)  # what VLLMEngine.close looks for

    def record(self, call: str, **info) -> None:
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps({"call": call, **info}) + "\n")
        if self.rank == 0:
            print(f"[stand-in] {call} {json.dumps(info)}", flush=True)

    def generate(self, prompts, sampling_params, use_tqdm=False):
        seeds = [p.seed for p in sampling_params]
        self.record("generate", prompts=len(prompts), seeds=seeds)
        if self.asleep:
            raise RuntimeError(f"generate while {sorted(self.asleep)} sleep: vLLM would never run these requests")
        first = sampling_params[0]  # transformers samples a batch from one generator: the first request's seed
        samples = self.hf.generate([list(p["prompt_token_ids"]) for p in prompts], Sampling(
            [p.max_tokens for p in sampling_params], first.temperature, first.top_p, first.seed,
            tuple(first.stop_token_ids)))
        for s in samples:
            if not all(math.isfinite(x) for x in s.logprobs):
                raise RuntimeError("sampled from discarded weights (NaN): a sleep was not followed by a weight reload")
        return [SimpleNamespace(outputs=[SimpleNamespace(
            token_ids=s.ids, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(s.ids, s.logprobs)])])
            for s in samples]

    def sleep(self, level: int = 1):
        self.record("sleep", level=level)
        if level == 2:  # discarded, not offloaded: garbage until reloaded
            with torch.no_grad():
                for p in self.hf.model.parameters():
                    p.fill_(float("nan"))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        self.record("wake_up", tags=tags)
        self.asleep -= set(tags or ("weights", "kv_cache"))

    def collective_rpc(self, method, kwargs):
        self.record(method)
        if "weights" in self.asleep:
            raise RuntimeError("reload_weights into weight memory that sleeps")
        assert method == "reload_weights"
        self.hf.sync_weights(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        self.record("reset_prefix_cache")


def standin_engine(model_dir, kind="auto", device="cpu", dtype="float32", max_model_len=4096, seed=0,
                   max_seqs=32, vllm=None) -> VLLMEngine:
    """make_engine's signature: a VLLMEngine as on a GPU (device "cuda"), around a StandInLLM."""
    engine = VLLMEngine.__new__(VLLMEngine)  # its methods as they are; only the vLLM object is stood in for
    engine.llm, engine.device, engine.released = StandInLLM(model_dir, dtype), "cuda", set()
    engine.compiled = (vllm or {}).get("compile", "auto") != "off"  # vLLM's default on a GPU
    return engine

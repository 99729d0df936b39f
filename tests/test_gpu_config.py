"""The GPU path's set-up, checked on the CPU: the device each rank takes, the dtype of the tiny model, the
environment vLLM starts in, vLLM's share of the GPU, and the memory plan's GPU rows (memplan.py).

No GPU is needed: a node's GPU count is an argument of the pure functions, and where a function reads
torch.cuda itself the count is set with monkeypatch (the one thing this machine cannot have).
"""
import os

import pytest
import torch

import config
import engine
import evaluate
from infra import memplan

GB = memplan.GB


def gpus(monkeypatch, n: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


@pytest.mark.parametrize("ranks, count, want", [(1, 0, "cpu"), (1, 1, "cuda"), (2, 1, "cpu"), (8, 8, "cuda"),
                                                (2, 4, "cuda")])
def test_auto_takes_the_gpus_only_when_every_rank_has_one(ranks, count, want):
    # each rank calls set_device(LOCAL_RANK): 2 ranks on 1 GPU died with "invalid device ordinal"
    assert config.pick_device("auto", ranks, count) == want
    assert config.pick_device("cpu", ranks, count) == "cpu"


def test_derive_runs_two_ranks_on_the_cpu_of_a_one_gpu_node(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert config.derive(config.parse(["--env", "textcraft"])).device == "cpu"
    assert evaluate.derive(evaluate.parse(["--env", "textcraft"])).device == "cpu"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert config.derive(config.parse(["--env", "textcraft"])).device == "cuda"


def test_explicit_cuda_with_too_few_gpus_is_one_line_naming_the_fix(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    problem = config.check(config.parse(["--env", "textcraft", "--device", "cuda"]), 2)
    assert problem and "--nproc_per_node 1" in problem and "\n" not in problem
    problem = evaluate.check(evaluate.parse(["--env", "textcraft", "--device", "cuda"]))
    assert problem and "--nproc_per_node 1" in problem
    gpus(monkeypatch, 0)
    assert "no GPU" in config.check(config.parse(["--env", "textcraft", "--device", "cuda"]), 2)


def test_the_tiny_model_stays_float32_on_a_gpu():
    # config's own rule: the tiny model tests the machinery at float32 precision, on every device
    assert config.compute_dtype("auto", "cuda", "tiny") == "float32"
    assert config.compute_dtype("auto", "cuda", "smollm2") == "bfloat16"
    assert config.compute_dtype("bfloat16", "cuda", "tiny") == "bfloat16"  # an explicit choice stands


def test_vllm_runs_in_process_even_when_the_environment_says_otherwise(monkeypatch):
    # a child process could not iterate the trainer's CUDA tensors in sync_weights
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine.vllm_environment("cuda")
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_gpu_memory_utilization_is_a_checked_flag_the_plan_uses(monkeypatch):
    monkeypatch.setenv("AGENTGYM_MEMORY_GB", "80")
    cfg = config.parse(["--model", "smollm2", "--env", "babyai", "--engine", "vllm", "--gpu-memory-utilization", "0.3"])
    assert cfg.gpu_memory_utilization == 0.3
    plan = memplan.rank_plan(cfg, 1, "cuda", "bfloat16")
    assert plan["rollout"]["generator (awake)"] == pytest.approx(0.3 * 80 * GB)
    for bad in ("0", "1.2"):
        problem = config.check(config.parse(["--env", "textcraft", "--gpu-memory-utilization", bad]), 1)
        assert problem and problem.startswith("--gpu-memory-utilization")


def smollm2_plan(**kw):
    s = memplan.shape(memplan.model_config("smollm2"))
    return memplan.plan(s, **{**dict(world=8, dtype="bfloat16", checkpointing=False, tokens=4096, kl=True,
                                     engine="vllm", device="cuda"), **kw})


def test_a_sleeping_vllm_still_holds_gpu_memory():
    # sleep(level=2) frees weights and KV cache; CUDA graphs and runtime buffers stay (about 1-4 GB)
    train = smollm2_plan()["train"]
    assert train["generator (asleep)"] == memplan.VLLM_GPU_ASLEEP >= 1 * GB


def test_min_groups_keeps_the_gradients_through_the_rollout():
    plain, kept = smollm2_plan()["rollout"], smollm2_plan(grads_resident=True)["rollout"]
    assert "sharded fp32 gradients" not in plain
    assert kept["sharded fp32 gradients"] == smollm2_plan()["train"]["sharded fp32 gradients"] > 0
    cfg = config.parse(["--model", "smollm2", "--env", "babyai", "--min-groups", "2", "--engine", "hf"])
    assert "sharded fp32 gradients" in memplan.rank_plan(cfg, 2, "cpu", "bfloat16")["rollout"]


def test_the_full_copy_rank_0_loads_is_host_memory_on_a_gpu():
    gpu, cpu = smollm2_plan(), smollm2_plan(device="cpu")
    P = gpu["params"]
    assert gpu["host"] == {"the whole model in fp32 (rank 0)": 4 * P}
    assert sum(gpu["load"].values()) == pytest.approx(4 * P / 8)  # only the arriving shards
    assert cpu["load"]["the whole model in fp32"] == 4 * P and not cpu["host"]
    # a 7B model on 8 GPUs: loading puts 1/8 of 4P on each GPU, not the whole 4P of rank 0's host copy
    s = memplan.shape(memplan.model_config("qwen2.5-7b"))
    big = memplan.plan(s, 8, "bfloat16", True, 4096, True, "vllm", "cuda", gpu_util=0.1)
    assert sum(big["load"].values()) < 4 * big["params"] / 7

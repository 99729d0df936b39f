"""The GPU path's set-up, checked on the CPU: the device each rank takes, the dtype of the tiny model, the
environment vLLM starts in, vLLM's share of the GPU, the memory plan's GPU rows (memplan.py), and the lent
GPU's plan (bench/gpu_plan.py): every phase's timeout above what it needs, the calls inside the device time.

No GPU is needed: a node's GPU count is an argument of the pure functions, and where a function reads
torch.cuda itself the count is set with monkeypatch (the one thing this machine cannot have).
"""
import importlib.util
import os
import sys
import threading

import pytest
import torch

from launch import checks
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
    assert checks.pick_device("auto", ranks, count) == want
    assert checks.pick_device("cpu", ranks, count) == "cpu"


def test_derive_runs_two_ranks_on_the_cpu_of_a_one_gpu_node(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert checks.derive(config.parse(["--env", "textcraft"])).device == "cpu"
    assert evaluate.derive(evaluate.parse(["--env", "textcraft"])).device == "cpu"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert checks.derive(config.parse(["--env", "textcraft"])).device == "cuda"


def test_explicit_cuda_with_too_few_gpus_is_one_line_naming_the_fix(monkeypatch):
    gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    problem = checks.check(config.parse(["--env", "textcraft", "--device", "cuda"]), 2)
    assert problem and "--nproc_per_node 1" in problem and "\n" not in problem
    problem = evaluate.check(evaluate.parse(["--env", "textcraft", "--device", "cuda"]))
    assert problem and "--nproc_per_node 1" in problem
    gpus(monkeypatch, 0)
    assert "no GPU" in checks.check(config.parse(["--env", "textcraft", "--device", "cuda"]), 2)


def test_the_tiny_model_stays_float32_on_a_gpu():
    # checks' own rule: the tiny model tests the machinery at float32 precision, on every device
    assert checks.compute_dtype("auto", "cuda", "tiny") == "float32"
    assert checks.compute_dtype("auto", "cuda", "smollm2") == "bfloat16"
    assert checks.compute_dtype("bfloat16", "cuda", "tiny") == "bfloat16"  # an explicit choice stands


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
        problem = checks.check(config.parse(["--env", "textcraft", "--gpu-memory-utilization", bad]), 1)
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


def bench_module(name: str):
    """bench/<name>.py loaded by path (bench/ on sys.path would shadow envs/ in later subprocesses)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "..", "bench",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SLOW = {"batches": {"512": {"decode_ms_per_step": 20.0, "prefill_tokens_per_s": 50_000.0}}}  # 4x the assumed figures


@pytest.mark.parametrize("bench", [None, SLOW])
def test_every_gpu_scale_phase_has_time_to_save_and_part_b_fits_its_budget(bench):
    """GPU scale once set --rl-seconds 330 under a 300-s timeout: GRPO and its control were killed before they
    saved (train.py saves after the step in which the seconds ran out, and start-up comes first)."""
    g = bench_module("gpu_plan")
    s = g.scale(dry=False)
    est = g.estimate(s, bench)
    plan = g.plan_b(s, est, g.BUDGET["B"], g.RESERVE["B"])
    assert 30 <= plan["rl_seconds"] <= s["rl_seconds"]
    for name, phase in plan["phases"].items():
        assert phase["timeout"] > phase["need"] > 0, name
    n = g.needs({**s, "rl_seconds": plan["rl_seconds"]}, est)
    # one step past the seconds, after the start-up, then the save; each arm gets the same seconds
    assert n["b2-rl"] >= plan["rl_seconds"] + est["grpo_step_s"] + g.STARTUP_S + g.SAVE_S
    assert min(n[arm] for arm in g.ARMS) >= plan["rl_seconds"] + g.STARTUP_S + g.SAVE_S
    # the stages one after another (side-by-side phases once), worst case: each phase runs to its timeout
    assert plan["timeouts_s"] + g.RESERVE["B"] <= g.BUDGET["B"]
    # at run time RL is fitted again into what is really left: its timeouts and the later phases' fit there
    for left in (200, 300, 400):
        rl = g.fit_rl(s, est, left)
        n = g.needs({**s, "rl_seconds": rl}, est)
        after = g.timeout_for(n["b3-eval"]) + 3 * g.timeout_for(n["b4-report"])
        assert rl == 30 or g.timeout_for(max(n[arm] for arm in g.ARMS)) + after <= left


def test_the_set_up_call_and_part_b_fit_the_device_time_with_the_machines_start():
    g = bench_module("gpu_plan")
    plan = g.DEVICE_PLAN
    assert sum(plan.values()) <= g.DEVICE_S == 15 * 60
    assert plan["machine start"] >= 60  # "a minute or more"
    assert plan["set-up call"] >= g.BUDGET["setup"] >= g.CHECK_S + g.GENERATE_S
    assert plan["part B call"] >= g.BUDGET["B"]
    assert max(g.BUDGET["setup"], g.BUDGET["B"]) + 30 <= 600  # one command's limit on the lent machine


def test_phases_side_by_side_record_their_rows_under_the_lock(tmp_path):
    g = bench_module("gpu_run")
    phases = g.Phases(tmp_path, timeout=60)
    rows = phases.parallel([(f"p{i}", [sys.executable, "-c", "pass"]) for i in range(6)])
    assert sorted(r["phase"] for r in phases.rows) == [f"p{i}" for i in range(6)] and all(r["code"] == 0 for r in rows)
    with phases.lock:  # a phase that has finished waits for the lock before it touches the rows
        worker = threading.Thread(target=phases.run, args=("late", [sys.executable, "-c", "pass"]))
        worker.start()
        worker.join(10)
        assert worker.is_alive() and "late" not in {r["phase"] for r in phases.rows}
    worker.join(60)
    assert "late" in {r["phase"] for r in phases.rows}

"""Smoke and learning runs of the real entry point under torchrun (2 CPU ranks, gloo, FSDP2, the vLLM
CPU engine when installed), plus the config checks that must fail fast with a one-line message."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch import checks
import config
from config import Config

ROOT = Path(__file__).resolve().parent.parent


def torchrun(args, nproc=2, timeout=600, script="train.py"):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           script, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("cfg, needle", [
    (Config(env="nope"), "unknown env 'nope'"),
    (Config(algo="ppo2"), "choose one of: grpo"),
    (Config(tasks_per_step=3, samples_per_task=1, algo="reinforce++"), "multiple of 2"),
    (Config(samples_per_task=1), "--samples-per-task 2 or more"),
    (Config(horizon="30,20@10"), "--horizon"),
    (Config(horizon="10,20"), "--horizon"),
    (Config(env_options="[1]"), "JSON object"),
    (Config(env_options="{oops"), "JSON object"),
    (Config(max_tokens=4096, max_context=1024), "raise the context"),
    (Config(model="/nonexistent/dir"), "cannot be loaded"),
    (Config(agg="mean"), "--agg"),
    (Config(dual_clip=0.5), "--dual-clip"),
    (Config(steps=0), "--steps 0 trains nothing without a warm start"),
    (Config(steps=-1, env="babyai", bc_episodes=4), "--steps must be positive"),
    (Config(bc_seconds=-1), "--bc-seconds must be >= 0"),
    (Config(env="babyai", bc_episodes=4, bc_play_seconds=5), "it needs --bc-actor policy"),
    (Config(env="babyai", bc_episodes=4, bc_actor="policy", bc_seconds=10, bc_play_seconds=10), "leaves nothing"),
    (Config(rl_seconds=-5), "--rl-seconds must be >= 0"),
    (Config(gpu_memory_utilization=1.0), "--gpu-memory-utilization must be in (0, 1)"),
    (Config(eval_turns=-2), "--eval-turns"),
    (Config(min_groups=-1), "--min-groups must be >= 0"),
    (Config(env="babyai", refusal_penalty=-0.1), "--refusal-penalty must be >= 0"),
    (Config(refusal_penalty=0.05), "textcraft does not, set --refusal-penalty 0"),
    (Config(min_groups=4, mini_batches=2), "--min-groups adds up"),
    (Config(bc_anchor=8), "textcraft has none, set --bc-anchor 0"),
    (Config(env="babyai", bc_anchor=8, bc_coef=-1), "--bc-coef must be >= 0"),
    (Config(train_layers=15), "--train-layers 15 but tiny has 2 decoder blocks"),
    (Config(checkpoint_format="zip"), "--checkpoint-format"),
    (Config(dynamic_sampling=-1), "--dynamic-sampling must be >= 0"),
    (Config(sometimes_solved=-3), "--sometimes-solved must be >= 0"),
    (Config(dynamic_sampling=2, curriculum=True), "--curriculum chooses the step's tasks"),
    (Config(sometimes_solved=5, curriculum=True), "--curriculum chooses the step's tasks"),
    (Config(dynamic_sampling=2, algo="reinforce++"), "--algo reinforce++ trains on those too"),
    (Config(dynamic_sampling=2, tasks_per_step=2, samples_per_task=3), "multiple of the 2 ranks"),
    (Config(sometimes_solved=5, algo="reinforce++", samples_per_task=1, tasks_per_step=2), "--sometimes-solved weighs"),
])
def test_config_check_names_the_fix(cfg, needle):
    problem = checks.check(cfg, world=2)
    assert problem is not None and needle in problem and "\n" not in problem


def test_config_default_is_valid_and_presets_apply():
    assert checks.check(Config(), world=2) is None
    # imitation only (the time-matched control of RL): no RL step after a warm start is a valid run
    assert checks.check(Config(env="babyai", steps=0, bc_episodes=4, bc_seconds=60), world=2) is None
    cfg = config.parse(["--preset", "paper", "--env", "babyai", "--lr", "2e-6"])
    assert (cfg.model, cfg.horizon, cfg.tasks_per_step, cfg.samples_per_task) == ("Qwen/Qwen2.5-7B-Instruct", "6,13,20@100", 32, 4)
    assert cfg.lr == 2e-6 and cfg.kl_coef == 0.001
    assert config.parse(["--no-grpo-std"]).grpo_std is False


def test_config_is_a_leaf():
    """Reading a run's settings (config.py, infra/recipes.py's presets) loads no torch, model, engine, environment,
    tracker or memory plan: those are launch/checks.py's, and the set-up's."""
    heavy = ("torch", "transformers", "engine", "envs", "infra.memplan", "infra.trackers", "algorithms", "checks")
    code = ("import sys, config, infra.recipes; config.parse([]); config.parse(['--preset', 'paper', '--env', 'babyai']); "
            f"config.preset('smollm2', 'miniwob'); print([m for m in {heavy!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_bad_config_stops_before_start_up_with_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no java on PATH
    for args, needle in ((["--env", "nope"], "unknown env"), (["--env", "sciworld"], "Java 17")):
        proc = subprocess.run([sys.executable, "train.py", *args, "--out", str(tmp_path / "x")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
        assert not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce++", "ppo", "gigpo"])
def test_two_steps_of_each_algorithm_save_and_resume(tmp_path, algo):
    out = tmp_path / algo
    # grpo runs the default engine (vLLM's CPU build where installed), the others the project's decode loop:
    # the algorithm is the subject here, every engine's bookkeeping is token-exact (tests/test_rollout.py),
    # and vLLM's start-up (about 13 CPU s a rank) would double each run's CPU seconds
    engine = "auto" if algo == "grpo" else "torch"
    common = ["--env", "tests.support.toy:Digits", "--algo", algo, "--engine", engine, "--horizon", "1,2,3@1",
              "--max-tokens", "8", "--out", str(out), "--tasks-per-step", "2", "--samples-per-task", "4",
              "--mini-batches", "2"]
    torchrun(common + ["--steps", "2", "--save-every", "1"])
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1] and [r["horizon"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["entropy"] > 0 and r["response_tokens"] > 0 for r in rows)
    assert all(r["mem/rss_mb"] > 100 and r["mem/heap_mb"] > 10 and r["time/trim"] >= 0 for r in rows)  # --trim-heap on
    if algo == "ppo":
        assert all(r["value_loss"] > 0 for r in rows)
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert ckpt.name == "step_000002"
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    assert AutoTokenizer.from_pretrained(ckpt / "policy").eos_token == "<|im_end|>"
    assert sum(p.numel() for p in model.parameters()) > 0
    if algo in ("grpo", "ppo"):  # resume: the step, horizon stage and data continue where they stopped
        torchrun(common + ["--steps", "3", "--resume"])
        rows = metrics(out)
        assert [r["step"] for r in rows] == [0, 1, 2] and rows[2]["horizon"] == 3


@pytest.mark.slow
def test_grpo_learns_a_toy_task(tmp_path):
    """From a random tiny model, reward near 0 (digit share of random tokens) to well above 0.5 (the project's
    decode loop generates: vLLM's start-up would cost more than the 40 steps' generation)."""
    torchrun(["--env", "tests.support.toy:Digits", "--env-options", '{"turns": 1}', "--engine", "torch", "--steps", "40",
              "--horizon", "1", "--tasks-per-step", "8", "--samples-per-task", "8", "--max-tokens", "4", "--kl-coef", "0",
              "--lr", "1e-2", "--eval-every", "20", "--eval-tasks", "8", "--out", str(tmp_path)])
    rows = metrics(tmp_path)
    rewards = [r["reward"] for r in rows]
    assert sum(rewards[:2]) / 2 < 0.1
    assert sum(rewards[-3:]) / 3 > 0.5, rewards
    evals = [r["eval/reward"] for r in rows if "eval/reward" in r]  # greedy, on held-out tasks
    assert len(evals) == 2 and evals[-1] > 0.5, evals
    assert (tmp_path / "reward.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("engine, nproc", [("vllm", 2), ("hf", 1), ("torch", 2)])
def test_synced_weights_reach_the_engine(engine, nproc):
    if engine == "vllm":
        pytest.importorskip("vllm")
    proc = torchrun([engine], nproc=nproc, script="tests/support/sync_check.py")
    diff = float(proc.stdout.split("max logprob diff:")[1].split()[0])
    assert diff < 1e-4


@pytest.mark.slow
def test_one_step_on_a_real_env_whose_imports_load_numba(tmp_path):
    """The search env imports bm25s, which loads numba/llvmlite before the engine starts; vLLM's
    start-up must survive that (infra.vllm_cpu.guard_llvmlite)."""
    torchrun(["--env", "searchqa", "--steps", "1", "--horizon", "2", "--tasks-per-step", "2",
              "--samples-per-task", "2", "--max-tokens", "16", "--out", str(tmp_path)])
    (row,) = metrics(tmp_path)
    assert row["turns"] > 0 and row["end/env_error"] == 0


def test_plain_python_runs_the_same_code_as_one_rank(tmp_path):
    proc = subprocess.run([sys.executable, "train.py", "--env", "tests.support.toy:Digits", "--steps", "1", "--engine", "hf",
                           "--max-tokens", "6", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = metrics(tmp_path)
    assert row["turns"] == 2 and (tmp_path / "checkpoints" / "latest").exists()
    # one rank reduces nothing, so the memory plan turned --grad-reduce auto into micro-batch, and said so
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["grad_reduce"] == "micro-batch" and saved["memplan"] == {"grad_reduce": ["auto", "micro-batch"]}


def test_agentgym_tasks_file_and_framing_train_one_step(tmp_path):
    """Paper mode through train.py: the tasks file replaces the train split, AgentGym's framing opens
    every episode (one process, the transformers engine: the wiring, not learning)."""
    tasks = tmp_path / "babyai_train.json"
    tasks.write_text(json.dumps([{"item_id": "babyai_93"}, {"item_id": "babyai_5"}, "babyai_7"]))
    cmd = [sys.executable, "train.py", "--env", "babyai", "--tasks-file", str(tasks), "--prompt-style", "agentgym",
           "--steps", "1", "--engine", "hf", "--tasks-per-step", "2", "--samples-per-task", "2", "--max-tokens", "8",
           "--horizon", "2", "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"training on the 3 tasks of {tasks}" in proc.stdout
    assert len(metrics(tmp_path / "run")) == 1


def standin_run(args, log_dir, nproc=2):
    """train.py under torchrun with every rank's generator a VLLMEngine in GPU mode around a CPU stand-in
    for vLLM (tests/support/gpu_standin.py): sleep level 2 discards weights and KV cache, generate refuses to run
    on either while it sleeps, every request carries its own seed. Returns (stdout, [calls of each rank])."""
    log_dir.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           "tests/support/gpu_run.py", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "GPU_STANDIN_LOG": str(log_dir)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    calls = [[json.loads(line) for line in (log_dir / f"rank{r}.jsonl").read_text().splitlines()] for r in range(nproc)]
    return proc.stdout, calls


def test_gpu_standin_takes_make_engines_arguments():
    """The GPU stand-in replaces `make_engine` in the runs below: a parameter added to one and not the
    other fails here in a second, not in the slow runs' child processes."""
    import inspect
    import engine
    from tests.support.gpu_standin import standin_engine
    assert list(inspect.signature(standin_engine).parameters) == list(inspect.signature(engine.make_engine).parameters)


@pytest.mark.slow
def test_gpu_call_sequence_warm_start_and_evaluations(tmp_path):
    """The GPU engine's call sequence with a warm start and an evaluation after every step: the engine
    sleeps while the warm start trains beside it (on a GPU it would hold half the memory), the weights
    come back by the sync, and every evaluation wakes the KV cache before generating (after a sync it
    still sleeps: the evaluation used to fail there with "engine is asleep"). The sampler's logprobs of
    the trained tokens match the trainer's, so the engine samples from the warm-started policy."""
    pytest.importorskip("vllm")  # engine.VLLMEngine.generate builds vLLM's request objects
    out = tmp_path / "run"
    stdout, calls = standin_run(["--env", "babyai", "--bc-episodes", "4", "--bc-batch", "2", "--eval-every", "1",
                                 "--eval-tasks", "2", "--steps", "2", "--horizon", "2", "--tasks-per-step", "2",
                                 "--samples-per-task", "2", "--max-tokens", "8", "--out", str(out)], tmp_path / "calls")
    lines = stdout.splitlines()
    at = lambda needle: next(i for i, line in enumerate(lines) if needle in line)  # noqa: E731
    first_call = next(i for i, line in enumerate(lines) if "[stand-in]" in line)
    # "expert episodes in": the warm start's own first line (the config summary also names the warm start)
    assert "[stand-in] sleep" in lines[first_call] and first_call < at("expert episodes in") < at("warm start done")
    assert at("warm start done") < at("[stand-in] reload_weights") < at("[stand-in] generate")
    for rank_calls in calls:
        names = [c["call"] for c in rank_calls]
        assert names[0] == "sleep" and names.count("sleep") == 3  # the warm start, then each step's update
        assert names.count("reload_weights") == 3 and names.count("generate") > 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1] and all("eval/success" in r for r in rows)
    assert "eval_start/success" in rows[0]
    assert all(r["sampler_gap"] < 1e-3 for r in rows), [r["sampler_gap"] for r in rows]


@pytest.mark.slow
def test_no_two_replies_of_a_run_share_a_seed_when_groups_span_ranks(tmp_path):
    """One task of 4 samples on 2 ranks: its group is split, 2 episodes on each rank. vLLM on a GPU seeds
    every request on its own; seeded per rank as `base + rank + i`, rank 0's second episode and rank 1's
    first got the same seed for the same task, and GRPO compared two identical samples. Every request
    of every step and turn, on every rank, now has a seed of its own."""
    pytest.importorskip("vllm")
    _, calls = standin_run(["--env", "tests.support.toy:Digits", "--steps", "2", "--horizon", "2", "--tasks-per-step", "1",
                            "--samples-per-task", "4", "--max-tokens", "6", "--out", str(tmp_path / "run")],
                           tmp_path / "calls")
    seeds = [s for rank_calls in calls for c in rank_calls if c["call"] == "generate" for s in c["seeds"]]
    assert len(seeds) == 2 * 2 * 4 and None not in seeds  # steps x turns x episodes
    assert len(set(seeds)) == len(seeds)


@pytest.mark.slow
def test_held_back_steps_keep_the_weights_and_the_gpu_engine_generating(tmp_path):
    """--min-groups beyond what 3 steps can hold: the first two steps add up gradients without stepping;
    the last step (a checkpoint) always steps. The GPU engine's sleep discards its weights every step,
    so a held-back step still reloads them (skipping that sync broke the next step's generate), and the
    sampler's logprobs match the trainer's at every step: the weights did not move in between."""
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    _, calls = standin_run(["--env", "tests.support.toy:Digits", "--steps", "3", "--horizon", "2", "--tasks-per-step", "2",
                            "--samples-per-task", "2", "--max-tokens", "6", "--min-groups", "100", "--out", str(out)],
                           tmp_path / "calls")
    rows = metrics(out)
    assert [r["stepped"] for r in rows] == [0.0, 0.0, 1.0] and rows[-1]["pending_groups"] == 0
    assert rows[0]["pending_groups"] <= rows[1]["pending_groups"] <= 4
    assert all(r["grad_norm"] == 0 for r in rows[:2])
    assert all(r["sampler_gap"] < 1e-3 for r in rows), [r["sampler_gap"] for r in rows]
    for rank_calls in calls:
        assert [c["call"] for c in rank_calls].count("reload_weights") == 3


def test_in_training_evaluation_without_a_validation_split_is_refused_before_start_up():
    cfg = config.parse(["--env", "webarena", "--env-options", '{"configs": "webarena"}', "--eval-every", "2"])
    problem = checks.check(cfg, 1)
    assert problem and "--eval-every 0" in problem and "\n" not in problem


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_rl_seconds_ends_the_run_with_a_saved_last_step(tmp_path, clock):
    """--rl-seconds (a GPU lent for minutes, or an arm's CPU seconds, infra/budget.py): the step during
    which the time runs out is the last one, and it saves like the last step of --steps, so the run can
    be evaluated and resumed. Each step logs its CPU seconds (the ranks' mean)."""
    out = tmp_path / "run"
    proc = torchrun(["--env", "tests.support.toy:Digits", "--engine", "torch", "--steps", "50", "--rl-seconds", "0.01",
                     "--horizon", "1",
                     "--max-tokens", "6", "--tasks-per-step", "2", "--samples-per-task", "2", "--budget-clock", clock,
                     "--out", str(out)])
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0] and rows[0]["time/cpu_step"] > 0 and rows[0]["episodes"] == 4
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert f"--rl-seconds 0.01 ({clock} clock)" in proc.stdout and "stopping after step 1" in proc.stdout
    # the budget used, as the stop decided on it: at least the budget, and within the step's own seconds (all
    # ranks' CPU seconds together; the slowest rank's wall seconds); the bar counts it, not the 50 steps
    whole = rows[0]["time/cpu_step"] * 2 if clock == "cpu" else rows[0]["time/step"]
    assert 0.01 <= rows[0]["budget/used"] <= whole * 1.5 + 0.05
    assert f"train ({clock} s of --rl-seconds)" in proc.stderr and "/50 [" not in proc.stderr


@pytest.mark.slow
def test_dynamic_sampling_and_sometimes_solved_through_a_resumed_run(tmp_path):
    """Every group constant (tests.support.toy:ByTask): each step plays its 2 extra rounds of fresh tasks and
    trains on its first round's groups; --sometimes-solved learns from all 3 rounds, and the resumed run
    draws step 2 from the estimates it replayed. Each step logs how many replies the cap cut off."""
    from studies.solved import SolveRates
    from tests.support.toy import ByTask

    out = tmp_path / "run"
    common = ["--env", "tests.support.toy:ByTask", "--engine", "torch", "--horizon", "1", "--max-tokens", "4",
              "--tasks-per-step", "2", "--samples-per-task", "2", "--dynamic-sampling", "2", "--sometimes-solved", "4",
              "--kl-coef", "0", "--out", str(out)]
    torchrun(common + ["--steps", "2", "--save-every", "1"])
    torchrun(common + ["--steps", "3", "--resume"])
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["dynamic/rounds"] == 3 and r["dynamic/played"] == 12 and r["episodes"] == 4 for r in rows)
    assert all(r["skipped"] == 1.0 for r in rows)  # at the cap the step trains on its constant groups (no KL term)
    assert all(0 <= r["cut_before_action"] <= r["cut"] <= 1 for r in rows)
    lines = [json.loads(line) for line in (out / "solved.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    for line in lines:  # 3 rounds x 2 fresh tasks, 2 episodes each, solved exactly on the odd tasks
        assert len(line["outcomes"]) == 6 and all(n == 2 and s == 2 * (t % 2) for t, s, n in line["outcomes"])
    env = ByTask()
    replayed = SolveRates(env.tasks("train"), env.subtask, 2, 4, 0, out / "solved.jsonl", start=2)
    used: set = set()
    for r in range(3):
        used.update(replayed.tasks(2, 2, r, used))
    assert used == {t for t, _, _ in lines[2]["outcomes"]}

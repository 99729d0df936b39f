"""The training configuration: one dataclass, its flags and its presets.

Every field has a one-line doc, which is also its `--help` text. A preset (infra/recipes.py) is the settings
it changes from these defaults: `cpu` (the default: a tiny model on this machine's CPU, minutes per
run), `smollm2` (the CPU learning recipes) and `paper` (the AgentGym-RL settings of the paper's Table
for that environment, for a GPU node). The command line starts from a preset and overrides only the
flags it names:

    python train.py --env textcraft --steps 5          # CPU preset
    torchrun --nproc_per_node 8 train.py --preset paper --env sciworld

This file is a leaf: it imports only the standard library and infra/recipes.py, so that reading a run's
settings (`parse`, `preset`) loads no torch, model or environment. What a configuration means on this
machine (`derive`) and the first thing wrong with it (`check`) are launch/checks.py's.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields

from infra import recipes


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
    chat_template_options: str = doc("JSON object of keyword options for the model's chat template, each a "
                                     "variable the template reads, e.g. '{\"enable_thinking\": false}' (Qwen3: an "
                                     "empty reasoning block opens every reply)", "{}")
    model: str = doc("'tiny' (built offline), an HF model name, or a local model directory", "tiny")
    algo: str = doc("advantage estimator: grpo, rloo, reinforce++, reinforce++_baseline, ppo (GAE + critic), "
                     "gigpo (GRPO plus step-level groups of turns from the same state: GiGPO, Feng et al. 2025; studies/gigpo.py)",
                    "grpo")
    # the batch
    steps: int = doc("training steps (one rollout batch and its updates each)", 4)
    rl_seconds: float = doc("also end training with the step during which this many seconds of training steps "
                            "(this process's, validation excluded) have passed; it saves like a last step. 0: no "
                            "limit (a budget in time, e.g. for a GPU lent for minutes)", 0.0)
    tasks_per_step: int = doc("distinct tasks per step over all ranks", 4)
    samples_per_task: int = doc("episodes per task (the GRPO/RLOO group size)", 4)
    min_groups: int = doc("DAPO's dynamic sampling (Yu et al. 2025), by accumulation: step the optimizer only once "
                          "the rollouts since its last step held this many informative groups over all ranks, adding up gradients in between (studies/curriculum.Accumulation); a "
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
    # behaviour-cloning warm start (studies/warmstart.py): the policy imitates the env's expert before RL
    bc_episodes: int = doc("expert episodes on train tasks to imitate before RL (0: no warm start; needs env.expert())", 0)
    bc_epochs: int = doc("passes over the expert episodes", 1)
    bc_lr: float = doc("learning rate of the warm start (AdamW)", 5e-5)
    bc_batch: int = doc("expert episodes per rank per warm-start optimizer step", 8)
    bc_seconds: float = doc("end the warm start's optimizer steps after this many seconds of it (0: no limit); with --model a warm start's directory, the time-matched imitation control of RL", 0.0)
    bc_actor: str = doc("who plays the demonstrations: expert (the env's solver) or policy (the model being trained, "
                        "its successful episodes kept: self-imitation, i.e. rejection-sampling fine-tuning)", "expert")
    bc_play_seconds: float = doc("with --bc-actor policy: stop playing once this many seconds (--budget-clock) have "
                                 "gone to play, between rounds (0: play every --bc-episodes task); the rest of "
                                 "--bc-seconds imitates the successes", 0.0)
    bc_tasks_seed: int = doc("seed that draws the demonstrations' train tasks (-1: --seed); fixing it while --seed "
                             "varies keeps one finite demonstration set across runs", -1)
    budget_clock: str = doc("what --rl-seconds and --bc-seconds count: wall (the slowest rank's seconds) or cpu (CPU "
                            "seconds of all ranks' processes together: fair between runs that share a machine)", "wall")
    # this project's own studies, off by default: the default path is the paper's method and the
    # published techniques above (docs/results.md reports each study, null results included)
    curriculum: bool = doc("draw each step's tasks by level, weighting a level by how often its groups were informative "
                           "(rewards not all equal) so far in the run; off: uniform shuffles of the train split", False)
    dynamic_sampling: int = doc("DAPO's dynamic sampling (Yu et al. 2025) within a step: while fewer than "
                                "--tasks-per-step of the step's groups had rewards that differ, play up to this many "
                                "more rounds of fresh tasks, their informative groups taking the places of constant "
                                "ones (studies/dynamic.py); 0: off", 0)
    sometimes_solved: int = doc("draw each step's tasks preferring those the policy sometimes solves: a task weighs "
                                "the chance that its group has mixed outcomes, from success estimates learnt from the "
                                "run's own rollouts whose counts fade with this half-life in steps "
                                "(studies/solved.py); 0: off, uniform shuffles of the train split", 0)
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
    engine: str = doc("rollout generator: auto (GPU: vLLM if installed, else torch; CPU with native bf16: vLLM if "
                       "installed, else hf; AVX2-only CPU: torch), vllm, torch (infra/decode.py: the project's own "
                       "decode loop, KV kept across turns, CUDA graphs) or hf", "auto")
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
                          "malloc_trim): resident memory then tracks what is in use (bench/soak.py), "
                          "and the generator wakes beside it, not beside the update's peak (docs/performance.md)",
                          True)
    mmap_threshold: float = doc("MB: C allocations of at least this size are mapped, and unmapped when freed "
                                "(glibc mallopt M_MMAP_THRESHOLD, fixed), so a tensor the decode loop rebuilds "
                                "each turn at a new width leaves no heap hole behind; 0: glibc's own threshold, "
                                "which rises up to 32 MB as blocks are freed (docs/performance.md)", 0.0)
    memory_check: str = doc("before any model loads, a rank's planned peak (memplan.py) against the memory it can "
                            "have: adapt (lower --micro-tokens, turn on --checkpointing, say so), stop (a one-line "
                            "error naming the flag), off", "adapt")
    preset: str = doc("starting point before flags apply: cpu (the tiny model's), smollm2 (a small pretrained "
                      "model on a CPU) or paper (a 7B model on GPUs); none given, the model chooses: tiny -> cpu, "
                      "smollm2 -> smollm2, any other model must name one", "")


def preset(name: str, env: str | None = None) -> Config:
    """The Config a preset starts from (infra/recipes.py), before the command line's flags apply."""
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
    # picks its preset, and checks.check refuses a real model on the cpu preset.
    name = args.get("preset") or MODEL_PRESET.get(args.get("model", Config.model), "")
    if name and name not in recipes.PRESETS:
        raise SystemExit(f"error: unknown --preset {name!r}; use one of: {', '.join(recipes.PRESETS)}")
    return dataclasses.replace(preset(name or "cpu", args.get("env")), **{**args, "preset": name})


def _type(f):
    return {"int": int, "float": float, "str": str}.get(f.type, f.type if callable(f.type) else str)

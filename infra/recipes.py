"""The recipes: each preset is the settings it changes from config.Config's defaults, for an environment.

    cpu        the tiny model on a laptop CPU: the machinery in minutes, not learning
    smollm2    SmolLM2-135M-Instruct on a CPU: BabyAI (the default), MiniWoB++ or SciWorld, each with
               its warm start and GRPO steps sized to about half an hour to an hour on 2 cores
    paper      AgentGym-RL's ScalingInter-7B settings per environment, for a GPU node

The fast paths of the update (`shared_prefix`, `fused_head`: the same gradient, less time or memory) are
off by default, so a reader's first path is the plain one; the smollm2 and paper presets turn them on.
`config.preset(name, env)` makes the Config; `--preset NAME` on the command line starts from it and the
flags given override it. Only `smollm2` looks an environment up (whether it has an expert to imitate). The numbers in each docstring come from measured runs (docs/results.md).
"""
from __future__ import annotations

import json


def cpu(env: str | None = None) -> dict:
    """A few minutes on a laptop CPU with the tiny model: the machinery, not learning."""
    return dict(env=env) if env else {}


def smollm2(env: str | None = None) -> dict:
    """The CPU learning recipe: SmolLM2-135M-Instruct on BabyAI, in bf16 where the CPU has it. A
    behaviour-cloning warm start on the env expert's successful episodes among 400 train tasks (the
    untrained model almost never writes a valid action, so RL alone sees only zero rewards), then 12 GRPO
    steps under ScalingInter stages of 6 and 8 turns. Only the top 15 of the 30 decoder blocks and the final
    norm train (a backward through half the model; the warm start and RL both). No KL term (a departure
    from the paper's 0.001, sparing the reference model's forward on 2 cores); BabyAI's brief instruction.
    A 4-turn stage was tried and dropped: the warm-started model finished almost no task in 4 turns, so
    those steps' groups were all zero and taught nothing. Held-out evaluation before RL and every 6 steps.
    train.py took 23 minutes on 2 cores (README, Results).

    `--env miniwob`: the same recipe on the ten MiniWoB++ pages that envs/miniwob_expert.py solves (see
    `miniwob_recipe`); `--env sciworld`: on SciWorld's seven shortest task types (`sciworld_recipe`)."""
    env = env or "babyai"
    if env == "miniwob":
        return miniwob_recipe()
    if env == "sciworld":
        return sciworld_recipe()
    from envs import env_class  # here, not above: reading the other presets loads no environment

    demos = 400 if hasattr(env_class(env), "expert") else 0  # an env without an expert: RL alone
    return dict(env=env, env_options='{"brief": true}' if env == "babyai" else "{}", model="smollm2", algo="grpo",
                  steps=12, tasks_per_step=8, samples_per_task=4, horizon="6,8@6", max_tokens=40, max_context=2048,
                  temperature=1.0, lr=3e-5, kl_coef=0.0, micro_tokens=2048, checkpointing=False, train_layers=15,
                  shared_prefix=True, fused_head=True,
                  eval_every=6, eval_tasks=40, bc_episodes=demos, bc_epochs=1, bc_lr=1e-4, bc_batch=8,
                  out="runs/{env}-smollm2")


MINIWOB_PAGES = ["click-button", "unicode-test", "click-link", "enter-text", "click-checkboxes", "login-user",
                 "choose-list", "click-tab", "email-inbox-delete", "click-option"]


def miniwob_recipe() -> dict:
    """SmolLM2 on ten MiniWoB++ pages in Chromium, within 30 minutes on 2 cores: a warm start on the
    scripted expert's episodes of 120 train seeds (4 episodes per rank per optimizer step: twice the
    updates of 8 for the same tokens), then 7 GRPO steps under ScalingInter stages of 3 and 5 turns
    (most pages take 1-3 actions, click-checkboxes up to 5). Replies are short (one sentence and the
    action: 48 tokens), and the instruction is the env's brief one (140 tokens instead of 530).
    An episode here is long (the accessibility tree comes back every turn), so the update, not generation,
    is most of a step: the top 10 blocks are trained, not 15. A first version (160 demonstrations, 12
    steps of 3 and 6 turns, 15 blocks) took about 3 minutes a step, 50 minutes in all; README, Results."""
    return dict(env="miniwob", env_options=json.dumps({"pages": MINIWOB_PAGES, "brief": True}), model="smollm2",
                  algo="grpo", steps=7, tasks_per_step=8, samples_per_task=4, horizon="3,5@4", max_tokens=48,
                  max_context=2048, temperature=1.0, lr=5e-5, kl_coef=0.0, micro_tokens=2048, checkpointing=False,
                  shared_prefix=True, fused_head=True,
                  train_layers=10, eval_every=7, eval_tasks=40, bc_episodes=120, bc_epochs=1, bc_lr=1e-4, bc_batch=4,
                  out="runs/{env}-smollm2")


SCIWORLD_TYPES = ["4-1", "4-2", "4-3", "4-4", "7-1", "7-2", "7-3"]  # find living/non-living/plant/animal, lifespans
SCIWORLD_JVM = ["-Xmx256m", "-Xms96m", "-Xmn48m", "-XX:+UseSerialGC"]  # ~175 MB a JVM instead of ~470 MB


def sciworld_recipe() -> dict:
    """SmolLM2 on SciWorld on 2 CPU cores: the seven task types whose whole expert episode fits a small
    model's budget, a warm start on the simulator's gold paths, then GRPO under ScalingInter 10 -> 16 turns.

    Task types 4-1..4-4 (find a living / non-living thing, a plant, an animal) and 7-1..7-3 (the longest-,
    shortest-lived animal, both): their gold paths take 1-16 actions, and a whole expert episode is
    590-1,462 tokens with SmolLM2's template (all 786 train variations played; the instruction alone is
    550-620), so one fits max_context 2048 with room for a wandering policy. Every other type but 3-1
    needs 21 turns and 2,000 tokens or more; 3-1 fits but has 5 variations a split. The seven types' test
    splits hold 396 tasks (at least 200 for the final tables); train 786, validation 393.

    The schedule scales the paper's SciWorld stages (10, 20, 30 turns, equal stages of 100 steps) to these
    paths: 10 turns, where the expert finishes 58% of the train tasks (every non-living thing and lifespan
    task, about 28% of the other three finds), then 16, where it finishes every one; two equal stages of 4
    steps. The reward is the simulator's score / 100, with partial credit along the path, so episodes cut
    off at 10 turns still differ within their group. Replies are capped at 48 tokens (a ReAct thought and
    one action; the expert's take 22-37). Each JVM gets a 256 MB heap (about 175 MB resident instead of
    470 at the env's 512 MB default): the batch's 32 episodes run in 32 JVMs beside the two ranks.

    Sized from measured runs (Intel Xeon, 2 cores shared with other work; docs/environments.md): an expert
    demonstration costs about 5.5 s (1 s to play, 4.5 s to imitate), so 112 take about 10 minutes, in 14
    optimizer steps of 4 per rank (as in the MiniWoB++ recipe: twice the updates of 8 for the same tokens;
    96 in 6 steps of 8 left a policy whose logged replies wrote no `Action:` line, 0 of 32 validation tasks,
    mean reward -0.01; these 14 steps: 1 of 32, partial credit on 19). A GRPO step took 170 s at 10 turns and
    280 s at 16, a validation pass 150-175 s: 8 steps, evaluated before RL and at the end, make about 47
    minutes of train.py. Otherwise the BabyAI recipe: its learning rates, the top 15 blocks trained, no KL.
    Validation: the first 32 of the 393 validation tasks (round-robin over the seven types), one pass of
    each rank's env pool."""
    return dict(env="sciworld", env_options=json.dumps({"task_types": SCIWORLD_TYPES, "java_opts": SCIWORLD_JVM}),
                  model="smollm2", algo="grpo", steps=8, tasks_per_step=8, samples_per_task=4, horizon="10,16@4",
                  max_tokens=48, max_context=2048, temperature=1.0, lr=3e-5, kl_coef=0.0, micro_tokens=2048,
                  checkpointing=False, train_layers=15, shared_prefix=True, fused_head=True, eval_every=8, eval_tasks=32,
                  bc_episodes=112, bc_epochs=1,
                  bc_lr=1e-4, bc_batch=4, out="runs/{env}-smollm2")


PAPER_TURNS = {  # env: (ScalingInter stages, stage length, tokens per turn, tasks, samples) from the paper
    "babyai": ("6,13,20", 100, 200, 32, 4),
    "sciworld": ("10,20,30", 100, 200, 16, 8),
    "textcraft": ("10,20,30", 100, 512, 32, 8),
    "searchqa": ("5,8,10", 100, 512, 32, 4),
    "webarena": ("8,12,15", 80, 512, 32, 4),
}


def paper(env: str | None = None) -> dict:
    """AgentGym-RL's ScalingInter-7B recipe: Qwen2.5-7B-Instruct, GRPO, lr 1e-6, KL loss 0.001 (k3),
    clip 0.2, temperature 1, the per-environment turn stages and batch sizes. micro_tokens 16,384:
    bench/memory_plan.py puts one rank's training peak at 41 GB of an 80 GB GPU with it (activations
    with checkpointing 12.8 GB), leaving room for context-length outliers; vLLM wakes after training."""
    env = env or "sciworld"
    stages, length, tokens, tasks, samples = PAPER_TURNS.get(env, PAPER_TURNS["sciworld"])
    return dict(env=env, model="Qwen/Qwen2.5-7B-Instruct", algo="grpo", steps=300, tasks_per_step=tasks,
                  samples_per_task=samples, horizon=f"{stages}@{length}", max_tokens=tokens, max_context=16384,
                  lr=1e-6, critic_lr=1e-5, warmup_steps=0, kl_coef=0.001, kl_kind="k3", micro_tokens=16384,
                  mini_batches=4, engine="vllm", device="cuda", checkpointing=True, save_every=50,
                  shared_prefix=True, fused_head=True)


PRESETS = {"cpu": cpu, "smollm2": smollm2, "paper": paper}

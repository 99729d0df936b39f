"""A training run's set-up, once per rank, before the loop of train.py. `setup` calls its named parts in
order: the config checked (`checked_config`: a broken one stops with one line before anything heavy), the
memory planned (`memory_plan`, infra/memplan.py: it may adapt settings, and config.json records each change:
`record`), the process group, where the weights come from (`weights_origin`: the model, a warm start, a
checkpoint), the models loaded into FSDP2 shards (`load_models`, infra/distributed.py) and their optimizers
(`training_state`), the generator (engine.py), the environments (`environments`), and the warm start when
there is one (`warm_start`, studies/warmstart.py). `Run` holds what every step reads; it is a
rollout.Playground, what plays a rank's episodes, and the studies (studies/) read only that part of it.
Test: tests/test_train.py (every entry runs through here)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from launch import checks
import config as configs
import envs
from launch.checks import Derived
from engine import make_engine
from envs.agentgym import task_ids
from infra import checkpoint, console, lifeline, lora, memplan, peaks
from infra.distributed import load, print0, setup_distributed, sync
from infra.runlog import RunLog, mmap_threshold, trim_heap
from models import resolve_model
from infra import stepplan
from rollout import ChatFormat, Playground
from studies import warmstart
from studies.hooks import Studies


@dataclass
class Run(Playground):
    """What a training step reads and keeps, built once per rank by `setup`: what plays its episodes
    (rollout.Playground: the settings, the generator, the envs, the train tasks), and the rest below."""
    out: Path = Path()
    models: dict = field(default_factory=dict)  # "policy" (and "critic" for PPO): FSDP2 shards
    ref: object = None               # the frozen reference model, None without a KL term
    optimizers: dict = field(default_factory=dict)
    schedulers: dict = field(default_factory=dict)
    val_ids: list = field(default_factory=list)  # the validation tasks of --eval-every
    start: int = 0                   # the first step this process runs (after a resume)
    log: RunLog | None = None        # rank 0's metrics, plots and progress bar
    studies: Studies | None = None   # the project's studies beside the method, off by default (studies/)
    spent: float = 0.0               # seconds of training steps in this process (--rl-seconds)


def setup(argv) -> Run:
    """Set up this rank's run, part by part; each part's docstring says what it does and why."""
    from transformers import AutoTokenizer

    asked, d = checked_config(argv)  # a broken config stops here with one line, before anything heavy
    if asked.mmap_threshold:  # before the first large allocation (infra/runlog.mmap_threshold)
        mmap_threshold(asked.mmap_threshold)
    planned, memory = memory_plan(asked, d)
    cfg, rank, world = process_group(planned, d, memory)
    out = Path(d.out)
    # the newest checkpoint whose files match their recorded sizes and checksums (a broken one is skipped)
    resume_from = checkpoint.resumable(out / "checkpoints", rank, world) if cfg.resume else None
    if rank == 0:
        record(out, asked, cfg)
        print0("\n".join(console.summary(cfg, d, world)))  # a few lines; all of it is in config.json
    seed = seeded(cfg, rank)
    origin = weights_origin(cfg, out, rank, resume_from)
    tokenizer = AutoTokenizer.from_pretrained(origin.policy)
    chat = ChatFormat(tokenizer, origin.policy, d.chat_options)
    with peaks.phase("load"):  # the models read and sharded (infra/peaks.py: each phase's peak memory)
        models, ref = load_models(cfg, d, world, origin)
        optimizers, schedulers, start = training_state(cfg, models, resume_from, rank, world)
    per_rank = stepplan.per_rank(cfg.tasks_per_step, cfg.samples_per_task, world)
    engine = generator(cfg, d, origin.policy, seed, per_rank)
    env_pool, make_env, train_ids, val_ids = environments(cfg, d, per_rank)
    if resume_from:  # after the engine's start-up, which re-seeds torch's global generator
        checkpoint.restore_rng(resume_from, rank, world)
    run = Run(cfg=cfg, d=d, rank=rank, world=world, out=out, models=models, ref=ref, optimizers=optimizers,
              schedulers=schedulers, engine=engine, env_pool=env_pool, make_env=make_env,
              threads=ThreadPoolExecutor(max_workers=max(1, min(cfg.env_workers, per_rank))),
              chat=chat, tokenizer=tokenizer, train_ids=train_ids, val_ids=val_ids,
              start=start, log=RunLog(out, cfg.steps, start, d.schedule,
                                       (cfg.rl_seconds, cfg.budget_clock)) if rank == 0 else None)
    if cfg.bc_episodes and not resume_from and not origin.warm_done:
        warm_start(run, origin.warm_dir)
    run.studies = Studies.make(run, getattr(env_pool[0], "level", env_pool[0].subtask), out, start)
    return run


def stop(problem: str) -> None:
    """A broken run ends here, before any model, engine or simulator starts: one line, exit status 2."""
    print(f"error: {problem}", file=sys.stderr)
    raise SystemExit(2)


def launched_world() -> int:
    """The ranks torchrun starts (1 for a plain `python train.py`), known before the process group exists."""
    return int(os.environ.get("WORLD_SIZE", 1))


def checked_config(argv) -> tuple[configs.Config, Derived]:
    """The command line's config and its derived values (launch/checks.py), or a stop naming the fix: a broken
    combination of flags, or a run directory that cannot be written."""
    cfg = configs.parse(argv)
    if problem := checks.check(cfg, launched_world()) or checks.writable(checks.derive(cfg).out):
        stop(problem)
    return cfg, checks.derive(cfg)


def memory_plan(cfg: configs.Config, d: Derived) -> tuple[configs.Config, dict]:
    """A rank's planned peak against the memory it can have (infra/memplan.py), before any model loads:
    the settings the run trains with (under --memory-check adapt the plan may lower --micro-tokens, turn
    on --checkpointing, or choose --grad-reduce; config.json records each change) and what lifeline.start
    says and watches. A plan that cannot fit stops here with one line naming the flag."""
    planned, memory, problem = memplan.check_run(cfg, launched_world(), d.device, d.dtype, d.algo.critic)
    if problem:
        stop(problem)
    return planned, memory


def process_group(planned: configs.Config, d: Derived, memory: dict) -> tuple[configs.Config, int, int]:
    """(the config every rank trains with, this rank, the ranks): the process group started (gloo or NCCL,
    infra/distributed.py), rank 0's plan given to all (ranks read their memory at slightly different
    moments), and this rank's heartbeat (infra/lifeline.py: rank 0 says the plan; if a rank dies, its
    memory and signal are named)."""
    rank, world = setup_distributed(d.device)
    box = [planned]
    dist.broadcast_object_list(box, src=0)
    lifeline.start(rank, **memory)
    return box[0], rank, world


def seeded(cfg: configs.Config, rank: int) -> int:
    """This rank's seed, from --seed (seeds are explicit: each rank its own), set in torch and python."""
    seed = cfg.seed * 1000 + rank
    torch.manual_seed(seed)
    random.seed(seed)
    return seed


def record(out: Path, asked: configs.Config, cfg: configs.Config) -> None:
    """config.json (rank 0): the settings the run trains with, and under "memplan" each one the memory plan
    changed, as [asked, used] (memplan.changes): the command line alone does not say what ran."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {**dataclasses.asdict(cfg), "memplan": memplan.changes(asked, cfg)}
    (out / "config.json").write_text(json.dumps(settings, indent=2))


@dataclass(frozen=True)
class Origin:
    """Where this run's weights come from."""
    base: str                 # --model as a directory or HF name (the critic starts from it)
    start: str                # the model RL starts from: the warm start when a resumed run has one, else base
    checkpoint: Path | None   # the checkpoint this process resumes from (--resume)
    warm_dir: Path            # the warm start's HF directory in the run directory
    warm_done: bool           # a resumed run whose warm start is saved keeps it (no second warm start)

    @property
    def policy(self) -> str:
        """The policy weights to read: the checkpoint's, else the start's."""
        return str(self.checkpoint / "policy") if self.checkpoint else self.start


def weights_origin(cfg: configs.Config, out: Path, rank: int, resume_from: Path | None) -> Origin:
    """The model named by --model (rank 0 builds the tiny or converted model first, if needed), a saved warm
    start, or a checkpoint (collective)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar per run: ours
    if rank == 0:
        resolve_model(cfg.model)
    dist.barrier()
    base, warm_dir = resolve_model(cfg.model), out / "warmstart"
    warm_done = cfg.resume and (warm_dir / "config.json").exists()  # a resumed run keeps its warm start
    return Origin(base, str(warm_dir) if warm_done else base, resume_from, warm_dir, warm_done)


def load_models(cfg: configs.Config, d: Derived, world: int, origin: Origin) -> tuple[dict, object]:
    """({"policy": ..., "critic": ... when the algorithm has one}, the frozen reference or None), sharded
    by FSDP2 over the ranks (collective). Rank 0 alone reads each model: one full fp32 copy in host memory
    per job; every rank keeps its shards. Under LoRA (infra/lora.py) the policy is the base RL starts from
    with adapters (a resumed run's adapters come from its checkpoint: training_state), and its reference is
    that base, the adapters switched off: no second model."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    mesh = init_device_mesh(d.device, (world,))
    adapters = lora.config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, origin.start) \
        if cfg.lora_rank else None
    policy = load(AutoModelForCausalLM, origin.start if adapters else origin.policy, mesh, d.dtype, cfg.checkpointing,
                  train_layers=cfg.train_layers, lora=adapters)
    ref = None
    if d.kl != "off" and adapters:  # the base under the adapters
        ref = lora.Base(policy)
    elif d.kl != "off":  # the KL anchor is the model RL starts from: the warm start when there is one
        ref = load(AutoModelForCausalLM, origin.start, mesh, d.dtype, False, trainable=False)
    models = {"policy": policy}
    if d.algo.critic:
        critic = models["critic"] = load(AutoModelForTokenClassification, str(origin.checkpoint / "critic")
                                         if origin.checkpoint else origin.base, mesh, d.dtype, cfg.checkpointing,
                                         num_labels=1)
        for module in critic.modules():  # the value head's dropout (0.1 by default) would make values noisy
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return models, ref


def training_state(cfg: configs.Config, models: dict, resume_from: Path | None, rank: int,
                   world: int) -> tuple[dict, dict, int]:
    """(optimizers, learning-rate schedulers, the first step to run): AdamW over each model's trained
    parameters (--train-layers and LoRA freeze the others), at the checkpoint's state when resuming; the
    warmup's position is a function of the step too, so a resumed run continues it exactly."""
    lrs = {"policy": cfg.lr, "critic": cfg.critic_lr}
    optimizers = {key: torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lrs[key],
                                         weight_decay=cfg.weight_decay) for key, model in models.items()}
    start = checkpoint.load_training_state(resume_from, models, optimizers, rank, world) if resume_from else 0
    if resume_from:
        print0(f"resuming from {resume_from} (step {start})")
    done_updates = start * cfg.ppo_epochs * cfg.mini_batches
    warm = lambda u: min(1.0, (done_updates + u + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0  # noqa: E731
    return optimizers, {k: torch.optim.lr_scheduler.LambdaLR(o, warm) for k, o in optimizers.items()}, start


def generator(cfg: configs.Config, d: Derived, path: str, seed: int, per_rank: int):
    """This rank's generator (engine.py) on the policy's weights at `path`, sized for its share of a step."""
    with peaks.phase("engine"):
        return make_engine(path, cfg.engine, d.device, d.dtype, cfg.max_context, seed, per_rank,
                           vllm=dict(gpu_memory_utilization=cfg.gpu_memory_utilization, compile=cfg.compile_generator))


def environments(cfg: configs.Config, d: Derived, per_rank: int) -> tuple[list, object, list, list]:
    """(this rank's env pool, one per episode of its share of a step; a maker of a replacement env for a hung
    or crashed simulator; the train tasks: the split, or --tasks-file's; the validation tasks of --eval-every)."""
    make_env = lambda: envs.make(cfg.env, **d.env_options)  # noqa: E731
    env_pool = [make_env() for _ in range(per_rank)]
    train_ids, val_ids = env_pool[0].tasks("train"), env_pool[0].tasks("val")[:cfg.eval_tasks] if cfg.eval_every else []
    if cfg.tasks_file:  # AgentGym-RL's task list instead of the train split (checked in checks.check)
        train_ids = task_ids(cfg.tasks_file, cfg.env, d.env_options)
        print0(f"training on the {len(train_ids)} tasks of {cfg.tasks_file}")
    return env_pool, make_env, train_ids, val_ids


def warm_start(run: Run, warm_dir: Path) -> None:
    """The warm start (studies/warmstart.py), with the generator asleep, then its weights synced into the generator."""
    with peaks.phase("warmstart"):
        run.engine.sleep()  # the GPU memory it holds is the warm start's; sync() reloads the weights
        warmstart.run(run, run.models["policy"], run.ref, warm_dir)
    if run.cfg.trim_heap:  # the imitation's freed heap back to the system before the generator wakes
        trim_heap()
    with peaks.phase("sync"):
        sync(run.engine, run.models["policy"], getattr(torch, run.d.dtype))

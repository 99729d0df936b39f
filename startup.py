"""A training run's set-up, once per rank, before the loop of train.py: the config checked (a broken one
stops with one line before anything heavy), the memory planned (infra/memplan.py), the process group, the
models loaded into FSDP2 shards (infra/distributed.py), the generator (engine.py), the environments, a resumed
checkpoint, and the warm start when there is one (warmstart.py). `Run` holds what every step reads.
Test: tests/test_train.py (every entry runs through here)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import checks
import config as configs
import envs
import warmstart
from engine import make_engine
from envs.agentgym import task_ids
from infra import checkpoint, console, lifeline, lora, memplan, peaks
from infra.distributed import load, print0, setup_distributed, sync
from infra.runlog import RunLog, trim_heap
from models import resolve_model
from rollout import ChatFormat, Play
from studies import Studies


@dataclass
class Run:
    """What a training step reads and keeps: built once per rank by `setup`."""
    cfg: configs.Config
    d: checks.Derived
    rank: int
    world: int
    out: Path
    models: dict                 # "policy" (and "critic" for PPO): FSDP2 shards
    ref: object                  # the frozen reference model, None without a KL term
    optimizers: dict
    schedulers: dict
    engine: object               # this rank's generator (engine.py)
    env_pool: list               # one environment per episode of this rank's share of a step
    make_env: object             # builds a replacement environment (a hung or crashed simulator)
    threads: ThreadPoolExecutor  # steps the environments concurrently
    chat: ChatFormat
    tokenizer: object
    train_ids: list
    val_ids: list                # the validation tasks of --eval-every
    start: int                   # the first step this process runs (after a resume)
    log: RunLog | None           # rank 0's metrics, plots and progress bar
    studies: Studies | None = None  # the project's studies beside the method, off by default (studies.py)
    spent: float = 0.0           # seconds of training steps in this process (--rl-seconds)

    @property
    def per_rank(self) -> int:
        return self.cfg.tasks_per_step * self.cfg.samples_per_task // self.world

    def play(self, turns: int, seed: int | None) -> Play:
        """How this run plays episodes at a turn budget and seed (rollout.Play)."""
        c = self.cfg
        return Play(turns, c.max_tokens, c.max_context, c.temperature, c.top_p, seed, self.d.framing,
                    c.env_timeout or None, states=self.d.algo.states)

    @property
    def kl_in_reward(self) -> bool:  # REINFORCE++ puts the KL to the reference inside the reward
        return self.d.algo.kl == "reward" and self.ref is not None


def setup(argv) -> Run:
    """Check the config (a broken one stops here with one line, before anything heavy), plan the memory,
    start the process group, load the models into FSDP2 shards, start the generator and the envs, and
    run the warm start when there is one."""
    cfg = configs.parse(argv)
    world_guess = int(os.environ.get("WORLD_SIZE", 1))
    problem = checks.check(cfg, world_guess) or checks.writable(checks.derive(cfg).out)
    if not problem:  # a rank's planned peak against what it can have (memplan.py): adapt, or stop here
        d = checks.derive(cfg)
        cfg, memory, problem = memplan.check_run(cfg, world_guess, d.device, d.dtype, d.algo.critic)
    if problem:  # before any model, engine or simulator starts
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    rank, world = setup_distributed(d.device)
    box = [cfg]  # ranks read their memory at slightly different moments: rank 0's plan decides for all
    dist.broadcast_object_list(box, src=0)
    cfg = box[0]
    lifeline.start(rank, **memory)  # rank 0 says the plan; heartbeats name the cause if a rank dies
    out = Path(d.out)
    # the newest checkpoint whose files match their recorded sizes and checksums (a broken one is skipped)
    resume_from = checkpoint.resumable(out / "checkpoints", rank, world) if cfg.resume else None
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        print0("\n".join(console.summary(cfg, d, world)))  # a few lines; all of it is in config.json
    seed = cfg.seed * 1000 + rank
    torch.manual_seed(seed)
    random.seed(seed)

    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar per run: ours

    base = resolve_model(cfg.model) if rank == 0 else None  # rank 0 builds the tiny model if needed
    dist.barrier()
    base = resolve_model(cfg.model)
    warm_dir = out / "warmstart"
    warm_done = cfg.resume and (warm_dir / "config.json").exists()  # a resumed run keeps its warm start
    start_path = str(warm_dir) if warm_done else base  # the model RL starts from
    policy_path = str(resume_from / "policy") if resume_from else start_path
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    chat = ChatFormat(tokenizer, policy_path)
    mesh = init_device_mesh(d.device, (world,))
    # Rank 0 alone reads each model (one full fp32 copy in host memory per job); every rank keeps its shards.
    # LoRA (infra/lora.py): the base RL starts from, its adapters from the checkpoint when resuming
    adapters = lora.config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, start_path) \
        if cfg.lora_rank else None
    peaks.enter("load")  # the models read and sharded (infra/peaks.py: each phase's peak memory)
    policy = load(AutoModelForCausalLM, start_path if adapters else policy_path, mesh, d.dtype, cfg.checkpointing,
                  train_layers=cfg.train_layers, lora=adapters)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizers = {"policy": torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)}
    models = {"policy": policy}
    ref = None
    if cfg.kl_coef > 0 and adapters:  # the base under the adapters: no second model
        ref = lora.Base(policy)
    elif cfg.kl_coef > 0:  # the KL anchor is the model RL starts from: the warm start when there is one
        ref = load(AutoModelForCausalLM, start_path, mesh, d.dtype, False, trainable=False)
    if d.algo.critic:
        critic = models["critic"] = load(AutoModelForTokenClassification, str(resume_from / "critic") if resume_from
                                         else base, mesh, d.dtype, cfg.checkpointing, num_labels=1)
        for module in critic.modules():  # the value head's dropout (0.1 by default) would make values noisy
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        optimizers["critic"] = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay)
    start = checkpoint.load_training_state(resume_from, models, optimizers, rank, world) if resume_from else 0
    if resume_from:
        print0(f"resuming from {resume_from} (step {start})")
    done_updates = start * cfg.ppo_epochs * cfg.mini_batches  # warmup position is a function of the step too
    warm = lambda u: min(1.0, (done_updates + u + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0  # noqa: E731
    schedulers = {k: torch.optim.lr_scheduler.LambdaLR(o, warm) for k, o in optimizers.items()}

    peaks.leave()
    per_rank = cfg.tasks_per_step * cfg.samples_per_task // world
    with peaks.phase("engine"):
        engine = make_engine(policy_path, cfg.engine, d.device, d.dtype, cfg.max_context, seed,
                             gpu_memory_utilization=cfg.gpu_memory_utilization, max_seqs=per_rank,
                             compile=cfg.compile_generator)
    env_pool = [envs.make(cfg.env, **d.env_options) for _ in range(per_rank)]
    train_ids, val_ids = env_pool[0].tasks("train"), env_pool[0].tasks("val")[:cfg.eval_tasks] if cfg.eval_every else []
    if cfg.tasks_file:  # AgentGym-RL's task list instead of the train split (checked in checks.check)
        train_ids = task_ids(cfg.tasks_file, cfg.env, d.env_options)
        print0(f"training on the {len(train_ids)} tasks of {cfg.tasks_file}")
    if resume_from:  # after the engine's start-up, which re-seeds torch's global generator
        checkpoint.restore_rng(resume_from, rank, world)
    threads = ThreadPoolExecutor(max_workers=max(1, min(cfg.env_workers, per_rank)))
    run = Run(cfg=cfg, d=d, rank=rank, world=world, out=out, models=models, ref=ref, optimizers=optimizers,
              schedulers=schedulers, engine=engine, env_pool=env_pool, make_env=lambda: envs.make(cfg.env, **d.env_options),
              threads=threads, chat=chat, tokenizer=tokenizer, train_ids=train_ids, val_ids=val_ids, start=start,
              log=RunLog(out, cfg.steps, start, d.schedule) if rank == 0 else None)
    if cfg.bc_episodes and not resume_from and not warm_done:
        with peaks.phase("warmstart"):
            engine.sleep()  # the GPU memory it holds is the warm start's; sync() reloads the weights
            warmstart.run(run, warm_dir)
        if cfg.trim_heap:  # the imitation's freed heap back to the system before the generator wakes
            trim_heap()
        with peaks.phase("sync"):
            sync(engine, policy, getattr(torch, d.dtype))
    run.studies = Studies.from_run(run, getattr(env_pool[0], "level", env_pool[0].subtask), start)
    return run


"""Multi-turn agent RL with torch FSDP2 and a colocated generator, launched by torchrun.

    torchrun --nproc_per_node 8 train.py --preset paper --env sciworld     # GPU node, paper settings
    torchrun --nproc_per_node 2 train.py --env textcraft                   # this CPU, tiny model
    python train.py --env babyai --algo rloo                               # one process, same code

Each rank owns a generator (vLLM, or transformers when vLLM is absent), a pool of environments and a
shard of the policy. One training step (AgentGym-RL, section 3; ScalingInter-RL, section 3.3):

  1. rollout: this rank's share of `tasks_per_step x samples_per_task` episodes, turn budget from the
     horizon schedule at this step;
  2. logprobs of the current policy (the PPO "old" policy), the frozen reference, the critic;
  3. advantages (algorithms.py) with group and batch statistics taken over all ranks;
  4. `ppo_epochs` passes of mini-batch updates, each split into micro-batches by a token budget; every
     loss is divided by the GLOBAL count of policy tokens, so the gradient does not depend on the split;
  5. weight sync: full parameters streamed into every rank's generator;
  6. log, checkpoint.

Paper mode: `--tasks-file` trains on an AgentGym-RL-Data-ID task list and `--prompt-style agentgym`
frames episodes as AgentGym's clients did (README, "Comparing with the paper").

Departures from the paper's code: the reward sits on the last policy token (the original put it on an
observation token outside the loss mask); RLOO is implemented; the horizon is a pure function of the
step, so a resumed run gets the same stage (the original's counter was off by one after resume).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist

import algorithms as A
from infra import checkpoint
import config as configs
import envs
from infra import faults
from infra import lifeline
from infra import memplan
from batch import DUMMY_WIDTH, collate, forward, micro_batches, pad, score
from infra.distributed import all_max, all_sum, load, print0, setup_distributed, sync
from engine import make_engine
from rollout import ChatFormat, abandoned, rollout
from infra.stepplan import Accumulation, Curriculum, informative_groups, rank_share, tasks_for_step
from infra.runlog import RunLog, log_episodes, log_outcomes, memory_metrics, trim_heap
from models import resolve_model

GAP_ALARM = 0.5  # mean |trainer - sampler| logprob per token above which a weight sync is suspect


def update(cfg, models: dict, optimizers: dict, schedulers: dict | None, batch: dict, old, ref_lp, values, adv,
           returns, kl_in_reward: bool, seed: int, reduce_sum=None, reduce_max=None, apply: bool = True,
           anchor=None) -> dict:
    """Step (4): `ppo_epochs` x `mini_batches` optimizer steps over the batch, each accumulating
    micro-batches within the token budget. Every term (policy, KL, entropy) is aggregated by `cfg.agg`
    over the mini-batch's policy tokens (or sequences) of all ranks (`reduce_sum`, default all ranks),
    so the gradient does not depend on the split and the KL keeps its weight under every aggregation.
    `old` None means the update is exactly on-policy (one epoch, one mini-batch): the "old" logprobs
    are then this forward's own, detached, and no separate scoring pass is needed (as verl does).
    `apply` False leaves the gradients in place for a later step's update (`--min-groups`) instead of
    stepping the optimizer. `anchor` (warmstart.Anchor, --bc-anchor) adds its imitation gradient before
    each optimizer step. Returns sums of this rank's loss terms (its share of each global mean) and the update count."""
    if old is None and (cfg.ppo_epochs > 1 or cfg.mini_batches > 1):
        raise ValueError("old=None (on-policy) needs ppo_epochs == 1 and mini_batches == 1: later updates "
                         "need the logprobs from before the first one (score the batch first)")
    reduce_sum, reduce_max = reduce_sum or all_sum, reduce_max or all_max
    world = dist.get_world_size() if reduce_sum is all_sum else 1
    policy, mask, lengths = models["policy"], batch["mask"], batch["attn"].sum(1)
    stats = dict.fromkeys(("loss", "clip_frac", "kl", "entropy", "grad_norm", "value_loss", "updates",
                           "skipped_rows", "sampler_gap", "gap_tokens", "bc_nll", "idle_steps"), 0.0)
    # A row whose advantage is 0 on every token adds exactly 0 to the policy gradient (the loss is
    # -A * ratio); when no other term touches it (no KL, no entropy bonus, no critic) its forward and
    # backward are skipped. It still counts in the normaliser, so the gradient is unchanged. GRPO makes
    # many such rows: every group whose rewards are all equal (all solved, or all failed).
    idle = ref_lp is None and not cfg.entropy_coef and "critic" not in models
    silent = set(((adv * mask) == 0).all(1).nonzero().flatten().tolist()) if idle else set()
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(cfg.ppo_epochs):
        order = torch.randperm(len(mask), generator=gen).tolist()
        for part in range(cfg.mini_batches):
            chunk = order[part::cfg.mini_batches]
            tokens, seqs = reduce_sum(mask[chunk].sum(), len(chunk))
            norm = {"token-mean": tokens, "seq-mean-token-mean": seqs, "seq-sum-norm": seqs * cfg.max_context}[cfg.agg]
            live = [r for r in chunk if r not in silent]
            stats["skipped_rows"] += len(chunk) - len(live)
            micro = micro_batches(live, lengths, cfg.micro_tokens, batch if cfg.shared_prefix else None)
            for mb in pad(micro, reduce_max(len(micro))):
                rows = mb or [0]  # an empty micro-batch runs a dummy row whose mask is zeroed
                lp, ent = forward(policy, batch, rows, cfg.temperature, entropy=True, entropy_grad=cfg.entropy_coef > 0,
                                  width=None if mb else DUMMY_WIDTH, shared_prefix=cfg.shared_prefix, policy_only=True)
                w = lp.shape[1]
                m = mask[rows, :w].to(lp.device) * bool(mb)
                old_mb = lp.detach() if old is None else old[rows, :w].to(lp.device)
                if epoch == 0 and "sampler_logp" in batch:  # trainer vs sampler on the same tokens (bf16 gap)
                    sampler = batch["sampler_logp"][rows, :w].to(lp.device)
                    stats["sampler_gap"] += float(A.masked_sum((lp.detach() - sampler).abs(), m))
                    stats["gap_tokens"] += float(m.sum())
                loss, pm = A.policy_loss(lp, old_mb, adv[rows, :w].to(lp.device), m,
                                         cfg.clip_low, cfg.clip_high, cfg.dual_clip or None, cfg.agg, norm)
                kl = lp.new_zeros(())
                if ref_lp is not None:
                    kl = A.kl_loss(lp, ref_lp[rows, :w].to(lp.device), m, cfg.kl_kind, cfg.agg, norm)
                if ref_lp is not None and not kl_in_reward:
                    loss = loss + cfg.kl_coef * kl
                ent_term = A.aggregate(ent, m, cfg.agg, norm)  # detached unless entropy_coef > 0
                if cfg.entropy_coef:
                    loss = loss - cfg.entropy_coef * ent_term
                # FSDP2 averages gradients over ranks; the loss is already a mean over all ranks' tokens
                (loss * world).backward()
                stats["loss"] += loss.item()
                stats["kl"] += kl.item()
                stats["entropy"] += ent_term.item()
                stats["clip_frac"] += float(pm["clip_frac"]) * float(m.sum()) / max(tokens, 1)
                del lp, ent, loss, kl, ent_term  # free this micro-batch's graph before the next forward
                if "critic" in models:
                    v, _ = forward(models["critic"], batch, rows, 1.0, value=True, width=w, shared_prefix=cfg.shared_prefix)
                    vl, _ = A.value_loss(v, values[rows, :w].to(v.device), returns[rows, :w].to(v.device), m,
                                         normalizer=tokens)
                    (vl * world).backward()
                    stats["value_loss"] += vl.item()
            if anchor is not None:
                stats["bc_nll"] += anchor.backward(policy) / world  # every rank returns the global mean
            faults.point("update")  # test-only: gradients made, optimizer not stepped (faults.py)
            for key, opt in optimizers.items() if apply else ():
                norm_ = torch.nn.utils.clip_grad_norm_(models[key].parameters(), cfg.grad_clip)
                norm_ = norm_.full_tensor() if hasattr(norm_, "full_tensor") else norm_
                if key == "policy":
                    stats["grad_norm"] += float(norm_)
                if float(norm_) == 0.0:
                    # Every group of the batch was constant (or every row masked): the gradient is exactly 0,
                    # yet Adam would still move each weight by its momentum (and weight decay). A step with
                    # nothing to learn leaves the model, the optimizer's state and the schedule as they were.
                    # The norm is global over ranks (FSDP2), so every rank makes the same choice.
                    opt.zero_grad(set_to_none=True)
                    stats["idle_steps"] += key == "policy"
                    continue
                opt.step()
                opt.zero_grad(set_to_none=True)
                if schedulers:
                    schedulers[key].step()
            stats["updates"] += 1
    return stats


# ------------------------------------------------------------------ advantages over all ranks

def global_advantages(cfg, d, batch, values, token_kl) -> tuple[torch.Tensor, torch.Tensor]:
    """algorithms.advantages with group statistics over the whole step and whitening over all ranks
    (the same `masked_whiten` as the single-process path, fed cross-rank sums and maxima).
    --positive-only keeps the positive part: failed episodes are not pushed down, only better ones up."""
    mask, rewards, groups = batch["mask"], batch["rewards"], batch["groups"]
    world = dist.get_world_size()
    gathered = [torch.zeros_like(rewards) for _ in range(world)]
    dist.all_gather(gathered, rewards)
    all_rewards = torch.cat(gathered)
    gids = [torch.zeros_like(groups) for _ in range(world)]
    dist.all_gather(gids, groups)
    all_groups = torch.cat(gids)
    mine = slice(dist.get_rank() * len(rewards), (dist.get_rank() + 1) * len(rewards))
    if d.estimator == "gigpo":  # GRPO's episode term plus turns compared from the same state (gigpo.py)
        import gigpo
        states = [None] * world
        dist.all_gather_object(states, batch["states"])
        states = sum(states, [])
        batch["shared_turns"] = gigpo.shared_turns(all_groups, states)  # logged with the step's metrics
        adv = gigpo.advantages(all_rewards, all_groups, states, mask, mine, cfg.gamma, cfg.step_weight, cfg.grpo_std)
        return (adv.clamp(min=0) if cfg.positive_only else adv), adv.clone()
    if d.estimator in ("grpo", "rloo"):  # per-episode scalars from the whole step, broadcast to tokens
        scalar = A.group_baseline(d.estimator, all_rewards, all_groups, norm_by_std=cfg.grpo_std)
        adv = (scalar.clamp(min=0) if cfg.positive_only else scalar)[mine, None].float() * mask
        return adv, adv.clone()
    name = d.estimator
    if name == "reinforce++_baseline":  # group mean over the whole step, then plain REINFORCE++
        rewards, name = A.group_baseline("center", all_rewards, all_groups)[mine].float(), "reinforce++"
    adv, returns = A.advantages(name, rewards, mask, groups, values=values, token_kl=token_kl, gamma=cfg.gamma,
                                lam=cfg.lam, kl_coef=cfg.kl_coef if token_kl is not None else 0.0, whiten=False)
    adv = A.masked_whiten(adv, mask, reduce_sum=reduced(dist.ReduceOp.SUM), reduce_max=reduced(dist.ReduceOp.MAX))
    return (adv.clamp(min=0) if cfg.positive_only else adv), returns


def reduced(op):
    """t -> t reduced over all ranks with `op` (a copy): the reductions `masked_whiten` takes."""
    def reduce(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        dist.all_reduce(t, op=op)
        return t
    return reduce


# ------------------------------------------------------------------ main

def main(argv=None):
    cfg = configs.parse(argv)
    world_guess = int(os.environ.get("WORLD_SIZE", 1))
    problem = configs.check(cfg, world_guess) or configs.writable(configs.derive(cfg).out)
    if not problem:  # a rank's planned peak against what it can have (memplan.py): adapt, or stop here
        d = configs.derive(cfg)
        cfg, memory, problem = memplan.check_run(cfg, world_guess, d.device, d.dtype)
    if problem:  # before any model, engine or simulator starts
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    rank, world = setup_distributed(d.device)
    box = [cfg]  # ranks read their memory at slightly different moments: rank 0's plan decides for all
    dist.broadcast_object_list(box, src=0)
    cfg = box[0]
    lifeline.start(rank, **memory)  # rank 0 says the plan; heartbeats name the cause if a rank dies
    out = Path(d.out)
    ckpt_root = out / "checkpoints"
    # the newest checkpoint whose files match their recorded sizes and checksums (a broken one is skipped)
    resume_from = checkpoint.resumable(ckpt_root, rank, world) if cfg.resume else None
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        print0("config: " + json.dumps(dataclasses.asdict(cfg)))
        print0(f"horizon: {d.schedule.describe()} | world {world} | device {d.device}")
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
    policy_path = str(resume_from / "policy") if resume_from else str(warm_dir) if warm_done else base
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    chat = ChatFormat(tokenizer, policy_path)
    mesh = init_device_mesh(d.device, (world,))
    # Rank 0 alone reads each model (one full fp32 copy in host memory per job); every rank keeps its shards
    policy = load(AutoModelForCausalLM, policy_path, mesh, d.dtype, cfg.checkpointing, train_layers=cfg.train_layers)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizers = {"policy": torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)}
    models = {"policy": policy}
    ref = None
    if cfg.kl_coef > 0:  # the KL anchor is the model RL starts from: the warm start when there is one
        ref = load(AutoModelForCausalLM, str(warm_dir) if warm_done else base, mesh, d.dtype, False, trainable=False)
    if cfg.algo == "ppo":
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

    per_rank = cfg.tasks_per_step * cfg.samples_per_task // world
    engine = make_engine(policy_path, cfg.engine, d.device, d.dtype, cfg.max_context, seed,
                         gpu_memory_utilization=cfg.gpu_memory_utilization, max_seqs=per_rank)
    env_pool = [envs.make(cfg.env, **d.env_options) for _ in range(per_rank)]
    train_ids, val_ids = env_pool[0].tasks("train"), env_pool[0].tasks("val")[:cfg.eval_tasks] if cfg.eval_every else []
    if cfg.tasks_file:  # AgentGym-RL's task list instead of the train split (checked in config.check)
        from envs.agentgym import task_ids
        train_ids = task_ids(cfg.tasks_file, cfg.env, d.env_options)
        print0(f"training on the {len(train_ids)} tasks of {cfg.tasks_file}")
    if resume_from:  # after the engine's start-up, which re-seeds torch's global generator
        checkpoint.restore_rng(resume_from, rank, world)
    curriculum = Curriculum(train_ids, getattr(env_pool[0], "level", env_pool[0].subtask), cfg.seed,
                            out / "curriculum.jsonl", start) if cfg.curriculum else None  # stepplan.py
    accumulation = Accumulation(cfg.min_groups)  # a checkpoint always steps: a resume starts with none pending
    threads = ThreadPoolExecutor(max_workers=max(1, min(cfg.env_workers, per_rank)))
    make_env = lambda: envs.make(cfg.env, **d.env_options)  # noqa: E731
    log = None
    if rank == 0:
        log = RunLog(out, cfg.steps, start, d.schedule)
    kl_in_reward = cfg.algo.startswith("reinforce++") and ref is not None
    dtype = getattr(torch, d.dtype)
    if cfg.bc_episodes and not resume_from and not warm_done:
        import warmstart
        engine.sleep()  # the GPU memory it holds is the warm start's; sync() reloads the weights
        warmstart.run(cfg, max(d.schedule.budgets), policy, ref, env_pool, threads, chat, tokenizer, train_ids,
                      warm_dir, all_sum, all_max, print0, d.framing)
        sync(engine, policy, dtype)
    anchor = None
    if cfg.bc_anchor:  # imitation beside RL (warmstart.Anchor)
        import warmstart
        anchor = warmstart.Anchor(cfg, max(d.schedule.budgets), env_pool, threads, chat, tokenizer, train_ids,
                                  all_sum, all_max, print0, d.framing)

    evaluate_now = cfg.eval_every and cfg.eval_tasks
    eval_turns = cfg.eval_turns or max(d.schedule.budgets)  # one footing for runs of different schedules
    first = {}
    if evaluate_now and start == 0:  # validation success of the model RL starts from (the warm start, if any)
        first = quick_eval(cfg, engine, chat, env_pool, make_env, val_ids, eval_turns, threads, d.framing,
                           out, start, "eval_start")
        print0(f"held-out validation success before RL: {first['eval_start/success']:.3f} ({len(val_ids)} tasks)")
    spent = 0.0  # seconds of training steps in this process (--rl-seconds)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        timing = {}
        # (1) rollout: this rank's contiguous share of the step's episodes; group id = task slot in the step
        horizon = d.schedule.max_turns(step)
        tasks = (curriculum.tasks(step, cfg.tasks_per_step) if curriculum
                 else tasks_for_step(train_ids, step, cfg.tasks_per_step, cfg.seed))
        mine = rank_share(tasks, cfg.samples_per_task, rank, world)  # every rank a part of every group
        engine.wake()
        episodes, rt = rollout(engine, chat, env_pool, make_env, mine, horizon, cfg.max_tokens, cfg.max_context,
                               cfg.temperature, cfg.top_p, seed=(cfg.seed * 7919 + step) * 131, first=rank * per_rank,
                               pool=threads, framing=d.framing, env_timeout=cfg.env_timeout or None)
        engine.sleep()
        timing.update({f"time/{k}": v for k, v in rt.items()})
        batch = collate(episodes, tokenizer.pad_token_id or 0, cfg.refusal_penalty)
        mask = batch["mask"]

        # (2) logprobs of the policy before the update ("old"), the reference, the critic
        t = time.perf_counter()
        micro = micro_batches(list(range(len(episodes))), batch["attn"].sum(1), cfg.micro_tokens)
        micro = pad(micro, all_max(len(micro)))
        # "old" logprobs anchor the PPO ratio; exactly on-policy (one epoch, one mini-batch) they equal
        # the update's own first forward, so that pass is skipped unless REINFORCE++ needs them for its
        # in-reward KL. The reference pass runs only with a KL term, the critic pass only for PPO.
        on_policy = cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and not kl_in_reward
        old = None if on_policy else score(policy, batch, micro, cfg.temperature)
        ref_lp = None
        if ref is not None:
            ref_lp = score(ref, batch, micro, cfg.temperature)
            # FSDP2 leaves a root's parameters (embeddings, head) gathered after forward, for the backward
            # that follows; the frozen reference never runs one, so it would keep them whole until its
            # next step (2.2 GB per GPU for Qwen2.5-7B instead of 0.3): reshard explicitly. (Resharding
            # inside forward instead would hand batch.forward's sliced head a sharded weight.)
            ref.reshard()
        values = score(models["critic"], batch, micro, 1.0, value=True) if "critic" in models else None
        timing["time/logprobs"] = time.perf_counter() - t

        # (3) advantages
        token_kl = A.kl_penalty(old, ref_lp, cfg.kl_kind) * mask if kl_in_reward else None
        adv, returns = global_advantages(cfg, d, batch, values, token_kl)
        if curriculum or cfg.min_groups:  # every rank counts the same gathered (group, reward) rows
            rows = [None] * world
            dist.all_gather_object(rows, [(g, r) for (_, g), r in zip(mine, batch["rewards"].tolist())])
            rows = sum(rows, [])
        informative = {}
        if curriculum:
            informative["curriculum/informative"] = curriculum.observe(step, tasks, rows, rank == 0)
        # --rl-seconds: the slowest rank's clock decides, so every rank ends (and saves) at the same step
        out_of_time = bool(cfg.rl_seconds) and all_max(spent + time.perf_counter() - t0) >= cfg.rl_seconds
        last = step + 1 == cfg.steps or out_of_time
        saves = last or bool(cfg.save_every and (step + 1) % cfg.save_every == 0)
        stepped = True  # every step updates the weights unless --min-groups holds its gradients back
        if cfg.min_groups:
            stepped = accumulation.due(sum(informative_groups(rows, len(tasks))), must=saves)
            informative["pending_groups"] = accumulation.pending
        log_episodes(out, step, cfg, episodes, batch, adv, tokenizer, env_pool)  # a few, at eval steps (runlog.py)

        # (4) updates: epochs x mini-batches x micro-batches, losses over the global token count
        t = time.perf_counter()
        stats = update(cfg, models, optimizers, schedulers, batch, old, ref_lp, values, adv, returns, kl_in_reward,
                       seed=cfg.seed * 31 + step, apply=stepped, anchor=anchor)
        timing["time/update"] = time.perf_counter() - t

        # (5) weight sync into this rank's generator
        t = time.perf_counter()
        engine.wake()  # even for weights held back (--min-groups): a GPU engine's sleep discarded its copy
        sync(engine, policy, dtype)
        timing["time/sync"] = time.perf_counter() - t

        # (6) log and checkpoint
        metrics = {**_rollout_metrics(episodes, horizon), **(first if step == start else {}), **informative,
                   **({"stepped": float(stepped)} if cfg.min_groups else {}),
                   **({"shared_turns": batch["shared_turns"]} if "shared_turns" in batch else {})}
        # every loss term is a rank's share of a global mean: summed over ranks, averaged over updates
        keys = ("loss", "kl", "entropy", "clip_frac", "value_loss") + (("bc_nll",) if anchor else ())
        metrics.update({k: v / stats["updates"] for k, v in zip(keys, all_sum(*(stats[k] for k in keys)))})
        metrics["grad_norm"] = stats["grad_norm"] / stats["updates"]
        metrics["idle_updates"] = stats["idle_steps"]  # optimizer steps left out: a zero gradient (update())
        metrics["skipped"] = all_sum(stats["skipped_rows"])[0] / (per_rank * world * cfg.ppo_epochs)
        gap, gap_n = all_sum(stats["sampler_gap"], stats["gap_tokens"])
        metrics["sampler_gap"] = gap / max(gap_n, 1)  # mean |trainer - sampler| logprob per trained token
        if gap_n and metrics["sampler_gap"] > GAP_ALARM and cfg.temperature == 1.0:
            # the cheap probe of every weight sync: an engine that silently kept stale or partly loaded
            # weights samples from another model than the one trained (bf16 noise is about 0.05-0.1)
            print0(f"\nwarning: step {step}: trainer and sampler logprobs differ by {metrics['sampler_gap']:.2f} "
                   "per token; the engine's weights may not match the policy (check the weight sync)")
        metrics["lr"] = schedulers["policy"].get_last_lr()[0]
        timing["time/step"] = time.perf_counter() - t0
        spent += timing["time/step"]
        if cfg.trim_heap:  # see runlog.memory_metrics
            timing["time/trim"] = trim_heap()
        metrics.update({k: all_sum(v)[0] / world for k, v in timing.items()})
        metrics.update(memory_metrics())
        if evaluate_now and ((step + 1) % cfg.eval_every == 0 or last):
            t = time.perf_counter()
            metrics.update(quick_eval(cfg, engine, chat, env_pool, make_env, val_ids, eval_turns, threads,
                                      d.framing, out, step))
            metrics["time/eval"] = time.perf_counter() - t
        if log:
            log.log(step, metrics)
        if saves:
            t = time.perf_counter()
            try:
                checkpoint.save(ckpt_root, step + 1, models, optimizers, tokenizer, rank, world, cfg.keep, d.sharded,
                                dtype)
            except checkpoint.CheckpointError as exc:  # raised on every rank alike: all stop, none waits
                if rank == 0:
                    print(f"\nerror: {exc}; {checkpoint.latest(ckpt_root) or 'no earlier checkpoint'} is intact. "
                          "Free space or fix --out, then rerun with --resume", file=sys.stderr, flush=True)
                finish(env_pool, threads, engine, None, code=1)  # no plots: the disk may refuse them too
            print0(f"\nsaved checkpoint step {step + 1} in {time.perf_counter() - t:.1f}s -> {ckpt_root / 'latest'}")
        if out_of_time:
            print0(f"\n--rl-seconds {cfg.rl_seconds:g}: {spent:.0f}s of training steps; stopping after step {step + 1}")
            break

    if log:
        print0(f"done: {out / 'metrics.jsonl'}, {out / 'reward.png'}")
    finish(env_pool, threads, engine, log)


def finish(env_pool, threads, engine, log, code: int = 0) -> None:
    """Close everything on every rank and end the process with `code` (a collective)."""
    lifeline.stop()
    if not code:
        print0(lifeline.peak_report())
    if log:
        log.close()
    for env in env_pool:
        env.close()
    threads.shutdown(wait=not abandoned(), cancel_futures=True)
    try:
        dist.barrier()
    except RuntimeError:  # stopping on an error, a peer may be gone already: exit all the same
        if not code:
            raise
    if hasattr(engine, "close"):
        engine.close()
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()
    if abandoned():  # an env call that never returned holds a thread the interpreter would wait for at exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)


def quick_eval(cfg, engine, chat, env_pool, make_env, val_ids, turns: int, pool, framing, out, step,
               name: str = "eval") -> dict:
    """One episode per task of this rank's share of `val_ids` (validation split) at `turns`, sampled at
    the training temperature with a fixed seed (as evaluate.py samples; greedy decoding of a freshly
    warm-started model repeats its most common action), played in batches of the env pool; mean reward
    and success over all ranks as `name`/reward and `name`/success; per-task outcomes to out/evals.jsonl.
    evaluate.py is the full evaluation (k samples, Pass@k, subtasks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    engine.wake()  # after sync() the KV cache is still asleep (GPU), and generate refuses to run
    lo, hi = rank * len(val_ids) // world, (rank + 1) * len(val_ids) // world  # contiguous: seeds follow the index
    mine, eps = val_ids[lo:hi], []
    for i in range(0, len(mine), len(env_pool)):
        part = [(t, j) for j, t in enumerate(mine[i:i + len(env_pool)])]
        eps += rollout(engine, chat, env_pool, make_env, part, turns, cfg.max_tokens, cfg.max_context,
                       temperature=cfg.temperature, top_p=cfg.top_p, seed=(cfg.seed * 7919 - 1) * 131,  # "step -1"
                       first=lo + i, pool=pool, framing=framing, env_timeout=cfg.env_timeout or None)[0]
    log_outcomes(out / "evals.jsonl", step, name, eps, env_pool[0].subtask, turns)  # the curve, traceable per task
    reward, success, n = all_sum(sum(e.reward for e in eps), sum(e.success for e in eps), len(mine))
    return {f"{name}/reward": reward / max(n, 1), f"{name}/success": success / max(n, 1)}


def _rollout_metrics(episodes, horizon: int) -> dict:
    rows = [(e.reward, e.success, e.turns, sum(e.mask), e.end, e.refused) for e in episodes]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    rows = [r for part in gathered for r in part]
    n = len(rows)
    ends = {k: sum(r[4] == k for r in rows) / n for k in ("done", "horizon", "context", "env_error")}
    return {"reward": sum(r[0] for r in rows) / n, "success": sum(r[1] for r in rows) / n,
            "turns": sum(r[2] for r in rows) / n, "response_tokens": sum(r[3] for r in rows) / n,
            "refused": sum(r[5] for r in rows) / max(sum(r[2] for r in rows), 1),  # share of turns
            "horizon": horizon, **{f"end/{k}": v for k, v in ends.items()}}


if __name__ == "__main__":
    main()

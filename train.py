"""Multi-turn agent RL with torch FSDP2 and a colocated generator, launched by torchrun.

    torchrun --nproc_per_node 8 train.py --preset paper --env sciworld     # GPU node, paper settings
    torchrun --nproc_per_node 2 train.py --env textcraft                   # this CPU, tiny model
    python train.py --env babyai --algo rloo                               # one process, same code

Each rank owns a generator (vLLM, or transformers when vLLM is absent), a pool of environments and a
shard of the policy, set up once by launch/startup.py. `main` is that set-up and a loop over `train_step`, whose body
is one step of AgentGym-RL (section 3; ScalingInter-RL, section 3.3), numbered as in the README:

  1. the step's tasks and its turn budget (schedule.py), then the rollout (rollout.py): this rank's share
     of `tasks_per_step x samples_per_task` episodes;
  2. logprobs of the current policy (the PPO "old" policy), the frozen reference, the critic (`score_batch`);
  3. advantages (`algorithms.advantages`) with group and batch statistics over all ranks;
  4. `ppo_epochs` passes of mini-batch updates (`update`), each split into micro-batches by a token
     budget; every loss is divided by the GLOBAL count of policy tokens, so the gradient does not depend
     on the split;
  5. weight sync: full parameters streamed into every rank's generator (`distributed.sync`);
  6. log, evaluate on the validation split, checkpoint (`log_step`, `save`).

The project's own studies beside the method (studies/) reach a step at two points, `run.studies.rollout`
around step 1's rollout and `run.studies.advantages` around step 3; with every study off (the default)
`run.studies` is None and the step calls the method directly.

Paper mode: `--tasks-file` trains on an AgentGym-RL-Data-ID task list and `--prompt-style agentgym`
frames episodes as AgentGym's clients did (docs/paper.md, "Comparing with the paper").

Departures from the paper's code: the reward sits on the last policy token (the original put it on an
observation token outside the loss mask); RLOO is implemented; the horizon is a pure function of the
step, so a resumed run gets the same stage (the original's counter was off by one after resume).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

import algorithms as A
from studies import gigpo
from batch import Fast, collate, forward, score, values
from infra import budget, checkpoint, faults, lifeline, peaks
from infra.peaks import phase
from infra.distributed import all_max, all_sum, print0, sync
from infra.runlog import (env_errors, log_episodes, log_outcomes, memory_metrics, phase_metrics, rollout_metrics,
                          trim_heap)
from infra.stepplan import rank_share
from infra import passes
from infra.passes import micro_batches, pad
from rollout import play_rounds, rollout
from launch.startup import Run, setup
from schedule import play_seed, tasks_for_step

GAP_ALARM = 0.5  # mean |trainer - sampler| logprob per token above which a weight sync is suspect


@dataclass
class Scored:
    """What the update reads of a step: the batch (batch.collate) and, aligned with it as (B, T) tensors, the
    advantages and returns (step 3) and step 2's logprobs and values: `old` None when the update is exactly
    on-policy (its own first forward is then the old policy, as verl does), `ref` None without a KL term,
    `values` None without a critic. `kl_in_reward`: the KL went into the reward (REINFORCE++), not the loss."""
    batch: dict
    adv: torch.Tensor
    returns: torch.Tensor
    old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    values: torch.Tensor | None = None
    kl_in_reward: bool = False


def update(cfg, models: dict, optimizers: dict, s: Scored, schedulers: dict | None = None, seed: int = 0,
           apply: bool = True, extra_gradient=None) -> dict:
    """Step (4): `ppo_epochs` x `mini_batches` optimizer steps over the batch, each accumulating micro-batches
    within the token budget. Every term is aggregated by `cfg.agg` with one normaliser, the mini-batch's
    policy tokens (or sequences) over all ranks, so the gradient does not depend on the split and the KL
    keeps its weight under every aggregation. `apply` False keeps the gradients for a later step
    (--min-groups); `extra_gradient` (an object with `backward(policy)`: --bc-anchor, studies/) adds its
    gradient before each optimizer step. The machinery (silent rows, packing, deferred reduction,
    statistics) is infra/passes.py's. Returns the update's figures over all ranks (`passes.Stats.result`);
    one process (`python train.py`, a test) is rank 0 of a group of one."""
    if s.old is None and (cfg.ppo_epochs > 1 or cfg.mini_batches > 1):
        raise ValueError("old=None (on-policy) needs ppo_epochs == 1 and mini_batches == 1: later updates "
                         "need the logprobs from before the first one (score the batch first)")
    policy, critic = models["policy"], models.get("critic")
    world = dist.get_world_size()
    fast = Fast.of(cfg)  # opt-in fast paths, the same gradient
    mask, kl_coef = s.batch["mask"], 0.0 if s.kl_in_reward else cfg.kl_coef
    silent, defer = passes.silent_rows(cfg, models, s), passes.defers(cfg, models, world, extra_gradient)
    stats, gen = passes.Stats(), torch.Generator().manual_seed(seed)
    clip = A.Clip(cfg.clip_low, cfg.clip_high, cfg.dual_clip or None)
    for epoch in range(cfg.ppo_epochs):
        order = torch.randperm(len(s.adv), generator=gen).tolist()
        for part in range(cfg.mini_batches):
            rows = order[part::cfg.mini_batches]
            tokens, seqs = all_sum(mask[rows].sum(), len(rows))  # all ranks' rows, silent ones included
            norm = {"token-mean": tokens, "seq-mean-token-mean": seqs, "seq-sum-norm": seqs * cfg.max_context}[cfg.agg]
            live = [r for r in rows if r not in silent]
            stats.sums["skipped_rows"] += len(rows) - len(live)
            for mb in passes.packed(live, s.batch, cfg, all_max):
                passes.gradient_sync(models, not defer or mb.last)
                lp, ent = forward(policy, s.batch, mb.rows, cfg.temperature, mb.width,
                                  "grad" if cfg.entropy_coef > 0 else "detached", policy_only=True, fast=fast)
                w, dev = lp.shape[1], lp.device
                take = lambda t: None if t is None else t[mb.rows, :w].to(dev)  # noqa: E731  (b, w)
                m = take(mask) * mb.real
                old = lp.detach() if s.old is None else take(s.old)
                pg, pm = A.policy_loss(lp, old, take(s.adv), m, clip, cfg.agg, norm)
                kl = lp.new_zeros(()) if s.ref is None else A.kl_loss(lp, take(s.ref), m, cfg.kl_kind, cfg.agg, norm)
                entropy = A.aggregate(ent, m, cfg.agg, norm)  # detached unless entropy_coef > 0
                value_loss = lp.new_zeros(())
                if critic is not None:  # PPO's critic, a model of its own: its term reaches only its weights
                    v = values(critic, s.batch, mb.rows, w, fast)
                    value_loss, _ = A.value_loss(v, take(s.values), take(s.returns), m, normalizer=tokens)
                # the objective: each term a share of the mini-batch's mean over all ranks
                loss = pg + kl_coef * kl - cfg.entropy_coef * entropy + value_loss
                (loss * world).backward()  # FSDP2 averages gradients over ranks; the loss is already their mean
                kl_tok = None if s.ref is None else A.kl_penalty(lp.detach(), take(s.ref), cfg.kl_kind)
                stats.micro_batch(m, loss - value_loss, value_loss, ent, kl_tok, pm["clip_frac"])
                if epoch == 0 and "sampler_logp" in s.batch:  # the sampler probe (train.GAP_ALARM)
                    stats.probe(lp, take(s.batch["sampler_logp"]), m)
                del lp, ent, loss, kl, entropy, value_loss  # free this micro-batch's graph before the next forward
            if extra_gradient is not None:
                stats.sums["bc_nll"] += extra_gradient.backward(policy) / world  # a share of the global mean
            faults.point("update")  # test-only: gradients made, optimizer not stepped (infra/faults.py)
            for key, opt in optimizers.items() if apply else ():
                norm = passes.optimizer_step(models[key], opt, (schedulers or {}).get(key), cfg.grad_clip)
                stats.grad_norm += norm if key == "policy" else 0.0
                stats.idle_steps += key == "policy" and norm == 0.0
            stats.updates += 1
    return stats.result(all_sum)


# ------------------------------------------------------------------ advantages over all ranks

def global_advantages(cfg, d, batch, values, token_kl) -> tuple[torch.Tensor, torch.Tensor]:
    """Step (3): algorithms.advantages with the group statistics of the whole step (every rank's rewards,
    groups and, for GiGPO, states, gathered here) and the batch whitening over all ranks."""
    world, rank, n = dist.get_world_size(), dist.get_rank(), len(batch["rewards"])
    rewards, groups = ([torch.zeros_like(batch[k]) for _ in range(world)] for k in ("rewards", "groups"))
    dist.all_gather(rewards, batch["rewards"])
    dist.all_gather(groups, batch["groups"])
    rewards, groups = torch.cat(rewards), torch.cat(groups)
    states = None
    if d.algo.states:
        states = [None] * world
        dist.all_gather_object(states, batch["states"])
        states = sum(states, [])
        batch["metrics"] = {"shared_turns": gigpo.shared_turns(groups, states)}  # logged with the step's
    step = A.Step(rewards, groups, batch["mask"], values, token_kl, states, rows=slice(rank * n, (rank + 1) * n),
                  reduce=(reduced(dist.ReduceOp.SUM), reduced(dist.ReduceOp.MAX)))
    opts = A.Options(cfg.gamma, cfg.lam, kl_coef=cfg.kl_coef if token_kl is not None else 0.0,
                     norm_by_std=cfg.grpo_std, step_weight=cfg.step_weight)
    return A.advantages(d.algo.estimator, step, opts)


def reduced(op):
    """t -> t reduced over all ranks with `op` (a copy): the reductions `masked_whiten` takes."""
    def reduce(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        dist.all_reduce(t, op=op)
        return t
    return reduce


# ------------------------------------------------------------------ the loop: set up once (launch/startup.py), then steps

def main(argv=None):
    run = setup(argv)
    first = start_evaluation(run)
    for step in range(run.start, run.cfg.steps):
        if train_step(run, step, first if step == run.start else {}):  # --rl-seconds ran out (the step saved)
            print0(f"\n--rl-seconds {run.cfg.rl_seconds:g} ({run.cfg.budget_clock} clock) reached; stopping after "
                   f"step {step + 1}")
            break
    if run.log:
        if errors := env_errors(run.out / "metrics.jsonl"):  # an env that raised or hung, a server that died
            print0(f"{errors} training episodes ended as env_error (an env raised, passed --env-timeout, or its "
                   f"server failed); they trained no tokens (metrics.jsonl: end/env_error)")
        print0(f"done: {run.out / 'metrics.jsonl'}, {run.out / 'reward.png'}")
    lifeline.finish(run.env_pool, run.threads, run.engine, run.log)


def train_step(run: Run, step: int, first: dict) -> bool:
    """One step of AgentGym-RL's loop (section 3; ScalingInter-RL, 3.3), numbered as in the README; True when
    --rl-seconds has run out (the step then saved like a last step)."""
    cfg, d, t0, timing = run.cfg, run.d, time.perf_counter(), {}
    clock0, cpu0 = budget.now(cfg.budget_clock), time.process_time()  # --rl-seconds' clock (infra/budget.py)
    # (1) the step's tasks and turn budget (schedule.py), then the rollout of this rank's share of their episodes,
    # or, with a study on, the studies' first hook: what they change of the tasks and of what the step plays (studies/)
    horizon = d.schedule.max_turns(step)
    tasks = tasks_for_step(run.train_ids, step, cfg.tasks_per_step, cfg.seed)
    play = run.play(horizon, play_seed(cfg.seed, step))
    with phase("generate"):  # its seconds split into generation, env steps and the rest (rollout's own timing)
        run.engine.wake()
        episodes, rt = run.studies.rollout(step, tasks, lambda chosen, at: play_tasks(run, play, chosen, at)) \
            if run.studies else play_tasks(run, play, tasks)
        run.engine.sleep()
    timing.update({f"time/{k}": v for k, v in rt.items()})
    trim(cfg, timing)  # what generation freed, back to the system before the update (--trim-heap)
    batch = collate(episodes, run.tokenizer.pad_token_id or 0, cfg.reward, cfg.success_bonus)
    # (2) logprobs before the update: the "old" policy, the reference, the critic's values
    with phase("logprobs", timing):
        old, ref_lp, values = score_batch(run, batch)
    # (3) advantages, with group statistics over the whole step (algorithms.advantages), or, with a study on, the
    # studies' second hook: what they change of the rewards, the advantages and the update (studies/)
    out_of_time, last, saves, used = step_end(run, step, clock0)
    kl_in_reward = d.kl == "reward"  # REINFORCE++ puts the KL to the reference inside the reward (launch/checks.py)
    token_kl = A.kl_penalty(old, ref_lp, cfg.kl_kind) * batch["mask"] if kl_in_reward else None
    compute = lambda: global_advantages(cfg, d, batch, values, token_kl)  # noqa: E731
    adv, returns, stepped, extra, anchor = run.studies.advantages(step, episodes, batch, saves, compute) \
        if run.studies else (*compute(), True, {}, None)
    log_episodes(run.out, step, cfg, episodes, batch, adv, run.tokenizer, run.env_pool)  # a few, at eval steps
    # (4) the update: epochs x mini-batches x micro-batches, every loss over the global token count
    with phase("update", timing):
        stats = update(cfg, run.models, run.optimizers, Scored(batch, adv, returns, old, ref_lp, values, kl_in_reward),
                       run.schedulers, cfg.seed * 31 + step, stepped, anchor)
    trim(cfg, timing)  # and what the update freed, before the engine wakes
    # (5) weight sync into this rank's generator
    with phase("sync", timing):
        run.engine.wake()  # even for weights held back (--min-groups): a GPU engine's sleep discarded its copy
        sync(run.engine, run.models["policy"], getattr(torch, d.dtype))
    # (6) log, evaluate on the validation split, checkpoint
    run.spent += budget.now(cfg.budget_clock) - clock0
    timing.update({"time/step": time.perf_counter() - t0, "time/cpu_step": time.process_time() - cpu0})
    metrics = {**rollout_metrics(episodes, horizon), **first, **extra, **batch.get("metrics", {})}
    if used is not None:
        metrics["budget/used"] = used
    log_step(run, step, metrics, stats, timing, last)
    if saves:
        save(run, step)
    return out_of_time


def play_tasks(run: Run, play, tasks: list[int], first: int = 0):
    """Step (1)'s rollout: this rank's contiguous share of the `samples_per_task` episodes of each of `tasks`
    (stepplan.rank_share: every rank a part of every group), played as `play` (rollout.Play) says. `first`:
    the index of the tasks' first episode among all the step plays (0 unless a study plays more: studies/)."""
    mine = rank_share(tasks, run.cfg.samples_per_task, run.rank, run.world)
    return rollout(run.engine, run.chat, run.env_pool, run.make_env, mine, play, run.threads,
                   first + run.rank * run.per_rank)


def trim(cfg, timing: dict) -> None:
    """--trim-heap: the C heap's freed pages back to the system (runlog.trim_heap), so that resident memory
    tracks what is in use and the generator wakes beside it; its seconds in timing["time/trim"]."""
    if cfg.trim_heap:
        timing["time/trim"] = timing.get("time/trim", 0.0) + trim_heap()


def step_end(run: Run, step: int, clock0: float) -> tuple[bool, bool, bool, float | None]:
    """(out of time, last step, saves, budget used). Out of time: --rl-seconds spent by the run's training
    steps, this one's so far included, on --budget-clock; one verdict over all ranks (infra/budget.py), so
    every rank ends (and saves) at the same step. The last step, and every --save-every steps, save a
    checkpoint. Budget used: that combined figure (None without --rl-seconds)."""
    cfg = run.cfg
    used = budget.combined(cfg.budget_clock, run.spent + budget.now(cfg.budget_clock) - clock0,
                           all_sum, all_max) if cfg.rl_seconds else None
    out_of_time = used is not None and used >= cfg.rl_seconds
    last = step + 1 == cfg.steps or out_of_time
    return out_of_time, last, last or bool(cfg.save_every and (step + 1) % cfg.save_every == 0), used


def score_batch(run: Run, batch: dict):
    """Step (2): (old, ref, values), each (B, T) or None. "old" logprobs anchor the PPO ratio; exactly
    on-policy (one epoch, one mini-batch) they equal the update's own first forward, so that pass is
    skipped unless REINFORCE++ needs them for its in-reward KL. The reference pass runs only with a KL
    term, the critic pass only for PPO."""
    cfg = run.cfg
    micro = micro_batches(list(range(len(batch["rewards"]))), batch["attn"].sum(1), cfg.micro_tokens)
    micro = pad(micro, all_max(len(micro)))
    on_policy = cfg.ppo_epochs == 1 and cfg.mini_batches == 1 and run.d.kl != "reward"
    head = Fast(fused_head=cfg.fused_head)
    old = None if on_policy else score(run.models["policy"], batch, micro, cfg.temperature, fast=head)
    ref_lp = None
    if run.ref is not None:
        ref_lp = score(run.ref, batch, micro, cfg.temperature, fast=head)
        # FSDP2 leaves a root's parameters (embeddings, head) gathered after forward, for the backward
        # that follows; the frozen reference never runs one, so it would keep them whole until its
        # next step (a whole embedding per GPU: docs/gpu.md): reshard explicitly. (Resharding
        # inside forward instead would hand batch.forward's sliced head a sharded weight.)
        run.ref.reshard()
    values = score(run.models["critic"], batch, micro, 1.0, value=True) if "critic" in run.models else None
    return old, ref_lp, values


def log_step(run: Run, step: int, metrics: dict, stats: dict, timing: dict, last: bool) -> None:
    """Step (6): the step's metrics over all ranks (a collective), the validation evaluation when due (every
    --eval-every steps and at the `last`), rank 0's line in metrics.jsonl."""
    cfg, world = run.cfg, run.world
    evaluate = bool(cfg.eval_every and cfg.eval_tasks and ((step + 1) % cfg.eval_every == 0 or last))
    # the update's figures are over all ranks already (passes.Stats): loss terms averaged over optimizer
    # steps, per-token figures over the tokens they were computed on
    keys = ("loss", "kl", "entropy", "clip_frac", "value_loss", "grad_norm", "sampler_gap") + (
        ("bc_nll",) if run.studies and run.studies.anchor else ())
    metrics.update({k: stats[k] for k in keys})
    metrics["idle_updates"] = stats["idle_steps"]  # optimizer steps left out: a zero gradient (update())
    metrics["skipped"] = stats["skipped_rows"] / (run.per_rank * world * cfg.ppo_epochs)
    if stats["gap_tokens"] and metrics["sampler_gap"] > GAP_ALARM and cfg.temperature == 1.0:
        # the cheap probe of every weight sync: an engine that silently kept stale or partly loaded
        # weights samples from another model than the one trained (bf16 noise is about 0.05-0.1)
        print0(f"\nwarning: step {step}: trainer and sampler logprobs differ by {metrics['sampler_gap']:.2f} "
               "per token; the engine's weights may not match the policy (check the weight sync)")
    metrics["lr"] = run.schedulers["policy"].get_last_lr()[0]
    metrics.update({k: all_sum(v)[0] / world for k, v in timing.items()})
    metrics.update(memory_metrics())
    if evaluate:
        t = time.perf_counter()
        with peaks.phase("eval"):
            metrics.update(quick_eval(run, step))
        metrics["time/eval"] = time.perf_counter() - t
    metrics.update(phase_metrics())  # each phase's peak this step (infra/peaks.py)
    if run.log:
        run.log.log(step, metrics)


def save(run: Run, step: int) -> None:
    """A checkpoint after `step` (checkpoint.py); a failed save stops every rank with the fix."""
    t, root = time.perf_counter(), run.out / "checkpoints"
    try:
        with peaks.phase("save"):  # its peak is in the next step's metrics and the run's last line
            checkpoint.save(root, step + 1, run.models, run.optimizers, run.tokenizer, run.cfg.keep, run.d.sharded,
                            getattr(torch, run.d.dtype))
    except checkpoint.CheckpointError as exc:  # raised on every rank alike: all stop, none waits
        if run.rank == 0:
            print(f"\nerror: {exc}; {checkpoint.latest(root) or 'no earlier checkpoint'} is intact. "
                  "Free space or fix --out, then rerun with --resume", file=sys.stderr, flush=True)
        lifeline.finish(run.env_pool, run.threads, run.engine, None, code=1)  # no plots: the disk may refuse them too
    print0(f"\nsaved checkpoint step {step + 1} in {time.perf_counter() - t:.1f}s -> {root / 'latest'}")


def start_evaluation(run: Run) -> dict:
    """Validation success of the model RL starts from (the warm start, if any), logged with the first step."""
    cfg = run.cfg
    if not (cfg.eval_every and cfg.eval_tasks and run.start == 0):
        return {}
    with peaks.phase("eval"):
        first = quick_eval(run, run.start, "eval_start")
    print0(f"held-out validation success before RL: {first['eval_start/success']:.3f} ({len(run.val_ids)} tasks)")
    return first


def quick_eval(run: Run, step: int, name: str = "eval") -> dict:
    """One episode per task of this rank's share of the validation tasks at --eval-turns (default the
    schedule's largest budget: one footing for runs of different schedules), sampled at the training
    temperature with a fixed seed (as evaluate.py samples; greedy decoding of a freshly warm-started model
    repeats its most common action), played in batches of the env pool; mean reward and success over all
    ranks as `name`/reward and `name`/success; per-task outcomes to out/evals.jsonl. evaluate.py is the
    full evaluation (k samples, Pass@k, subtasks)."""
    cfg, rank, world, val_ids = run.cfg, run.rank, run.world, run.val_ids
    turns = cfg.eval_turns or max(run.d.schedule.budgets)
    run.engine.wake()  # after sync() the KV cache is still asleep (GPU), and generate refuses to run
    lo, hi = rank * len(val_ids) // world, (rank + 1) * len(val_ids) // world  # contiguous: seeds follow the index
    mine = val_ids[lo:hi]
    eps = play_rounds(run.engine, run.chat, run.env_pool, run.make_env, [(t, j % len(run.env_pool)) for j, t in
                      enumerate(mine)], run.play(turns, play_seed(cfg.seed, -1)), run.threads, lo)
    log_outcomes(run.out / "evals.jsonl", step, name, eps, run.env_pool[0].subtask, turns)  # the curve, per task
    reward, success, n = all_sum(sum(e.reward for e in eps), sum(e.success for e in eps), len(mine))
    return {f"{name}/reward": reward / max(n, 1), f"{name}/success": success / max(n, 1)}


if __name__ == "__main__":
    main()

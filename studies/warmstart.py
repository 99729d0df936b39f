"""Behaviour cloning from the environment's own solver: the warm start before RL on a real model.

Why: untrained, SmolLM2-135M-Instruct almost never writes a reply in the required format (BabyAI: 2
of 256 first replies), so every episode scores 0, every GRPO group is constant and its advantage is
exactly 0: RL from environment reward has nothing to work with. AgentGym itself started its agents from
behaviour cloning (AgentTraj) before its evolution step; this is the same idea at laptop scale.

Departure from the paper: AgentGym-RL trains from the instruct model with RL alone (a 7B model follows
the format out of the box). Here, when `--bc-episodes` > 0, the policy first imitates the env's expert
(`env.expert()`, e.g. minigrid's BabyAI bot behind the text actions, envs/babyai_expert.py, or the
ScienceWorld simulator's gold path, envs/sciworld.py) on TRAIN
tasks for a short while, and RL starts from that model. Results report the RL gain over this warm start,
not over the raw model.

How: each rank plays its share of expert episodes in the env and records them token-exactly as
`rollout.Episode`s (prompt, then the expert's reply tokens with mask 1 and end-of-turn token, then
observation tokens with mask 0), exactly the layout RL trains on. Training is the negative
log-likelihood of the masked tokens, summed over a mini-batch and divided by its policy-token count
over all ranks, through the same FSDP2 model, micro-batching and sliced LM head as the RL update.

An exception inside `env.expert()` (minigrid's BabyAI bot raises a TypeError on a few tasks) ends that
demonstration as failed (end "expert_error", logged on stderr, counted in the summary); the run goes on.
Test: python -m pytest tests/test_warmstart.py
"""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from infra import budget, checkpoint, lora, peaks

from batch import Fast, collate, forward
from infra.distributed import all_max, all_sum, print0, sync
from infra.passes import DUMMY_WIDTH, micro_batches, pad
from infra.runlog import trim_heap
from infra.framing import Framing
from rollout import Episode, Expert, Play, Playground, play_rounds
from schedule import play_seed


class Ranks(NamedTuple):
    """The collectives imitation runs on: a sum and a max over all ranks (infra/distributed.py's `all_sum`,
    `all_max`; one process: the values themselves), and the number of ranks."""
    sum: Callable
    max: Callable
    world: int = 1


@dataclass(frozen=True)
class Imitation:
    """How `clone` imitates: `epochs` passes, `batch` episodes of this rank per optimizer step, micro-batches
    within `micro_tokens`, its order seeded by `seed`; stopped early once `seconds` (> 0) have passed on
    `clock` (infra/budget.py); `fused_head`: batch.forward's fast head."""
    epochs: int = 1
    batch: int = 1
    micro_tokens: int = 4096
    seed: int = 0
    seconds: float = 0.0
    clock: str = "wall"
    fused_head: bool = False


def expert_play(max_turns: int, max_context: int, framing: Framing = Framing(),
                env_timeout: float | None = None) -> Play:
    """How the expert's episodes are played: replies as long as the context allows, the run's framing."""
    return Play(max_turns, max_tokens=max_context, max_context=max_context, framing=framing, env_timeout=env_timeout)


def expert_episodes(chat, envs: list, make_env, task_ids: list[int], play: Play, pool=None) -> list[Episode]:
    """Expert episodes of `task_ids`, in order (task j on envs[j % len(envs)]), played by the RL rollout's
    own loop with the env's solver as the actor, so each is recorded exactly as a sampled episode would be;
    `play`: `expert_play`'s. An episode whose expert timed out is played once more, on a fresh env: the
    timeout is wall-clock, so a run paused for a measurement (SIGSTOP) or starved of its cores trips it
    with no fault of the expert's, and a finite demonstration set must not shrink by a pause (a 25-minute
    pause cost seed 0's ladder 3 of its 278 demonstrations in one epoch). A real hang costs twice the wait."""
    episodes = play_rounds(Expert(chat), chat, envs, make_env, [(t, 0) for t in task_ids], play, pool)
    again = [i for i, ep in enumerate(episodes) if ep.end == "expert_error" and ep.error.startswith("TimeoutError")]
    if again:
        redone = play_rounds(Expert(chat), chat, envs, make_env, [(episodes[i].task_id, 0) for i in again], play, pool)
        for i, ep in zip(again, redone):
            episodes[i] = ep
    return episodes


def demo_tasks(train_ids: list[int], count: int, seed: int) -> list[int]:
    """`count` distinct train tasks for the demonstrations, a seeded sample (never test tasks)."""
    return random.Random(seed * 7_000_003 + 1).sample(list(train_ids), min(count, len(train_ids)))


def demo_batch(episodes: list[Episode], pad_id: int) -> dict:
    """The expert episodes as one padded batch (batch.collate). A rank left without episodes still joins
    every collective, on a dummy row that trains nothing."""
    dummy = Episode(0, 0, [pad_id, pad_id], 1, mask=[0], logprobs=[0.0])  # one scored position, never trained
    return collate(episodes or [dummy], pad_id)


def nll_backward(model, batch: dict, chunk: list[int], micro_tokens: int, ranks: Ranks, scale: float = 1.0,
                 fused_head: bool = False) -> float:
    """Backward of `scale` x the mean -log p of the expert tokens of rows `chunk` (this rank's) over all
    ranks' policy tokens, micro-batched (`fused_head`: batch.forward's fast head); the optimizer is left to
    the caller. Collective: every rank calls it, with or without rows. Returns the mean NLL per policy token
    over all ranks."""
    mask, lengths = batch["mask"], batch["attn"].sum(1)
    (tokens,) = ranks.sum(mask[chunk].sum() if chunk else 0.0)
    micro, total = micro_batches(chunk, lengths, micro_tokens), 0.0
    for mb in pad(micro, ranks.max(len(micro))):
        rows = mb or [0]  # an empty micro-batch runs a dummy row whose mask is zeroed
        lp, _ = forward(model, batch, rows, 1.0, None if mb else DUMMY_WIDTH, policy_only=True,
                        fast=Fast(fused_head=fused_head))
        m = mask[rows, :lp.shape[1]].to(lp.device) * bool(mb)
        loss = -(lp * m).sum() / max(tokens, 1)
        (loss * scale * ranks.world).backward()  # FSDP2 averages gradients over ranks
        total += loss.item()
        del lp, loss
    (mean_nll,) = ranks.sum(total)
    return mean_nll


def clone(model, optimizer, episodes: list[Episode], how: Imitation, pad_id: int, ranks: Ranks,
          progress=None) -> list[float]:
    """Minimise -log p(expert tokens) as `how` says, stopping early once `how.seconds` (> 0) have passed on
    `how.clock` (infra/budget.py: the slowest rank's wall seconds, or all ranks' CPU seconds), one verdict for
    all ranks. Returns the mean NLL per policy token of each step (over all ranks)."""
    batch_episodes, seconds, clock = how.batch, how.seconds, how.clock
    steps = -(-len(episodes) // batch_episodes)
    n_real = len(episodes)
    batch = demo_batch(episodes, pad_id)
    gen = torch.Generator().manual_seed(how.seed)
    n_steps = ranks.max(steps)  # every rank runs the same number of optimizer steps (collectives)
    losses, start = [], budget.now(clock)
    for _ in range(how.epochs):
        order = torch.randperm(n_real, generator=gen).tolist()
        for s in range(n_steps):
            # One verdict for all ranks, even when their budgets differ: any rank past its own stops them all
            # (a rank that left alone would leave the other waiting forever in its next collective).
            spent = budget.combined(clock, budget.now(clock) - start, ranks.sum, ranks.max) if seconds else 0.0
            if seconds and ranks.max(int(spent > seconds)):
                return losses
            chunk = order[s * batch_episodes:(s + 1) * batch_episodes]
            mean_nll = nll_backward(model, batch, chunk, how.micro_tokens, ranks, fused_head=how.fused_head)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(mean_nll)
            if progress:
                progress(len(losses), n_steps * how.epochs, mean_nll, spent if seconds else None)
    return losses


def demonstrations(ground: Playground, count: int, seed: int, what: str = "warm start",
                   actor: str = "expert") -> tuple[list[Episode], int]:
    """This rank's share of `count` episodes on train tasks (sample `seed`), at the run's largest turn
    budget, played by the env pool in parallel; returns the successful ones and how many episodes all
    ranks played (collective: the summary line counts all ranks). A failed expert episode ends in fallback wandering, not in skill.

    `actor` "policy": the run's own generator plays them instead (one sample per task, at the run's
    temperature, seeded by `seed`), and its successes are what is imitated: self-imitation, i.e.
    rejection-sampling fine-tuning (RFT, Yuan et al. 2023): interaction with the env without a policy
    gradient, the control that asks whether RL adds more than imitating one's own wins."""
    g = ground
    t, turns = time.perf_counter(), max(g.d.schedule.budgets)
    tasks = demo_tasks(g.train_ids, count, seed)
    lo = g.rank * len(tasks) // g.world  # contiguous shares: the reply seeds follow the global index
    mine = tasks[lo:(g.rank + 1) * len(tasks) // g.world] if actor == "policy" else tasks[g.rank::g.world]
    if actor == "policy":
        g.engine.wake()  # its KV cache back (run() synced the weights in)
        play = g.play(turns, play_seed(seed, 3))
        played, size, clock, limit = [], len(g.env_pool), g.cfg.budget_clock, g.cfg.bc_play_seconds
        start, rounds = budget.now(clock), all_max(-(-len(mine) // size))
        for r in range(rounds):  # every rank the same rounds: the budget check is collective
            part = [(t_, 0) for t_ in mine[r * size:(r + 1) * size]]
            played += play_rounds(g.engine, g.chat, g.env_pool, g.make_env, part, play, g.threads, lo + r * size)
            n, wins = all_sum(len(played), sum(ep.success for ep in played))
            spent = budget.combined(clock, budget.now(clock) - start, all_sum, all_max)
            print0(f"  {what}: round {r + 1}/{rounds}, {int(n)} episodes played, {int(wins)} won, "
                   f"{spent:.0f}{f' of {limit:.0f}' if limit else ''} {clock} s of play")
            if limit and spent >= limit:
                break  # --bc-play-seconds spent: the rest of --bc-seconds imitates what was won so far
        g.engine.sleep()
    else:
        play = expert_play(turns, g.cfg.max_context, g.d.framing, g.cfg.env_timeout or None)
        played = expert_episodes(g.chat, g.env_pool, g.make_env, mine, play, g.threads)
    episodes = [ep for ep in played if ep.success]
    crashed = [ep for ep in played if ep.end == "expert_error"]
    for ep in crashed:  # every rank reports its own
        print(f"{what}: the expert failed on task {ep.task_id} ({ep.error[:200]}); one failed demonstration",
              file=sys.stderr, flush=True)
    n, wins, tokens, errors = all_sum(len(played), len(episodes), sum(sum(e.mask) for e in episodes), len(crashed))
    print0(f"{what}: {int(n)} {actor} episodes in {time.perf_counter() - t:.0f}s, {int(wins)} successful within "
           f"{turns} turns ({tokens / max(wins, 1):.0f} policy tokens each), {int(errors)} stopped by an expert error")
    return episodes, int(n)


class Anchor:
    """Imitation beside RL (`--bc-anchor N --bc-coef c`): every RL optimizer step also descends c x the
    NLL of `bc_batch` expert episodes per rank, drawn in turn from N of them played once at the start, on
    a sample of train tasks of their own (seed + 1000, the imitation control's sample). The
    demonstration-augmented policy gradient of DAPG (Rajeswaran et al., 2018) and of RL-with-SFT mixes
    for LLMs: RL's updates may move the policy only where the expert's likelihood does not fall much.
    It asks whether RL adds to imitation when both run together, in the time imitation alone would have."""

    def __init__(self, ground: Playground):
        cfg = ground.cfg
        self.episodes, _ = demonstrations(ground, cfg.bc_anchor, cfg.seed + 1000, what="imitation anchor")
        self.batch = demo_batch(self.episodes, ground.tokenizer.pad_token_id or 0)
        self.coef, self.size, self.micro_tokens, self.world = cfg.bc_coef, cfg.bc_batch, cfg.micro_tokens, ground.world
        self.fused_head = cfg.fused_head
        self.gen = torch.Generator().manual_seed(cfg.seed * 17 + ground.rank)
        self.queue: list[int] = []

    def backward(self, model) -> float:
        """Add this step's imitation gradient (collective); returns the mean expert NLL per token."""
        chunk = []
        while self.episodes and len(chunk) < min(self.size, len(self.episodes)):
            if not self.queue:  # a fresh pass over this rank's demonstrations, in a new order
                self.queue = torch.randperm(len(self.episodes), generator=self.gen).tolist()
            chunk.append(self.queue.pop())
        return nll_backward(model, self.batch, chunk, self.micro_tokens, Ranks(all_sum, all_max, self.world),
                            scale=self.coef, fused_head=self.fused_head)


def run(ground: Playground, policy, ref, warm_dir: Path) -> None:
    """The warm start as train.py runs it (collective): this rank's share of expert episodes on train
    tasks, the successful ones imitated through the FSDP2 `policy`, the result saved to `warm_dir` (an HF
    directory, for evaluate.py and --resume) and, with a KL term, copied into the reference model `ref`."""
    cfg, tokenizer = ground.cfg, ground.tokenizer
    t, clock0 = time.perf_counter(), budget.now(cfg.budget_clock)
    what = "self-imitation" if cfg.bc_actor == "policy" else "warm start"
    tasks_seed = cfg.seed if cfg.bc_tasks_seed < 0 else cfg.bc_tasks_seed  # one finite set across --seed
    with peaks.phase("warmstart.demonstrations"):  # infra/peaks.py: each phase's peak memory
        if cfg.bc_actor == "policy":
            # The generator plays, and startup.warm_start put it to sleep, its weights discarded (vLLM's
            # sleep frees them; its generate then refuses to run): the policy's weights go back in first,
            # as after every RL update (train.py's step 5). The in-process engines ignore sleep.
            sync(ground.engine, policy, getattr(torch, ground.d.dtype))
        episodes, played = demonstrations(ground, cfg.bc_episodes, tasks_seed, what, cfg.bc_actor)
    trained = [p for p in policy.parameters() if p.requires_grad]  # --train-layers may freeze some
    optimizer = torch.optim.AdamW(trained, lr=cfg.bc_lr, weight_decay=cfg.weight_decay)
    log = []  # warmstart.jsonl: the warm start's own metrics (a control run has no RL step to log)

    def progress(k: int, total: int, nll: float, spent: float | None) -> None:
        log.append({"step": k, "nll": nll, "time": time.perf_counter() - t})
        # under --bc-seconds the epochs are a ceiling that is never reached (the protocol's arm B sets
        # millions of steps): the seconds left are what the reader waits on, so show those instead
        of = (f": NLL {nll:.3f} per token (imitation: {spent:,.1f} of {left:,.1f} {cfg.budget_clock} s used)"
              if spent is not None else f"/{total}: NLL {nll:.3f} per token")
        print0(f"  warm-start step {k}{of}")
        if cfg.trim_heap:  # each step's freed heap back to the system (--trim-heap; train.py trims its steps too)
            trim_heap()
    # --bc-seconds counts from the start of the warm start (demonstrations played included), as RL's steps
    # count their rollouts, on --budget-clock (infra/budget.py)
    spent = budget.combined(cfg.budget_clock, budget.now(cfg.budget_clock) - clock0, all_sum, all_max)
    left = max(cfg.bc_seconds - spent, 1e-9) if cfg.bc_seconds else 0.0
    with peaks.phase("warmstart.imitate"):
        how = Imitation(cfg.bc_epochs, cfg.bc_batch, cfg.micro_tokens, cfg.seed, left, cfg.budget_clock, cfg.fused_head)
        losses = clone(policy, optimizer, episodes, how, tokenizer.pad_token_id or 0,
                       Ranks(all_sum, all_max, ground.world), progress)
    del optimizer
    with peaks.phase("warmstart.save"):
        if lora.active(policy):  # the imitated adapters become the base, so the KL's reference (adapters off)
            lora.fold_into_base(policy, str(warm_dir))  # and a resumed run's base are the warm start (infra/lora.py)
        checkpoint.save_model(warm_dir, policy, tokenizer, ground.rank)
        if ref is not None and not isinstance(ref, lora.Base):
            with torch.no_grad():
                ref.load_state_dict(policy.state_dict())
    cut = f" (--bc-seconds {cfg.bc_seconds:g} reached: {len(losses)} optimizer steps)" if cfg.bc_seconds else ""
    nll = f"NLL {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no optimizer step"
    print0(f"warm start done in {time.perf_counter() - t:.0f}s{cut}: {nll}; saved {warm_dir}")
    (demos,) = all_sum(len(episodes))  # collective: every rank calls it
    spent_all = budget.combined(cfg.budget_clock, budget.now(cfg.budget_clock) - clock0, all_sum, all_max)
    if ground.rank == 0:
        done = {"done": True, "demonstrations": int(demos), "optimizer_steps": len(losses),
                "seconds": time.perf_counter() - t, "bc_seconds": cfg.bc_seconds, "clock": cfg.budget_clock,
                "budget_spent": spent_all, "actor": cfg.bc_actor, "tasks_seed": tasks_seed,
                "played": played}
        (warm_dir.parent / "warmstart.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*log, done]))

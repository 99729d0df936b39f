"""Behaviour cloning from the environment's own solver: the warm start before RL on a real model.

Why: untrained, SmolLM2-135M-Instruct almost never writes a reply in the required format (BabyAI: 2
of 256 first replies), so every episode scores 0, every GRPO group is constant and its advantage is
exactly 0: RL from environment reward has nothing to work with. AgentGym itself started its agents from
behaviour cloning (AgentTraj) before its evolution step; this is the same idea at laptop scale.

Departure from the paper: AgentGym-RL trains from the instruct model with RL alone (a 7B model follows
the format out of the box). Here, when `--bc-episodes` > 0, the policy first imitates the env's expert
(`env.expert()`, e.g. minigrid's BabyAI bot behind the text actions, envs/babyai_expert.py) on TRAIN
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

import random
import sys
import time

import torch

import checkpoint

from batch import DUMMY_WIDTH, collate, forward, micro_batches, pad
from framing import Framing
from rollout import Episode, opening


def expert_episode(env, chat, task_id: int, max_turns: int, max_context: int, framing: Framing = Framing()) -> Episode:
    """One expert episode of `task_id`, recorded as the RL rollout would record a sampled one (same framing)."""
    obs = env.reset(task_id)
    instruction, acknowledgement = framing.opening(env)
    ep = Episode(task_id, 0, [], 0, messages=opening(instruction, acknowledgement) + [{"role": "user", "content": obs}])
    ep.ids = chat.prompt(instruction, obs, acknowledgement)
    ep.prompt_len = len(ep.ids)
    for turn in range(max_turns):
        try:
            reply = env.expert()
        except Exception as exc:  # noqa: BLE001  the solver's own bug (minigrid's BabyAI bot raises a TypeError
            # on some tasks) costs one demonstration, flagged, never the whole run
            ep.end, ep.error = "expert_error", f"{type(exc).__name__}: {exc}"
            break
        reply_ids = chat.encode(reply) + list(chat.stop_ids[:1])
        if len(ep.ids) + len(reply_ids) > max_context:
            ep.end = "context"
            break
        ep.append(reply_ids, True)
        ep.turns += 1
        ep.messages.append({"role": "assistant", "content": reply})
        obs, ep.reward, done = env.step(reply)
        ep.success = bool(getattr(env, "success", False))
        if done:
            ep.end = "done"
            break
        obs_ids = chat.observation(obs, stopped=True)
        if turn + 1 == max_turns or len(ep.ids) + len(obs_ids) >= max_context:
            ep.end = "horizon" if turn + 1 == max_turns else "context"
            break
        ep.append(obs_ids, False)
        ep.messages.append({"role": "user", "content": obs})
    ep.end = ep.end or "horizon"
    return ep


def demo_tasks(train_ids: list[int], count: int, seed: int) -> list[int]:
    """`count` distinct train tasks for the demonstrations, a seeded sample (never test tasks)."""
    return random.Random(seed * 7_000_003 + 1).sample(list(train_ids), min(count, len(train_ids)))


def clone(model, optimizer, episodes: list[Episode], epochs: int, batch_episodes: int, micro_tokens: int,
          seed: int, pad_id: int, reduce_sum, reduce_max, world: int, progress=None, seconds: float = 0.0) -> list[float]:
    """Minimise -log p(expert tokens) over `epochs` passes, `batch_episodes` episodes of this rank per
    optimizer step, stopping early once `seconds` (> 0) have passed (the slowest rank's clock decides, so
    all stop at the same step). Returns the mean NLL per policy token of each step (over all ranks)."""
    steps = -(-len(episodes) // batch_episodes)
    n_real = len(episodes)
    # a rank left without episodes still joins every collective, on a dummy row that trains nothing
    dummy = Episode(0, 0, [pad_id, pad_id], 1, mask=[0], logprobs=[0.0])  # one scored position, never trained
    batch = collate(episodes or [dummy], pad_id)
    mask, lengths = batch["mask"], batch["attn"].sum(1)
    gen = torch.Generator().manual_seed(seed)
    n_steps = reduce_max(steps)  # every rank runs the same number of optimizer steps (collectives)
    losses, start = [], time.perf_counter()
    for _ in range(epochs):
        order = torch.randperm(n_real, generator=gen).tolist()
        for s in range(n_steps):
            if seconds and reduce_max(int(1000 * (time.perf_counter() - start)) + 1) > 1000 * seconds:  # whole ms
                return losses
            chunk = order[s * batch_episodes:(s + 1) * batch_episodes]
            (tokens,) = reduce_sum(mask[chunk].sum() if chunk else 0.0)
            micro = micro_batches(chunk, lengths, micro_tokens)
            total = 0.0
            for mb in pad(micro, reduce_max(len(micro))):
                rows = mb or [0]  # an empty micro-batch runs a dummy row whose mask is zeroed
                lp, _ = forward(model, batch, rows, 1.0, width=None if mb else DUMMY_WIDTH, policy_only=True)
                m = mask[rows, :lp.shape[1]].to(lp.device) * bool(mb)
                loss = -(lp * m).sum() / max(tokens, 1)
                (loss * world).backward()  # FSDP2 averages gradients over ranks
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            (mean_nll,) = reduce_sum(total)
            losses.append(mean_nll)
            if progress:
                progress(len(losses), n_steps * epochs, mean_nll)
    return losses


def run(cfg, turns: int, policy, ref, env_pool, pool, chat, tokenizer, train_ids, warm_dir, reduce_sum, reduce_max,
        say=print, framing: Framing = Framing()) -> None:
    """The warm start as train.py runs it (collective): this rank's share of expert episodes on train
    tasks at `turns`, the successful ones imitated through the FSDP2 policy, the result saved to
    `warm_dir` (an HF directory, for evaluate.py and --resume) and, with a KL term, copied into the
    reference model. `say` prints on rank 0."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    t = time.perf_counter()
    mine = demo_tasks(train_ids, cfg.bc_episodes, cfg.seed)[rank::world]
    parts = [mine[i::len(env_pool)] for i in range(len(env_pool))]  # one env instance plays each part
    played = pool.map(lambda i: [expert_episode(env_pool[i], chat, task, turns, cfg.max_context, framing)
                                 for task in parts[i]], range(len(env_pool)))
    played = [ep for part in played for ep in part]
    # only the expert's successes: a failed expert episode ends in fallback wandering, not in skill
    episodes = [ep for ep in played if ep.success]
    crashed = [ep for ep in played if ep.end == "expert_error"]
    for ep in crashed:  # every rank reports its own
        print(f"warm start: the expert failed on task {ep.task_id} ({ep.error[:200]}); one failed demonstration",
              file=sys.stderr, flush=True)
    n, wins, tokens, errors = reduce_sum(len(played), len(episodes), sum(sum(e.mask) for e in episodes), len(crashed))
    say(f"warm start: {int(n)} expert episodes in {time.perf_counter() - t:.0f}s, {int(wins)} successful within "
        f"{turns} turns ({tokens / max(wins, 1):.0f} policy tokens each), {int(errors)} stopped by an expert error; "
        "imitating the successful ones")
    trained = [p for p in policy.parameters() if p.requires_grad]  # --train-layers may freeze some
    optimizer = torch.optim.AdamW(trained, lr=cfg.bc_lr, weight_decay=cfg.weight_decay)
    progress = lambda k, total, nll: say(f"  warm-start step {k}/{total}: NLL {nll:.3f} per token")  # noqa: E731
    # --bc-seconds counts from the start of the warm start (expert episodes included), like RL's wall time
    budget = max(cfg.bc_seconds - (time.perf_counter() - t), 1e-9) if cfg.bc_seconds else 0.0
    losses = clone(policy, optimizer, episodes, cfg.bc_epochs, cfg.bc_batch, cfg.micro_tokens, cfg.seed,
                   tokenizer.pad_token_id or 0, reduce_sum, reduce_max, world, progress=progress, seconds=budget)
    del optimizer
    checkpoint.save_model(warm_dir, policy, tokenizer, rank)
    if ref is not None:
        with torch.no_grad():
            ref.load_state_dict(policy.state_dict())
    cut = f" (--bc-seconds {cfg.bc_seconds:g} reached: {len(losses)} optimizer steps)" if cfg.bc_seconds else ""
    nll = f"NLL {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "no optimizer step"
    say(f"warm start done in {time.perf_counter() - t:.0f}s{cut}: {nll}; saved {warm_dir}")

"""Benchmark one training step of train.py on synthetic episodes: time per phase, tokens/s, weight
sync, and the cost of FSDP2 against a plain unsharded update of the same tokens.

    torchrun --nproc_per_node 2 bench/train_step.py                 # 2 ranks, FSDP2 over gloo
    python bench/train_step.py --model small --hidden 256 --layers 4  # one process, a larger model

The step is train.py's, phases (2) to (5), built from train.py's own functions (
`global_advantages`, `update`, `sync`, `shard`, `full_tensors`) and batch.py's (`collate`, `micro_batches`, `pad`, `score`);
the rollout (1) is replaced by synthetic episodes, since bench/rollout.py measures it. The plain
comparison runs the same `train.update` with one-process reductions on an unsharded copy.

Synthetic episodes: random token ids with the layout of a TextCraft episode on the tiny tokenizer:
a prompt of about `--prompt` tokens (mask 0), then 1 to `--turns` assistant replies of up to
`--reply` tokens (mask 1; half run to the cap, the others stop earlier), each but the last followed
by an observation of about `--obs` tokens (mask 0). Rewards are 0/1 in groups of `--samples`.

Printed on rank 0 (each phase: mean over `--repeats` steps after a warm-up, max over ranks):
- seconds per phase: collate and micro-batching, old/ref logprobs, advantages, update, weight sync
  (full_tensors streamed into engine.sync_weights), and the share of each in the step;
- trained tokens/s of the update and of the whole step, counting masked (policy) tokens and all tokens;
- the weight sync, and the all-gathers alone (full_tensors drained without an engine);
- FSDP2 against plain: the update of each rank's share with FSDP2 at world N, next to a plain
  unsharded model doing forward + backward + AdamW step of rank 0's share in one process (the other
  ranks wait), the two interleaved step by step so that load changes hit both; and their ratio.
  Under torchrun each process runs one torch thread (torchrun sets OMP_NUM_THREADS=1), so the plain
  run uses as many threads as one rank.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import algorithms as A  # noqa: E402
import config as configs  # noqa: E402
import batch as batch_  # noqa: E402
import train  # noqa: E402
from engine import make_engine, vllm_available  # noqa: E402
from rollout import Episode  # noqa: E402
import tiny as tiny_recipe  # noqa: E402
from tiny import resolve_model  # noqa: E402

PHASES = ("collate", "logprobs", "advantages", "update", "sync", "gather_only", "plain_update")


def model_dir(args, rank: int) -> tuple[str, str | None]:
    """The tiny model, or a Qwen2-shaped model of `--hidden`/`--layers` on the tiny tokenizer, saved by
    rank 0 into a temporary directory (engines load from a directory). Returns (path, dir to delete)."""
    if rank == 0:
        resolve_model("tiny")  # rank 0 builds the tiny model first, so ranks do not race to build it
    dist.barrier()
    tiny = resolve_model("tiny")
    if args.model == "tiny":
        return tiny, None
    path = [None]
    if rank == 0:
        from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

        base = Qwen2Config.from_pretrained(tiny)
        shape = dict(tiny_recipe.MODEL, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                     num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                     num_key_value_heads=max(1, args.hidden // 128))  # head_dim 64, grouped KV as in Qwen2
        config = Qwen2Config(vocab_size=base.vocab_size, pad_token_id=base.pad_token_id, bos_token_id=None,
                             eos_token_id=base.eos_token_id, **shape)
        torch.manual_seed(0)
        path[0] = tempfile.mkdtemp(prefix="bench-train-step-")
        Qwen2ForCausalLM(config).save_pretrained(path[0])
        AutoTokenizer.from_pretrained(tiny).save_pretrained(path[0])
    dist.broadcast_object_list(path, src=0)
    return path[0], path[0] if rank == 0 else None


def synthetic(args, vocab: int) -> list[Episode]:
    """The whole step's episodes (identical on every rank); each rank takes its contiguous share."""
    rng = random.Random(args.seed)
    token = lambda: rng.randrange(vocab)  # noqa: E731
    out = []
    for i in range(args.episodes):
        p = args.prompt + rng.randint(-args.prompt // 10, args.prompt // 10)
        ep = Episode(i // args.samples, i // args.samples, [token() for _ in range(p)], p)
        turns = rng.randint(1, args.turns)
        for turn in range(turns):
            n = args.reply if rng.random() < 0.5 else rng.randint(max(1, args.reply // 4), args.reply)
            ep.append([token() for _ in range(n)], True, [-rng.random() * 5 for _ in range(n)])
            if turn + 1 < turns:
                ep.append([token() for _ in range(rng.randint(args.obs // 2, args.obs * 3 // 2))], False)
        ep.turns, ep.reward = turns, float(rng.random() < 0.3)
        out.append(ep)
    return out


def update(model, opt, batch, old, ref_lp, adv, cfg, kl_in_reward, reduce_sum=None, reduce_max=None) -> dict:
    """train.update on one model; plain Python reductions run it unsharded on one process."""
    return train.update(cfg, {"policy": model}, {"policy": opt}, None, batch, old, ref_lp, None, adv, adv,
                        kl_in_reward, cfg.seed, reduce_sum, reduce_max)


def step(policy, ref, opt, plain, engine, cfg, d, episodes, pad_id, world) -> dict:
    """One training step as train.main runs it after the rollout; seconds per phase on this rank."""
    times, clock = {}, time.perf_counter
    kl_in_reward = cfg.algo.startswith("reinforce++") and ref is not None
    t = clock()  # batch building and micro-batching, which train.main does before it starts timing (2)
    batch = batch_.collate(episodes, pad_id)
    mask, lengths = batch["mask"], batch["attn"].sum(1)
    rows = list(range(len(episodes)))
    n_micro = train.all_max(len(batch_.micro_batches(rows, lengths, cfg.micro_tokens)))
    micro = batch_.pad(batch_.micro_batches(rows, lengths, cfg.micro_tokens), n_micro)
    times["collate"], t = clock() - t, clock()
    old = batch_.score(policy, batch, micro, cfg.temperature)
    ref_lp = batch_.score(ref, batch, micro, cfg.temperature) if ref is not None else None
    times["logprobs"], t = clock() - t, clock()
    token_kl = A.kl_penalty(old, ref_lp, cfg.kl_kind) * mask if kl_in_reward else None
    adv, _ = train.global_advantages(cfg, d, batch, None, token_kl)
    times["advantages"], t = clock() - t, clock()
    update(policy, opt, batch, old, ref_lp, adv, cfg, kl_in_reward)
    times["update"], t = clock() - t, clock()
    if engine is not None:
        engine.wake()
        train.sync(engine, policy, torch.float32)
    times["sync"], t = clock() - t, clock()
    for _ in train.full_tensors(policy, torch.float32):
        pass
    times["gather_only"] = clock() - t
    # the same tokens through an unsharded copy on rank 0 alone; the other ranks wait at the barrier
    t = clock()
    if plain is not None:
        update(plain[0], plain[1], batch, old, ref_lp, adv, cfg, kl_in_reward,
               lambda *xs: [float(x) for x in xs], lambda n: n)
    times["plain_update"] = clock() - t
    dist.barrier()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny",
                        help="tiny: tiny.py's model; small: a Qwen2-shaped model of --hidden and --layers")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of --model small (head_dim 64)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of --model small")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per step over all ranks")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task (GRPO group size)")
    parser.add_argument("--prompt", type=int, default=700, help="prompt tokens (TextCraft's first turn: ~700)")
    parser.add_argument("--turns", type=int, default=6, help="most assistant turns of an episode")
    parser.add_argument("--reply", type=int, default=48, help="token cap of one reply")
    parser.add_argument("--obs", type=int, default=30, help="mean tokens of one observation turn")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--engine", choices=("hf", "vllm", "none"), default="hf", help="engine synced each step")
    parser.add_argument("--algo", default="grpo", choices=("grpo", "rloo", "reinforce++", "reinforce++_baseline"))
    parser.add_argument("--kl-coef", type=float, default=0.001, help="0 drops the reference model")
    parser.add_argument("--micro-tokens", type=int, default=16384, help="token budget of one micro-batch")
    parser.add_argument("--no-plain", action="store_true", help="skip the unsharded comparison")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic episodes")
    args = parser.parse_args()

    # train.py's defaults (the CPU preset) except for the flags above
    cfg = configs.Config(algo=args.algo, kl_coef=args.kl_coef, micro_tokens=args.micro_tokens, device="cpu",
                         tasks_per_step=max(1, args.episodes // args.samples), samples_per_task=args.samples)
    world_guess = int(os.environ.get("WORLD_SIZE", 1))
    if args.episodes % world_guess or args.episodes % args.samples:
        raise SystemExit(f"error: --episodes {args.episodes} must split over {world_guess} ranks and into "
                         f"groups of --samples {args.samples}")
    if args.engine == "vllm" and not vllm_available():
        raise SystemExit("error: --engine vllm but vLLM does not import; use --engine hf")
    d = configs.derive(cfg)
    rank, world = train.setup_distributed("cpu")
    torch.manual_seed(rank)
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, cleanup = model_dir(args, rank)
    load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # noqa: E731
    mesh = init_device_mesh("cpu", (world,))
    policy = train.shard(load(), mesh, d.dtype, False)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ref = train.shard(load(), mesh, d.dtype, False, trainable=False) if cfg.kl_coef > 0 else None
    plain = None
    if rank == 0 and not args.no_plain:
        model = load()
        plain = (model, torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay))
    engine = make_engine(path, args.engine, "cpu", "float32", cfg.max_context, rank) if args.engine != "none" else None
    tokenizer = AutoTokenizer.from_pretrained(path)
    params = sum(p.numel() for p in policy.parameters())  # DTensor.numel() is the global count

    # random ids below the first special token, so no synthetic token is a role or end-of-turn marker
    episodes = synthetic(args, min(tokenizer.all_special_ids))
    share = len(episodes) // world
    mine = episodes[rank * share:(rank + 1) * share]
    pad_id = tokenizer.pad_token_id or 0
    sums = {k: 0.0 for k in PHASES}
    for r in range(args.repeats + 1):  # step 0 is the warm-up: FSDP2 lazy init, allocator, first calls
        times = step(policy, ref, opt, plain, engine, cfg, d, mine, pad_id, world)
        slowest = torch.tensor([times[k] for k in PHASES], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if r:
            for k, v in zip(PHASES, slowest.tolist()):
                sums[k] += v / args.repeats

    masked, total = train.all_sum(sum(sum(e.mask) for e in mine), sum(len(e.ids) for e in mine))
    mine0 = episodes[:share]
    if rank == 0:
        report(args, sums, world, params, policy.config, masked, total, sum(sum(e.mask) for e in mine0),
               sum(len(e.ids) for e in mine0))
    dist.barrier()
    if engine is not None and hasattr(engine, "close"):
        engine.close()
    if cleanup:
        shutil.rmtree(cleanup, ignore_errors=True)
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()


def report(args, s, world, params, config, masked, total, masked0, total0) -> None:
    step_s = sum(s[k] for k in ("collate", "logprobs", "advantages", "update", "sync"))
    print(f"# model {args.model}: {params / 1e6:.2f}M parameters, hidden {config.hidden_size}, "
          f"{config.num_hidden_layers} layers; world {world} (FSDP2, gloo, CPU), torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print(f"# {args.episodes} synthetic episodes per step ({args.episodes // world} per rank): {total:.0f} tokens, "
          f"{masked:.0f} of them policy tokens (mask 1); engine {args.engine}; {args.algo}, kl_coef {args.kl_coef}; "
          f"mean of {args.repeats} steps after a warm-up, each phase the slowest rank's")
    rows = [("phase", "s/step", "% of step")]
    names = {"collate": "collate + micro-batching", "logprobs": "old + ref logprobs (2)",
             "advantages": "advantages (3)", "update": "update: fwd+bwd+step (4)",
             "sync": "weight sync full_tensors -> engine (5)"}
    for k, name in names.items():
        rows.append((name, f"{s[k]:.3f}", f"{100 * s[k] / step_s:.1f}%"))
    rows.append(("step total (no rollout)", f"{step_s:.3f}", "100%"))
    rows.append(("  all-gathers alone (full_tensors drained)", f"{s['gather_only']:.3f}", ""))
    rows += [("trained tokens/s, update: policy (mask 1)", f"{masked / s['update']:.0f}", ""),
             ("trained tokens/s, update: all tokens", f"{total / s['update']:.0f}", ""),
             ("trained tokens/s, whole step: policy (mask 1)", f"{masked / step_s:.0f}", ""),
             ("trained tokens/s, whole step: all tokens", f"{total / step_s:.0f}", "")]
    print(table(rows))
    if args.no_plain:
        return
    print(f"\n# FSDP2 vs plain, same tokens per process ({total0} tokens, {masked0} policy tokens of rank 0's share)")
    print(table([("update of the share", "s", "tokens/s"),
                 ("plain unsharded, 1 process", f"{s['plain_update']:.3f}", f"{total0 / s['plain_update']:.0f}"),
                 (f"FSDP2, world {world}", f"{s['update']:.3f}", f"{total0 / s['update']:.0f}")]))
    print(f"FSDP2 / plain update time ratio: {s['update'] / s['plain_update']:.2f}")


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


if __name__ == "__main__":
    main()

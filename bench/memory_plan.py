"""Per-rank memory budget of train.py, by arithmetic alone: will a model train at this world size, dtype
and micro-batch budget on a GPU of this size? And the same formulas against what bench/train_step.py
measured on this machine's CPU.

    python bench/memory_plan.py --model qwen2.5-7b --world 8 --gpu-gb 80                # the paper's setting
    python bench/memory_plan.py --model smollm2-135m --world 2 --device cpu --engine none --kl-coef 0
    python bench/memory_plan.py --model path/to/config.json --world 4 --no-checkpointing
    python bench/memory_plan.py --world 1 --gpu-gb 139 --lora-rank 32                  # LoRA on one H200
    python bench/memory_plan.py --compare /tmp/smollm2.json /tmp/tiny.json   # bench/train_step.py --json

Models: built-in `qwen2.5-7b` and `smollm2-135m` configs, `tiny`/`smollm2`, or any HF config.json (or a
directory holding one). The arithmetic, its rows and their reasons live in memplan.py, which train.py,
evaluate.py and bench/train_step.py consult before any model loads; this script prints the rows.

Printed: the table of rows for the training phase (forward/backward of one micro-batch) and the
rollout phase (training state resident, gradients freed, the generator awake), their totals, and
whether each fits `--gpu-gb`. `--compare` prints, for each bench JSON, the estimate next to the peak
RSS that bench/train_step.py measured per rank (ranks that did not run its plain baseline).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from infra import lora  # noqa: E402
from infra.memplan import GB, MB, Shape, model_config as load_config, plan, shape  # noqa: E402


def show(name: str, s: Shape, p: dict, args) -> None:
    print(f"# {name}: {p['params'] / 1e9:.3f}B parameters (L {s.L}, H {s.H}, I {s.I}, V {s.V}, kv {s.kv}, "
          f"{'tied' if s.tied else 'untied'} head); world {args.world}, {args.dtype}, {args.device}, engine "
          f"{args.engine}, kl {'on' if args.kl_coef > 0 else 'off'}, micro-batch {args.micro_tokens} tokens")
    rows = [("per rank", "training (GB)", "rollout (GB)")]
    keys = list(dict.fromkeys(list(p["train"]) + list(p["rollout"])))
    for k in keys:
        a, b = p["train"].get(k), p["rollout"].get(k)
        rows.append((k, "" if a is None else f"{a / GB:.2f}", "" if b is None else f"{b / GB:.2f}"))
    t, r = sum(p["train"].values()), sum(p["rollout"].values())
    rows.append(("total", f"{t / GB:.2f}", f"{r / GB:.2f}"))
    print(table(rows))
    if args.device == "cuda":
        for phase, total in (("training", t), ("rollout", r)):
            verdict = "fits" if total <= args.gpu_gb * GB else "does NOT fit"
            print(f"{phase}: {total / GB:.1f} GB of {args.gpu_gb:g} GB: {verdict}")
        if p["kv_tokens"] is not None:
            print(f"vLLM KV cache at --gpu-util {args.gpu_util}: about {p['kv_tokens']:.0f} tokens")
    load = (p["host"] or p["load"])[next(k for k in (p["host"] or p["load"]) if k.startswith("the whole model"))]
    print(f"loading: up to {load / GB:.2f} GB of host RAM per rank (the whole model in fp32), "
          f"{args.world * load / GB:.1f} GB for {args.world} ranks on one node (less when the checkpoint "
          f"is fp32 on disk: its memory-mapped pages are shared)")


def compare(paths: list[str]) -> None:
    """Estimates against bench/train_step.py's measured peak RSS (MB), side by side."""
    rows = [("run", "rank", "after imports", "load: est | measured", "step: est | measured",
             "est / measured")]
    for path in paths:
        f = json.loads(Path(path).read_text())
        a, world = f["args"], f["world"]
        s = shape(f["config"])
        tokens = f.get("max_slots") or a["micro_tokens"]
        for rank, m in enumerate(f["memory"]):
            if rank == 0 and not a["no_plain"]:
                continue  # rank 0 also held the plain transformers baseline
            base = m["imports"] * MB
            p = plan(s, world, a["dtype"], a["checkpointing"], tokens, a["kl_coef"] > 0, a["engine"], "cpu",
                     runtime=base, max_context=a.get("max_context", 3072), seqs=a["episodes"] // world)
            step = sum(p["train"].values())
            engine = p["train"][[k for k in p["train"] if k.startswith("generator")][0]]
            load = base + p["load"]["the whole model in fp32"] + engine
            name = (f"{a['model']} {a['dtype']}{' ckpt' if a['checkpointing'] else ''} "
                    f"kl {a['kl_coef']:g} {a['engine']} T={tokens}")
            rows.append((name, str(rank), f"{m['imports']:.0f}", f"{load / MB:.0f} | {m['loaded']:.0f}",
                         f"{step / MB:.0f} | {m['step']:.0f}", f"{step / MB / m['step']:.2f}"))
            print(f"# {name}, rank {rank}: " + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in p["train"].items()))
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-7b",
                        help="qwen2.5-7b, smollm2-135m, tiny, smollm2, or an HF config.json / model directory")
    parser.add_argument("--world", type=int, default=8, help="FSDP2 ranks")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="compute dtype")
    parser.add_argument("--no-checkpointing", action="store_true", help="activation checkpointing off")
    parser.add_argument("--micro-tokens", type=int, default=16384, help="token budget of one micro-batch")
    parser.add_argument("--kl-coef", type=float, default=0.001, help="0: no reference model")
    parser.add_argument("--engine", choices=("vllm", "hf", "none"), default="vllm")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU")
    parser.add_argument("--gpu-util", type=float, default=0.5,
                        help="vLLM's gpu_memory_utilization (train.py --gpu-memory-utilization, default 0.5)")
    parser.add_argument("--runtime-gb", type=float, default=1.0, help="CUDA context and allocator slack per rank")
    parser.add_argument("--max-context", type=int, default=16384, help="token cap of an episode (CPU vLLM's KV)")
    parser.add_argument("--seqs", type=int, default=16, help="episodes per rank (CPU vLLM's KV cache)")
    parser.add_argument("--lora-rank", type=int, default=0, help="train.py --lora-rank (every linear layer)")
    parser.add_argument("--train-layers", type=int, default=0, help="train.py --train-layers")
    parser.add_argument("--compare", nargs="+", metavar="JSON", help="bench/train_step.py --json files")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return
    s = shape(load_config(args.model))
    runtime = args.runtime_gb * GB if args.device == "cuda" else 0.0
    p = plan(s, args.world, args.dtype, not args.no_checkpointing, args.micro_tokens, args.kl_coef > 0, args.engine,
             args.device, args.gpu_gb, args.gpu_util, runtime, args.max_context, args.seqs, train_layers=args.train_layers,
             adapters=lora.param_count(s, args.lora_rank, lora.TARGETS) if args.lora_rank else 0)
    show(args.model, s, p, args)


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


if __name__ == "__main__":
    main()

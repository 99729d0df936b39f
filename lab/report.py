"""The study's command line: a result folder's tables, a result folder made from a run and its
evaluations, one recipe's seeds side by side, a run's report.html, or the before/after table of
evaluate.py outputs. The numbers are lab/stats.py's; result folders are lab/results.py's, their tables
lab/tables.py's; the run report is lab/runreport.py's, a protocol ladder's curve lab/curve.py's. Run it
from the repository's root:

    python -m lab.report --publish runs/babyai-smollm2 results/babyai-smollm2 untrained=runs/.../eval-untrained ...
    python -m lab.report results/babyai-smollm2          # every table of that folder, from its files only
    python -m lab.report results/protocol-babyai-seed0-ladder   # a protocol ladder's curve.png and its table
    python -m lab.report runs/babyai-grpo [LABEL=EVAL_DIR ...]   # the run's report.html (lab/runreport.py)
    python -m lab.report --unpack results/NAME/evals/untrained runs/eval-untrained   # a published evaluation back
    python -m lab.report --refresh results/NAME          # its action counts made again from its transcripts

Tests: python -m pytest tests/test_report.py tests/test_runreport.py
"""
from __future__ import annotations

import sys
from pathlib import Path

from lab import runreport
from lab.results import publish, refresh, unpack
from lab.stats import compare, load_evals, paired_table
from lab.tables import render, seeds_table


USAGE = """usage:
  python -m lab.report results/NAME                      the tables of a result folder, from its files only
                                                         (a protocol ladder's folder: curve.png and its table)
  python -m lab.report results/A results/B ...           one recipe's seeds: each paired difference per seed, the mean
  python -m lab.report --publish RUN_DIR results/NAME [--control CONTROL_DIR] [LABEL=EVAL_DIR ...]
                                                         make a result folder (RUN_DIR: train.py's --out, or -;
                                                         CONTROL_DIR: the imitation control's --out)
  python -m lab.report --unpack results/NAME/evals/LABEL EVAL_DIR
                                                         a published evaluation back into evaluate.py's output
  python -m lab.report --refresh results/NAME            its evaluations' action counts made again from their
                                                         transcripts, then its tables
  python -m lab.report RUN_DIR [LABEL=EVAL_DIR ...]     RUN_DIR/report.html: curves, tables, episodes (lab/runreport.py)
  python -m lab.report LABEL=EVAL_DIR [LABEL=EVAL_DIR ...]   before/after table of evaluate.py outputs"""


def main(args: list[str]) -> None:
    if any(a in ("-h", "--help") for a in args) or not args:
        raise SystemExit(USAGE)
    if args[0] == "--publish":
        rest, control = args[3:], None
        if rest[:1] == ["--control"] and len(rest) > 1:
            rest, control = rest[2:], Path(rest[1])
        if len(args) < 3 or any("=" not in a for a in rest):
            raise SystemExit(USAGE)
        evals = [(label, Path(d)) for label, d in (a.split("=", 1) for a in rest)]
        print(publish(None if args[1] == "-" else Path(args[1]), Path(args[2]), evals, control=control), end="")
    elif args[0] == "--refresh" and len(args) == 2:
        print(f"made again from the transcripts: {len(refresh(Path(args[1])))} files")
        print(render(Path(args[1])), end="")
    elif args[0] == "--unpack" and len(args) == 3:
        print(f"unpacked {args[1]} into {unpack(Path(args[1]), Path(args[2]))}")
    elif "=" not in args[0] and (Path(args[0]) / "metrics.jsonl").exists() and all("=" in a for a in args[1:]):
        evals = [(label, Path(d)) for label, d in (a.split("=", 1) for a in args[1:])]
        print(f"report: {runreport.write(Path(args[0]), evals)}")
    elif len(args) == 1 and (Path(args[0]) / "ladder.json").exists():  # lab/ladder.py's folder: its curve
        from lab import curve
        print(curve.report(Path(args[0])) + f"\ncurve: {Path(args[0]) / 'curve.png'}")
    elif len(args) > 1 and all((Path(a) / "manifest.json").exists() for a in args):
        print(seeds_table([Path(a) for a in args]), end="")
    elif len(args) == 1 and "=" not in args[0]:
        if not (Path(args[0]) / "manifest.json").exists():
            raise SystemExit(f"error: {args[0]} has no manifest.json: not a result folder (make one with --publish); "
                             "nor a run directory (no metrics.jsonl)")
        print(render(Path(args[0])), end="")
    elif all("=" in a for a in args):
        results, records = load_evals([(label, Path(d)) for label, d in (a.split("=", 1) for a in args)])
        print("\n".join([compare(results), *paired_table(records)]))
    else:
        raise SystemExit(USAGE)


if __name__ == "__main__":
    main(sys.argv[1:])

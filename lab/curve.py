"""The ladder's curve (lab/ladder.py): each arm's validation success against the CPU-hours it spent from W*,
one line per arm with its 95% interval at every rung, W* as a band; a table of the same points. Drawn from
a protocol folder's files alone: ladder.json (the rungs, what each arm spent, the rules' verdicts),
plateau.json (W*'s epoch) and the validations' transcripts archived in evals/ (the intervals: the
task-clustered standard error, lab/stats.py, in float64).

    python -m lab.report results/protocol-babyai-seed0-ladder     # curve.png into the folder, the table printed

The x axis is the budgeted CPU seconds each arm's pieces measured (their training steps on --budget-clock
cpu), not the rung's nominal hours: a rung runs over by its last step, and the stretch rung's hours are
what RL took. Tests: python -m pytest tests/test_ladder.py
"""
from __future__ import annotations

import json
import lzma
from pathlib import Path

from lab.stats import as_f64, clustered_se, task_means

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
LABELS = {"rl": "RL (A)", "imitation": "more imitation (B)", "self": "self-imitation (C)"}
COLORS = {"rl": "tab:red", "imitation": "tab:blue", "self": "tab:green"}


def validation(results: Path, piece: str) -> tuple[float, float, float, int]:
    """(success, low, high, tasks) of an archived validation: the mean of its per-task means and a 95% interval
    of the task-clustered standard error."""
    text = lzma.decompress((results / "evals" / piece / "transcripts.jsonl.xz").read_bytes()).decode()
    means = as_f64(list(task_means([json.loads(line) for line in text.splitlines() if line.strip()]).values()))
    p, half = float(means.mean()), Z95 * clustered_se(means)
    return p, p - half, p + half, len(means)


def points(results: Path) -> tuple[tuple, dict[str, list[dict]], dict]:
    """W*'s (success, low, high, tasks), each arm's rungs as points (x: budgeted CPU-hours from W*), ladder.json."""
    decided = json.loads((results / "ladder.json").read_text())
    best_epoch = json.loads((results / "plateau.json").read_text())["best_epoch"]
    wstar = validation(results, f"val-epoch-{best_epoch}")
    arms = {}
    for arm, rungs in decided["arms"].items():
        arms[arm] = []
        for r in rungs:
            p, lo, hi, tasks = validation(results, f"val-{arm}-{r['rung']}")
            arms[arm].append({"rung": r["rung"], "hours": r["hours"], "x": r["budget_cpu_s"] / 3600.0, "success": p,
                              "lo": lo, "hi": hi, "tasks": tasks, "episodes": r["episodes"],
                              "best": r["rung"] == decided["best"][arm]})
    return wstar, arms, decided


def draw(results: Path, wstar: tuple, arms: dict[str, list[dict]]) -> Path:
    """curve.png: validation success (%) against CPU-hours from W*, W*'s interval as a band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.axhspan(100 * wstar[1], 100 * wstar[2], color="0.85", label="W* (95% interval)")
    ax.axhline(100 * wstar[0], color="0.4", lw=1)
    for arm, pts in arms.items():
        xs, ys = [0.0] + [q["x"] for q in pts], [100 * wstar[0]] + [100 * q["success"] for q in pts]
        ax.plot(xs, ys, marker="o", color=COLORS[arm], label=LABELS[arm])
        ax.errorbar([q["x"] for q in pts], [100 * q["success"] for q in pts], capsize=3, fmt="none", ecolor=COLORS[arm],
                    yerr=[[100 * (q["success"] - q["lo"]) for q in pts], [100 * (q["hi"] - q["success"]) for q in pts]])
        ax.plot([q["x"] for q in pts if q["best"]], [100 * q["success"] for q in pts if q["best"]], marker="*",
                ms=14, color=COLORS[arm], ls="none")
    ax.set_xlabel("CPU-hours from W* (budgeted, all ranks)")
    ax.set_ylabel("validation success (%)")
    ax.set_title(f"{results.name}: each arm's validation against its CPU-hours (star: its best rung)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = results / "curve.png"
    fig.savefig(out, dpi=120, metadata={"Software": None})  # no version string: the same files, the same bytes
    plt.close(fig)
    return out


def report(results: Path) -> str:
    """The curve's section of summary.md (and of `python -m lab.report FOLDER`), curve.png drawn beside it."""
    wstar, arms, decided = points(results)
    draw(results, wstar, arms)
    lines = ["", "## The curve: validation success against CPU-hours from W*", "",
             "![each arm's validation success against its CPU-hours](curve.png)", "",
             f"W*: {100 * wstar[0]:.1f}% [{100 * wstar[1]:.1f}, {100 * wstar[2]:.1f}] on {wstar[3]} validation tasks. "
             "Intervals: 95%, the task-clustered standard error. Rungs: "
             + ", ".join(f"{h:g}" for h in decided["hours"]) + " CPU-hours.", "",
             "| arm | rung | CPU-hours (rung) | CPU-hours (budgeted) | validation success % [95% interval] | "
             "episodes | best rung |", "|---|---|---|---|---|---|---|"]
    for arm, pts in arms.items():
        for q in pts:
            lines.append(f"| {LABELS[arm]} | {q['rung']} | {q['hours']:g} | {q['x']:.3f} | {100 * q['success']:.1f} "
                         f"[{100 * q['lo']:.1f}, {100 * q['hi']:.1f}] | {q['episodes']} | "
                         f"{'yes' if q['best'] else ''} |")
    stop, stretch = decided["stop"], decided["stretch"]
    if stop:
        lines += ["", f"RL's stop rule at {stop['rung']:g} CPU-hours: {100 * stop['rl_val']:.1f}% against W*'s "
                      f"{100 * stop['wstar_val']:.1f}%, {stop['points']:+g} points asked: "
                      + ("RL stopped there, and the ladder with it." if stop["stopped"] else "RL went on.")]
    if stretch:
        lines += ["", f"The stretch: RL had played {stretch['after_episodes']} episodes by the last listed rung; it "
                      f"went on to step {stretch['to_step']} ({stretch['episodes']} episodes), "
                      f"{stretch['hours']:.3f} CPU-hours, one more rung for every arm."]
    lines += ["", "Rules (written before any rung was scored, ladder.json): "
              + "; ".join(f"{k}: {v}" for k, v in decided["rules"].items()) + "."]
    plateau = json.loads((results / "plateau.json").read_text())
    lines += ["", f"W*'s plateau (plateau.json: validation after each epoch of imitation, patience "
                  f"{plateau['patience']}; W* is epoch {plateau['best_epoch']}):", "",
              "| epoch | " + " | ".join(str(e["epoch"]) for e in plateau["epochs"]) + " |",
              "|---|" + "---|" * len(plateau["epochs"]),
              "| validation success % | "
              + " | ".join(f"{100 * e['val_success']:.1f}" for e in plateau["epochs"]) + " |"]
    return "\n".join(lines) + "\n"

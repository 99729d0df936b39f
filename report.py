"""The numbers and pictures of an evaluation: unbiased Pass@k, per-subtask rows, the markdown table,
and the sample-scaling / interaction-scaling plots (the AgentGym-RL paper's Figures 9 and 8).

Pure functions of episode records, dicts with task_id, subtask, budget, reward, success, turns, end;
evaluate.py produces them and calls these. Tests: python -m pytest tests/test_evaluate.py
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples with c successes: 1 - C(n-c, k) / C(n, k). Written as the product
    prod_{i=n-c+1}^{n} (1 - k/i), which needs no big binomials (C(200, 100) overflows a float)."""
    if not 0 <= c <= n:
        raise ValueError(f"successes c={c} must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"Pass@{k} needs 1 <= k <= n; only {n} samples")
    if n - c < k:  # every k-subset holds a success
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def k_values(k: int) -> list[int]:
    """1, 2, 4, ... up to k, and k itself."""
    return sorted({2 ** i for i in range(k.bit_length()) if 2 ** i <= k} | {k})


def stats(records: list[dict], ks: list[int]) -> dict:
    """One table row from episode records: every task weighs the same, whatever its sample count."""
    by_task = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(r)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    row = {"tasks": len(by_task), "episodes": len(records),
           "avg_reward": mean([mean([r["reward"] for r in rs]) for rs in by_task.values()]),
           "success": mean([mean([float(r["success"]) for r in rs]) for rs in by_task.values()]),
           "turns": mean([mean([r["turns"] for r in rs]) for rs in by_task.values()])}
    for j in ks:
        row[f"pass@{j}"] = mean([pass_at_k(len(rs), sum(bool(r["success"]) for r in rs), j) for rs in by_task.values()])
    ends = Counter(r["end"] for r in records)  # why episodes stopped: done, horizon, context, env_error
    row["ends"] = {e: n / len(records) for e, n in sorted(ends.items())}
    return row


def summarize(records: list[dict]) -> dict:
    """{"ks": [...], "budgets": {"<turns>": {"all": row, "subtasks": {name: row}}}} over all records."""
    if not records:
        raise ValueError("no finished episodes to summarize")
    ks = k_values(min(len(group) for group in pairs(records).values()))  # every pair has k samples
    by_budget = defaultdict(list)
    for r in records:
        by_budget[r["budget"]].append(r)
    out = {"ks": ks, "budgets": {}}
    for budget in sorted(by_budget):
        rs = by_budget[budget]
        names = sorted({r["subtask"] for r in rs})
        out["budgets"][str(budget)] = {"all": stats(rs, ks),
                                       "subtasks": {s: stats([r for r in rs if r["subtask"] == s], ks) for s in names}}
    return out


def pairs(records: list[dict]) -> dict:
    groups = defaultdict(list)
    for r in records:
        groups[(r["task_id"], r["budget"])].append(r)
    return groups


def table(summary: dict) -> str:
    ks = summary["ks"]
    head = ["turns", "subtask", "tasks", f"Avg@{ks[-1]} reward", "success %", *[f"Pass@{j} %" for j in ks], "mean turns"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for budget, res in summary["budgets"].items():
        for name, row in [("all", res["all"]), *res["subtasks"].items()]:
            cells = [budget, name, row["tasks"], f"{row['avg_reward']:.3f}", f"{100 * row['success']:.1f}",
                     *[f"{100 * row[f'pass@{j}']:.1f}" for j in ks], f"{row['turns']:.1f}"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def plot(summary: dict, out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks, budgets = summary["ks"], list(summary["budgets"])
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.5 * len(budgets), 3.6), squeeze=False, sharey=True)
    for ax, budget in zip(axes[0], budgets):  # sample scaling (Figure 9): one panel per turn budget
        res = summary["budgets"][budget]
        for name, row in [("all", res["all"]), *res["subtasks"].items()]:
            ax.plot(ks, [100 * row[f"pass@{j}"] for j in ks], marker="o", lw=2.5 if name == "all" else 1,
                    color="black" if name == "all" else None, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(j) for j in ks])
        ax.set_title(f"{budget} turns")
        ax.set_xlabel("k (samples per task)")
    axes[0][0].set_ylabel("Pass@k (%)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"sample scaling, {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "pass_at_k.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.6))  # interaction scaling (Figure 8)
    names = ["all", *sorted({s for res in summary["budgets"].values() for s in res["subtasks"]})]
    for name in names:
        pts = [(int(b), res["all"] if name == "all" else res["subtasks"].get(name)) for b, res in summary["budgets"].items()]
        pts = [(b, 100 * row["success"]) for b, row in pts if row]
        ax.plot(*zip(*pts), marker="o", lw=2.5 if name == "all" else 1, color="black" if name == "all" else None, label=name)
    ax.set_xticks([int(b) for b in summary["budgets"]])
    ax.set_title(f"interaction scaling, {title}", fontsize=10)
    ax.set_xlabel("turn budget")
    ax.set_ylabel("success rate (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "turn_scaling.png", dpi=120)
    plt.close(fig)


def compare(runs: list[tuple[str, dict]]) -> str:
    """Evaluations of several models on the same tasks side by side, one row per subtask, success % of
    each and the gain of each over the one before it (e.g. warm start over untrained, RL over warm
    start): the before/after table of a learning run. `runs` holds
    (label, summary) pairs, summaries as `summarize` returns them (results.json holds one)."""
    budgets = sorted({b for _, s in runs for b in s["budgets"]}, key=int)
    head = ["turns", "subtask", "tasks", *[f"{label} success %" for label, _ in runs],
            *[f"gain: {label} - {prev}" for (prev, _), (label, _) in zip(runs, runs[1:])], *[f"{label} Avg reward" for label, _ in runs]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for budget in budgets:
        names = ["all", *sorted({n for _, s in runs for n in s["budgets"].get(budget, {}).get("subtasks", {})})]
        for name in names:
            rows = [s["budgets"].get(budget, {}).get("all") if name == "all"
                    else s["budgets"].get(budget, {}).get("subtasks", {}).get(name) for _, s in runs]
            if any(r is None for r in rows):
                continue
            rates = [100 * r["success"] for r in rows]
            cells = [budget, name if name != "all" else "**all**", rows[0]["tasks"], *[f"{x:.1f}" for x in rates],
                     *[f"{b - a:+.1f}" for a, b in zip(rates, rates[1:])], *[f"{r['avg_reward']:.3f}" for r in rows]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) < 2 or any("=" not in a for a in sys.argv[1:]):
        raise SystemExit("usage: python report.py LABEL=EVAL_DIR [LABEL=EVAL_DIR ...]  (evaluate.py output directories)")
    pairs_ = [a.split("=", 1) for a in sys.argv[1:]]
    print(compare([(label, json.loads((Path(d) / "results.json").read_text())) for label, d in pairs_]))

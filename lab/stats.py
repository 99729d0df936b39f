"""The numbers and pictures of an evaluation: unbiased Pass@k, per-subtask rows, the markdown table,
and the sample-scaling / interaction-scaling plots (the AgentGym-RL paper's Figures 9 and 8); the
uncertainty of a success rate over tasks and the paired task-level bootstrap of two models on the
same tasks; and evaluate.py's output files read back as records. Result folders (results/<name>/) are
lab/results.py's, the tables regenerated from their files lab/tables.py's; lab/report.py is the command line.

Pure functions of episode records, dicts with task_id, subtask, budget, reward, success, turns, end;
evaluate.py produces them and calls these. docs/evaluation.md says why the intervals are paired and
over tasks. Where the reward is a score with partial credit and a failure below 0 (SciWorld's), the
tables give progress (a failure counted as 0) and Pass@k of a score above 0 (AgentGym-RL's) beside the
paper's mean score: `scored`. Tests: python -m pytest tests/test_evaluate.py tests/test_report.py
"""
from __future__ import annotations

import json
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


def progress(r: dict) -> float:
    """The env's score with a failure counted as 0, max(reward, 0): how far the episode got. SciWorld's
    -1 (a wrong `focus on` ends the task) is a failure, not less progress than none."""
    return max(float(r["reward"]), 0.0)


def scored(records: list[dict]) -> bool:
    """Whether the reward is a score with partial credit and a failure below 0, as SciWorld's (score / 100,
    -1 for a wrong `focus on`, 0 for running out of turns): some episode scored below 0 and some episode
    that did not succeed scored above 0. There the paper's mean score pays a policy for never answering,
    so the tables set success and progress beside it (docs/results.md, SciWorld). BabyAI (no reward below
    0) and MiniWoB++ (-1 or a success) are not: their tables keep their columns."""
    return (any(r["reward"] < 0 for r in records)
            and any(r["reward"] > 0 and not r["success"] for r in records))


def score_stats(records: list[dict], ks: list[int]) -> dict:
    """Beside `stats`'s row, for a `scored` reward: progress (mean of max(reward, 0)) and AgentGym-RL's
    Pass@k, some of k samples scored above 0 (`stats`'s Pass@k: some of k samples succeeded); every task
    weighs the same."""
    by_task = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(r)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    row = {"progress": mean([mean([progress(r) for r in rs]) for rs in by_task.values()])}
    for j in ks:
        row[f"pass@{j} score>0"] = mean([pass_at_k(len(rs), sum(r["reward"] > 0 for r in rs), j)
                                         for rs in by_task.values()])
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


# ------------------------------------------------------------------ uncertainty over tasks (float64)
# The k samples of one task are correlated (a task the model can do it mostly does), so the unit of
# resampling is the task: a success rate is the mean of per-task means, and its uncertainty comes from
# how those means vary between tasks. Treating the T x k episodes as independent coin flips (the naive
# binomial SE) understates it whenever successes cluster in a few tasks (Pass@k far above Pass@1).

def as_f64(values):
    """A 1-D float64 numpy array from a list, a numpy array or a torch tensor of any float dtype (bf16 too)."""
    import numpy as np

    if hasattr(values, "detach"):  # torch: numpy has no bfloat16, so convert on the torch side first
        import torch
        values = values.detach().to(device="cpu", dtype=torch.float64).numpy()
    out = np.asarray(values, dtype=np.float64)
    if out.ndim != 1:
        raise ValueError(f"expected one value per task (1-D), got shape {out.shape}")
    return out


def task_means(records: list[dict], key="success") -> dict:
    """{task_id: mean of `key` over the task's samples} for records of one turn budget; `key` is a field
    or a function of a record (`progress`)."""
    value = key if callable(key) else lambda r: float(r[key])
    by_task = defaultdict(list)
    for r in records:
        by_task[r["task_id"]].append(value(r))
    return {t: sum(v) / len(v) for t, v in sorted(by_task.items())}


def clustered_se(per_task) -> float:
    """Task-clustered standard error of a rate that is the mean of T per-task means:
    sqrt(sum_t (p_t - p)^2 / (T (T - 1))); 0 for a single task."""
    p = as_f64(per_task)
    return float(p.std(ddof=1) / math.sqrt(len(p))) if len(p) > 1 else 0.0


def naive_se(rate: float, episodes: int) -> float:
    """The binomial SE sqrt(p (1 - p) / n) that treats all n episodes as independent (for comparison)."""
    return math.sqrt(rate * (1 - rate) / episodes)


def paired_bootstrap(before, after, resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
    """Paired difference `after - before` of two models' per-task means on the same tasks (same order),
    with a percentile bootstrap interval: draw T tasks with replacement `resamples` times, each task
    bringing both models' means over all its samples (the samples stay together), and take the
    (1-level)/2 and (1+level)/2 quantiles of the resampled mean differences. Fixed seed: the same
    inputs give the same interval. Returns diff, lo, hi and se (the SD of the resampled differences)."""
    import numpy as np

    a, b = as_f64(before), as_f64(after)
    if a.shape != b.shape or not len(a):
        raise ValueError(f"need the same non-empty task list for both models, got {len(a)} and {len(b)} tasks")
    d = b - a                                                    # (T,)
    rng = np.random.default_rng(seed)
    reps = np.empty(resamples, dtype=np.float64)                 # (R,)
    block = max(1, 2_000_000 // len(d))                          # resamples per draw: at most 2M indices in memory
    for i in range(0, resamples, block):
        n = min(block, resamples - i)
        reps[i:i + n] = d[rng.integers(0, len(d), size=(n, len(d)))].mean(axis=1)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "se": float(reps.std(ddof=1)),
            "tasks": len(d)}


def paired(runs: list[tuple[str, list[dict]]], resamples: int = 10_000, seed: int = 0) -> list[dict]:
    """For each pair of evaluations (in the given order) and each turn budget both played on exactly
    the same tasks: the paired bootstrap of success, of progress and of Avg reward (later minus earlier).
    Pairs on different task sets are listed with `skipped` and no numbers."""
    out = []
    for i, (label_a, recs_a) in enumerate(runs):
        for label_b, recs_b in runs[i + 1:]:
            budgets = sorted({r["budget"] for r in recs_a} & {r["budget"] for r in recs_b})
            for budget in budgets:
                row = {"before": label_a, "after": label_b, "budget": budget}
                ra = [r for r in recs_a if r["budget"] == budget]
                rb = [r for r in recs_b if r["budget"] == budget]
                sa, sb = task_means(ra), task_means(rb)
                if list(sa) != list(sb):
                    row["skipped"] = f"not the same tasks ({len(sa)} and {len(sb)}, {len(set(sa) & set(sb))} shared)"
                else:
                    row["success"] = paired_bootstrap(list(sa.values()), list(sb.values()), resamples, seed)
                    row["progress"] = paired_bootstrap(list(task_means(ra, progress).values()),
                                                       list(task_means(rb, progress).values()), resamples, seed)
                    row["reward"] = paired_bootstrap(list(task_means(ra, "reward").values()),
                                                     list(task_means(rb, "reward").values()), resamples, seed)
                out.append(row)
    return out


def paired_columns(score: bool) -> tuple[list[str], list[str]]:
    """The headers and `paired` keys of a paired table's figures: success and Avg reward; for a `scored`
    reward success, progress and the paper's mean score."""
    if score:
        return (["success, points [95% interval]", "progress [95% interval]", "mean score (paper) [95% interval]"],
                ["success", "progress", "reward"])
    return ["success, points [95% interval]", "Avg reward [95% interval]"], ["success", "reward"]


def paired_cells(d: dict, keys: list[str]) -> list[str]:
    """A `paired` row's figures with their intervals: success in points, the others as the reward is."""
    return [f"{100 * c['diff']:+.1f} [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]" if key == "success"
            else f"{c['diff']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]" for key in keys for c in [d[key]]]


def paired_table(runs: list[tuple[str, list[dict]]], resamples: int = 10_000, seed: int = 0) -> list[str]:
    """`paired` as markdown lines (none when there is only one evaluation)."""
    diffs = paired(runs, resamples, seed)
    if not diffs:
        return []
    heads, keys = paired_columns(scored([r for _, recs in runs for r in recs]))
    lines = ["", f"## Paired differences (later minus earlier, same tasks; task-level bootstrap 95% interval, "
             f"{resamples:,} resamples, seed {seed})", "",
             "| turns | after | before | tasks | " + " | ".join(heads) + " |", "|" + "---|" * (4 + len(heads))]
    for d in diffs:
        if "skipped" in d:
            lines.append(f"| {d['budget']} | {d['after']} | {d['before']} | | {d['skipped']} |" + " |" * (len(heads) - 1))
            continue
        lines.append(f"| {d['budget']} | {d['after']} | {d['before']} | {d['success']['tasks']} | "
                     + " | ".join(paired_cells(d, keys)) + " |")
    return lines


# ------------------------------------------------------------------ evaluate.py's outputs, read back

def load_transcripts(path: Path, k: int) -> tuple[list[dict], bool]:
    """Records of finished (task, budget) pairs (k samples each) and whether the file needs rewriting:
    an interrupted write can leave a cut last line, which the next append would run into."""
    if not path.exists():
        return [], False
    text = path.read_text()
    latest, lines = {}, 0
    for line in filter(str.strip, text.split("\n")):
        lines += 1
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        latest[(r["task_id"], r["budget"], r["sample"])] = r
    records = [r for rs in pairs(list(latest.values())).values() if len(rs) >= k for r in rs]
    return records, len(records) != lines or not text.endswith("\n")


def load_evals(dirs: list[tuple[str, Path]]) -> tuple[list[tuple[str, dict]], list[tuple[str, list[dict]]]]:
    """(label, results.json) and (label, episode records) of evaluate.py output directories."""
    for _, d in dirs:  # a one-line error, not a traceback, for a folder that is not an evaluation
        if not (d / "results.json").exists():
            hint = (f"a published evaluation: unpack it first, python -m lab.report --unpack {d} EVAL_DIR"
                    if (d / "transcripts-all.jsonl.xz").exists() else "give evaluate.py's --out directory")
            raise SystemExit(f"error: {d} has no results.json; {hint}")
    results = [(label, json.loads((d / "results.json").read_text())) for label, d in dirs]
    records = [(label, load_transcripts(d / "transcripts.jsonl", r["config"]["k"])[0])
               for (label, d), (_, r) in zip(dirs, results)]
    return results, records

"""What a run leaves behind for people: a progress bar, metrics.jsonl, TensorBoard (when installed),
and a reward curve with the ScalingInter horizon stages marked.

Only rank 0 makes a RunLog; the numbers it gets are already reduced over ranks.
"""
from __future__ import annotations

import json
from pathlib import Path


class RunLog:
    def __init__(self, out: str | Path, total_steps: int, start_step: int, schedule):
        from tqdm import tqdm

        self.out = Path(out)
        self.schedule = schedule
        self.file = open(self.out / "metrics.jsonl", "a")
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        try:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(self.out / "tb"))
        except ImportError:  # tensorboard is optional
            self.tb = None

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.tb:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        self.bar.set_postfix(reward=f"{metrics['reward']:.3f}", success=f"{metrics['success']:.2f}",
                             turns=f"{metrics['turns']:.1f}", horizon=metrics["horizon"])
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.file.close()
        if self.tb:
            self.tb.close()
        plot_rewards(self.out / "metrics.jsonl", self.out / "reward.png", self.schedule)


def plot_rewards(metrics_file: Path, png: Path, schedule) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    for line in Path(metrics_file).read_text().splitlines():  # a resumed run appends; the last row of a step wins
        row = json.loads(line)
        rows[row["step"]] = row
    steps = sorted(rows)
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, [rows[s]["reward"] for s in steps], label="mean reward")
    ax.plot(steps, [rows[s]["success"] for s in steps], label="success rate")
    if schedule.stage_length:  # shade the ScalingInter stages
        for i, budget in enumerate(schedule.budgets):
            lo = i * schedule.stage_length
            if lo > steps[-1]:
                break
            hi = (i + 1) * schedule.stage_length if i + 1 < len(schedule.budgets) else steps[-1] + 1
            ax.axvspan(lo, min(hi, steps[-1] + 1), alpha=0.08 * (i + 1), color="tab:green")
            ax.text(lo, 1.02, f"{budget} turn{'s' * (budget != 1)}", transform=ax.get_xaxis_transform(), fontsize=8)
    held = [(0, rows[s]["eval_start/success"]) for s in steps if "eval_start/success" in rows[s]]
    held += [(s + 1, rows[s]["eval/success"]) for s in steps if "eval/success" in rows[s]]  # after step s's update
    if held:
        ax.plot(*zip(*held), "o-", color="tab:red", label="held-out success (test tasks)")
    ax.set_xlabel("training step")
    ax.set_ylim(min(-0.05, min(rows[s]["reward"] for s in steps)), 1.05)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)

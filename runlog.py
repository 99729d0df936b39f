"""What a run leaves behind for people: a progress bar, metrics.jsonl, TensorBoard (when installed),
and a reward curve with the ScalingInter horizon stages marked.

Only rank 0 makes a RunLog; the numbers it gets are already reduced over ranks.
"""
from __future__ import annotations

import ctypes
import json
import resource
import time
from pathlib import Path


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def memory_mb() -> dict[str, float]:
    """This process's resident set and its live C heap, in MB. RSS alone cannot tell a leak from a heap
    that keeps freed memory: glibc returns little of it to the system, so RSS swings by hundreds of MB
    with the size of a step's tensors. `heap` is what is allocated now (glibc's mallinfo2: bytes in use
    in its arenas plus its mmapped blocks), the number whose drift would be a leak (bench/soak.py)."""
    rss = float("nan")
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:  # not Linux
        pass
    try:
        info = ctypes.CDLL(None).mallinfo2
        info.restype = _Mallinfo2
        m = info()
        heap = (m.uordblks + m.hblkhd) / 2**20
    except (AttributeError, OSError):  # not glibc (or older than 2.33)
        heap = float("nan")
    return {"rss_mb": rss, "heap_mb": heap}


def trim_heap() -> float:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim); the seconds it took."""
    t = time.perf_counter()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass
    return time.perf_counter() - t


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

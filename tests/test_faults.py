"""Faults in the middle of training, on the real loop: a hung env, a killed simulator, a full disk.

- an env whose `reset` never returns: the rollout gives up on it after --env-timeout, flags the episode
  `env_error`, replaces the env, and the step, the next step and the process's exit all complete;
- a SciWorld JVM killed with SIGKILL during a training step's rollout: that episode is flagged, the step
  completes, the next step has no env error;
- the disk refusing writes at checkpoint time, on rank 0 or rank 1 (faults.py `disk_full`: a real write
  error from the kernel): every rank stops with the same one-line error and a non-zero exit, none is
  left waiting in a collective, the half-written checkpoint is removed, the previous one verifies, and
  `--resume` then finishes the run;
- a run directory that cannot be written: a one-line error before any start-up.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import checkpoint
import engine as engines
from models import tiny
from rollout import ChatFormat, Play, rollout
from tests.support import faulty

ROOT = Path(__file__).resolve().parent.parent
TOY = ["--engine", "hf", "--horizon", "2", "--tasks-per-step", "2", "--samples-per-task", "4", "--max-tokens", "6"]


def run(args, nproc=2, fault=None, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "TRAIN_FAULT"}
    if fault:
        env["TRAIN_FAULT"] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone", "train.py",
           *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def rows(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_rollout_gives_up_on_a_hung_reset_and_the_rest_play_on():
    from transformers import AutoTokenizer
    model_dir = tiny.tiny_model_dir()
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir))
    engine = engines.make_engine(model_dir, "hf", max_model_len=2048)
    tasks = [(t, t) for t in range(4)]
    envs = [faulty.HangingReset() for _ in tasks]
    originals = list(envs)
    try:
        t = time.monotonic()
        eps, _ = rollout(engine, chat, envs, faulty.HangingReset, tasks, Play(2, max_tokens=6, seed=0, env_timeout=2))
        took = time.monotonic() - t
    finally:
        faulty.release.set()  # lets the hung thread finish, so it does not outlive the test
    hung = [i for i, ep in enumerate(eps) if ep.end == "env_error"]
    assert len(hung) == 1, [ep.end for ep in eps]
    assert "TimeoutError: env.reset did not return within 2 s" in eps[hung[0]].error
    assert envs[hung[0]] is not originals[hung[0]]  # replaced by a fresh env
    assert all(ep.end == "done" and ep.turns == 2 for i, ep in enumerate(eps) if i != hung[0])
    assert took < 60  # it gave up on the call instead of waiting for it (2 s timeout, generous bound)


@pytest.mark.slow
def test_training_survives_a_hung_reset_and_exits(tmp_path):
    proc = run(["--env", "tests.support.faulty:HangingReset", *TOY, "--steps", "2", "--env-timeout", "3",
                "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second = rows(tmp_path)
    assert first["end/env_error"] == 2 / 8  # one hung reset on each rank, flagged
    assert second["end/env_error"] == 0 and second["turns"] == 2
    assert checkpoint.verify(tmp_path / "checkpoints" / "step_000002", 0, 1) is None


@pytest.mark.slow
def test_training_survives_a_sciworld_jvm_killed_mid_rollout(tmp_path):
    proc = run(["--env", "tests.support.faulty:JVMKilledSciWorld", "--engine", "hf", "--horizon", "2", "--tasks-per-step",
                "2", "--samples-per-task", "2", "--max-tokens", "12", "--steps", "2", "--out", str(tmp_path)], nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, second = rows(tmp_path)
    assert first["end/env_error"] == 1 / 4  # the killed JVM's episode, flagged; the other three played on
    assert second["end/env_error"] == 0 and second["turns"] > 0  # the replacement env started a fresh JVM


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_disk_full_at_checkpoint_stops_every_rank_and_keeps_the_previous_one(tmp_path, rank):
    args = ["--env", "tests.support.toy:Digits", *TOY, "--steps", "3", "--save-every", "1", "--out", str(tmp_path)]
    t = time.monotonic()
    proc = run(args, fault=f"disk_full:2:{rank}")  # the second checkpoint's writes fail on this rank
    took = time.monotonic() - t
    assert proc.returncode != 0
    ours = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"checkpoint step_000002 not written (rank {rank}: " in ours[0]
    assert "step_000001 is intact" in ours[0] and "--resume" in ours[0]
    assert "checkpoint.py" not in proc.stderr  # no traceback from deep in the save
    assert took < 240  # the other rank stopped too instead of waiting in a collective for an hour
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # no half-written directory
    assert checkpoint.verify(root / "step_000001", 0, 1) is None
    assert len(rows(tmp_path)) == 2  # steps 0 and 1 were logged; nothing after the failed save

    proc = run([*args, "--resume"])  # space again: the run finishes from the checkpoint it kept
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (root / "latest").read_text() == "step_000003" and rows(tmp_path)[-1]["step"] == 2


def test_unwritable_run_directory_is_a_one_line_error_before_start_up():
    proc = subprocess.run([sys.executable, "train.py", "--env", "tests.support.toy:Digits", "--out", "/proc/no/such/run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: --out /proc/no/such/run is not writable")

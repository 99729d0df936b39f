"""Crash anywhere, resume exactly: a 2-rank run (transformers engine, toy env, tiny model, seeded) is
killed with SIGKILL at four moments in turn (faults.py), each time resumed with `--resume`, and the
history it finally writes equals an uninterrupted run's: the same metrics at every step and the same
final weights, bit for bit. After every crash each visible checkpoint verifies (sizes and CRC-32s);
a half-written one exists only as a hidden `.step_*.tmp`, which the next save removes.

One chain of five launches instead of five independent crashes: each launch resumes from what the
previous crash left, so every fault point is also a resume point (and the test runs 6 launches, not 10).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infra import checkpoint

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--env", "tests.support.toy:Digits", "--engine", "hf", "--steps", "5", "--save-every", "1", "--horizon", "2",
        "--tasks-per-step", "2", "--samples-per-task", "4", "--max-tokens", "6", "--mini-batches", "2", "--seed", "3",
        "--curriculum"]  # its weights replay from RUN/curriculum.jsonl on resume (studies/curriculum.py)

# (fault point, n-th time it is reached in that launch, rank killed) -> what the checkpoints look like after:
# rollout_turn is reached twice per step (2 turns), update twice per step (2 mini-batches), and each
# launch counts from its own start.
CHAIN = [
    (("rollout_turn", 4, 1), {"latest": 1, "complete": [1], "tmp": False}),      # step 1's rollout
    (("update", 3, 1), {"latest": 2, "complete": [1, 2], "tmp": False}),         # step 2, after a backward
    (("checkpoint_write", 1, 0), {"latest": 2, "complete": [1, 2], "tmp": True}),  # writing step_000003
    (("before_latest", 2, 0), {"latest": 3, "complete": [2, 3, 4], "tmp": False}),  # step_000004 renamed
]


def launch(out, *extra, fault=None):
    env = {k: v for k, v in os.environ.items() if k != "TRAIN_FAULT"}
    if fault:
        env["TRAIN_FAULT"] = ":".join(map(str, fault))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "train.py",
           *ARGS, "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def history(out) -> dict:
    """step -> the last logged row of that step without wall times and memory readings (a resumed step is
    logged again)."""
    rows = {}
    for line in (Path(out) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {k: v for k, v in row.items() if not k.startswith(("time/", "mem/"))}
    return rows


def weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(ckpt / "policy" / "model.safetensors")


@pytest.mark.slow
def test_sigkill_at_four_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    proc = launch(reference)
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = tmp_path / "crashed"
    for i, (fault, expect) in enumerate(CHAIN):
        proc = launch(out, *(["--resume"] if i else []), fault=fault)
        assert proc.returncode != 0 and f"fault point {fault[0]} #{fault[1]} reached" in proc.stderr, \
            (fault, proc.stderr[-3000:])
        ckpts = out / "checkpoints"
        assert checkpoint.latest(ckpts).name == f"step_{expect['latest']:06d}", fault
        visible = sorted(int(p.name[5:]) for p in ckpts.glob("step_*"))
        assert visible == expect["complete"], (fault, visible)
        for step in visible:  # nothing visible is half-written
            assert checkpoint.verify(ckpts / f"step_{step:06d}", 0, 1) is None, (fault, step)
        assert bool(list(ckpts.glob(".step_*.tmp"))) == expect["tmp"], fault

    proc = launch(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = out / "checkpoints"
    assert checkpoint.latest(ckpts).name == "step_000005" and not list(ckpts.glob(".step_*.tmp"))
    assert all(checkpoint.verify(p, 0, 1) is None for p in ckpts.glob("step_*"))

    expected, got = history(reference), history(out)
    assert sorted(got) == list(range(5))
    for step in expected:
        assert got[step] == expected[step], (step, got[step], expected[step])
    a, b = weights(reference / "checkpoints" / "step_000005"), weights(ckpts / "step_000005")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_resume_with_the_vllm_cpu_engine_samples_what_the_uninterrupted_run_sampled(tmp_path):
    """vLLM's CPU sampler draws from torch's global generator (no per-request seeds on CPU) and vLLM
    re-seeds it at start-up; the checkpoint's RNG state, restored after that, makes resume exact.
    Two launches: an uninterrupted 3-step run, then a copy of it cut back to its step-2 checkpoint and
    resumed to step 3."""
    pytest.importorskip("vllm")
    import shutil

    run, cut = tmp_path / "run", tmp_path / "cut"
    vllm = ["--engine", "vllm", "--steps", "3"]
    proc = launch(run, *vllm)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copytree(run, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000003")  # as if killed during step 2
    rows = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(rows[:2]) + "\n")
    proc = launch(cut, *vllm, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected, got = history(run), history(cut)
    assert got[2] == expected[2] and got[2]["response_tokens"] > 0
    a, b = weights(run / "checkpoints" / "step_000003"), weights(cut / "checkpoints" / "step_000003")
    assert all(torch.equal(a[k], b[k]) for k in a)

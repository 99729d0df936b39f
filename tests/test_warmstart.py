"""The warm start survives its expert: an exception inside `env.expert()` (minigrid's BabyAI bot raises
a TypeError in baby_ai_bot.py on BabyAI task 4000074, SynthS5R2 seed 100001) is one failed
demonstration, flagged and counted, never the end of the run. Real env, real bot, real train.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from models import tiny
from studies import warmstart
from envs.babyai import BabyAI
from rollout import ChatFormat

ROOT = Path(__file__).resolve().parent.parent
CRASH = 4_000_074  # the bot's TypeError: 'NoneType' object is not iterable (replan_before_action)


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(AutoTokenizer.from_pretrained(tiny.tiny_model_dir()))


def test_bot_crash_is_one_failed_demonstration(chat):
    env = BabyAI()
    assert env.level(CRASH) == "BabyAI-SynthS5R2-v0" and CRASH // 40 == 100_001
    ep = warmstart.expert_episodes(chat, [env], type(env), [CRASH], warmstart.expert_play(40, 8192))[0]
    assert ep.end == "expert_error" and not ep.success and ep.error.startswith("TypeError")
    assert sum(ep.mask) == ep.turns == 0  # the bot fails on its first call: nothing to imitate
    ok = warmstart.expert_episodes(chat, [env], type(env), [1],
                                   warmstart.expert_play(40, 8192))[0]  # the same instance goes on
    assert ok.success and ok.end == "done" and not ok.error


class StallsOnce(BabyAI):
    """BabyAI whose bot stalls once, past the play's timeout, as a run paused mid-demonstration does."""
    stalled = False

    def expert(self):
        if not StallsOnce.stalled:
            StallsOnce.stalled = True
            time.sleep(3.0)
        return super().expert()


def test_an_expert_timed_out_by_a_stall_is_played_again_and_the_demonstration_kept(chat):
    play = warmstart.expert_play(8, 2048, env_timeout=1.0)
    envs = [StallsOnce(brief=True), StallsOnce(brief=True)]
    eps = warmstart.expert_episodes(chat, envs, lambda: StallsOnce(brief=True), [0, 1], play)
    assert StallsOnce.stalled and [e.task_id for e in eps] == [0, 1]
    assert all(e.end != "expert_error" for e in eps), [e.error for e in eps]
    plain = warmstart.expert_episodes(chat, [BabyAI(brief=True)], BabyAI, [0, 1], warmstart.expert_play(8, 2048))
    assert [e.ids for e in eps] == [e.ids for e in plain]  # the same demonstrations as without the stall


def test_train_with_a_crashing_demonstration_runs_to_the_end(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([f"babyai_{CRASH}", "babyai_1"]))  # the crash, and a task the bot solves
    cmd = [sys.executable, "train.py", "--env", "babyai", "--tasks-file", str(tasks), "--bc-episodes", "2",
           "--bc-epochs", "1", "--bc-batch", "2", "--steps", "1", "--engine", "hf", "--tasks-per-step", "2",
           "--samples-per-task", "2", "--max-tokens", "8", "--horizon", "2", "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 expert episodes" in proc.stdout and "1 successful" in proc.stdout
    assert "1 stopped by an expert error" in proc.stdout
    assert f"the expert failed on task {CRASH} (TypeError" in proc.stderr
    assert (tmp_path / "run" / "warmstart" / "config.json").exists()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_bc_seconds_ends_imitation_early_at_the_same_step_on_every_rank(chat):
    """--bc-seconds (the time-matched imitation control): a budget already spent stops before the first
    optimizer step and leaves the weights as they were; no budget runs every step."""
    import torch
    from transformers import AutoModelForCausalLM

    env = BabyAI(brief=True)
    eps = warmstart.expert_episodes(chat, [env], type(env), list(range(4)), warmstart.expert_play(8, 2048))
    eps = [e for e in eps if e.success]
    assert len(eps) >= 2
    model = AutoModelForCausalLM.from_pretrained(tiny.tiny_model_dir())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    one = warmstart.Ranks(lambda *xs: xs, lambda x: x)  # one process: the sums are the values
    spent = warmstart.clone(model, optimizer, eps, warmstart.Imitation(seconds=1e-9), 0, one)
    assert spent == [] and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    full = warmstart.clone(model, optimizer, eps, warmstart.Imitation(), 0, one)
    assert len(full) == len(eps) and all(0 < nll < 20 for nll in full)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # what the progress line gets: under a budget the seconds used before each step (growing), else None
    seen = []
    warmstart.clone(model, optimizer, eps, warmstart.Imitation(epochs=2, seconds=1e9, clock="cpu"), 0, one,
                    progress=lambda k, total, nll, used: seen.append((k, total, used)))
    assert [(k, total) for k, total, _ in seen] == [(k, 2 * len(eps)) for k in range(1, 2 * len(eps) + 1)]
    assert all(b[2] > a[2] >= 0 for a, b in zip(seen, seen[1:]))
    seen.clear()
    warmstart.clone(model, optimizer, eps, warmstart.Imitation(), 0, one,
                    progress=lambda k, total, nll, used: seen.append(used))
    assert seen == [None] * len(eps)


def test_imitation_only_run_continues_a_warm_start_within_its_time_budget(tmp_path):
    """The control of run.sh's recipe: `--steps 0` after a warm start from a warm-started model directory
    trains by imitation alone, stops at --bc-seconds, saves the result and evaluates it on validation."""
    first = tmp_path / "first"
    base = [sys.executable, "train.py", "--env", "babyai", "--engine", "hf", "--bc-epochs", "1", "--bc-batch", "1",
            "--max-tokens", "8", "--horizon", "3", "--tasks-per-step", "2", "--samples-per-task", "2"]
    proc = subprocess.run([*base, "--bc-episodes", "2", "--steps", "1", "--out", str(first)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    control = tmp_path / "control"
    proc = subprocess.run([*base, "--model", str(first / "warmstart"), "--preset", "smollm2", "--seed", "1000",
                           "--bc-episodes", "40", "--bc-seconds", "0.5", "--steps", "0", "--eval-every", "1",
                           "--eval-tasks", "2", "--micro-tokens", "4096", "--train-layers", "0", "--out", str(control)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--bc-seconds 0.5 reached" in proc.stdout and "held-out validation success before RL" in proc.stdout
    assert (control / "warmstart" / "model.safetensors").exists()
    assert (control / "metrics.jsonl").read_text() == ""  # no RL step
    assert len((control / "evals.jsonl").read_text().splitlines()) == 2  # the control model on validation
    rows = [json.loads(line) for line in (control / "warmstart.jsonl").read_text().splitlines()]
    done = rows[-1]  # the control's own metrics: its steps' NLL and clock, then the summary
    assert done["done"] and done["bc_seconds"] == 0.5 and done["optimizer_steps"] == len(rows) - 1
    assert [r["step"] for r in rows[:-1]] == list(range(1, len(rows))) and 0 < done["demonstrations"] <= 40
    from lab import results
    dest = tmp_path / "published"  # published beside the RL run, its line in the tables
    md = results.publish(first, dest, [], control=control)
    assert (dest / "control" / "warmstart.jsonl").read_bytes() == (control / "warmstart.jsonl").read_bytes()
    assert (f"Imitation control: from `{first / 'warmstart'}`, 40 expert episodes played, imitated for at most 0.5 s "
            f"(RL's steps' time): {done['demonstrations']} successful demonstrations, {done['optimizer_steps']} "
            "optimizer steps in") in md


def test_nll_backward_scales_its_gradient(chat):
    """The imitation anchor's weight (--bc-coef) multiplies the gradient and nothing else."""
    from transformers import AutoModelForCausalLM

    from batch import collate

    env = BabyAI(brief=True)
    eps = [e for e in warmstart.expert_episodes(chat, [env], type(env), list(range(4)),
                                                warmstart.expert_play(8, 2048)) if e.success]
    batch = collate(eps, 0)
    model = AutoModelForCausalLM.from_pretrained(tiny.tiny_model_dir())
    one = warmstart.Ranks(lambda *xs: xs, lambda x: x)  # one process: the sums are the values
    grads = []
    for scale in (1.0, 0.25):
        model.zero_grad(set_to_none=True)
        nll = warmstart.nll_backward(model, batch, list(range(len(eps))), 64, one, scale=scale)
        assert 0 < nll < 20  # the NLL itself is unscaled
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0 and torch.allclose(grads[1], grads[0] * 0.25, rtol=1e-4, atol=1e-8)


def test_imitation_anchor_trains_beside_rl(tmp_path):
    """--bc-anchor: expert episodes played once at the start (their own line in the log) and imitated at
    every RL optimizer step, 2 ranks. The tiny model never solves BabyAI, so every GRPO group is constant and
    the anchor's is the only gradient: the expert NLL of the same demonstrations must fall step by step."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "train.py",
           "--env", "babyai", "--engine", "hf", "--bc-anchor", "12", "--bc-batch", "8", "--bc-coef", "1",
           "--steps", "3", "--lr", "1e-3", "--kl-coef", "0", "--max-tokens", "6", "--horizon", "6",
           "--tasks-per-step", "2", "--samples-per-task", "2", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imitation anchor: 12 expert episodes" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    nll = [r["bc_nll"] for r in rows]
    assert len(nll) == 3 and nll[0] > nll[1] > nll[2] > 0, nll
    assert all(r["grad_norm"] > 0 for r in rows)


def test_self_imitation_stops_playing_at_its_play_budget(tmp_path):
    """--bc-play-seconds (the protocol's self-imitation arm): the policy's own play stops between rounds
    once that budget is spent, so the rest of --bc-seconds imitates; without it every task is played.
    One rank's env pool holds tasks x samples = 4 episodes, so 12 tasks are 3 rounds."""
    base = [sys.executable, "train.py", "--env", "babyai", "--engine", "hf", "--bc-actor", "policy",
            "--bc-episodes", "12", "--bc-batch", "1", "--steps", "0", "--max-tokens", "4", "--horizon", "2",
            "--tasks-per-step", "2", "--samples-per-task", "2"]
    played = {}
    for label, extra in (("bounded", ["--bc-play-seconds", "1e-6", "--bc-seconds", "600"]), ("all", [])):
        proc = subprocess.run([*base, *extra, "--out", str(tmp_path / label)], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("self-imitation: "))
        played[label] = int(line.split()[1])
        rounds = [x.split(", ")[:2] for x in proc.stdout.splitlines() if x.startswith("  self-imitation: round ")]
        # a progress line a round, counting both ranks' episodes so far
        assert rounds == [[f"  self-imitation: round {r}/3", f"{4 * r} episodes played"]
                          for r in range(1, 1 + played[label] // 4)], rounds
    assert played == {"bounded": 4, "all": 12}  # one round, then the budget's verdict; else all three


def test_self_imitation_plays_with_the_vllm_engine(tmp_path):
    """The protocol's arm C on its real generator: startup.warm_start puts vLLM to sleep, its weights
    discarded, before the warm start; the self-play must first get the policy's weights back (warmstart.run
    syncs them), else vLLM's generate refuses ("engine is asleep") and the arm crashes at its first round.
    Two ranks as the protocol runs it; the in-process engines ignore sleep and never showed this."""
    pytest.importorskip("vllm")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "train.py",
           "--env", "babyai", "--engine", "vllm", "--bc-actor", "policy", "--bc-episodes", "8", "--bc-batch", "1",
           "--steps", "0", "--max-tokens", "4", "--horizon", "2", "--tasks-per-step", "2", "--samples-per-task", "2",
           "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("self-imitation: "))
    assert line.split()[1:3] == ["8", "policy"]  # every task played, by the generator
    assert (tmp_path / "run" / "warmstart" / "config.json").exists()

"""The memory plan and the settings that follow the model: a run that would not fit is adapted or refused
before any model loads, a pretrained model never gets the tiny model's settings, and a rank killed
mid-run is named, with its signal and memory, by the launcher and by the ranks that survive it.

The available memory is faked with AGENTGYM_MEMORY_GB (the node's memory for its ranks).
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch import checks
import config
from infra import lifeline
from infra import memplan

ROOT = Path(__file__).resolve().parent.parent
GB = memplan.GB


@pytest.fixture
def memory(monkeypatch):
    def limit(gb):
        monkeypatch.setenv("AGENTGYM_MEMORY_GB", str(gb))
    return limit


def smollm2_with_tiny_settings():
    """The cpu preset's settings (16,384-token micro-batches, no checkpointing, a reference model) on SmolLM2:
    what `--model smollm2` ran with before the model chose its preset (a rank grew to 13 GB)."""
    return dataclasses.replace(config.preset("cpu", "babyai"), model="smollm2", preset="smollm2", engine="hf")


def test_plan_adapts_an_oversized_micro_batch_and_says_so(memory):
    memory(16)  # 8 GB a rank
    cfg = smollm2_with_tiny_settings()
    before = memplan.peak(memplan.rank_plan(cfg, 2, "cpu", "float32"))
    assert before > 0.9 * 8 * GB  # the plan sees that these settings do not fit
    new, info = memplan.fit(cfg, 2, 2, "cpu", "float32")
    assert new.checkpointing and new.micro_tokens <= cfg.micro_tokens
    after = memplan.peak(memplan.rank_plan(new, 2, "cpu", "float32"))
    assert after <= 0.9 * 8 * GB and info["plan"] == after and info["share"] == 8 * GB
    assert f"--micro-tokens {new.micro_tokens}" in info["note"] and "--checkpointing" in info["note"]


def test_plan_stops_with_the_flag_and_the_figure(memory):
    memory(16)
    cfg = smollm2_with_tiny_settings()
    with pytest.raises(memplan.MemoryPlanError) as stop:  # the same adaptation, refused under --memory-check stop
        memplan.fit(cfg, 2, 2, "cpu", "float32", mode="stop")
    assert "--micro-tokens" in str(stop.value) and "GB" in str(stop.value) and "\n" not in str(stop.value)
    memory(1)  # 0.5 GB a rank: nothing fits, even one episode per micro-batch with checkpointing
    with pytest.raises(memplan.MemoryPlanError) as none:
        memplan.fit(cfg, 2, 2, "cpu", "float32")
    assert "even with --micro-tokens 2048 --checkpointing" in str(none.value) and "under 0.5 GB" in str(none.value)


def test_a_plan_that_fits_is_left_alone(memory):
    memory(1000)
    cfg = config.parse(["--model", "smollm2", "--env", "babyai"])
    new, info = memplan.fit(cfg, 2, 2, "cpu", "bfloat16")
    assert new == dataclasses.replace(cfg, grad_reduce="mini-batch") and info["note"].startswith("memory plan: ")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_deferred_gradient_reduction_is_taken_only_where_the_plan_has_room(memory, dtype):
    """--grad-reduce auto: the CPU holds a whole fp32 gradient per rank until a mini-batch's last backward
    when the plan fits with it; between that plan and the one without it, each backward reduces instead, and
    nothing else changes; an imitation anchor always reduces every backward."""
    cfg = config.parse(["--model", "smollm2", "--env", "babyai"])
    held = memplan.peak(memplan.rank_plan(cfg, 2, "cpu", dtype))
    each = memplan.peak(memplan.rank_plan(dataclasses.replace(cfg, grad_reduce="micro-batch"), 2, "cpu", dtype))
    s = memplan.shape(memplan.model_config("smollm2"))
    trained = cfg.train_layers * s.block + s.H  # the recipe's top blocks and the final norm
    assert abs(held - each - 4 * trained) < 0.05 * GB  # the row: a whole fp32 gradient (RSS moves a little)
    memory(2 * (held + each) / 2 / memplan.HEADROOM / GB)  # two ranks, a share between the two plans
    new, info = memplan.fit(cfg, 2, 2, "cpu", dtype)
    assert new == dataclasses.replace(cfg, grad_reduce="micro-batch") and "--grad-reduce micro-batch" in info["note"]
    memory(2 * (held + 0.1 * GB) / memplan.HEADROOM / GB)
    assert memplan.fit(cfg, 2, 2, "cpu", dtype)[0].grad_reduce == "mini-batch"
    assert memplan.fit(cfg, 1, 1, "cpu", dtype)[0].grad_reduce == "micro-batch"  # one rank: nothing to reduce
    anchored = dataclasses.replace(cfg, bc_anchor=8)
    assert not memplan.defers(anchored) and memplan.fit(anchored, 2, 2, "cpu", dtype)[0].grad_reduce == "auto"


def test_config_json_records_what_the_plan_adapted(memory, monkeypatch, tmp_path):
    """The plan's rewrite of the settings is a named step of the set-up (startup.memory_plan), and config.json
    holds the settings the run trains with and, under "memplan", each one the plan changed as [asked, used]."""
    from launch import startup

    memory(16)  # two ranks, 8 GB each: the tiny model's settings on SmolLM2 do not fit
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    asked = dataclasses.replace(smollm2_with_tiny_settings(), dtype="float32")
    used, info = startup.memory_plan(asked, checks.derive(asked))
    startup.record(tmp_path, asked, used)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert used.checkpointing and "--checkpointing instead" in info["note"]
    adapted = {k: [getattr(asked, k), getattr(used, k)] for k in ("micro_tokens", "checkpointing", "grad_reduce")
               if getattr(asked, k) != getattr(used, k)}  # the micro-batch too when this process holds more
    assert saved["memplan"] == adapted and adapted["checkpointing"] == [False, True]
    assert {k: v for k, v in saved.items() if k != "memplan"} == dataclasses.asdict(used)
    startup.record(tmp_path, used, used)  # a plan that changes nothing records nothing
    assert json.loads((tmp_path / "config.json").read_text())["memplan"] == {}


def test_plan_grows_with_what_it_should():
    s = memplan.shape(memplan.model_config("smollm2"))
    base = dict(world=2, dtype="float32", checkpointing=False, tokens=2048, kl=False, engine="hf", device="cpu")
    total = lambda **kw: memplan.peak(memplan.plan(s, **{**base, **kw}))  # noqa: E731
    assert total(tokens=4096) > total()                       # activations scale with the micro-batch
    assert total(checkpointing=True) < total()                # checkpointing keeps one block's activations
    assert total(kl=True) > total() and total(critic=True) > total()
    assert total(dtype="bfloat16") < total()
    assert total(world=4) < total()                           # sharded state shrinks with ranks


@pytest.mark.parametrize("model", ["smollm2", "qwen2.5-7b"])
def test_train_layers_counts_the_trained_blocks_and_an_untied_head(model):
    """--train-layers N: gradients, moments and the CPU's held gradient for the top N blocks, the final norm
    and an untied head only; activations for the N blocks backward runs through."""
    s = memplan.shape(memplan.model_config(model))
    base = dict(world=2, dtype="bfloat16", checkpointing=False, tokens=2048, kl=False, engine="hf", device="cpu")
    full, top = (memplan.plan(s, **base, train_layers=n)["train"] for n in (0, 10))
    trained = 10 * s.block + s.H + (0 if s.tied else s.V * s.H)
    assert top["AdamW moments (fp32)"] == 8 * trained / 2 and top["sharded fp32 gradients"] == 4 * trained / 2
    assert top["unsharded fp32 gradients, accumulated (CPU)"] == 4 * trained
    masters = "sharded parameters (fp32 masters, frozen in c)"  # the frozen blocks kept in bf16
    assert top[masters] == (4 * trained + 2 * (s.params - trained)) / 2 and full[masters] == 4 * s.params / 2
    acts = next(k for k in top if k.startswith("activations"))
    assert full[acts] - top[acts] == (s.L - 10) * 2048 * (2 * (8 * s.H + 3 * s.kv + 5 * s.I) + 16 * s.H)
    root = "unsharded root gradients (+ fp32 for reduce)"
    assert top[root] == (trained - 10 * s.block) * (2 + 4) < full[root]  # bf16 + fp32; a tied head is frozen


def test_train_refuses_before_start_up_when_nothing_fits(tmp_path):
    env = {**os.environ, "AGENTGYM_MEMORY_GB": "0.5"}
    res = subprocess.run([sys.executable, "train.py", "--model", "smollm2", "--env", "babyai", "--engine", "hf",
                          "--out", str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: memory plan:") and "AGENTGYM_MEMORY_GB" in lines[0]
    assert not (tmp_path / "run" / "config.json").exists()  # stopped before start-up


def test_settings_follow_the_model(tmp_path):
    cfg = config.parse(["--model", "smollm2", "--env", "babyai"])
    assert cfg.preset == "smollm2" and cfg.lr == config.preset("smollm2").lr and cfg.micro_tokens == 2048
    assert config.parse([]).preset == "cpu" and config.parse([]).lr == 1e-3
    no_expert = config.parse(["--model", "smollm2", "--env", "textcraft"])  # an env without an expert: RL alone
    assert no_expert.bc_episodes == 0 and checks.check(no_expert, 2) is None
    refused = checks.check(config.parse(["--model", "smollm2", "--preset", "cpu"]), 1)
    assert "--preset smollm2" in refused and "tiny" in refused
    other = tmp_path / "model"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    problem = checks.check(config.parse(["--model", str(other)]), 1)
    assert problem and "--preset smollm2" in problem and "--preset paper" in problem


def test_a_killed_rank_is_named_with_its_signal_and_memory(tmp_path):
    """TRAIN_FAULT SIGKILLs rank 1 in its first update, as the OOM killer would; the launcher's last line
    and rank 0's output name it."""
    env = {**os.environ, "TRAIN_FAULT": "update:1:1"}
    cmd = [sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", "2", "train.py", "--engine", "hf",
           "--steps", "2", "--horizon", "2", "--tasks-per-step", "2", "--samples-per-task", "2", "--max-tokens", "6",
           "--out", str(tmp_path / "run")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 (pid ") and "SIGKILL" in last and "GB resident" in last, last
    assert "[rank 0] error: rank 1 (pid " in res.stderr  # the survivor said it too, before torchrun's wall


def test_the_survivors_line_is_out_before_either_thread_goes_on(monkeypatch):
    """The watcher thread and the main thread's exit can find the dead peer at the same moment: whichever
    comes second must not return (and let the process exit) while the first is still writing the line.
    A slow stderr holds the watcher mid-line; the main thread's call returns only once the line is out."""
    import threading
    import time

    class Slow:
        def __init__(self):
            self.text, self.writing = "", threading.Event()

        def write(self, s):
            self.writing.set()
            time.sleep(0.3)
            self.text += s
            return len(s)

        def flush(self):
            pass

    slow = Slow()
    monkeypatch.setattr(sys, "stderr", slow)
    monkeypatch.setitem(lifeline._STATE, "said", False)
    monkeypatch.setitem(lifeline._STATE, "rank", 0)
    watcher = threading.Thread(target=lifeline._say_once, args=("error: rank 1 (pid 7) died",))
    watcher.start()
    assert slow.writing.wait(5)
    lifeline._say_once("error: rank 1 (pid 7) died")  # the main thread's exit path, second
    assert slow.text.count("[rank 0] error: rank 1 (pid 7) died") == 1, repr(slow.text)
    watcher.join()
    assert slow.text.count("error: rank 1") == 1


def _peer(tmp_path, monkeypatch, seconds: float):
    """This process as rank 0 of a lifeline directory whose rank 1 is a child process living `seconds`."""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    (tmp_path / "rank1.json").write_text(json.dumps({"rank": 1, "pid": child.pid, "rss": GB, "peak": GB,
                                                     "plan": None, "share": None, "stopped": False}))
    for key, value in {"dir": tmp_path, "rank": 0, "said": False, "stopped": False}.items():
        monkeypatch.setitem(lifeline._STATE, key, value)
    return child


def test_a_rank_exiting_on_an_error_waits_for_a_peer_that_is_dying(tmp_path, monkeypatch, capsys):
    """A killed peer's sockets close a moment before its process is gone: the collective here fails and this
    rank reaches its exit while the peer still looks alive. The exit waits for it, and names it."""
    child = _peer(tmp_path, monkeypatch, 1.0)
    lifeline.stop(grace=10)
    child.wait()
    assert f"[rank 0] error: rank 1 (pid {child.pid}) died" in capsys.readouterr().err
    assert json.loads((tmp_path / "rank0.json").read_text())["stopped"]


def test_a_sigterm_after_a_quiet_exit_still_names_the_dead_peer(tmp_path, monkeypatch, capsys):
    """A rank that found every peer alive at its exit stays stopped, not silenced: torchrun's SIGTERM,
    sent once it has reaped the dead peer, still says which peer died."""
    child = _peer(tmp_path, monkeypatch, 60)
    lifeline.stop()
    assert "error: rank 1" not in capsys.readouterr().err
    child.kill()
    child.wait()
    with pytest.raises(SystemExit):
        lifeline._on_term(15, None)
    assert f"[rank 0] error: rank 1 (pid {child.pid}) died" in capsys.readouterr().err


def test_cause_reads_like_a_diagnosis():
    record = {"rank": 3, "pid": 2**22 + 7, "rss": 13.3 * GB, "peak": 13.4 * GB, "plan": 5.2 * GB, "share": 11.0 * GB}
    line = lifeline.cause(record, 9)
    assert line.startswith("error: rank 3 (pid ") and "SIGKILL" in line and "13.3 GB resident" in line
    assert "planned peak 5.2 GB" in line and "likely out of memory" in line
    assert "names the signal" in lifeline.cause({**record, "peak": 1 * GB}, None)
    assert "own output" in lifeline.cause({**record, "peak": 1 * GB}, 6)  # SIGABRT: the rank's own crash


def test_the_critic_is_planned_from_the_algorithm_record_not_its_name():
    """memplan never tests an --algo name: the caller says whether a value model trains (algorithms.Algo.critic),
    as startup does from checks.derive(cfg).algo."""
    from algorithms import ALGOS

    cfg = dataclasses.replace(config.Config(), algo="ppo", device="cpu")
    named = memplan.rank_plan(cfg, 2, "cpu", "float32")
    told = memplan.rank_plan(cfg, 2, "cpu", "float32", critic=ALGOS[cfg.algo].critic)
    # "runtime" is the process's resident size read at each call: it may grow between two calls
    planned = lambda plan: {k: {n: v for n, v in part.items() if n != "runtime"} if isinstance(part, dict) else part  # noqa: E731
                            for k, part in plan.items()}
    assert planned(named) == planned(memplan.rank_plan(dataclasses.replace(cfg, algo="grpo"), 2, "cpu", "float32"))
    assert sum(told["train"].values()) > sum(named["train"].values())

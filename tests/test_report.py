"""Tests of lab/stats.py's evidence: the task-clustered SE and the paired task-level bootstrap against
hand values, a fixed-seed snapshot and a brute-force enumeration of every resample of a small case
(float64 whatever the input dtype); then a real train.py run (validation curve in evals.jsonl) and two
real evaluate.py runs, published into a result folder (lab/results.py) whose tables (lab/tables.py)
regenerate from its files alone."""
from __future__ import annotations

import itertools
import json
import lzma
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate as E
from lab import stats as R
from lab import results as RS
from lab import tables as T
from tests.test_evaluate import FAST, rec

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ pure functions

def test_clustered_and_naive_se_by_hand():
    # per-task means 1, 0, .5, .5: mean .5, sample variance (.25 + .25) / 3 = 1/6, SE sqrt(1/6 / 4)
    assert R.clustered_se([1, 0, 0.5, 0.5]) == pytest.approx(math.sqrt(1 / 24), abs=1e-15)
    assert R.clustered_se([0.7]) == 0.0 and R.clustered_se([0.25, 0.25, 0.25]) == 0.0
    assert R.naive_se(0.5, 16) == pytest.approx(0.125)
    # successes clustered in one task of four (4 samples each): the naive SE is half the clustered one
    per_task = [1.0, 0.0, 0.0, 0.0]
    assert R.clustered_se(per_task) == pytest.approx(0.25) and R.naive_se(0.25, 16) == pytest.approx(math.sqrt(3) / 16)


BEFORE, AFTER = [0, 0, 1, 0.5, 0], [1, 0, 1, 1, 0.5]


def test_paired_bootstrap_fixed_seed_snapshot():
    r = R.paired_bootstrap(BEFORE, AFTER)  # 10,000 resamples, seed 0
    assert r["diff"] == pytest.approx(0.4, abs=1e-15) and r["tasks"] == 5
    assert (r["lo"], r["hi"]) == (pytest.approx(0.1, abs=1e-12), pytest.approx(0.7, abs=1e-12))
    assert r["se"] == pytest.approx(0.167390977874996, abs=1e-12)
    assert R.paired_bootstrap(BEFORE, AFTER) == r  # seeded: the same numbers every time
    assert R.paired_bootstrap(BEFORE, AFTER, seed=1) != r
    same = R.paired_bootstrap(AFTER, AFTER)
    assert same["diff"] == same["lo"] == same["hi"] == same["se"] == 0.0
    with pytest.raises(ValueError):
        R.paired_bootstrap([0, 1], [0, 1, 1])


def test_paired_bootstrap_matches_brute_force_enumeration():
    """Every one of the 4^4 equally likely resamples of 4 tasks, enumerated: the Monte Carlo interval
    falls on the exact distribution's quantiles and its SD on the exact bootstrap SD."""
    d = np.array([0.5, -0.25, 1.0, 0.0])
    exact = np.sort([d[list(idx)].mean() for idx in itertools.product(range(4), repeat=4)])
    assert exact.std() == pytest.approx(math.sqrt(((d - d.mean()) ** 2).mean() / 4))  # textbook: sigma^2 / T
    r = R.paired_bootstrap(np.zeros(4), d, resamples=40_000, seed=3)
    assert r["diff"] == pytest.approx(d.mean())
    assert r["se"] == pytest.approx(exact.std(), rel=0.02)
    assert np.quantile(exact, 0.015) <= r["lo"] <= np.quantile(exact, 0.035)
    assert np.quantile(exact, 0.965) <= r["hi"] <= np.quantile(exact, 0.985)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs_give_float64_results(dtype):
    exact = R.paired_bootstrap(BEFORE, AFTER)  # halves are exact in every float format
    assert R.paired_bootstrap(torch.tensor(BEFORE, dtype=dtype), torch.tensor(AFTER, dtype=dtype)) == exact
    thirds = torch.tensor([1 / 3, 2 / 3, 0.0, 1.0], dtype=dtype)  # not exact: the same values widened to float64
    widened = thirds.double().tolist()
    assert R.clustered_se(thirds) == R.clustered_se(widened) and isinstance(R.clustered_se(thirds), float)
    assert R.paired_bootstrap(torch.zeros(4, dtype=dtype), thirds) == R.paired_bootstrap([0.0] * 4, widened)
    assert R.as_f64(thirds).dtype == np.float64


def test_paired_evaluations_on_the_same_tasks_only():
    a = [rec(t, "x", i, 10, float(s), s) for t, wins in ((1, 2), (2, 0), (3, 1)) for i, s in enumerate([True] * wins + [False] * (2 - wins))]
    b = [rec(t, "x", i, 10, float(s), s) for t, wins in ((1, 2), (2, 1), (3, 2)) for i, s in enumerate([True] * wins + [False] * (2 - wins))]
    c = [rec(t, "x", 0, 10, 1.0, True) for t in (1, 2)]
    rows = R.paired([("a", a), ("b", b), ("c", c)], resamples=2000)
    assert [(r["before"], r["after"]) for r in rows] == [("a", "b"), ("a", "c"), ("b", "c")]
    ab = rows[0]["success"]
    # per-task differences 0, .5, .5: the mean equals the difference of the two success rates
    assert ab["diff"] == pytest.approx(R.stats(b, [1])["success"] - R.stats(a, [1])["success"]) == pytest.approx(1 / 3)
    assert ab["lo"] == pytest.approx(0.0) and ab["hi"] == pytest.approx(0.5)  # the extremes of 3-task resamples
    assert rows[0]["reward"]["diff"] == pytest.approx(1 / 3)
    assert "not the same tasks" in rows[1]["skipped"] and "success" not in rows[1]
    lines = R.paired_table([("a", a), ("b", b)], resamples=2000)
    assert "| 10 | b | a | 3 | +33.3 [+0.0, +50.0] | +0.333 [+0.000, +0.500] |" in lines



def test_transitions_tell_sharpening_from_extending():
    def model(wins):  # {task: successes of 2 samples}
        return [rec(t, "x", i, 8, float(i < w), i < w) for t, w in wins.items() for i in range(2)]
    base = model({1: 0, 2: 1, 3: 2, 4: 1, 5: 0, 6: 2})
    after = model({1: 1, 2: 2, 3: 0, 4: 0, 5: 0, 6: 1, 7: 2})  # task 7: not in the base, not counted
    assert T.transitions(base, after) == {"tasks": 6, "up": 2, "from_none": 1, "down": 3, "to_none": 2, "same": 1}
    assert T.transitions(base, base)["same"] == 6
    lines = T.transitions_table([("W", base), ("A", after)])
    assert "| A | 6 | 2 | 1 | 3 | 2 | 1 |" in lines and "## Task by task from W" in lines

# SciWorld-like outcomes, 3 tasks x 2 samples: a score with partial credit, -1 for a failure, 1 a success
SCORED = {"before": [(1, -1.0, False), (1, 0.5, False), (2, 1.0, True), (2, 0.0, False), (3, -1.0, False), (3, -1.0, False)],
          "after": [(1, 0.25, False), (1, 0.25, False), (2, 0.0, False), (2, 0.5, False), (3, 0.0, False), (3, 1.0, True)]}


def _folder(dest: Path, outcomes: dict, cpus: dict | None = None) -> Path:
    """A result folder written by hand: manifest.json, and per evaluation config.json and outcomes.jsonl
    (provenance.jsonl and a run/ too when `cpus` names each one's machine)."""
    evals = []
    for label, rows in outcomes.items():
        (dest / "evals" / label).mkdir(parents=True)
        (dest / "evals" / label / "config.json").write_text(json.dumps({"model": f"m-{label}", "k": 2, "out": f"runs/{label}"}))
        (dest / "evals" / label / "outcomes.jsonl").write_text("".join(json.dumps(
            {"task_id": t, "subtask": "x", "sample": i % 2, "budget": 16, "reward": r, "success": s, "turns": 3, "end": "done"})
            + "\n" for i, (t, r, s) in enumerate(rows)))
        evals.append({"label": label, "dir": f"evals/{label}"})
        if cpus:
            (dest / "evals" / label / "provenance.jsonl").write_text(json.dumps(
                {"commit": "c", "dirty": False, "cpu": cpus[label], "time": "t"}) + "\n")
    if cpus:
        (dest / "run").mkdir()
        (dest / "run" / "config.json").write_text(json.dumps({"env": "e", "model": "m-before", "algo": "grpo", "steps": 1}))
        (dest / "run" / "provenance.jsonl").write_text(json.dumps({"commit": "c", "dirty": False, "cpu": cpus["run"]}) + "\n")
    (dest / "manifest.json").write_text(json.dumps({"evals": evals, "by_subtask": True}))
    return dest


def test_a_score_with_a_failure_gets_progress_and_score_pass_at_k(tmp_path):
    """Where a failure scores below 0 and partial credit above it (SciWorld), every table sets success,
    progress (a failure counted as 0) and the paper's mean score side by side, with both Pass@k; where no
    reward is below 0 the tables keep success and Avg reward only."""
    # by hand, per task (1, 2, 3), before: progress .25, .5, 0 (mean .250); mean score -.25, .5, -1 (-.250);
    # success 0, .5, 0 (16.7%); a sample above 0: 1 of 2, 1 of 2, 0 of 2 -> Pass@1 score>0 (1/2 + 1/2 + 0) / 3
    # = 33.3%, Pass@2 score>0 (1 + 1 + 0) / 3 = 66.7%; Pass@1 = 16.7%, Pass@2 (a success among 2) 33.3%.
    # after: progress .25, .25, .5 (.333), no reward below 0 so mean score .333 too; success 0, 0, .5 (16.7%);
    # Pass@1 score>0 (1 + 1/2 + 1/2) / 3 = 66.7%, Pass@2 score>0 100.0%; Pass@1 16.7%, Pass@2 33.3%.
    md = T.render(_folder(tmp_path / "sci", SCORED))
    assert ("| evaluation | turns | tasks | episodes | success % | SE (tasks) | SE (naive) | progress | mean score (paper) "
            "| Pass@1 % | Pass@2 % | Pass@1, score > 0 % | Pass@2, score > 0 % |") in md
    assert "| before | 16 | 3 | 6 | 16.7 |" in md and "| 0.250 | -0.250 | 16.7 | 33.3 | 33.3 | 66.7 |" in md
    assert "| after | 16 | 3 | 6 | 16.7 |" in md and "| 0.333 | 0.333 | 16.7 | 33.3 | 66.7 | 100.0 |" in md
    # paired, after - before per task: success 0, -.5, +.5 (mean 0); progress 0, -.25, +.5 (+.083); mean score
    # .25 - (-.25) = +.5, .25 - .5 = -.25, .5 - (-1) = +1.5 (+.583). With 3 tasks each extreme (all three draws of
    # one task, 1/27 = 3.7% > 2.5%) is an end of the interval.
    row = "| 16 | after | before | 3 | +0.0 [-50.0, +50.0] | +0.083 [-0.250, +0.500] | +0.583 [-0.250, +1.500] |"
    assert ("| turns | after | before | tasks | success, points [95% interval] | progress [95% interval] | "
            "mean score (paper) [95% interval] |") in md and row in md
    assert "| x " + row in md  # the one subtask: the same figures
    recs = {label: [json.loads(line) for line in (tmp_path / "sci" / "evals" / label / "outcomes.jsonl").read_text().splitlines()]
            for label in SCORED}
    assert R.scored(recs["before"] + recs["after"]) and not R.scored(recs["after"])  # after alone: nothing below 0
    assert R.progress({"reward": -1.0}) == 0.0 and R.progress({"reward": 0.25}) == 0.25
    # the seeds side by side: success, progress and the paper's mean score, each seed's interval
    seeds = T.seeds_table([tmp_path / "sci", _folder(tmp_path / "sci2", SCORED)])
    assert "## Progress" in seeds and "## Mean score (paper" in seeds
    assert "| 16 | after | before | +0.083 [-0.250, +0.500] | +0.083 [-0.250, +0.500] | 0 of 2 | +0.083 |" in seeds
    # no reward below 0 (BabyAI's kind, partial credit and all): success and Avg reward only, as before
    plain = {label: [(t, max(r, 0.0), s) for t, r, s in rows] for label, rows in SCORED.items()}
    md = T.render(_folder(tmp_path / "plain", plain))
    assert "| success % | SE (tasks) | SE (naive) | Avg reward | Pass@1 % | Pass@2 % |\n" in md
    assert "progress" not in md and "score > 0" not in md and "mean score" not in md
    assert "| 16 | after | before | 3 | +0.0 [-50.0, +50.0] | +0.083 [-0.250, +0.500] |\n" in md  # Avg reward = progress
    seeds = T.seeds_table([tmp_path / "plain", _folder(tmp_path / "plain2", plain)])
    assert "## Progress" not in seeds and "## Mean reward (the env's own" in seeds
    # -1 or a success (MiniWoB++'s kind): no partial credit, so nothing to add either
    assert not R.scored([{"reward": -1.0, "success": False}, {"reward": 1.0, "success": True}])


def test_an_evaluation_from_another_machine_says_so(tmp_path):
    """run.sh reuses seed 0's untrained evaluation in later seeds: its provenance names another CPU than
    the folder's training run, and the evaluations' list says so."""
    md = T.render(_folder(tmp_path / "f", SCORED, cpus={"before": "Intel", "after": "AMD", "run": "AMD"}))
    (note,) = [line for line in md.splitlines() if line.startswith("- NOTE")]
    assert note.startswith("- NOTE: before was evaluated on another machine than this training run: CPU Intel "
                           "(run/provenance.jsonl: AMD), into `runs/before`.")
    assert "run.sh evaluates the untrained model once" in note  # `before` is the run's starting model
    md = T.render(_folder(tmp_path / "g", SCORED, cpus={"before": "AMD", "after": "AMD", "run": "AMD"}))
    assert "- NOTE" not in md


def test_trim_keeps_head_and_tail():
    msgs = [{"role": "user", "content": "x" * 2000}] + [{"role": "assistant", "content": str(i)} for i in range(30)]
    cut = RS.trim(msgs, chars=100, head=3, tail=5)
    assert len(cut) == 9 and cut[3] == {"role": "note", "content": "[23 messages cut]"}
    assert cut[0]["content"].startswith("x" * 100) and "1900 characters cut" in cut[0]["content"]
    assert [m["content"] for m in cut[-5:]] == [str(i) for i in range(25, 30)]


# ------------------------------------------------------------------ real runs, published

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two GRPO steps of the tiny model on the toy env, evaluated on 4 validation tasks before RL and
    after each step (2 ranks, so the outcomes are gathered from both; the project's decode loop generates,
    since vLLM's start-up would cost more CPU than the whole run)."""
    out = tmp_path_factory.mktemp("run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py",
           "--env", "tests.support.toy:Digits", "--engine", "torch", "--steps", "2", "--horizon", "1",
           "--tasks-per-step", "2", "--samples-per-task", "2", "--max-tokens", "4", "--eval-every", "1", "--eval-tasks", "4", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out validation success before RL" in proc.stdout
    return out


def test_train_writes_the_validation_outcomes(run_dir):
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    metrics = {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    points = [(0, "eval_start"), (0, "eval"), (1, "eval")]
    assert [(r["step"], r["eval"]) for r in rows] == [p for p in points for _ in range(4)]
    assert {r["task_id"] for r in rows} == {80, 81, 82, 83}  # Digits' validation split, not its test (64..79)
    for step, name in points:
        mine = [r for r in rows if (r["step"], r["eval"]) == (step, name)]
        assert sum(r["success"] for r in mine) / 4 == pytest.approx(metrics[step][f"{name}/success"], abs=1e-6)
        assert sum(r["reward"] for r in mine) / 4 == pytest.approx(metrics[step][f"{name}/reward"], abs=1e-5)
        assert all(r["turns"] == 1 and r["subtask"].startswith("len") for r in mine)
    (prov,) = [json.loads(line) for line in (run_dir / "provenance.jsonl").read_text().splitlines()]
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool) and prov["cpu"]


@pytest.fixture
def evals(tmp_path, monkeypatch):
    """Two evaluations of the tiny model on the same 6 Coin tasks x 4 samples (two seeds: two 'models')."""
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    coin = ["--env", "tests.test_evaluate:Coin", *FAST, "--turns", "1", "--k", "4"]
    for seed in (1, 2):
        E.main([*coin, "--seed", str(seed), "--out", str(tmp_path / f"eval{seed}")])
    return [("seed 1", tmp_path / "eval1"), ("seed 2", tmp_path / "eval2")]


def test_publish_and_regenerate(run_dir, evals, tmp_path):
    dest = tmp_path / "results" / "coin"
    args = ["--publish", str(run_dir), str(dest), *[f"{label}={d}" for label, d in evals]]
    proc = subprocess.run([sys.executable, "-m", "lab.report", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    each = ["actions.json", "config.json", "outcomes.jsonl", "provenance.jsonl", "transcripts-all.jsonl.xz", "transcripts.jsonl"]
    assert files == [*[f"evals/seed-{i}/{f}" for i in (1, 2) for f in each], "manifest.json",
                     "run/config.json", "run/evals.jsonl", "run/metrics.jsonl", "run/provenance.jsonl", "tables.md"]
    for label, d in evals:  # every transcript, byte for byte
        kept = lzma.decompress((dest / "evals" / RS._slug(label) / "transcripts-all.jsonl.xz").read_bytes())
        assert kept == (d / "transcripts.jsonl").read_bytes() and len(kept.splitlines()) == 24
    assert sum(p.stat().st_size for p in dest.rglob("*")) < 200_000 and not list(dest.rglob("*.safetensors"))
    manifest = json.loads((dest / "manifest.json").read_text())
    assert len(manifest["published"]["commit"]) == 40 and manifest["evals"][1]["label"] == "seed 2"
    outcomes = [json.loads(line) for line in (dest / "evals/seed-1/outcomes.jsonl").read_text().splitlines()]
    source = E.load_transcripts(evals[0][1] / "transcripts.jsonl", 4)[0]
    assert len(outcomes) == 24 and sorted(json.dumps(o) for o in outcomes) == sorted(
        json.dumps({k: r[k] for k in RS.OUTCOME_KEYS}) for r in source)
    shown = [json.loads(line) for line in (dest / "evals/seed-1/transcripts.jsonl").read_text().splitlines()]
    assert len(shown) == 3 and all(s["messages"][-1]["role"] == "assistant" for s in shown)
    # the tables come back from the folder's files alone, identical to what --publish printed and wrote
    again = subprocess.run([sys.executable, "-m", "lab.report", str(dest)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout == proc.stdout == (dest / "tables.md").read_text()
    md = again.stdout
    for label, d in evals:  # each evaluation's row: its success and Avg reward as evaluate.py reported them
        row = json.loads((d / "results.json").read_text())["budgets"]["1"]["all"]
        assert f"| {label} | 1 | 6 | 24 | {100 * row['success']:.1f} |" in md and f"| {row['avg_reward']:.3f} |" in md
    diff = R.paired([(label, E.load_transcripts(d / "transcripts.jsonl", 4)[0]) for label, d in evals])[0]["success"]
    assert f"| 1 | seed 2 | seed 1 | 6 | {100 * diff['diff']:+.1f} [{100 * diff['lo']:+.1f}, {100 * diff['hi']:+.1f}] |" in md
    mix = json.loads((dest / "evals/seed-1/actions.json").read_text())  # every assistant turn of all 24 episodes
    assert sum(sum(c.values()) for c in mix.values()) == sum(
        sum(m["role"] == "assistant" for m in r["messages"]) for r in source)
    assert "## Actions per subtask" in md
    for sub in sorted({r["subtask"] for r in source}):  # per subtask, the same bootstrap over its tasks only
        part = [(label, [r for r in E.load_transcripts(d / "transcripts.jsonl", 4)[0] if r["subtask"] == sub])
                for label, d in evals]
        d = R.paired(part)[0]["reward"]
        assert f"| {sub} | 1 | seed 2 | seed 1 | {d['tasks']} |" in md and f"| {d['diff']:+.3f} [{d['lo']:+.3f}, " in md
    curve = md.split("## Validation curve")[1].strip().splitlines()[4:]
    assert [line.split(" | ")[0] for line in curve] == ["| 0", "| 1", "| 2"] and all(line.endswith("| yes |") for line in curve)


def test_unpack_gives_back_the_evaluation_it_published(evals, tmp_path):
    """A later seed reuses seed 0's published untrained evaluation (run.sh): unpacked, it is the
    evaluate.py output it was made from, transcripts byte for byte and results.json's figures equal."""
    dest = tmp_path / "results" / "coin"
    RS.publish(None, dest, evals)
    for label, d in evals:
        back = tmp_path / "back" / RS._slug(label)
        proc = subprocess.run([sys.executable, "-m", "lab.report", "--unpack", str(dest / "evals" / RS._slug(label)),
                               str(back)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (back / "transcripts.jsonl").read_bytes() == (d / "transcripts.jsonl").read_bytes()
        made, original = (json.loads((p / "results.json").read_text()) for p in (back, d))
        assert made.pop("unpacked_from") == str(dest / "evals" / RS._slug(label))
        assert made["config"].pop("model") == original["model"] and original["config"].pop("model")
        assert made == original
    with pytest.raises(SystemExit, match="holds an evaluation already"):
        RS.unpack(dest / "evals" / "seed-1", tmp_path / "back" / "seed-1")
    # compared as it is, a published evaluation gets a one-line error naming --unpack, not a traceback
    proc = subprocess.run([sys.executable, "-m", "lab.report", f"a={dest / 'evals' / 'seed-1'}", f"b={back}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(f"--unpack {dest / 'evals' / 'seed-1'} EVAL_DIR")
    again = R.paired([(label, E.load_transcripts(tmp_path / "back" / RS._slug(label) / "transcripts.jsonl", 4)[0])
                      for label, _ in evals])
    assert again == R.paired([(label, E.load_transcripts(d / "transcripts.jsonl", 4)[0]) for label, d in evals])


def test_action_mix_counts_verbs_per_subtask():
    reply = lambda action: {"role": "assistant", "content": f"Thought:\nx\n\nAction:\n{action}"}  # noqa: E731
    records = [{"subtask": "Pickup", "messages": [{"role": "user", "content": "Action:\ngo to a"}, reply("go to red ball 1"),
                                                  reply("pick up red ball 1"), reply("Pickup red ball 1")]},
               {"subtask": "GoTo", "messages": [reply("turn left"), {"role": "assistant", "content": "no action here"}]}]
    assert RS.action_mix(records) == {"GoTo": {"turn": 1, "(invalid)": 1}, "Pickup": {"pickup": 2, "go": 1}}
    web = [{"subtask": "click-tab", "messages": [
        {"role": "assistant", "content": "Open the tab. In summary, the next action I will perform is ```click [7]```"},
        {"role": "assistant", "content": "```type [3] [Kasie] [1]``` and then ```click [4]```"},
        {"role": "assistant", "content": "Thought:\nx\n\nAction:\nclick [4]"}]}]  # a ReAct reply is no web action
    assert RS.action_mix(web, "miniwob") == {"click-tab": {"click": 1, "type": 1, "(invalid)": 1}}
    table = "\n".join(T.actions_table([]))
    assert table == ""


def test_refused_turns_reads_the_real_envs_refusals(tmp_path):
    """Turns whose action BabyAI did not carry out (not available here, or no action at all), counted from
    the observations the real env wrote back."""
    from envs.babyai import BabyAI

    env = BabyAI(brief=True)
    task = env.tasks("test")[0]
    messages = [{"role": "user", "content": env.reset(task)}]
    flags = []
    for action in ("Action:\ngo to nowhere 9", "Action:\nturn left", "no action here", "Action:\nturn right"):
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": env.step(action)[0]}]
        flags.append(env.refused)  # what rollout counts into Episode.refused (config.refusal_penalty)
    assert flags == [True, False, True, False]
    record = {"subtask": env.subtask(task), "messages": messages}
    assert RS.refused_turns([record], "babyai") == {env.subtask(task): {"observed": 4, "refused": 2}}
    cut = {**record, "messages": messages[:-1]}  # the last turn's observation unseen: not counted either way
    assert RS.refused_turns([cut], "babyai") == {env.subtask(task): {"observed": 3, "refused": 2}}
    assert RS.refused_turns([record], "textcraft") is None  # no known refusal messages: no column
    files = []
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        (tmp_path / label / "actions.json").write_text(json.dumps(RS.action_mix([record], "babyai")))
        files.append((label, tmp_path / label / "actions.json"))
    (tmp_path / "a" / "refused.json").write_text(json.dumps(RS.refused_turns([record], "babyai")))
    table = T.actions_table(files)
    assert table[3].endswith("| other | refused by the env (of turns with an observation) |")
    assert table[5].endswith("| 50 |") and table[6].endswith("|  |")  # b has no refused.json: an empty cell
    assert table[-1] == "| a | 4 | 50.0 |" and len(table) == 11  # b is left out of the totals


def test_publish_refuses_an_oversized_or_existing_folder(run_dir, evals, tmp_path):
    dest = tmp_path / "big"
    with pytest.raises(SystemExit, match="over the 0.0 MB limit"):
        RS.publish(run_dir, dest, evals, limit=1000)
    assert not dest.exists()  # nothing half-written is left to commit
    RS.publish(None, dest, evals[:1])
    assert "Paired differences" not in (dest / "tables.md").read_text()
    with pytest.raises(SystemExit, match="holds files already"):
        RS.publish(None, dest, evals[:1])


def test_seeds_table_lists_each_seed_and_their_mean(run_dir, evals, tmp_path):
    """`python -m lab.report results/A results/B`: one recipe's seeds side by side (here two folders whose later
    evaluation is, in turn, each of two evaluations of the same 6 tasks)."""
    a, b = tmp_path / "a", tmp_path / "b"
    RS.publish(run_dir, a, evals)
    RS.publish(None, b, [(evals[0][0], evals[1][1]), (evals[1][0], evals[0][1])])  # the same labels, swapped data
    proc = subprocess.run([sys.executable, "-m", "lab.report", str(a), str(b)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [E.load_transcripts(d / "transcripts.jsonl", 4)[0] for _, d in evals]
    d = R.paired([("x", recs[0]), ("y", recs[1])])[0]["success"]
    success = proc.stdout.split("## Success")[1].split("## Mean reward")[0]
    (row,) = [line for line in success.splitlines() if line.startswith("| 1 | seed 2 | seed 1 |")]
    cells = row.split(" | ")
    assert cells[3] == f"{100 * d['diff']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
    assert cells[4].startswith(f"{-100 * d['diff']:+.1f} [")  # the swapped seed: the opposite difference
    assert cells[5] == f"{(d['lo'] > 0) + (-d['hi'] > 0)} of 2" and cells[6] == "+0.0 |"
    # Coin's reward is 1 or -0.5, not success: the mean-reward table follows, in the env's own units
    reward = R.paired([("x", recs[0]), ("y", recs[1])])[0]["reward"]
    after = proc.stdout.split("## Mean reward")[1]
    (row,) = [line for line in after.splitlines() if line.startswith("| 1 | seed 2 | seed 1 |")]
    assert row.split(" | ")[3] == f"{reward['diff']:+.3f} [{reward['lo']:+.3f}, {reward['hi']:+.3f}]"
    # the RL run of the folder that has one: its steps, seconds and constant-group shares, step by step
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shares = [m["skipped"] for m in metrics if "skipped" in m]
    (run,) = [line for line in proc.stdout.split("## The RL runs")[1].splitlines() if line.startswith("| a |")]
    assert run.split(" | ")[1:5] == ["2", f"{sum(m.get('time/step', 0) for m in metrics if 'skipped' in m):,.0f}",
                                     f"{sum(shares) / 2:.2f}", ", ".join(f"{x:.2f}" for x in shares)]
    assert "| b |" not in proc.stdout.split("## The RL runs")[1]  # b was published without its run


def test_seeds_table_names_folders_of_one_name_by_their_parent(run_dir, evals, tmp_path):
    """A protocol's seeds are each one `test/` folder (results/protocol-...-seedN/test): the table names them by
    their parent, or its columns could not be told apart."""
    a, b = tmp_path / "seed0" / "test", tmp_path / "seed1" / "test"
    RS.publish(None, a, evals)
    RS.publish(None, b, evals)
    table = T.seeds_table([a, b], resamples=200)
    assert table.splitlines()[0] == "# 2 seeds: seed0/test, seed1/test"
    (header,) = [line for line in table.splitlines() if line.startswith("| turns |")][:1]
    assert "| seed0/test | seed1/test |" in header


def test_refresh_makes_a_folders_action_counts_again_from_its_transcripts(tmp_path):
    """SciWorld's refusals ("No known action matches that input.") counted from a published folder's
    transcripts-all.jsonl.xz: its action mix comes out byte for byte as published, the refusal counts as
    committed, and a refused action is one the transcript shows refused."""
    import shutil

    src = ROOT / "results" / "sciworld-smollm2-seed0"
    dest = tmp_path / "folder"
    shutil.copytree(src, dest)
    for f in dest.glob("evals/*/refused.json"):
        f.unlink()
    written = RS.refresh(dest)
    assert len(written) == 8
    for f in written:
        assert f.read_bytes() == (src / f.relative_to(dest)).read_bytes(), f
    refused = json.loads((dest / "evals" / "untrained" / "refused.json").read_text())
    assert all(c["refused"] <= c["observed"] for c in refused.values())
    records = [json.loads(line) for line in lzma.decompress(
        (dest / "evals" / "untrained" / "transcripts-all.jsonl.xz").read_bytes()).decode().splitlines()]
    no_match = sum(a["content"].startswith("No known action matches") for r in records
                   for m, a in zip(r["messages"], r["messages"][1:]) if m["role"] == "assistant" and a["role"] == "user")
    assert sum(c["refused"] for c in refused.values()) >= no_match > 0

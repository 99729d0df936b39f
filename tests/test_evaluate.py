"""Tests of evaluate.py: the Pass@k estimator and the table arithmetic against hand-computed values,
transcript repair, fail-fast messages, and real runs with the tiny model (TextCraft, then a resumed run
under torchrun with 2 ranks; SearchQA; a coin-flip env whose numbers are not all zero)."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import evaluate as E
from lab import stats as R

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--model", "tiny", "--engine", "hf", "--max-tokens", "12", "--max-context", "4096"]


class Coin:
    """One-turn env that a random model passes about half the time: success when the reply's character
    codes sum to an even number. Reward 1 on success, -0.5 otherwise, so reward and success differ."""
    instruction = "Reply with anything."

    def __init__(self):
        self.success = False

    def reset(self, task_id: int) -> str:
        self.success = False
        return f"Task {task_id}."

    def step(self, text: str) -> tuple[str, float, bool]:
        self.success = sum(map(ord, text)) % 2 == 0
        return "Done.", 1.0 if self.success else -0.5, True

    def close(self) -> None:
        pass

    def tasks(self, split: str) -> list[int]:
        return list(range(6)) if split == "test" else list(range(6, 20))

    def subtask(self, task_id: int) -> str:
        return "odd" if task_id % 2 else "even"


# ------------------------------------------------------------------ pure functions

@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),          # 1 - C(3,2)/C(5,2)
    (4, 2, 2, 1 - 1 / 6),           # 1 - C(2,2)/C(4,2)
    (10, 3, 1, 0.3),                # Pass@1 is the success fraction
    (8, 1, 4, 0.5),                 # 1 - C(7,4)/C(8,4) = 1 - 35/70
    (5, 0, 3, 0.0), (5, 5, 3, 1.0), (5, 3, 3, 1.0),  # no success; all; fewer failures than k
    (200, 1, 100, 0.5),             # C(200,100) overflows a float; the product does not
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert R.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomials_and_rejects_bad_counts():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert R.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    for n, c, k in ((3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1)):
        with pytest.raises(ValueError):
            R.pass_at_k(n, c, k)
    assert [R.k_values(k) for k in (1, 4, 6)] == [[1], [1, 2, 4], [1, 2, 4, 6]]


def rec(task, sub, sample, budget, reward, success, turns=3, end="done"):
    return {"task_id": task, "subtask": sub, "sample": sample, "budget": budget, "reward": reward,
            "success": success, "turns": turns, "end": end, "error": "", "messages": []}


SYNTHETIC = (  # budget 10: task 1 (a) 2 of 4 succeed, task 2 (b) none; budget 20: task 1 all, task 2 one
    [rec(1, "a", i, 10, r, s, t) for i, (r, s, t) in enumerate([(1, True, 2), (1, True, 4), (0, False, 10), (-1, False, 10)])]
    + [rec(2, "b", i, 10, r, False, 10, "horizon") for i, r in enumerate([0, 0.5, 0, 0])]
    + [rec(1, "a", i, 20, 1, True, 5) for i in range(4)]
    + [rec(2, "b", i, 20, r, s, 6) for i, (r, s) in enumerate([(0, False), (1, True), (0, False), (0, False)])])


def test_summary_numbers_by_hand():
    s = R.summarize(SYNTHETIC)
    assert s["ks"] == [1, 2, 4] and list(s["budgets"]) == ["10", "20"]
    b10 = s["budgets"]["10"]
    # Avg@4: task 1 (1+1+0-1)/4 = 0.25, task 2 0.5/4 = 0.125 -> 0.1875; success (0.5 + 0) / 2
    assert b10["all"]["avg_reward"] == pytest.approx(0.1875) and b10["all"]["success"] == pytest.approx(0.25)
    # Pass@2: task 1 1 - C(2,2)/C(4,2) = 5/6, task 2 0 -> 5/12; Pass@4: (1 + 0) / 2
    assert b10["all"]["pass@2"] == pytest.approx(5 / 12) and b10["all"]["pass@4"] == pytest.approx(0.5)
    assert b10["all"]["pass@1"] == pytest.approx(b10["all"]["success"])
    assert b10["all"]["turns"] == pytest.approx((6.5 + 10) / 2) and b10["all"]["tasks"] == 2
    assert b10["all"]["ends"] == {"done": 0.5, "horizon": 0.5}
    assert b10["subtasks"]["a"]["pass@2"] == pytest.approx(5 / 6) and b10["subtasks"]["b"]["success"] == 0
    b20 = s["budgets"]["20"]
    # task 2 with one success of 4: Pass@2 = 1 - C(3,2)/C(4,2) = 1/2 -> overall (1 + 1/2) / 2
    assert b20["all"]["success"] == pytest.approx((1 + 0.25) / 2) and b20["all"]["pass@2"] == pytest.approx(0.75)
    assert b20["subtasks"]["b"]["avg_reward"] == pytest.approx(0.25)
    lines = R.table(s).splitlines()
    assert lines[0] == "| turns | subtask | tasks | Avg@4 reward | success % | Pass@1 % | Pass@2 % | Pass@4 % | mean turns |"
    assert "| 10 | all | 2 | 0.188 | 25.0 | 25.0 | 41.7 | 50.0 | 8.2 |" in lines  # 8.25 rounds half to even
    assert "| 20 | b | 1 | 0.250 | 25.0 | 25.0 | 50.0 | 100.0 | 6.0 |" in lines
    assert len(lines) == 2 + 2 * 3


def test_load_transcripts_drops_cut_lines_and_unfinished_pairs(tmp_path):
    path = tmp_path / "transcripts.jsonl"
    whole = "".join(json.dumps(r) + "\n" for r in SYNTHETIC[:8])         # task 1 and task 2 at budget 10
    path.write_text(whole)
    records, dirty = E.load_transcripts(path, k=4)
    assert len(records) == 8 and not dirty
    path.write_text(whole + json.dumps(SYNTHETIC[8]) + "\n" + json.dumps(SYNTHETIC[9])[:40])  # interrupted
    records, dirty = E.load_transcripts(path, k=4)
    assert dirty and len(records) == 8 and {(r["task_id"], r["budget"]) for r in records} == {(1, 10), (2, 10)}
    # the resume plan: the unfinished pair is played again, and the file is cut back to whole pairs
    assert E.pending_pairs(path, 4, [10, 20], [1, 2]) == [(20, 1), (20, 2)]
    assert path.read_text() == whole and E.load_transcripts(path, k=4) == (records, False)


# ------------------------------------------------------------------ fail fast

@pytest.mark.parametrize("args, needle", [
    (["--env", "nope"], "unknown env 'nope'"),
    (["--k", "0"], "--k must be at least 1"),
    (["--turns", "10,x"], "comma list"),
    (["--turns", "10,0"], "at least 1 turn"),
    (["--model", "/nonexistent/dir"], "cannot be loaded"),
    (["--model", str(ROOT / "envs")], "no config.json"),
    (["--temperature", "0"], "--greedy"),
    (["--env-options", "[1]"], "JSON object"),
    (["--max-tokens", "5000", "--max-context", "4096"], "raise the context"),
])
def test_check_names_the_fix(args, needle):
    problem = E.check(E.parse(args))
    assert problem is not None and needle in problem and "\n" not in problem


def test_task_selection():
    env = Coin()
    assert E.select_tasks(E.parse(["--limit", "2"]), env) == [0, 1]
    assert E.select_tasks(E.parse(["--tasks", "5,2,5"]), env) == [5, 2]
    with pytest.raises(ValueError, match=r"\[7\] are not in the 'test' split"):
        E.select_tasks(E.parse(["--tasks", "1,7"]), env)


def test_checkpoint_paths_resolve_to_the_policy(tmp_path):
    """A train run's layout (checkpoint.py): run/checkpoints/latest names step_N, whose policy/ is the model."""
    from models import tiny
    policy = tmp_path / "run" / "checkpoints" / "step_000002" / "policy"
    shutil.copytree(tiny.tiny_model_dir(), policy)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000002\n")
    for given in ("run", "run/checkpoints", "run/checkpoints/step_000002", "run/checkpoints/step_000002/policy"):
        assert E.policy_dir(str(tmp_path / given)) == str(policy)
    assert E.policy_dir("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert E.check(E.parse(["--model", str(tmp_path / "run"), "--out", str(tmp_path / "o")])) is None
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000009")  # points at nothing
    assert "no config.json" in E.check(E.parse(["--model", str(tmp_path / "run")]))


def run(args, torchrun=False):
    launcher = [sys.executable] + (["-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"] if torchrun else [])
    return subprocess.run([*launcher, "evaluate.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_bad_input_stops_with_one_line_and_exit_2(tmp_path):
    proc = run(["--tasks", "0,99999", "--out", str(tmp_path / "x")])  # the other messages: test_check_names_the_fix
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --tasks [99999] are not in the 'test' split of textcraft")
    assert not (tmp_path / "x").exists()


def test_a_run_is_not_scored_on_tasks_it_trained_on(tmp_path):
    """A run trained on BabyAI's train split (AgentGym ids below 40,000) and evaluated on a paper-style
    tasks file: the ids it trained on are refused before any model loads; its own --tasks-file counts too."""
    import dataclasses

    import config
    from models import tiny
    from envs.babyai import BabyAI
    policy = tmp_path / "run" / "checkpoints" / "step_000001" / "policy"
    shutil.copytree(tiny.tiny_model_dir(), policy)
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000001")
    (tmp_path / "run" / "config.json").write_text(json.dumps(dataclasses.asdict(config.Config(env="babyai"))))
    (tmp_path / "paper.json").write_text(json.dumps([{"item_id": "babyai_5"}, {"item_id": "babyai_4000003"}]))
    proc = run(["--env", "babyai", "--model", str(tmp_path / "run"), "--tasks-file", str(tmp_path / "paper.json"),
                "--out", str(tmp_path / "x")])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "1 of the 2 tasks to evaluate (e.g. ids [5]) are tasks --model's training run trained on" in lines[0]
    assert not (tmp_path / "x").exists()
    env = BabyAI()
    ids = [5, 39_999, 40_000, 2_000_000, 4_000_003]
    for given in ("run", "run/checkpoints", "run/checkpoints/step_000001/policy"):
        cfg = E.parse(["--env", "babyai", "--model", str(tmp_path / given)])
        assert E.trained_on(cfg, env, ids) == [5, 39_999]  # the train split: seeds 0-999 of the 40 levels
    assert E.trained_on(E.parse(["--env", "textcraft", "--model", str(tmp_path / "run")]), env, ids) == []
    assert E.trained_on(E.parse(["--env", "babyai", "--model", str(policy.parent.parent.parent.parent)]), env, ids) == []
    (tmp_path / "train.json").write_text(json.dumps(["babyai_4000003", "babyai_7"]))
    saved = dataclasses.asdict(config.Config(env="babyai", tasks_file=str(tmp_path / "train.json")))
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    assert E.trained_on(E.parse(["--env", "babyai", "--model", str(policy)]), env, ids) == [4_000_003]
    (tmp_path / "train.json").unlink()
    with pytest.raises(ValueError, match="cannot be read to check for overlap"):
        E.trained_on(E.parse(["--env", "babyai", "--model", str(policy)]), env, ids)


# ------------------------------------------------------------------ real runs

def check_outputs(out: Path, budgets: list[int], tasks: int, k: int) -> list[dict]:
    """Every file is there and the table/JSON numbers equal those recomputed from transcripts.jsonl."""
    for name in ("results.md", "pass_at_k.png", "turn_scaling.png"):
        assert (out / name).stat().st_size > 0
    rows = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert len(rows) == len(budgets) * tasks * k
    result = json.loads((out / "results.json").read_text())
    md = (out / "results.md").read_text()
    for b in budgets:
        mine = [r for r in rows if r["budget"] == b]
        success, reward = sum(r["success"] for r in mine) / len(mine), sum(r["reward"] for r in mine) / len(mine)
        row = result["budgets"][str(b)]["all"]
        assert row["tasks"] == tasks and row["success"] == pytest.approx(success) and row["avg_reward"] == pytest.approx(reward)
        passes = []
        for t in {r["task_id"] for r in mine}:
            c = sum(r["success"] for r in mine if r["task_id"] == t)
            passes.append(1 - math.comb(k - c, k) / math.comb(k, k))
        assert row[f"pass@{k}"] == pytest.approx(sum(passes) / len(passes))
        assert f"| {b} | all | {tasks} | {reward:.3f} | {100 * success:.1f} |" in md
        assert all(r["turns"] <= b and r["end"] in ("done", "horizon", "context") for r in mine)
    return rows


def test_textcraft_run_then_resume_under_torchrun(tmp_path):
    common = ["--env", "textcraft", *FAST, "--k", "2", "--turns", "1,2", "--out", str(tmp_path)]
    proc = run([*common, "--limit", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| turns | subtask | tasks | Avg@2 reward |" in proc.stdout  # the table is printed
    first = (tmp_path / "transcripts.jsonl").read_text()
    check_outputs(tmp_path, [1, 2], tasks=2, k=2)
    rows = [json.loads(line) for line in first.splitlines()]
    assert rows[0]["messages"][0]["role"] == "system" and rows[0]["messages"][2]["role"] == "assistant"
    assert {r["subtask"] for r in rows} <= {"depth1", "depth2", "depth3", "depth4"}

    # Resume with more tasks on 2 ranks: only the 2 new tasks are played, the first lines stay as they were.
    proc = run([*common, "--limit", "4", "--chunk", "1"], torchrun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 pairs to play, 4 already in" in proc.stdout
    assert (tmp_path / "transcripts.jsonl").read_text().startswith(first)
    rows = check_outputs(tmp_path, [1, 2], tasks=4, k=2)
    assert len({r["task_id"] for r in rows}) == 4

    # Other decoding settings must not be mixed into the same transcripts.
    problem = E.check(E.parse([*common, "--k", "4", "--temperature", "0.5"]))
    assert "k 2 -> 4" in problem and "temperature 1.0 -> 0.5" in problem and "another --out" in problem


def test_searchqa_run(tmp_path):
    proc = run(["--env", "searchqa", *FAST, "--limit", "2", "--k", "2", "--turns", "2", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = check_outputs(tmp_path, [2], tasks=2, k=2)
    assert rows[0]["messages"][1]["content"].startswith("Question:")
    assert "exact" in json.loads((tmp_path / "results.json").read_text())["reward_scale"]


def test_agentgym_tasks_file_and_framing_run(tmp_path, in_process):
    """Paper mode end to end: AgentGym's ids from a file are played as given, in AgentGym's framing."""
    tasks = tmp_path / "babyai_test.json"
    tasks.write_text(json.dumps([{"item_id": "babyai_93"}, {"item_id": "babyai_5"}]))
    in_process(["--env", "babyai", *FAST, "--tasks-file", str(tasks), "--prompt-style", "agentgym",
                "--turns", "2", "--out", str(tmp_path / "out")])
    rows = check_outputs(tmp_path / "out", [2], tasks=2, k=1)
    assert [r["task_id"] for r in rows] == [93, 5] and [r["subtask"] for r in rows] == ["Open", "GoTo"]
    first = rows[0]["messages"]
    assert [m["role"] for m in first[:4]] == ["user", "assistant", "user", "assistant"]
    assert first[1]["content"].startswith("OK. I'll follow your instructions")
    assert first[2]["content"].startswith("Your goal: ")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["prompt_style"] == "agentgym"


def test_search_datasets_are_reported_one_row_each(tmp_path, in_process):
    """Questions carry their dataset in `data_source`; the table has a row per dataset, as the paper's."""
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Zorbland"\nZorbland is an island.'}) + "\n")
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"id": str(i), "question": f"Question {i}?", "golden_answers": ["x"],
                                        "data_source": source}) + "\n"
                            for i, source in enumerate(["nq", "hotpotqa", "nq"])))
    options = json.dumps({"qa_test": str(test), "corpus": str(corpus)})
    in_process(["--env", "searchqa", "--env-options", options, *FAST, "--turns", "1", "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "results.json").read_text())["budgets"]["1"]
    assert {name: row["tasks"] for name, row in result["subtasks"].items()} == {"hotpotqa": 1, "nq": 2}
    assert "| 1 | nq | 2 |" in (tmp_path / "out" / "results.md").read_text()


@pytest.fixture
def in_process(monkeypatch):
    """evaluate.main() in this process: setup_distributed writes these variables; restore them after."""
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    return E.main


def test_coin_env_numbers_are_consistent_and_greedy_warns(tmp_path, in_process, capsys):
    coin = ["--env", "tests.test_evaluate:Coin", *FAST, "--turns", "1", "--chunk", "3"]
    in_process([*coin, "--k", "4", "--seed", "1", "--out", str(tmp_path / "sampled")])
    rows = check_outputs(tmp_path / "sampled", [1], tasks=6, k=4)
    result = json.loads((tmp_path / "sampled" / "results.json").read_text())["budgets"]["1"]
    assert 0 < result["all"]["success"] < 1, "the coin env should give a mix of outcomes"
    assert result["all"]["pass@4"] >= result["all"]["pass@2"] >= result["all"]["pass@1"]
    assert set(result["subtasks"]) == {"even", "odd"} and all(r["reward"] in (1.0, -0.5) for r in rows)

    from models import tiny  # the greedy run loads a checkpoint the way train.py saves one
    shutil.copytree(tiny.tiny_model_dir(), tmp_path / "run" / "checkpoints" / "step_000001" / "policy")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000001")
    coin[coin.index("tiny")] = str(tmp_path / "run")
    in_process([*coin, "--k", "2", "--greedy", "--limit", "2", "--out", str(tmp_path / "greedy")])
    assert "identical" in capsys.readouterr().err
    rows = check_outputs(tmp_path / "greedy", [1], tasks=2, k=2)
    assert json.loads((tmp_path / "greedy" / "results.json").read_text())["model"].endswith("step_000001/policy")
    for t in (0, 1):  # greedy samples of a task are the same reply
        a, b = [r["messages"] for r in rows if r["task_id"] == t]
        assert a == b


def test_in_process_evaluation_returns_after_an_earlier_abandoned_env_thread(tmp_path, in_process, monkeypatch):
    """evaluate.main() ends the process only for env threads it abandoned itself: one abandoned earlier in
    the same process (another test, a notebook) made it os._exit(0) and end the caller silently."""
    from infra import envcalls
    monkeypatch.setattr(envcalls, "_abandoned", envcalls.abandoned() + 1)
    coin = ["--env", "tests.test_evaluate:Coin", *FAST, "--turns", "1", "--k", "2", "--limit", "2"]
    in_process([*coin, "--out", str(tmp_path / "out")])  # before the fix the test process ended here, exit 0
    assert (tmp_path / "out" / "results.json").exists()

"""lab/screen.py: the tasks with both outcomes among an evaluation's samples, from a real evaluate.py run
(the tiny model on the coin env, whose outcomes are mixed), and a pool file train.py's loader accepts."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from lab import screen
from envs.agentgym import task_ids
from tests.test_evaluate import FAST, in_process  # noqa: F401  (a fixture)


def test_mixed_keeps_only_tasks_with_both_outcomes():
    results = {3: [True, False], 1: [True, True], 2: [False, False, False], 5: [False, True, True], 7: [True]}
    assert screen.mixed(results) == [3, 5]
    assert screen.mixed(results, min_samples=3) == [5]
    assert screen.mixed({7: [True, False]}, min_samples=1) == [7]


def test_screen_an_evaluation_into_a_tasks_file(tmp_path, in_process, capsys):  # noqa: F811
    coin = ["--env", "tests.test_evaluate:Coin", *FAST, "--turns", "1", "--k", "4", "--seed", "3"]
    in_process([*coin, "--out", str(tmp_path / "a")])
    in_process([*coin, "--seed", "4", "--out", str(tmp_path / "b")])
    by_task = defaultdict(list)
    for name in ("a", "b"):
        for line in (tmp_path / name / "transcripts.jsonl").read_text().splitlines():
            row = json.loads(line)
            by_task[row["task_id"]].append(row["success"])
    expected = sorted(t for t, s in by_task.items() if 0 < sum(s) < len(s))
    assert all(len(s) == 8 for s in by_task.values()) and expected, "eight samples a task, some mixed"

    screen.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "pool.json")])
    assert json.loads((tmp_path / "pool.json").read_text()) == expected
    assert f"{len(expected)} of {len(by_task)} tasks mixed" in capsys.readouterr().out
    assert task_ids(tmp_path / "pool.json", "babyai", {}) == expected  # what train.py --tasks-file reads


def test_screen_refuses_a_folder_without_transcripts(tmp_path):
    with pytest.raises(SystemExit, match="transcripts.jsonl not found"):
        screen.main([str(tmp_path), "--out", str(tmp_path / "pool.json")])

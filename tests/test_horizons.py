"""lab/horizons.py end to end on the tiny model (one rank, the transformers engine: the wiring, not
learning): two schedules from one model, every validation and test evaluation at one turn budget,
the published folder, its tables and figure regenerated from the files."""
import json
import subprocess
import sys
from pathlib import Path

from lab import horizons

ROOT = Path(__file__).resolve().parent.parent


def test_two_schedules_are_trained_evaluated_alike_and_published(tmp_path):
    runs, dest = tmp_path / "runs", tmp_path / "results" / "horizons-tiny"
    args = ["--warmstart", "tiny", "--preset", "cpu", "--out", str(runs), "--arms", "short=2", "staged=2,3@1",
            "--seeds", "0", "--steps", "2", "--eval-every", "1", "--eval-tasks", "2", "--test-tasks", "3", "--k", "2",
            "--nproc", "1", "--", "--env", "babyai", "--engine", "hf", "--max-tokens", "8", "--tasks-per-step", "2",
            "--samples-per-task", "2"]
    outputs = []
    for _ in range(2):  # the second call finds everything finished and runs nothing
        proc = subprocess.run([sys.executable, "-m", "lab.horizons", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outputs.append(proc.stdout)
    assert "== staged, seed 0: steps 0-0 are short's" in outputs[0] and "== short" not in outputs[1]
    rows = {arm: [json.loads(line) for line in (runs / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines()]
            for arm in ("short", "staged")}
    assert [r["step"] for r in rows["staged"]] == [0, 1]
    assert rows["staged"][0] == rows["short"][0]  # step 0 has 2 turns in both: played once, by short
    assert rows["staged"][1]["horizon"] == 3 and rows["short"][1]["horizon"] == 2
    for arm in ("short", "staged"):
        cfg = json.loads((runs / f"{arm}-seed0" / "config.json").read_text())
        assert cfg["eval_turns"] == 3 and cfg["bc_episodes"] == 0
        evals = [json.loads(line) for line in (runs / f"{arm}-seed0" / "evals.jsonl").read_text().splitlines()]
        assert {r["budget"] for r in evals} == {3}, "the short arm's validation must be played at 3 turns too"
        assert sorted({r["step"] + (r["eval"] != "eval_start") for r in evals}) == [0, 1, 2]
    horizons.main(["--publish", str(runs), str(dest)])
    tables = (dest / "tables.md").read_text()
    assert tables == horizons.render(dest)
    assert "| short | 0 |" in tables and "| staged | 0 |" in tables
    assert "| 3 | staged | short | 3 |" in tables  # the paired row: same 3 test tasks, 3 turns
    assert (dest / "validation.png").stat().st_size > 1000
    test = [json.loads(line) for line in (dest / "staged-seed0" / "evals" / "staged" / "outcomes.jsonl").open()]
    assert len(test) == 6 and {r["budget"] for r in test} == {3}


def test_shared_steps_of_two_schedules():
    assert horizons.shared_steps("5,8@4", "5", 8) == 4
    assert horizons.shared_steps("5,8@4", "8", 8) == 0
    assert horizons.shared_steps("8", "8", 8) == 8


def test_pooled_keeps_each_seeds_samples_apart():
    seeds = {0: {"test": [{"task_id": 1, "sample": 0}, {"task_id": 1, "sample": 1}]},
             1: {"test": [{"task_id": 1, "sample": 0}]}}
    assert sorted(r["sample"] for r in horizons.pooled(seeds)) == [0, 1, 1000]

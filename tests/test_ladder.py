"""The protocol's second version, the ladder (lab/ladder.py), at its smoke scale (the tiny model on BabyAI, one
rank): its rules as written, the rungs climbed under them, the curve (lab/curve.py), a crashed rung resumed.
A file of its own: its whole-protocol fixture and tests/test_protocol.py's run on different test workers."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import protocol

ROOT = Path(__file__).resolve().parent.parent


def run(*flags: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab.protocol", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_the_ladder_rules_as_written():
    from lab import ladder
    assert ladder.best_rung([0.30, 0.35, 0.35, 0.20]) == 1  # a tie goes to the earlier, cheaper rung
    assert ladder.rl_stops(0.41, 0.40, 2.0) and not ladder.rl_stops(0.42, 0.40, 2.0)  # 2 points above: goes on
    assert ladder.rl_stops(0.40, 0.45, -100.0) is False and ladder.rl_stops(0.40, 0.45, 0.0)
    assert ladder.plateaued([0.3, 0.4, 0.35, 0.38, 0.39], 3) and not ladder.plateaued([0.3, 0.4, 0.35, 0.38], 3)
    assert not ladder.plateaued([0.3, 0.4, 0.35, 0.38, 0.41], 3)  # a new best restarts the count
    assert ladder.stretch_steps(30, 960, 10_000) == 313  # 32 episodes a step: 9,040 more are 282.5 steps



@pytest.fixture(scope="module")
def ladder_smoke(tmp_path_factory):
    base = tmp_path_factory.mktemp("ladder")
    flags = ["--scale", "ladder-smoke", "--nproc", "1", "--runs", str(base / "runs"), "--results",
             str(base / "results")]
    proc = run(*flags)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return base, flags, proc


def test_the_ladder_screens_the_signal_levers_beside_the_first_versions_choice(monkeypatch):
    """The ladder's screen: the first version's choice first (a tie goes to it), then each lever on signal per
    episode on top of it alone; every setting a valid train.py command; the one-budget scale keeps its screen
    (its published folders record it)."""
    import config
    from launch import checks
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ladder = protocol.Protocol("babyai", 0, protocol.SCALES["ladder"], Path("runs"), Path("results"))
    full = protocol.Protocol("babyai", 0, protocol.SCALES["full"], Path("runs"), Path("results"))
    assert full.screen is protocol.SCREEN and ladder.screen is protocol.LADDER_SCREEN
    assert list(ladder.screen)[0] == "wide-groups" and ladder.screen["wide-groups"] == protocol.SCREEN["wide-groups"]
    levers = {"--dynamic-sampling", "--sometimes-solved", "--refusal-penalty", "--max-tokens"}
    for name, flags in ladder.screen.items():
        assert flags[:4] == protocol.SCREEN["wide-groups"]
        assert len(set(flags[4:]) & levers) == (name != "wide-groups")  # one lever each
        cfg = config.parse(["--preset", "smollm2", "--env", "babyai", *flags])
        assert checks.check(cfg, 2) is None, name
    assert {f for flags in ladder.screen.values() for f in flags} >= levers


def test_the_ladder_climbs_its_rungs_under_its_rules_and_draws_its_curve(ladder_smoke):
    from lab import ladder
    base, flags, _ = ladder_smoke
    results, runs, scale = base / "results", base / "runs", protocol.SCALES["ladder-smoke"]
    settings = json.loads((results / "protocol.json").read_text())
    assert settings["ladder_rules"] == ladder.RULES and settings["scale"]["ladder"] == list(scale.ladder)
    records = {}
    for line in (results / "pieces.jsonl").read_text().splitlines():
        records[json.loads(line)["piece"]] = json.loads(line)
    made = json.loads((results / "ladder.json").read_text())
    rl, hours = made["arms"]["rl"], made["hours"]
    # RL: one run through every rung, each rung carrying on from the last (steps, episodes and CPU s from W*)
    listed = len(scale.ladder)
    assert [r["rung"] for r in rl] == list(range(1, len(hours) + 1)) and hours[:listed] == list(scale.ladder)
    assert all(records[f"rl-{k}"]["resumed"] for k in range(2, len(hours) + 1)) and not records["rl-1"].get("resumed")
    assert [r["steps"] for r in rl] == sorted({r["steps"] for r in rl})  # rising: no rung started again
    for r, h in zip(rl, scale.ladder):
        assert r["budget_cpu_s"] >= h * ladder.HOUR  # the budget is checked after each step: never short
    # the stop rule, judged on the recorded validations: never at W* - 100 points
    stop = made["stop"]
    assert stop["rl_val"] == records["val-rl-1"]["success"] and stop["stopped"] is False
    assert stop["stopped"] == ladder.rl_stops(stop["rl_val"], stop["wstar_val"], scale.stop_points)
    # the stretch: fewer than min_episodes by the last listed rung, so one more rung where RL reached them
    short = records[f"rl-{listed}"]["episodes_played"] < scale.min_episodes
    assert (made["stretch"] is not None) == short and (len(hours) == listed + 1) == short, made
    if short:
        assert rl[-1]["episodes"] >= scale.min_episodes
        assert hours[listed] == records[f"rl-{listed + 1}"]["budget_cpu_s"] / ladder.HOUR
    # every rung kept its own model: the carried checkpoints are links, not the next rung's
    latest = [(runs / f"rl-{k}" / "checkpoints" / "latest").read_text() for k in range(1, len(hours) + 1)]
    assert len(set(latest)) == len(latest)
    # B and C: the ladder RL left, each rung from the last rung's model, stopped by the plateau rule or the last rung
    for arm, actor in (("imitation", "expert"), ("self", "policy")):
        vals = [r["val_success"] for r in made["arms"][arm]]
        assert vals == [records[f"val-{arm}-{k}"]["success"] for k in range(1, len(vals) + 1)]
        assert not any(ladder.plateaued(vals[:i], scale.patience) for i in range(1, len(vals)))
        assert len(vals) == len(hours) or ladder.plateaued(vals, scale.patience)
        assert records[f"{arm}-1"]["actor"] == actor
    # the best rung of each arm is the one tested
    for arm, slug in (("rl", "rl"), ("imitation", "imitation"), ("self", "self")):
        best = made["best"][arm]
        assert best == ladder.best_rung([r["val_success"] for r in made["arms"][arm]]) + 1
        tested = json.loads((results / "evals" / f"test-{slug}" / "results.json").read_text())["config"]["model"]
        assert Path(tested).parts[-2 if arm != "rl" else -1] == f"{arm}-{best}", tested
    # the picture and its table, from the folder's files: lab.report draws the same bytes again
    summary = (results / "summary.md").read_text()
    assert "![each arm's validation success" in summary and summary.count("| RL (A) | ") == len(hours)
    png = (results / "curve.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    (results / "curve.png").unlink()
    report = subprocess.run([sys.executable, "-m", "lab.report", str(results)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0 and (results / "curve.png").read_bytes() == png, report.stderr
    assert report.stdout.split("\ncurve: ")[0] in summary
    status = run(*flags, "--status", timeout=120)
    assert status.returncode == 0 and " to run " not in status.stdout and "ladder decided" in status.stdout
    assert "left: about 0.0 h" in status.stdout, status.stdout


def test_a_crashed_rung_resumes_from_its_checkpoint_and_replays_no_finished_rung(ladder_smoke, tmp_path, capfd):
    """RL's last rung stopped after a checkpoint before its end (its newest checkpoint, piece.json and record
    gone): built again, it resumes from the checkpoint left (--resume), and the rungs before it, finished,
    are not replayed."""
    from lab import ladder
    base, _, _ = ladder_smoke
    for part in ("runs", "results"):
        shutil.copytree(base / part, tmp_path / part, symlinks=True)
    runs, results = tmp_path / "runs", tmp_path / "results"
    made = json.loads((results / "ladder.json").read_text())
    k = len(made["arms"]["rl"])
    lines = (results / "pieces.jsonl").read_text().splitlines()
    (results / "pieces.jsonl").write_text("\n".join(x for x in lines if json.loads(x)["piece"] != f"rl-{k}") + "\n")
    (runs / f"rl-{k}" / "piece.json").unlink()
    checkpoints = sorted((runs / f"rl-{k}" / "checkpoints").glob("step_*"))
    shutil.rmtree(checkpoints[-1])
    (runs / f"rl-{k}" / "checkpoints" / "latest").write_text(checkpoints[-2].name)
    resumed_at = int(checkpoints[-2].name.split("_")[-1])
    proto = protocol.Protocol("babyai", 0, protocol.SCALES["ladder-smoke"], runs, results, nproc=1)
    capfd.readouterr()
    ladder.Ladder(proto).model("rl", k, made["hours"], "recipe")
    started = [x for x in capfd.readouterr().out.splitlines() if x.startswith("[protocol] ")]
    assert len(started) == 1 and started[0].startswith(f"[protocol] rl-{k}:") and "--resume" in started[0], started
    record = json.loads((results / "pieces.jsonl").read_text().splitlines()[-1])
    assert record["piece"] == f"rl-{k}" and record["resumed"] and record["steps"] > resumed_at


def test_a_second_seed_climbs_only_after_seed_0s_best_rl_rung_beat_w_star_by_3_points(tmp_path):
    """ladder.SECOND_SEED, written before any rung ran: seed 1 is refused in one line, before start-up, until seed
    0's ladder.json exists and its best RL rung is 3 points or more above W* on validation."""
    from lab import ladder
    seed0, seed1 = tmp_path / "results-seed0", tmp_path / "results-seed1"
    assert ladder.second_seed(0, seed0) is None
    assert "only after seed 0" in ladder.second_seed(1, seed1)
    seed0.mkdir()
    for best_val, allowed in ((0.42, False), (0.429, False), (0.43, True), (0.50, True)):
        rl = [{"val_success": 0.41}, {"val_success": best_val}, {"val_success": 0.30}]
        (seed0 / "ladder.json").write_text(json.dumps({"wstar_val": 0.40, "best": {"rl": 2}, "arms": {"rl": rl}}))
        said = ladder.second_seed(1, seed1)
        assert (said is None) == allowed, (best_val, said)
    (seed0 / "ladder.json").write_text(json.dumps({"wstar_val": 0.40, "best": {"rl": 1},
                                                   "arms": {"rl": [{"val_success": 0.41}]}}))
    proc = run("--scale", "ladder-smoke", "--seed", "1", "--nproc", "1", "--runs", str(tmp_path / "runs-seed{seed}"),
               "--results", str(tmp_path / "results-seed{seed}"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "seed 1 is not run: seed 0's best RL rung is +1.0 points over W*" in proc.stderr
    assert not (tmp_path / "runs-seed1").exists()  # refused before anything started

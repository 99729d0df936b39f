"""The finite-demonstrations protocol (lab/protocol.py): its one-line refusals before start-up, the
screen's rule, and the whole protocol at the smoke scale (the tiny model on BabyAI, one rank): every
piece runs, the result folder holds what each measured, and a rerun replays only unfinished pieces; the
published folders regenerate their summaries byte for byte; a one-budget folder is never continued as a ladder.
The second version, the ladder, is tests/test_ladder.py's."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import protocol, status

ROOT = Path(__file__).resolve().parent.parent


def run(*flags: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab.protocol", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("flags, says", [
    (["--patience", "0"], "--patience must be at least 1"),
    (["--arm-cpu", "0"], "an arm with no time left"),
    (["--self-play-share", "1"], "arm C must both play and imitate"),
    (["--demo-tasks", "40001"], "the expert cannot fill it, babyai has 40000 train tasks"),
    (["--env", "textcraft"], "textcraft has no expert"),
    (["--scale", "ladder", "--ladder", "1,4,2"], "--ladder 1,4,2: the rungs (CPU-hours) must be positive and rising"),
    (["--scale", "ladder", "--ladder", "0.01,1,2,4"], "a rung adds 36 CPU s, under one RL step"),
    (["--scale", "ladder", "--stop-rung", "3"], "--stop-rung 3: the ladder has no such rung"),
    (["--scale", "ladder", "--val-tasks", "240"], "the validation split has 200 tasks"),
])
def test_a_broken_protocol_is_one_line_before_start_up(flags, says, tmp_path):
    proc = run(*flags, "--runs", str(tmp_path / "runs"), timeout=120)
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_the_screen_rule_takes_the_best_and_breaks_ties_by_order():
    assert protocol.choose({"a": 0.2, "b": 0.3, "c": 0.3}, ["a", "b", "c"]) == "b"
    assert protocol.choose({"a": 0.3, "b": 0.3}, ["b", "a"]) == "b"


def test_a_later_seed_takes_seed_0s_screened_setting_and_never_screens_itself(tmp_path):
    first, later = tmp_path / "protocol-babyai-seed0-k", tmp_path / "protocol-babyai-seed1-k"
    later.mkdir()
    proto = protocol.Protocol("babyai", 1, protocol.SCALES["smoke"], tmp_path / "runs", later)
    with pytest.raises(SystemExit, match="run seed 0 .* through its screen first"):
        proto.screened()
    first.mkdir()
    (first / "screen.json").write_text(json.dumps({"choice": "gentle", "scores": {}}))
    assert proto.screened() == "gentle" and not (tmp_path / "runs").exists()  # nothing trained
    assert json.loads((later / "screen.json").read_text()) == {"choice": "gentle", "from": first.name}


def test_a_goal_is_met_only_at_its_points_with_the_interval_above_zero():
    from lab.tables import goal_verdict, protocol_goals
    assert goal_verdict(0.06, 0.01, 5.0) == "met"
    assert goal_verdict(0.06, -0.01, 5.0) == "not met"   # the interval reaches 0
    assert goal_verdict(0.04, 0.01, 5.0) == "not met"    # above 0, short of the points
    assert goal_verdict(-0.2, -0.3, None) == "reported"
    # RL solves 30 of 40 tasks that W* never solves (2 samples each); B solves the same 30 as RL
    recs = lambda won: [{"task_id": t, "budget": 8, "success": t in won, "reward": float(t in won)}
                        for t in range(40) for _ in range(2)]
    runs = [("W*", recs(set())), ("B", recs(set(range(30)))), ("A", recs(set(range(30))))]
    lines = protocol_goals(runs, [("A", "W*", 5.0), ("A", "B", 5.0), ("A", "C", None)], resamples=2_000)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| A - ")}
    assert "+75.0" in rows["A - W*"] and rows["A - W*"].endswith("| met |")
    assert "+0.0 [+0.0, +0.0]" in rows["A - B"] and rows["A - B"].endswith("| not met |")
    assert "not evaluated" in rows["A - C"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    base = tmp_path_factory.mktemp("protocol")
    flags = ["--scale", "smoke", "--nproc", "1", "--runs", str(base / "runs"), "--results", str(base / "results")]
    proc = run(*flags)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return base, flags, proc


def test_every_piece_runs_and_the_result_folder_holds_what_each_measured(smoke):
    base, _, proc = smoke
    results = base / "results"
    pieces = [json.loads(line) for line in (results / "pieces.jsonl").read_text().splitlines()]
    names = [p["piece"] for p in pieces]
    assert names[:4] == ["epoch-1", "val-epoch-1", "epoch-2", "val-epoch-2"]  # patience 1: two epochs
    assert {"arm-rl", "arm-imitation", "arm-self", "test-wstar", "test-rl", "test-imitation", "test-self"} <= set(names)
    assert all(p["wall_s"] > 0 and p["cpu_s"] > 0 and p["machine"] for p in pieces)
    assert all(p["episodes_timed"] == p["episodes"] > 0 for p in pieces if p["kind"] == "eval")  # none resumed
    demos = json.loads((results / "demos.json").read_text())
    assert len(demos["tasks"]) == protocol.SCALES["smoke"].demo_tasks  # the finite set, recorded
    arms = {p["piece"]: p for p in pieces}
    assert arms["arm-self"]["actor"] == "policy" and arms["arm-self"]["played"] == 4  # W*'s own play
    assert arms["arm-imitation"]["actor"] == "expert" and arms["arm-rl"]["steps"] >= 1
    screen = json.loads((results / "screen.json").read_text())
    assert screen["choice"] == protocol.choose(screen["scores"], list(protocol.SMOKE_SCREEN))
    summary = (results / "summary.md").read_text()
    for label in ("W* (imitation plateau)", "more imitation (B)", "self-imitation (C)", "W* + RL (A)"):
        assert label in summary
    assert "never solved" in summary and "Paired differences" in (results / "test" / "tables.md").read_text()
    goals = [line for line in summary.splitlines() if line.startswith("| W* + RL (A) - ")]
    assert len(goals) == 3 and goals[0].endswith(("| met |", "| not met |")) and goals[2].endswith("| reported |")
    # each training piece's logs stay in the folder; the arms' table says what each gradient saw
    for name in ("epoch-1", "arm-rl", "arm-imitation", "arm-self"):
        assert (results / "train" / name / "config.json").exists()
    rl = [json.loads(line) for line in (results / "train" / "arm-rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(rl) == arms["arm-rl"]["steps"]
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ") for line in summary.splitlines()
            if line.startswith(("| rl |", "| imitation |", "| self |"))}
    assert rows["imitation"][-1] == str(arms["arm-imitation"]["demonstrations"])
    assert rows["self"][-1] == str(arms["arm-self"]["demonstrations"])
    assert float(rows["rl"][-1]) == round(sum((1 - r["skipped"]) * r["episodes"] for r in rl))
    status = run(*smoke[1], "--status", timeout=120)
    assert status.returncode == 0 and " to run " not in status.stdout and "plateau: decided" in status.stdout
    assert "left: about 0.0 h" in status.stdout, status.stdout


def test_a_rerun_on_a_new_machine_replays_only_unfinished_pieces(smoke, tmp_path):
    """A crashed self-imitation arm (no record of it, nor of its test), rerun on a machine whose runs/ is
    empty: the result folder outlives the machine, so every recorded measurement is reused (the finished
    arms are not replayed) and only what the unfinished pieces start from is built again: W*'s epochs,
    then the arm and its test. On the same machine the rebuilt epochs are the same weights, byte for byte."""
    base, _, _ = smoke
    results = tmp_path / "results"
    subprocess.run(["cp", "-r", str(base / "results"), str(results)], check=True)
    lines = (results / "pieces.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["piece"] not in ("arm-self", "test-self")]
    (results / "pieces.jsonl").write_text("\n".join(kept) + "\n")
    subprocess.run(["rm", "-r", str(results / "evals" / "test-self"), str(results / "test")], check=True)
    flags = ["--scale", "smoke", "--nproc", "1", "--runs", str(tmp_path / "runs"), "--results", str(results)]
    status = run(*flags, "--status", timeout=120)  # runs nothing: says what is left, and what must be built again
    assert status.returncode == 0 and not (tmp_path / "runs").exists(), status.stderr
    left = [line.split()[0] for line in status.stdout.splitlines() if " to run " in line]
    assert left == ["arm-self", "test-self"] and "epoch models the next pieces start from" in status.stdout
    proc = run(*flags)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    started = [line.split(":")[0].removeprefix("[protocol] ") for line in proc.stdout.splitlines()
               if line.startswith("[protocol]")]
    best = json.loads((results / "plateau.json").read_text())["best_epoch"]
    assert started == [f"epoch-{e}" for e in range(1, best + 1)] + ["arm-self", "test-self"]
    after = (results / "pieces.jsonl").read_text().splitlines()
    assert after[:len(kept)] == kept  # the earlier records stay as they were
    new = [json.loads(line) for line in after[len(kept):]]
    assert [r.get("rebuilt", False) for r in new] == [True] * best + [False, False]
    assert all(r["same_weights_as_recorded"] for r in new[:best])  # deterministic imitation, same machine
    assert "W* + self-imitation (C)" in (results / "summary.md").read_text()
    assert (tmp_path / "runs" / "test-wstar" / "results.json").exists()  # restored from the folder's archive


def test_a_screened_setting_stopped_after_its_checkpoint_resumes_with_the_seconds_it_had_left(smoke, tmp_path):
    """A screened RL setting whose machine stopped after its last checkpoint (runs/ holds the checkpoint and its
    metrics; no piece.json, no record, no validation): the rerun resumes it (--resume, the CPU seconds it had
    left) instead of training it again from W*, validates it, and runs nothing else."""
    base, _, _ = smoke
    for part in ("runs", "results"):
        shutil.copytree(base / part, tmp_path / part, symlinks=True)
    runs, results = tmp_path / "runs", tmp_path / "results"
    lines = (results / "pieces.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["piece"] not in ("screen-recipe", "val-screen-recipe")]
    (results / "pieces.jsonl").write_text("\n".join(kept) + "\n")
    for path in (runs / "val-screen-recipe", results / "evals" / "val-screen-recipe"):
        shutil.rmtree(path)
    (runs / "screen-recipe" / "piece.json").unlink()
    (results / "screen.json").unlink()
    assert (runs / "screen-recipe" / "checkpoints" / "latest").exists()
    steps = len((runs / "screen-recipe" / "metrics.jsonl").read_text().splitlines())
    proc = run("--scale", "smoke", "--nproc", "1", "--runs", str(runs), "--results", str(results))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    started = [line.split(":")[0].removeprefix("[protocol] ") for line in proc.stdout.splitlines()
               if line.startswith("[protocol]")]
    assert started == ["screen-recipe", "val-screen-recipe"]
    assert "--resume" in next(line for line in proc.stdout.splitlines() if line.startswith("[protocol] screen-"))
    record = json.loads((results / "pieces.jsonl").read_text().splitlines()[-2])
    assert record["piece"] == "screen-recipe" and record["resumed"] and record["steps"] > steps
    assert json.loads((results / "screen.json").read_text())["choice"] == "recipe"


def test_a_folder_from_another_cpu_kind_is_refused_before_start_up(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    other = {"piece": "epoch-1", "kind": "imitation", "machine": "Some CPU (family 1 model 2, no bf16, 2 cores)"}
    (results / "pieces.jsonl").write_text(json.dumps(other) + "\n")
    proc = run("--scale", "smoke", "--runs", str(tmp_path / "runs"), "--results", str(results), timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "Some CPU" in proc.stderr and f"--results {results}-" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_started_folder_keeps_the_scale_and_settings_it_recorded(tmp_path):
    """protocol.json governs a rerun: a default changed since keeps the folder's value, a flag against it is
    one line before start-up, and so is code whose recipe differs from the one the folder started under."""
    results = tmp_path / "results"
    results.mkdir()
    proto = protocol.Protocol("babyai", 0, protocol.SCALES["smoke"], tmp_path / "runs", results)
    (results / "protocol.json").write_text(json.dumps(proto.settings()))
    later = protocol.replace(protocol.SCALES["smoke"], patience=4)  # the smoke preset's patience, changed
    assert protocol.recorded_scale(results, later, {}) == protocol.SCALES["smoke"]
    assert protocol.recorded_scale(results, later, {"scale": "smoke"}).train_extra == protocol.SCALES["smoke"].train_extra
    with pytest.raises(ValueError, match="ran with --patience 1 \\(asked: 4\\)"):
        protocol.recorded_scale(results, later, {"patience": 4})
    with pytest.raises(ValueError, match="--scale smoke \\(asked: full\\)"):
        protocol.recorded_scale(results, protocol.SCALES["full"], {"scale": "full"})
    unnamed = proto.settings()  # a folder recorded before presets were named: the preset it equals
    del unnamed["scale"]["name"]
    (results / "protocol.json").write_text(json.dumps(unnamed))
    assert protocol.recorded_scale(results, later, {"scale": "smoke"}).name == "smoke"
    with pytest.raises(ValueError, match="--scale smoke \\(asked: full\\)"):
        protocol.recorded_scale(results, protocol.SCALES["full"], {"scale": "full"})
    flags = ["--runs", str(tmp_path / "runs"), "--results", str(results)]
    plan = run("--plan", *flags, timeout=120)  # no --scale: the folder's smoke scale, not the full default
    assert plan.returncode == 0 and json.loads(plan.stdout)["scale"]["demo_tasks"] == 6, plan.stderr
    proc = run("--patience", "3", *flags, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--patience 1 (asked: 3)" in proc.stderr
    settings = proto.settings()
    settings["recipe"] = {**settings["recipe"], "lr": 1.0}
    (results / "protocol.json").write_text(json.dumps(settings))
    proc = run("--scale", "smoke", *flags, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "another recipe than" in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_piece_finished_before_logs_were_kept_has_them_copied_when_next_read(tmp_path):
    """A folder whose training pieces ran before keep_logs existed gets their logs from this machine's runs/
    on the next rerun (an evaluation's record is untouched; a piece without files here stays as it is)."""
    from lab.pieces import Pieces
    runs, results = tmp_path / "runs", tmp_path / "results"
    (runs / "arm-rl").mkdir(parents=True)
    results.mkdir()
    (runs / "arm-rl" / "piece.json").write_text(json.dumps({"piece": "arm-rl", "kind": "rl"}))
    (runs / "arm-rl" / "metrics.jsonl").write_text('{"step": 0, "skipped": 0.25, "episodes": 32}\n')
    (runs / "arm-rl" / "model.safetensors").write_bytes(b"weights")
    pieces = Pieces(runs, results)
    assert pieces.done("arm-rl")["kind"] == "rl"
    kept = results / "train" / "arm-rl"
    assert (kept / "metrics.jsonl").read_text() == (runs / "arm-rl" / "metrics.jsonl").read_text()
    assert not (kept / "model.safetensors").exists()  # never weights
    assert pieces.done("arm-self") is None and not (results / "train" / "arm-self").exists()


def test_an_epoch_that_imitated_other_than_the_finite_set_stops_unrecorded_and_its_rerun_plays_it_again(tmp_path):
    """An epoch whose demonstrations differ from epoch 1's (an expert that timed out, say) is not recorded:
    the protocol stops in one line and the rerun trains the piece again from nothing."""
    from lab.pieces import Pieces
    runs, results = tmp_path / "runs", tmp_path / "results"
    results.mkdir()
    pieces = Pieces(runs, results, nproc=1)

    def imitation(n: int):  # an imitation piece's files, as train.py leaves them, with n demonstrations
        code = ("import json, pathlib, sys; out = pathlib.Path(sys.argv[-1]); (out / 'warmstart').mkdir(parents=True, "
                f"exist_ok=True); (out / 'warmstart.jsonl').write_text(json.dumps({{'demonstrations': {n}, "
                "'optimizer_steps': 18}) + chr(10))")
        return lambda: [sys.executable, "-c", code, "--nproc_per_node", "1", str(runs / "epoch-2")]

    with pytest.raises(SystemExit, match=r"piece epoch-2 measured \{'demonstrations': 275\}, not "
                                         r"\{'demonstrations': 278\}.*rerun"):
        pieces.run("epoch-2", imitation(275), "imitation", expect={"demonstrations": 278}, epoch=2)
    assert pieces.recorded("epoch-2") is None and pieces.done("epoch-2") is None
    record = pieces.run("epoch-2", imitation(278), "imitation", expect={"demonstrations": 278}, epoch=2)
    assert record["demonstrations"] == 278 and pieces.recorded("epoch-2")["demonstrations"] == 278


def test_a_one_budget_folder_keeps_what_it_recorded_and_a_ladder_folder_its_rungs_and_rules(tmp_path):
    """The one-budget version records no ladder field (its protocol.json as before); a folder of it is not
    continued as a ladder, nor a ladder folder under other rungs or other rules."""
    one, lad = tmp_path / "one", tmp_path / "ladder"
    for folder, scale in ((one, protocol.SCALES["smoke"]), (lad, protocol.SCALES["ladder-smoke"])):
        folder.mkdir()
        proto = protocol.Protocol("babyai", 0, scale, tmp_path / "runs", folder)
        (folder / "protocol.json").write_text(json.dumps(proto.settings()))
    recorded = json.loads((one / "protocol.json").read_text())
    assert not set(protocol.LADDER) & set(recorded["scale"]) and "ladder_rules" not in recorded
    ladder_smoke = protocol.SCALES["ladder-smoke"]
    with pytest.raises(ValueError, match=r"ran with --ladder \(\) \(asked: \(0.0003,\)\)"):
        protocol.recorded_scale(one, ladder_smoke, {"ladder": ladder_smoke.ladder})
    assert protocol.recorded_scale(lad, protocol.SCALES["smoke"], {}) == ladder_smoke  # no flag: the folder's ladder
    with pytest.raises(ValueError, match=r"--ladder \(0.0003,\) \(asked: \(0.0003, 0.0012\)\)"):
        protocol.recorded_scale(lad, ladder_smoke, {"ladder": (0.0003, 0.0012)})
    with pytest.raises(ValueError, match=r"--stop-points -100.0 \(asked: 2.0\)"):
        protocol.recorded_scale(lad, ladder_smoke, {"stop_points": 2.0})
    proto = protocol.Protocol("babyai", 0, ladder_smoke, tmp_path / "runs", lad)
    assert protocol.recorded_code(proto) is None
    settings = proto.settings()
    settings["ladder_rules"] = {**settings["ladder_rules"], "best_rung": "the last rung"}
    (lad / "protocol.json").write_text(json.dumps(settings))
    assert "another ladder_rules than this code's" in protocol.recorded_code(proto)


@pytest.mark.parametrize("folder", ["protocol-babyai-seed0-f25m17-avx512_bf16",
                                    "protocol-babyai-seed1-f25m17-avx512_bf16"])
def test_a_published_one_budget_folder_regenerates_its_summary_byte_for_byte(folder, tmp_path):
    """The published folders of the one-budget version, rerun by this code from their files alone (every piece
    recorded, nothing trained): the same summary.md, screen and plateau, and the settings they recorded."""
    published = ROOT / "results" / folder
    results = tmp_path / folder
    shutil.copytree(published, results)
    before = json.loads((published / "protocol.json").read_text())
    scale = protocol.recorded_scale(results, protocol.SCALES["full"], {})
    proto = protocol.Protocol(before["env"], before["seed"], scale, tmp_path / "runs", results)
    assert protocol.recorded_code(proto) is None
    now = json.loads(json.dumps(proto.settings()))  # as protocol.json would hold it
    assert {k: v for k, v in now["scale"].items() if k != "name"} == before["scale"]
    if before["seed"] != 0:  # a later seed reads seed 0's screen from its sibling folder
        sibling = folder.replace("seed1", "seed0")
        shutil.copytree(ROOT / "results" / sibling, tmp_path / sibling)
    assert " to run " not in status.report(proto)  # every piece recorded: the rerun trains nothing
    proto.main()
    for name in ("summary.md", "screen.json", "plateau.json", "test/tables.md", "pieces.jsonl", "protocol.json"):
        assert (results / name).read_bytes() == (published / name).read_bytes(), name
    assert not any(p.name.startswith(("epoch-", "arm-", "screen-")) for p in (tmp_path / "runs").iterdir())


def test_the_ladder_folder_under_way_still_agrees_with_this_code():
    """results/protocol-babyai-seed0-ladder is resumed piece by piece over many sittings: the settings it recorded
    (env, seed, recipe, turns, screen, rule, the ladder's rules, its scale) must be the ones this code gives, or its
    next piece would be refused (or, worse, mix two protocols)."""
    results = ROOT / "results" / "protocol-babyai-seed0-ladder"
    recorded = json.loads((results / "protocol.json").read_text())
    scale = protocol.recorded_scale(results, protocol.SCALES["ladder"], {"scale": "ladder"})
    proto = protocol.Protocol(recorded["env"], recorded["seed"], scale, ROOT / "runs", results)
    assert protocol.recorded_code(proto) is None
    assert {k: v for k, v in json.loads(json.dumps(proto.settings()))["scale"].items()} == recorded["scale"]


def test_status_shows_a_piece_under_way_and_counts_only_its_rest(tmp_path):
    """--status on a folder whose validation was stopped part-way (its transcripts kept on this machine, which
    the rerun resumes from) says how far it got and counts only the rest as left; a training piece shows the
    checkpoint it would resume from. Read from files alone: nothing runs."""
    results, ladder = tmp_path / "results", ROOT / "results" / "protocol-babyai-seed0-ladder"
    results.mkdir()
    shutil.copy(ladder / "protocol.json", results)  # the ladder's settings, and its first piece alone: the
    first = (ladder / "pieces.jsonl").read_text().splitlines()[0]  # folder as it stood before its first validation
    assert json.loads(first)["piece"] == "epoch-1"
    (results / "pieces.jsonl").write_text(first + "\n")
    recorded = json.loads((results / "protocol.json").read_text())
    scale = protocol.recorded_scale(results, protocol.SCALES["ladder"], {"scale": "ladder"})
    runs = tmp_path / "runs"
    proto = protocol.Protocol(recorded["env"], recorded["seed"], scale, runs, results)
    before = status.report(proto)
    assert "under way" not in before
    total = scale.val_tasks * scale.val_k
    (runs / "val-epoch-1").mkdir(parents=True)
    (runs / "val-epoch-1" / "transcripts.jsonl").write_text('{"task_id": 1}\n' * (total // 4))
    (runs / "screen-dynamic" / "checkpoints").mkdir(parents=True)
    (runs / "screen-dynamic" / "checkpoints" / "latest").write_text("step_00003\n")
    with (results / "pieces.jsonl").open("a") as f:  # a validation resumed half-way, one second an episode it timed
        f.write(json.dumps({"piece": "val-elsewhere", "wall_s": 240.0, "episodes": 480, "episodes_timed": 240,
                            "cpu_s": 480.0}) + "\n")
    lines = {line.split()[0]: line for line in status.report(proto).splitlines() if line.startswith("  ")}
    assert f"~{3 * total // 4:>5} s" in lines["val-epoch-1"] and f"~{total:>5} s" in lines["val-screen-dynamic"]
    with (results / "pieces.jsonl").open("a") as f:  # the same work paused for an hour: wall, not CPU, grows
        f.write(json.dumps({"piece": "val-paused", "wall_s": 3840.0, "episodes": 240, "cpu_s": 480.0}) + "\n")
    assert lines == {line.split()[0]: line for line in status.report(proto).splitlines() if line.startswith("  ")}
    assert lines["val-epoch-1"].endswith(f"under way: {total // 4} of {total} episodes played"), lines["val-epoch-1"]
    assert lines["screen-dynamic"].endswith("under way: resumes from step_00003"), lines["screen-dynamic"]
    assert "under way" not in lines["val-screen-dynamic"]

"""The protocol's second version: each arm's validation success against its own CPU-hours from W*, on a
ladder of rungs (lab/protocol.py with a `ladder`, e.g. --scale ladder: 1, 2, 4 and 8 CPU-hours).

One budget answered one point (docs/protocol.md: RL +2.1 and +1.1 over W* at 3,600 CPU s, while published
agent-RL gains needed 10-40x more episodes); a curve answers where one point cannot. From the same W*:

  (A) RL climbs first, one continuous run: rung k resumes rung k-1's run (its directory carried over,
      checkpoints hard-linked, so every rung keeps its own) until its cumulative budgeted CPU seconds
      reach the rung's; the optimizer, the step counter and the task order go on as in one run;
  (B) more imitation of the finite set and (C) self-imitation of the current policy's successes climb
      the ladder RL leaves, each rung its own train.py run from the previous rung's model (AdamW's
      moments restart, as between epochs; C's policy plays other train tasks each rung, then imitates
      its wins: iterated rejection-sampling fine-tuning);
  each rung's model is scored on the validation of W*'s plateau (the same tasks and samples).

The rules (RULES below: the best rung, RL's stop, the stretch to min_episodes, the imitation arms'
plateau) were written here before any rung was scored; protocol.json records them, and a folder started
under other rules is refused (lab.protocol.recorded_code).

Each rung is two pieces (lab/pieces.py): ARM-K (the training) and val-ARM-K (its validation). A crashed
RL rung resumes from its last checkpoint with the CPU seconds it had left; a crashed imitation rung starts
again; finished rungs are never replayed. ladder.json records what the climb decided; lab/curve.py draws
the curve from the folder's files (`python -m lab.report results/FOLDER`).
Test: python -m pytest tests/test_ladder.py
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

HOUR = 3600.0
BEST_RUNG = ("an arm's test model is its rung with the highest validation success; a tie goes to the earlier "
             "(cheaper) rung")
STOP = ("if RL's validation success at its stop_rung is not at least stop_points above W*'s, RL stops there and "
        "the ladder every arm climbs ends at that rung; the result is reported as it stands")
STRETCH = ("if RL has played fewer than min_episodes episodes by the ladder's last rung, it goes on, step by step, "
           "until it has played them; the CPU seconds that took become one more rung, for every arm")
PLATEAU = ("an imitation arm (B, C) stops after `patience` rungs without a new best validation success, or at the "
           "ladder's last rung")
SECOND_SEED = ("a seed after 0 climbs the ladder only if seed 0's best RL rung is at least 3 points above W* on "
               "validation; otherwise seed 0's curve is the result and the hours go elsewhere")
SECOND_SEED_POINTS = 3.0
RULES = {"best_rung": BEST_RUNG, "stop": STOP, "stretch": STRETCH, "plateau": PLATEAU}
ARMS = ("rl", "imitation", "self")


def best_rung(scores: list[float]) -> int:
    """BEST_RUNG: the index of the highest score, the earliest of a tie."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def rl_stops(rl_val: float, wstar_val: float, points: float) -> bool:
    """STOP: RL's validation (a fraction) short of W*'s by less than `points` percentage points above it."""
    return 100.0 * (rl_val - wstar_val) < points - 1e-9


def plateaued(scores: list[float], patience: int) -> bool:
    """PLATEAU: `patience` scores after the best without a new best."""
    return len(scores) - 1 - best_rung(scores) >= patience


def second_seed(seed: int, results: Path) -> str | None:
    """SECOND_SEED, checked before a later seed starts: None when it may climb, else the one line that says why not.
    Seed 0's folder is `results` with seed0 in its name (the same --results pattern), its verdict its ladder.json."""
    if seed == 0:
        return None
    first = results.parent / results.name.replace(f"seed{seed}", "seed0") / "ladder.json"
    if not first.exists():
        return (f"seed {seed} climbs the ladder only after seed 0 has (its {first} does not exist yet); run seed 0 "
                f"with the same --runs/--results pattern first")
    decided = json.loads(first.read_text())
    best = decided["arms"]["rl"][decided["best"]["rl"] - 1]["val_success"]
    gain = 100.0 * (best - decided["wstar_val"])
    if gain < SECOND_SEED_POINTS - 1e-9:
        return (f"seed {seed} is not run: seed 0's best RL rung is {gain:+.1f} points over W* on validation, under "
                f"the {SECOND_SEED_POINTS:g} the rule asks (ladder.SECOND_SEED); seed 0's curve is the result")
    return None


def stretch_steps(steps: int, episodes: int, wanted: int) -> int:
    """STRETCH: the step RL's run must reach to have played `wanted` episodes, at its steps' mean so far."""
    return steps + math.ceil((wanted - episodes) * steps / max(episodes, 1))


def carry(prev: Path, out: Path) -> None:
    """Rung k's run directory from rung k-1's: its logs copied, its checkpoints hard-linked (a checkpoint is
    never written in place: a new one is a new directory, `latest` is replaced by a rename), so both rungs keep
    their own model for the cost of one; without piece.json, so the rung is still to run. Atomic: a crash
    leaves no half-carried directory."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(prev, tmp, ignore=shutil.ignore_patterns("piece.json", "checkpoints"))
    shutil.copytree(prev / "checkpoints", tmp / "checkpoints", copy_function=os.link)
    tmp.rename(out)


class Ladder:
    """The climb of one protocol folder (`proto`: lab.protocol.Protocol, whose scale has a ladder)."""

    def __init__(self, proto):
        self.proto, self.scale, self.pieces = proto, proto.scale, proto.pieces

    # ------------------------------------------------------------------ the rungs' models, built (again) when missing
    def wstar_val(self) -> float:
        plateau = json.loads((self.proto.results / "plateau.json").read_text())
        return next(e["val_success"] for e in plateau["epochs"] if e["epoch"] == plateau["best_epoch"])

    def model(self, arm: str, k: int, hours: list[float], setting: str) -> Path:
        """Arm `arm`'s rung-k model on this machine, built (with the rungs before it) where missing."""
        p = self.proto
        if arm == "rl":
            out = p.runs / f"rl-{k}"
            if k > 1 and self.pieces.done(f"rl-{k}") is None and not (out / "checkpoints" / "latest").exists():
                carry(self.model("rl", k - 1, hours, setting), out)
            seconds, steps = HOUR * hours[k - 1], 100_000
            if k > len(self.scale.ladder):  # the stretch: to the step where RL has played min_episodes
                last = self.pieces.done(f"rl-{k - 1}", reuse=True)
                seconds, steps = 1e9, stretch_steps(last["steps"], last["episodes_played"], self.scale.min_episodes)
            p.rl_piece(f"rl-{k}", setting, seconds, steps=steps, rung=k)
            return out
        start = str(p.wstar()) if k == 1 else str(self.model(arm, k - 1, hours, setting))
        seconds = HOUR * (hours[k - 1] - (hours[k - 2] if k > 1 else 0.0))
        seed = 1000 * p.seed + (500 if arm == "imitation" else 700) + k
        kw = {"actor": "policy", "play_seconds": seconds * self.scale.self_play_share,
              "tasks_seed": 20_000 + 100 * p.seed + k} if arm == "self" else {}
        self.pieces.run(f"{arm}-{k}", lambda: p.imitate(start, p.runs / f"{arm}-{k}", seed, epochs=100_000,
                                                         seconds=seconds, **kw), "imitation", rung=k)
        return p.runs / f"{arm}-{k}" / "warmstart"

    def rung(self, arm: str, k: int, hours: list[float], setting: str) -> dict:
        """Rung k of `arm`: trained and validated (a rung whose validation is recorded needs no model here)."""
        p, s = self.proto, self.scale
        val = self.pieces.run(f"val-{arm}-{k}", lambda: p.evaluate(
            self.model(arm, k, hours, setting), p.runs / f"val-{arm}-{k}", "val", s.val_tasks, s.val_k),
            "eval", fresh=False, arm=arm, rung=k)
        return {"rung": k, "hours": hours[k - 1], "val_success": val["success"],
                "piece": self.pieces.done(f"{arm}-{k}", reuse=True)}

    # ------------------------------------------------------------------ the climb
    def climb(self, setting: str) -> dict:
        """RL first (its stop rule and stretch fix the ladder), then B and C up that ladder to their plateaus;
        each arm's best rung. Decided once (ladder.json); replayed from the records, never retrained."""
        decided = self.proto.results / "ladder.json"
        if decided.exists():
            return json.loads(decided.read_text())
        s, wstar = self.scale, self.wstar_val()
        hours, rl, stop = list(s.ladder), [], None
        for k in range(1, len(hours) + 1):
            rl.append(self.rung("rl", k, hours, setting))
            if hours[k - 1] == s.stop_rung:
                stop = {"rung": s.stop_rung, "rl_val": rl[-1]["val_success"], "wstar_val": wstar,
                        "points": s.stop_points, "stopped": rl_stops(rl[-1]["val_success"], wstar, s.stop_points)}
                if stop["stopped"]:
                    hours = hours[:k]
                    break
        stretch = None
        played = rl[-1]["piece"]["episodes_played"]
        if not (stop and stop["stopped"]) and played < s.min_episodes:
            target = stretch_steps(rl[-1]["piece"]["steps"], played, s.min_episodes)
            hours.append(math.inf)  # its CPU-hours are what RL takes to get there: known once it has run
            rl.append(self.rung("rl", len(hours), hours, setting))
            hours[-1] = rl[-1]["hours"] = rl[-1]["piece"]["budget_cpu_s"] / HOUR
            stretch = {"after_episodes": played, "to_step": target, "episodes": rl[-1]["piece"]["episodes_played"],
                       "hours": hours[-1]}
        arms = {"rl": rl}
        for arm in ARMS[1:]:
            arms[arm] = []
            for k in range(1, len(hours) + 1):
                arms[arm].append(self.rung(arm, k, hours, setting))
                if plateaued([r["val_success"] for r in arms[arm]], s.patience):
                    break
        out = {"ladder": list(s.ladder), "hours": hours, "wstar_val": wstar, "stop": stop, "stretch": stretch,
               "arms": {arm: [{k: v for k, v in r.items() if k != "piece"} | cumulative(arm, rs[:i + 1])
                              for i, r in enumerate(rs)] for arm, rs in arms.items()},
               "best": {arm: best_rung([r["val_success"] for r in rs]) + 1 for arm, rs in arms.items()},
               "rules": RULES}
        decided.write_text(json.dumps(out, indent=1) + "\n")
        return out

    def test_model(self, arm: str, decided: dict, setting: str) -> Path:
        """The best rung's model, for the arm's test (built again only when missing)."""
        return self.model(arm, decided["best"][arm], decided["hours"], setting)

    def arm_record(self, arm: str, decided: dict) -> dict:
        """The summary's line of an arm: what it spent up to its best rung (lab.tables.protocol_summary)."""
        k = decided["best"][arm]
        rec, spent = self.pieces.done(f"{arm}-{k}", reuse=True), decided["arms"][arm][k - 1]
        more = {"demonstrations": spent["demonstrations"]} if arm == "self" else {}  # its wins of every rung
        return {**rec, **{key: spent[key] for key in ("cpu_s", "wall_s", "budget_cpu_s")}, **more,
                "played": spent["episodes"], "episodes_played": spent["episodes"]}


def cumulative(arm: str, rungs: list[dict]) -> dict:
    """What an arm spent from W* to its last rung in `rungs`: RL's budgeted CPU seconds and episodes are its one
    run's (each rung's record counts from W*); every piece's own CPU and wall seconds add up."""
    recs = [r["piece"] for r in rungs]
    spent = {"cpu_s": round(sum(r["cpu_s"] for r in recs), 1), "wall_s": round(sum(r["wall_s"] for r in recs), 1)}
    if arm == "rl":
        return {**spent, "budget_cpu_s": recs[-1]["budget_cpu_s"], "episodes": recs[-1]["episodes_played"],
                "steps": recs[-1]["steps"]}
    return {**spent, "budget_cpu_s": round(sum(r.get("budget_cpu_s", 0.0) for r in recs), 1),
            "episodes": sum(r.get("played") or 0 for r in recs),
            "demonstrations": sum(r.get("demonstrations", 0) for r in recs)}

"""`python -m lab.protocol ... --status`: where a protocol folder stands, read from its files and this
machine's runs/ (it runs nothing). Each piece is done, with what it measured; under way (an evaluation's
episodes played, which its rerun keeps; the checkpoint a training piece resumes from); or to run. The wall
hours left are estimated from the folder's own records (docs/protocol.md, "Cost, and status"). `proto` is
a lab.protocol.Protocol, whose command calls this module.
Test: python -m pytest tests/test_protocol.py -k status
"""
from __future__ import annotations

import json

from lab import ladder
from lab.pieces import played


def report(proto) -> str:
    """Where the protocol stands, from the result folder and this machine's runs/ (runs nothing): each piece
    recorded, with what it measured, or still to run, and the wall seconds left, estimated from this
    folder's own records: an epoch's and a validation episode's CPU seconds (a test at the validations'),
    a budgeted piece's own, each turned into wall seconds at the quietest wall-to-CPU ratio its kind
    recorded. A run paused for a measurement (SIGSTOP) or sharing its cores gains wall seconds but hardly
    any CPU seconds, so the quietest record is the nearest to the piece alone on its cores."""
    rec, lines, left = proto.pieces.recorded, [], 0.0
    rows = [json.loads(x) for x in (proto.results / "pieces.jsonl").read_text().splitlines() if x.strip()] \
        if (proto.results / "pieces.jsonl").exists() else []
    epochs = [r for r in rows if r["piece"].startswith("epoch-")]
    vals = [r for r in rows if r["piece"].startswith("val-")]
    quiet = lambda rs: min((r["wall_s"] / r["cpu_s"] for r in rs if r.get("cpu_s")), default=1.0)  # noqa: E731
    wall_per_cpu = quiet(epochs)
    epoch_s = sorted(r["cpu_s"] for r in epochs)[len(epochs) // 2] * wall_per_cpu if epochs else 0.0  # the median
    # over the episodes each record's seconds played (a resumed evaluation's record times only its rest)
    per_episode = quiet(vals) * sum(r["cpu_s"] for r in vals) / max(
        sum(r.get("episodes_timed", r["episodes"]) for r in vals), 1)
    guess = {"epoch": epoch_s, "val": per_episode * proto.scale.val_tasks * proto.scale.val_k,
             "screen": proto.scale.screen_cpu * wall_per_cpu, "arm": proto.scale.arm_cpu * wall_per_cpu,
             "rung": 0.0, "test": per_episode * proto.scale.test_tasks * proto.scale.test_k}
    known = bool(epochs and vals)  # a fresh folder has nothing to estimate from

    episodes = {"val": proto.scale.val_tasks * proto.scale.val_k, "test": proto.scale.test_tasks * proto.scale.test_k}

    def piece(name: str, family: str, show=lambda r: "", seconds: float | None = None) -> None:
        nonlocal left
        r, wall = rec(name), guess[family] if seconds is None else seconds
        n, so_far = (0, "") if r else under_way(proto, name, episodes.get(family))
        if n and family in episodes:  # an evaluation resumes where it stopped: only its rest is left
            wall *= 1.0 - min(n, episodes[family]) / episodes[family]
        if r is None:
            left += wall
        lines.append(f"  {name:<24} {'done' if r else 'to run':<7} " + (
            f"{r['wall_s']:>6.0f} s  {show(r)}" if r else (f"~{wall:>5.0f} s" if known else "~?")
            + (f"  under way: {so_far}" if so_far else "")))
    success = lambda r: f"success {100 * r['success']:.1f}%"  # noqa: E731
    decided = proto.results / "plateau.json"
    plateau = json.loads(decided.read_text()) if decided.exists() else None
    lines.append(f"plateau: {'decided, W* = epoch ' + str(plateau['best_epoch']) if plateau else 'not decided'}")
    last = len(plateau["epochs"]) if plateau else next(  # the last epoch recorded, or the next to run
        e for e in range(1, proto.scale.max_epochs + 2) if e > proto.scale.max_epochs or rec(f"val-epoch-{e}") is None)
    for e in range(1, min(last, proto.scale.max_epochs) + 1):
        piece(f"epoch-{e}", "epoch", lambda r: f"{r['cpu_s']:.0f} CPU s" + (", rebuilt" if r.get("rebuilt") else ""))
        piece(f"val-epoch-{e}", "val", success)
    need = plateau["best_epoch"] if plateau else last - 1  # the epochs the next piece starts from
    built = [e for e in range(1, need + 1) if (proto.runs / f"epoch-{e}" / "warmstart").exists()]
    rebuild = len(lines)  # where the rebuild's line goes, if a piece is left to start from those epochs
    lines.append("screen:" if proto.seed == 0 else "screen: seed 0's choice")
    for name in proto.screen if proto.seed == 0 else []:
        piece(f"screen-{name}", "screen", lambda r: f"{r.get('steps')} RL steps")
        piece(f"val-screen-{name}", "val", success)
    if proto.scale.ladder:
        lines += rungs(proto, piece, success, wall_per_cpu)
    else:
        lines.append("arms:")
        for slug in ("rl", "imitation", "self"):
            piece(f"arm-{slug}", "arm", lambda r: f"{r.get('budget_cpu_s', 0):.0f} budgeted CPU s")
    lines.append("test:")
    for name in proto.tests:
        piece(name, "test", success)
    if len(built) < need and any(" to run " in line for line in lines[rebuild:]):
        lines.insert(rebuild, f"  this machine has {len(built)} of the {need} epoch models the next pieces start "
                              f"from: ~{(need - len(built)) * epoch_s:.0f} s to build them again")
        left += (need - len(built)) * epoch_s
    end = (f"left: about {left / 3600:.1f} h of wall time on this machine, alone on its cores"
           + ("" if plateau else ", and more epochs while validation rises")) if known else \
        "left: not estimated yet (the folder records no epoch and validation to estimate from)"
    return "\n".join([f"{proto.results} ({proto.runs}):", *lines, end]) + "\n"


def under_way(proto, name: str, episodes: int | None) -> tuple[int, str]:
    """What an unrecorded piece has done on this machine, as (episodes played, words): the episodes an
    evaluation has played (its transcripts, which a rerun keeps), or the checkpoint a training run would
    resume from; (0, "") if nothing."""
    if n := played(proto.runs / name):
        return n, f"{n} of {episodes} episodes played" if episodes else f"{n} episodes played"
    latest = proto.runs / name / "checkpoints" / "latest"
    return 0, f"resumes from {latest.read_text().strip()}" if latest.exists() else ""


def rungs(proto, piece, success, wall_per_cpu: float) -> list[str]:
    """--status's rungs (lab/ladder.py): each arm's rungs, done or to run, and the ladder's decisions once
    made. Undecided, every listed rung of every arm is counted (B and C may stop sooner, at their plateau), and a
    stretch rung where RL's recorded rungs, at their episodes per CPU second, fall short of min_episodes."""
    s, decided = proto.scale, proto.results / "ladder.json"
    if decided.exists():
        made = json.loads(decided.read_text())
        hours, climbed = made["hours"], {arm: len(rs) for arm, rs in made["arms"].items()}
        said = [f"ladder decided: rungs {', '.join(f'{h:g}' for h in hours)} CPU-hours; best rungs "
                + ", ".join(f"{arm} {k}" for arm, k in made["best"].items())]
    else:
        hours, climbed = list(s.ladder), {}
        said = [f"ladder: rungs {', '.join(f'{h:g}' for h in s.ladder)} CPU-hours"]
        rl = [r for k in range(1, len(hours) + 1) if (r := proto.pieces.recorded(f"rl-{k}"))]
        if rl and rl[-1]["budget_cpu_s"] and (rate := rl[-1]["episodes_played"] / rl[-1]["budget_cpu_s"]) > 0:
            if rate * ladder.HOUR * hours[-1] < s.min_episodes:  # the stretch, at RL's episodes per CPU s so far
                hours.append(s.min_episodes / rate / ladder.HOUR)
                said.append(f"  RL plays about {rate * ladder.HOUR:.0f} episodes a CPU-hour: a stretch rung at "
                            f"about {hours[-1]:.2f} CPU-hours to reach {s.min_episodes}")
    lines = [*said]
    for arm in ladder.ARMS:
        lines.append(f"{arm}:")
        for k in range(1, climbed.get(arm, len(hours)) + 1):
            added = ladder.HOUR * (hours[k - 1] - (hours[k - 2] if k > 1 else 0.0))
            piece(f"{arm}-{k}", "rung", lambda r: f"{r.get('budget_cpu_s', 0):.0f} budgeted CPU s",
                  seconds=added * wall_per_cpu)
            piece(f"val-{arm}-{k}", "val", success)
    return lines


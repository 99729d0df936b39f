"""The finite-demonstrations protocol: once the demonstrations one has are used up, does interaction with
the environment add anything, and does RL add more than imitating one's own successes?

    python -m lab.protocol --env babyai --seed 0          # runs (or resumes) every piece, publishing as it goes
    python -m lab.protocol --env babyai --seed 0 --plan   # prints its settings (sizes, screen, rule), runs nothing
    python -m lab.protocol --env babyai --seed 0 --status # each piece done or to run, and the time left (lab/status.py)
    python -m lab.protocol --env babyai --seed 0 --scale ladder --runs runs/protocol-babyai-seed0-ladder \
        --results results/protocol-babyai-seed0-ladder    # the second version: the curve (lab/ladder.py)

Earlier tables compared GRPO with imitation that drew unlimited fresh demonstrations from a near-perfect
expert: that asks whether the expert is worth more than the environment (it is, at this scale), not
what RL is for. Here the demonstrations are finite, and imitation has used them up before RL starts:

  1. demonstrations: the expert plays `demo_tasks` train tasks drawn once by `demo seed` (the seed's own,
     recorded in demos.json); its successes within the turn budget are the finite set;
  2. plateau: imitation of that set one epoch at a time, each epoch's model scored on validation
     (`val_tasks` tasks x `val_k` samples); it stops after `patience` epochs without a new best, and the
     best epoch's model is W*. Each epoch is its own train.py run from the previous epoch's model, so
     AdamW's moments restart every epoch (every arm below restarts them too);
  3. screen (once per env, on seed 0; later seeds reuse its choice): RL from W* under each of SCREEN's
     settings for `screen_cpu` CPU seconds, scored on validation; RULE picks one. Both were written
     before any result;
  4. three arms from W*, one after another, each for `arm_cpu` CPU seconds of all its processes
     (--budget-clock cpu: fair even when something else shares the machine; each arm's wall time is
     recorded beside it):
       (A) rl         RL on train tasks under the screened settings, no further demonstrations;
       (B) imitation  more imitation of the same finite set;
       (C) self       self-imitation: W* plays up to `self_episodes` train tasks for at most
                      `self_play_share` of the arm's seconds, then imitates its successes for the rest
                      (rejection-sampling fine-tuning: interaction without a policy gradient);
  5. test: W* and the three arms on `test_tasks` tasks of the `test_split` split (BabyAI's "fresh":
     outside train, validation, test and every screen) x `test_k` samples, the same decoding for all;
     the tables (lab/tables.py) with paired task-level intervals, and summary.md: success, Pass@k,
     refused share, never-/always-solved counts, each arm's CPU and wall seconds and episodes per hour.

Every step is a piece (lab/pieces.py): a directory under runs/protocol-ENV-seedS/, and when finished a
record in results/protocol-ENV-seedS/pieces.jsonl (small files, never weights), so a change of machine
loses at most one piece. A rerun skips finished pieces and resumes a crashed RL piece (arm A or a screened
setting) from its checkpoint with the CPU seconds it had left (a crashed imitation arm or epoch starts
again; evaluate.py resumes itself); on a machine with an empty runs/ it builds again only the models an
unfinished piece starts from. A started folder keeps the settings its protocol.json records (a flag or code
that contradicts them is refused: recorded_scale, recorded_code).

The second version (a Scale with a `ladder`, e.g. --scale ladder) replaces step 4's single budget with rungs
of CPU-hours: each arm scored on validation at every rung, its best rung tested, under rules written before
any rung ran (lab/ladder.py); the curve is lab/curve.py's. A folder of the first version keeps running it.
Test: python -m pytest tests/test_protocol.py
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lab import ladder
from lab.pieces import Pieces, other_machine
from lab.tables import protocol_summary

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scale:
    """The protocol's sizes. `full` is the published one; `smoke` runs the machinery in minutes (tests)."""
    demo_tasks: int = 500        # train tasks the expert plays once: the finite demonstration set
    val_tasks: int = 120         # validation tasks scoring each epoch and each screened setting
    val_k: int = 1
    patience: int = 2            # epochs without a new best validation success before imitation stops
    max_epochs: int = 12
    screen_cpu: float = 1200.0   # CPU seconds of each screened RL setting
    arm_cpu: float = 3600.0      # CPU seconds of each arm (all its processes together)
    self_episodes: int = 1000    # train tasks W* may play for self-imitation (one sample each)
    # The share of arm C's CPU seconds its play may take (it stops between rounds); the rest imitates its
    # successes. Unbounded, W*'s play of 1,000 tasks (10-12 CPU s each on 2 cores) would spend the whole
    # arm before one imitation step. Fixed before any arm ran.
    self_play_share: float = 0.5
    test_split: str = "fresh"
    test_tasks: int = 400
    test_k: int = 2
    model: str = "smollm2"
    train_extra: tuple = ()      # more train.py flags (the smoke scale's engine and sizes)
    eval_extra: tuple = ()       # more evaluate.py flags
    name: str = "full"           # the preset these sizes began from (SCALES), flags on top of it
    # The second version (lab/ladder.py): each arm's validation at rungs of its own CPU-hours from W*, the arms'
    # test models their best rungs. Empty: the one-budget protocol above (arm_cpu), as its folders ran.
    ladder: tuple = ()           # CPU-hours of each rung from W*, increasing
    stop_rung: float = 0.0       # RL's stop rule: the rung (CPU-hours) whose validation must beat W*'s by
    stop_points: float = 0.0     # at least these points, or RL and the ladder stop there (ladder.STOP)
    min_episodes: int = 0        # RL's episodes by its last rung; short of them the ladder stretches (ladder.STRETCH)
    rl_step_cpu: float = 130.0   # the fewest CPU seconds a rung may add: one RL step's (110-130 in the folders)


LADDER = ("ladder", "stop_rung", "stop_points", "min_episodes", "rl_step_cpu")  # fields the one-budget version lacks


SCALES = {
    "full": Scale(),
    "smoke": Scale(name="smoke", demo_tasks=6, val_tasks=2, patience=1, max_epochs=2, screen_cpu=2.0, arm_cpu=2.0,
                   self_episodes=4, test_split="test", test_tasks=2, model="tiny",
                   train_extra=("--engine", "hf", "--train-layers", "0", "--micro-tokens", "4096", "--tasks-per-step",
                                "2", "--samples-per-task", "2", "--max-tokens", "8"),
                   eval_extra=("--engine", "hf", "--max-tokens", "8")),
}
# The ladder (docs/protocol.md, "The curve"): a plateau that is one (120 validation tasks x 2 samples, BabyAI's
# validation split having 200; patience 3), then every arm at 1, 2, 4 and 8 CPU-hours of its own; RL stops
# at 4 unless 2 points above W* there, and plays at least 10,000 episodes (published agent-RL gains used
# 19,000-38,000). Each screened setting gets the first rung's CPU seconds.
SCALES["ladder"] = replace(SCALES["full"], name="ladder", val_k=2, patience=3, max_epochs=20, screen_cpu=3600.0,
                           ladder=(1.0, 2.0, 4.0, 8.0), stop_rung=4.0, stop_points=2.0, min_episodes=10_000)
# Its machinery in a few minutes: one rung of about a CPU second (an RL step of the tiny model or more); a stop
# rule that never stops (W* - 100 points); more episodes than that rung plays, so the ladder stretches by a rung.
SCALES["ladder-smoke"] = replace(SCALES["smoke"], name="ladder-smoke", max_epochs=1, test_k=1, ladder=(0.0003,),
                                 stop_rung=0.0003, stop_points=-100.0, min_episodes=12, rl_step_cpu=1.0)

# RL settings screened from W* (written before any result). Each names what it changes from the
# recipe (recipes.smollm2: GRPO, token-mean, the group std, temperature 1, 8 tasks x 4 samples,
# lr 3e-5, no warm-up, no cost for refused turns).
SCREEN = {
    "recipe": [],
    "gentle": ["--lr", "1e-5", "--warmup-steps", "4"],            # a smaller, warmed-up step: less drift from W*
    "refusal-cost": ["--refusal-penalty", "0.02", "--no-grpo-std"],  # refused turns cost; Dr. GRPO's advantages
    "wide-groups": ["--tasks-per-step", "4", "--samples-per-task", "8"],  # fewer constant groups
    # The two the first four lacked of the choices RL's settings span (added before any folder chose): the
    # aggregation, each episode weighing the same whatever its length; and a hotter sampler, whose groups
    # vary more where W* always succeeds (the published runs' groups were 73-79% constant). Evaluation
    # samples at the recipe's temperature for every model.
    "seq-mean": ["--agg", "seq-mean-token-mean"],
    "hot": ["--temperature", "1.3"],
}
# The ladder's screen (written before any ladder folder started): the first version's choice on both seeds
# (wide-groups) and, each on top of it alone, the levers on signal per episode: DAPO's dynamic sampling (up to
# 2 more rounds of fresh tasks while a step's groups are constant: studies/dynamic.py); tasks the policy
# sometimes solves, learnt from its own rollouts (half-life 4 steps, about half a screen: studies/solved.py);
# a cost for a refused turn (a cut-off reply is one: seed 1's drift); a reply budget the format fits (64
# tokens: 132 of seed 1's 220 invalid replies were cut off before `Action:` at 40). Evaluation keeps the
# recipe's 40 tokens for every model, so a setting that only learns longer replies is scored as it acts.
LADDER_SCREEN = {
    "wide-groups": SCREEN["wide-groups"],
    "dynamic": [*SCREEN["wide-groups"], "--dynamic-sampling", "2"],
    "sometimes-solved": [*SCREEN["wide-groups"], "--sometimes-solved", "4"],
    "refusal-cost": [*SCREEN["wide-groups"], "--refusal-penalty", "0.02"],
    "reply-fits": [*SCREEN["wide-groups"], "--max-tokens", "64"],
}
GOAL_POINTS = 5.0  # RL's goal over W* and over more imitation, in points of test success (both intervals above 0)
SMOKE_SCREEN = {"recipe": []}  # the smoke scale screens one setting: the machinery, not a choice
SLUG = {"W*": "wstar", "rl": "rl", "imitation": "imitation", "self": "self"}  # each model's test piece: test-SLUG
RULE = ("the setting with the highest validation success after its screen_cpu seconds; a tie goes to the one "
        "listed first in SCREEN")


def choose(scores: dict[str, float], order: list[str]) -> str:
    """RULE: the highest validation success; ties to the earlier in `order`."""
    return max(order, key=lambda name: (scores[name], -order.index(name)))


@dataclass
class Protocol:
    env: str
    seed: int
    scale: Scale
    runs: Path
    results: Path
    nproc: int = 2
    pieces: Pieces = field(init=False)  # runs each step once, records it in the result folder (lab/pieces.py)

    def __post_init__(self):
        self.pieces = Pieces(self.runs, self.results, self.nproc)

    # ------------------------------------------------------------------ the settings every piece shares
    @property
    def recipe(self) -> dict:
        from infra import recipes
        return recipes.smollm2(self.env)

    @property
    def turns(self) -> int:
        import schedule
        return max(schedule.parse(self.recipe["horizon"]).budgets)

    @property
    def demo_seed(self) -> int:
        return 10_000 + self.seed  # the finite set's own seed: never one a run's --seed gives its tasks

    @property
    def screen(self) -> dict:
        if self.scale.model == "tiny":
            return SMOKE_SCREEN
        return LADDER_SCREEN if self.scale.ladder else SCREEN

    def train(self, out: Path, *flags: str) -> list[str]:
        return [sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", str(self.nproc),
                "train.py", "--preset", "smollm2", "--env", self.env, "--budget-clock", "cpu", "--eval-every", "0",
                *(["--model", self.scale.model] if self.scale.model != "smollm2" else []), *flags, *self.scale.train_extra,
                "--out", str(out)]

    def evaluate(self, model: Path, out: Path, split: str, tasks: int, k: int) -> list[str]:
        r = self.recipe
        return [sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", str(self.nproc),
                "evaluate.py", "--env", self.env, "--env-options", r["env_options"], "--model", str(model),
                "--split", split, "--limit", str(tasks), "--k", str(k), "--turns", str(self.turns),
                "--max-tokens", str(r["max_tokens"]), "--max-context", str(r["max_context"]),
                "--temperature", str(r["temperature"]), *self.scale.eval_extra, "--out", str(out)]

    def imitate(self, model: str, out: Path, seed: int, **kw) -> list[str]:
        """Imitation only (--steps 0) from `model`: the finite set, or W*'s own play with actor='policy'."""
        actor = kw.get("actor", "expert")
        episodes = self.scale.self_episodes if actor == "policy" else self.scale.demo_tasks
        tasks_seed = kw.get("tasks_seed", self.demo_seed + (1 if actor == "policy" else 0))  # self-play: other tasks
        return self.train(out, "--model", model, "--steps", "0", "--bc-episodes", str(episodes), "--bc-actor", actor,
                          "--bc-tasks-seed", str(tasks_seed), "--bc-epochs", str(kw.get("epochs", 1)),
                          "--bc-seconds", str(kw.get("seconds", 0)), "--seed", str(seed),
                          *(["--bc-play-seconds", str(kw["play_seconds"])] if kw.get("play_seconds") else []))

    def rl(self, out: Path, setting: str, seconds: float, steps: int = 100_000) -> list[str]:
        return self.train(out, "--model", str(self.wstar()), "--bc-episodes", "0", "--steps", str(steps),
                          "--rl-seconds", str(seconds), "--save-every", "4", "--seed", str(self.seed),
                          *self.screen[setting])

    # ------------------------------------------------------------------ pieces
    def epoch_model(self, e: int) -> Path:
        """Epoch e's model on this machine, built (again) when missing: each epoch starts from the last's."""
        start = self.scale.model if e == 1 else str(self.epoch_model(e - 1))
        first = self.pieces.recorded("epoch-1") if e > 1 else None  # every epoch imitates the same finite set
        self.pieces.run(f"epoch-{e}", lambda: self.imitate(start, self.runs / f"epoch-{e}", self.seed * 100 + e),
                        "imitation", expect={"demonstrations": first["demonstrations"]} if first else None, epoch=e)
        return self.runs / f"epoch-{e}" / "warmstart"

    def plateau(self) -> list[dict]:
        """Epochs of imitation on the finite set until validation stops rising (patience). An epoch whose
        validation is recorded needs no model here; one still to validate is built with its predecessors."""
        decided = self.results / "plateau.json"
        if decided.exists():
            return json.loads(decided.read_text())["epochs"]
        epochs, best = [], None
        for e in range(1, self.scale.max_epochs + 1):
            val = self.pieces.run(f"val-epoch-{e}", lambda: self.evaluate(
                self.epoch_model(e), self.runs / f"val-epoch-{e}", "val", self.scale.val_tasks, self.scale.val_k),
                "eval", fresh=False, epoch=e)
            train = self.pieces.done(f"epoch-{e}", reuse=True)
            epochs.append({**train, "val_success": val["success"]})
            if best is None or val["success"] > best["val_success"]:
                best = epochs[-1]
            elif e - best["epoch"] >= self.scale.patience:
                break
        decided.write_text(json.dumps({"best_epoch": best["epoch"], "epochs": epochs,
                                       "patience": self.scale.patience}, indent=1) + "\n")
        return epochs

    def wstar(self) -> Path:
        """W*, the plateau's best epoch, on this machine (built again from its epochs when missing)."""
        return self.epoch_model(json.loads((self.results / "plateau.json").read_text())["best_epoch"])

    def screened(self) -> str:
        """The RL setting RULE picks, screened here (seed 0) or read from seed 0's result folder."""
        own = self.results / "screen.json"
        first = self.results.parent / self.results.name.replace(f"seed{self.seed}", "seed0") / "screen.json"
        if self.seed != 0:
            if not first.exists():  # screening again here would choose on this seed's own luck
                raise SystemExit(f"error: seed {self.seed} uses seed 0's screened RL setting, and {first} does not "
                                 f"exist yet; run seed 0 (same --runs/--results pattern) through its screen first")
            choice = json.loads(first.read_text())["choice"]
            own.write_text(json.dumps({"choice": choice, "from": first.parent.name}, indent=1) + "\n")
            return choice
        scores = {}
        for name in self.screen:
            val = self.pieces.run(f"val-screen-{name}", lambda: self.evaluate(
                self.screen_model(name), self.runs / f"val-screen-{name}", "val", self.scale.val_tasks,
                self.scale.val_k), "eval", fresh=False, setting=name)
            scores[name] = val["success"]
        choice = choose(scores, list(self.screen))
        own.write_text(json.dumps({"choice": choice, "scores": scores, "settings": self.screen, "rule": RULE},
                                  indent=1) + "\n")
        return choice

    def rl_piece(self, name: str, setting: str, seconds: float, reuse: bool = False, steps: int = 100_000,
                 **info) -> dict:
        """An RL piece (a screened setting, arm A, a rung) under `setting` until `seconds` CPU seconds (or step
        `steps`). One that crashed (or whose machine stopped) after a checkpoint (every 4 steps), or a rung
        carried over from the last, resumes from it with the seconds it had left, instead of starting again."""
        out = self.runs / name
        if self.pieces.done(name, reuse) is None and (out / "checkpoints" / "latest").exists():
            left = seconds - rl_cpu_spent(out, self.nproc)
            return self.pieces.run(name, lambda: self.rl(out, setting, max(left, 1e-3), steps) + ["--resume"], "rl",
                                   fresh=False, setting=setting, resumed=True, **info)
        return self.pieces.run(name, lambda: self.rl(out, setting, seconds, steps), "rl", reuse=reuse,
                               setting=setting, **info)

    def screen_model(self, name: str) -> Path:
        self.rl_piece(f"screen-{name}", name, self.scale.screen_cpu)
        return self.runs / f"screen-{name}"

    def arm_rl(self, setting: str) -> dict:
        # its test measured, the arm's model is not needed: its record is enough
        return self.rl_piece("arm-rl", setting, self.scale.arm_cpu, reuse=self.pieces.recorded("test-rl") is not None)

    def arm_imitation(self, slug: str, seed: int, **kw) -> dict:
        """Arm B (the finite set again) or C (actor='policy': W*'s own play), for arm_cpu CPU seconds."""
        return self.pieces.run(f"arm-{slug}", lambda: self.imitate(
            str(self.wstar()), self.runs / f"arm-{slug}", seed, epochs=100_000, seconds=self.scale.arm_cpu, **kw),
            "imitation", reuse=self.pieces.recorded(f"test-{slug}") is not None)

    def settings(self) -> dict:
        """What protocol.json records: every setting a piece of this folder ran under."""
        scale = {k: v for k, v in asdict(self.scale).items() if self.scale.ladder or k not in LADDER}
        return {"env": self.env, "seed": self.seed, "demo_seed": self.demo_seed, "scale": scale,
                "recipe": self.recipe, "turns": self.turns, "screen": self.screen, "rule": RULE,
                **({"ladder_rules": ladder.RULES} if self.scale.ladder else {})}

    def main(self) -> Path:
        self.results.mkdir(parents=True, exist_ok=True)
        if not (self.results / "protocol.json").exists():  # once, before any piece: a rerun was checked against it
            (self.results / "protocol.json").write_text(json.dumps(self.settings(), indent=1) + "\n")
        self.demos()
        self.plateau()
        setting = self.screened()
        if self.scale.ladder:  # the second version: the arms' rungs, their best rungs tested (lab/ladder.py)
            climb = ladder.Ladder(self)
            decided = climb.climb(setting)
            arms = {"W*": None, **{arm: climb.arm_record(arm, decided) for arm in ladder.ARMS}}
            models = {"W*": self.wstar, **{arm: lambda arm=arm: climb.test_model(arm, decided, setting)
                                           for arm in ladder.ARMS}}
        else:
            arms = {"W*": None, "rl": self.arm_rl(setting),
                    "imitation": self.arm_imitation("imitation", self.seed * 100 + 50),
                    "self": self.arm_imitation("self", self.seed * 100 + 60, actor="policy",
                                               play_seconds=self.scale.arm_cpu * self.scale.self_play_share)}
            models = {"W*": self.wstar, "rl": lambda: self.runs / "arm-rl",
                      "imitation": lambda: self.runs / "arm-imitation" / "warmstart",
                      "self": lambda: self.runs / "arm-self" / "warmstart"}
        for label, model in models.items():
            self.pieces.run(f"test-{SLUG[label]}", lambda: self.evaluate(
                model(), self.runs / f"test-{SLUG[label]}", self.scale.test_split, self.scale.test_tasks,
                self.scale.test_k), "eval", fresh=False, model=label)
        from lab import results as published
        labels = {"W*": "W* (imitation plateau)", "imitation": "W* + more imitation (B)",
                  "self": "W* + self-imitation (C)", "rl": "W* + RL (A)"}
        evals = [(labels[k], self.runs / f"test-{SLUG[k]}") for k in ("W*", "imitation", "self", "rl")]
        if not (self.results / "test" / "manifest.json").exists():
            if (self.results / "test").exists():
                shutil.rmtree(self.results / "test")
            published.publish(None, self.results / "test", evals)
        rl = labels["rl"]  # the goals: RL - W* and RL - B at least +5 points, intervals above 0; RL - C reported
        goals = [(rl, labels["W*"], GOAL_POINTS), (rl, labels["imitation"], GOAL_POINTS), (rl, labels["self"], None)]
        summary = protocol_summary(self.results, evals, arms, published.REFUSALS.get(self.env, ()), goals)
        if self.scale.ladder:  # the curve: its table in summary.md, its picture beside it (lab/curve.py)
            from lab import curve
            summary += curve.report(self.results)
        (self.results / "summary.md").write_text(summary)
        print((self.results / "summary.md").read_text())
        return self.results

    @property
    def tests(self) -> list[str]:
        """The test pieces, one a model: test-SLUG."""
        return [f"test-{slug}" for slug in SLUG.values()]

    def demos(self) -> None:
        """demos.json: the finite set's task ids, drawn as the warm start draws them (warmstart.demo_tasks)."""
        import envs
        from studies import warmstart
        env = envs.make(self.env, **json.loads(self.recipe["env_options"]))
        try:
            ids = warmstart.demo_tasks(env.tasks("train"), self.scale.demo_tasks, self.demo_seed)
        finally:
            env.close()
        (self.results / "demos.json").write_text(json.dumps({"seed": self.demo_seed, "tasks": ids}) + "\n")





def rl_cpu_spent(out: Path, world: int) -> float:
    """CPU seconds of an RL run's logged steps up to its latest checkpoint (time/cpu_step is the ranks' mean)."""
    latest = (out / "checkpoints" / "latest").read_text().strip()
    steps = int(latest.split("_")[-1])
    rows = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    return sum(r.get("time/cpu_step", 0.0) * world for s, r in rows.items() if s < steps)


def recorded_scale(results: Path, requested: Scale, given: dict) -> Scale:
    """The scale a run of `results` uses. A folder that has started (its protocol.json) keeps the scale it
    recorded, whatever the presets say now: its pieces were measured under it, and a rerun that changed
    the patience or an arm's seconds would mix two protocols in one table. `given` holds the flags on the
    command line (with `scale`, the preset's name, when named); one that contradicts the folder is a
    ValueError naming both values."""
    path = results / "protocol.json"
    if not path.exists():
        return requested
    fields = asdict(requested)
    kept = {k: tuple(v) if isinstance(v, list) else v
            for k, v in json.loads(path.read_text())["scale"].items() if k in fields}
    for k in LADDER:  # a folder from before the ladder existed ran the one-budget version
        kept.setdefault(k, getattr(Scale(), k))
    if "name" not in kept:  # a folder from before presets were named: the preset it equals, if any
        if guess := next((n for n, sc in SCALES.items() if all(asdict(sc)[k] == v for k, v in kept.items())), None):
            kept["name"] = guess
    folder = replace(requested, **kept)
    wanted = {("name" if k == "scale" else k): v for k, v in given.items()}
    clash = [k for k, v in wanted.items() if k in fields and getattr(folder, k) != v]
    if clash:
        flag = lambda k: "--scale" if k == "name" else f"--{k.replace('_', '-')}"  # noqa: E731
        said = ", ".join(f"{flag(k)} {getattr(folder, k)!s} (asked: {wanted[k]!s})" for k in clash[:3])
        raise ValueError(f"{results} ran with {said}{' and more' if len(clash) > 3 else ''}; a started folder keeps "
                         f"its settings: drop those flags to resume it, or pass --results to start another folder")
    return folder


def recorded_code(proto: Protocol) -> str | None:
    """A folder started under other settings (env, seed, recipe, turns, screen, rule, demonstration seed) than
    this command and code give: one line naming them, since resuming it would mix the two; None when they
    agree or the folder is new."""
    path = proto.results / "protocol.json"
    if not path.exists():
        return None
    before, now = json.loads(path.read_text()), json.loads(json.dumps(proto.settings()))
    differ = [k for k in ("env", "seed", "recipe", "turns", "screen", "rule", "demo_seed")
              if k in before and before[k] != now[k]]
    differ += ["ladder_rules"] if before.get("ladder_rules") != now.get("ladder_rules") else []  # the ladder's rules
    if not differ:
        return None
    if {"env", "seed"} & set(differ):
        return (f"{proto.results} holds {before['env']} seed {before['seed']}, not {proto.env} seed {proto.seed}: "
                f"pass --env {before['env']} --seed {before['seed']}, or another --results")
    return (f"{proto.results} was started under another {', '.join(differ)} than this code's: resume it with the "
            f"code that started it (git log -- {path}), or pass --results to start another folder")


def check(args) -> str | None:
    """A broken protocol command: one line, before anything starts."""
    s = args.scale
    if s.patience < 1:
        return f"--patience must be at least 1, got {s.patience}: imitation would stop before any epoch compared"
    if s.arm_cpu <= 0 or s.screen_cpu <= 0:
        return "--arm-cpu and --screen-cpu must be positive: an arm with no time left trains nothing"
    if not 0 < s.self_play_share < 1:
        return f"--self-play-share must be in (0, 1), got {s.self_play_share}: arm C must both play and imitate"
    if s.demo_tasks < 1 or s.val_tasks < 1 or s.test_tasks < 1 or s.self_episodes < 1:
        return "--demo-tasks, --val-tasks, --test-tasks and --self-episodes must be positive"
    if problem := check_ladder(s):
        return problem
    import envs
    from infra import recipes
    if not hasattr(envs.env_class(args.env), "expert"):
        return f"{args.env} has no expert to demonstrate (env.expert()); the protocol needs one"
    env = envs.make(args.env, **json.loads(recipes.smollm2(args.env)["env_options"]))
    try:
        train, val, test = env.tasks("train"), env.tasks("val"), env.tasks(s.test_split)
    except ValueError as exc:
        return f"--test-split: {exc}"
    finally:
        env.close()
    if s.val_tasks > len(val):
        return f"--val-tasks {s.val_tasks}: the validation split has {len(val)} tasks (more samples: --val-k)"
    if s.demo_tasks > len(train):
        return (f"--demo-tasks {s.demo_tasks}: the expert cannot fill it, {args.env} has {len(train)} train tasks; "
                f"ask for at most {len(train)}")
    if s.test_tasks > len(test):
        return f"--test-tasks {s.test_tasks}: the {s.test_split} split has {len(test)} tasks"
    return None


def check_ladder(s: Scale) -> str | None:
    """The ladder's bad input (lab/ladder.py), one line: rungs that do not rise, a rung that adds less than one
    RL step, a stop rule naming a rung the ladder does not have."""
    if not s.ladder:
        return None
    if any(h <= 0 for h in s.ladder) or any(b <= a for a, b in zip(s.ladder, s.ladder[1:])):
        return f"--ladder {','.join(f'{h:g}' for h in s.ladder)}: the rungs (CPU-hours) must be positive and rising"
    added = min(b - a for a, b in zip((0.0, *s.ladder), s.ladder)) * ladder.HOUR
    if added < s.rl_step_cpu:
        return (f"--ladder: a rung adds {added:g} CPU s, under one RL step at this scale ({s.rl_step_cpu:g} CPU s): "
                f"two rungs would score the same model")
    if s.stop_rung not in s.ladder:
        return (f"--stop-rung {s.stop_rung:g}: the ladder has no such rung (its rungs: "
                f"{', '.join(f'{h:g}' for h in s.ladder)} CPU-hours)")
    if s.min_episodes < 0:
        return f"--min-episodes must be 0 or more, got {s.min_episodes}"
    return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="The finite-demonstrations protocol (lab/protocol.py's docstring).")
    p.add_argument("--env", default="babyai")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", default=None, choices=sorted(SCALES), help="the sizes' preset (default full)")
    for name in ("demo_tasks", "patience", "max_epochs", "val_tasks", "val_k", "test_tasks", "self_episodes",
                 "min_episodes"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    for name in ("arm_cpu", "screen_cpu", "self_play_share", "stop_rung", "stop_points"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None)
    p.add_argument("--ladder", type=rungs, default=None, help="the rungs' CPU-hours, e.g. 1,2,4,8 (lab/ladder.py)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--runs", default="runs/protocol-{env}-seed{seed}")
    p.add_argument("--results", default="results/protocol-{env}-seed{seed}")
    p.add_argument("--plan", action="store_true", help="print the settings and stop")
    p.add_argument("--status", action="store_true", help="print each piece's state and the time left; run nothing")
    args = p.parse_args(argv)
    scale = SCALES[args.scale or "full"]
    given = {k: v for k, v in vars(args).items() if k in asdict(scale) and v is not None}
    named, args.scale = args.scale, replace(scale, **given)
    if problem := check(args):
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    fill = dict(env=args.env, seed=args.seed)
    os.chdir(ROOT)  # paths stay relative to the repository: the result folders name no machine's paths
    results = Path(args.results.format(**fill))
    try:  # a started folder keeps the scale it recorded (recorded_scale)
        scale = recorded_scale(results, args.scale, {**given, **({"scale": named} if named else {})})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2)
    proto = Protocol(args.env, args.seed, scale, Path(args.runs.format(**fill)), results, args.nproc)
    if problem := recorded_code(proto):
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if args.plan:
        print(json.dumps({"scale": asdict(scale), "screen": proto.screen, "rule": RULE, "turns": proto.turns,
                          **({"ladder_rules": ladder.RULES} if scale.ladder else {})}, indent=1))
        return
    if args.status:  # lab/status.py: read from files, runs nothing
        from lab import status
        print(status.report(proto), end="")
        return
    if problem := other_machine(proto.results, str(proto.runs), str(proto.results)):
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    if scale.ladder and (problem := ladder.second_seed(args.seed, results)):  # ladder.SECOND_SEED, before start-up
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    proto.runs.mkdir(parents=True, exist_ok=True)
    proto.main()


def rungs(text: str) -> tuple:
    """--ladder's value: CPU-hours separated by commas."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU-hours separated by commas, like 1,2,4,8; got {text!r}")


if __name__ == "__main__":
    main()

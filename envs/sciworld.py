"""SciWorld: the ScienceWorld simulator (PyPI `scienceworld`, a Scala jar driven over py4j) as an Env.

Task ids enumerate every (task type, variation) pair of the 30 task types, 7207 in all, in the
simulator's task order; `tasks(split)` returns the official train/dev/test variations ("val" is dev; each task type's
variations are split into three contiguous ranges; the counts are in TASK_TYPES and a test checks
them against the simulator). The first observation is the task description, a newline, and the
output of `look around`, as in AgentGym. The reward is the running score / 100 (a failed task scores
-100, so -1, and ends the episode); success is a score of 100.

Engineering departures from `scienceworld.ScienceWorldEnv` (same simulator, same answers):
- one JVM per instance, started with a capped heap (-Xmx512m -XX:+UseSerialGC: a fraction of the default's
  resident memory; figures: docs/environments.md) and reused across episodes with `load()`. ScienceWorldEnv cannot
  pass JVM options, so `_launch_jvm` starts the jar with py4j itself, as ScienceWorldEnv does;
- step() talks to the simulator's Scala interface directly and skips what ScienceWorldEnv.step() adds
  to every call: the enumeration of all valid action/object combinations (most of a step's time) and
  the look/inventory/task strings. The valid actions are computed only when the agent asks
  ('check valid actions') or a caller calls `valid_actions()`;
- a JVM that dies or stops answering (py4j read timeout) never hangs or raises out of step(): the
  step says so, ends the episode and sets `crashed`/`error`; the next reset starts a fresh JVM.
- by default all 30 task types are used and the agent may ask for 'check valid actions', which the
  paper's agent could not; the simulator's own move limit is an option (`step_limit`, default 100
  moves as in ScienceWorldEnv).

Task types (`task_types`, e.g. `["4-1", "7-2"]`, codes as in TASK_TYPES): `tasks(split)` keeps the official
train/dev/test variations of those types only, within the task set (an unknown code, or one the task set
leaves out, is refused with the valid codes), round-robin over the types so that a prefix of a split
(train.py's first --eval-tasks validation tasks, evaluate.py's --limit) holds every chosen type. Task ids
stay those of all 7207 tasks. recipes.smollm2's SciWorld recipe keeps the seven short types 4-1..4-4 and
7-1..7-3.

Paper task set (`task_set="agentgym"`): the 23 task types of AgentGym's server (it left out 5-1, 5-2,
9-1, 9-2, 9-3, 10-1, 10-2), no 'check valid actions' command (the instruction does not offer it and the
simulator answers it as an unknown action), and `tasks(split)` keeps the official train/dev/test
variations of those 23 types (1,171 test tasks). The paper's test set is 200 tasks over those 23 types,
listed in AgentGym-RL-Data-ID's `eval/sciworld_test.json`: pass that file with `--tasks-file` to play
exactly those. `agentgym_task(n)` maps AgentGym's `sciworld_<n>` to a task id here: the original server
lists every variation of each of the 23 types in the simulator's task order, and n indexes that list.

Action parsing (`parser`): "ours" takes the first non-empty line after a single `Action:`
(`envs.parse_action`); "agentgym" takes the text after the first `Action:` as AgentGym's client did
(`envs.agentgym_action`). `--prompt-style agentgym` selects the latter.

Expert (`expert()`, for warmstart.py's demonstrations): the next action of the simulator's gold path,
as 'Thought:\\nStep k of n of the plan.\\n\\nAction:\\n<action>'. The path is built on the expert's first call
of an episode (`load(..., gold=True)` runs the simulator's gold agent: seconds for the short task types, far
longer for Mendelian genetics; figures: docs/environments.md), never at a plain reset. On the 1,030 dev
variations of 19 task types (all but boil, freeze, the known melting point, growing, life stages 1, inclined
planes and genetics) every path built, and replayed in one reused JVM 974 reached score 100 within 80 turns;
45 paths are longer than that (melt, change of state, unknown melting point), and 11 of test-conductivity's
225 failed: their paths answer an ambiguous `drop shovel` with '0', the gold agent's choice, and the options
can come in another order (the JVM's identity-hash order), so '0' drops the wrong shovel. The gold agent's
route can also differ between two builds of one task. A path that cannot be built or runs out raises, which
warmstart.py counts as one failed demonstration.

Determinism: load() reseeds the simulator's RNG with the variation, so the first observation of a task
id is reproducible. A few dynamics (bees, wandering animals, Mendelian pollination) also depend on the
JVM's identity-hash order, so in a reused JVM they can unfold differently after different histories.

Run: `python -m pytest tests/test_sciworld.py` (needs Java 8+ on PATH or JAVA_HOME).
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import shutil

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError, Py4JJavaError
from scienceworld.constants import BASEPATH, JAR_PATH

from envs import agentgym_action, parse_action

# (code, topic, simulator task name, train, dev, test variations); splits are contiguous ranges.
TASK_TYPES = [
    ("1-1", "Matter", "boil", 14, 7, 9),
    ("1-2", "Matter", "melt", 14, 7, 9),
    ("1-3", "Matter", "freeze", 14, 7, 9),
    ("1-4", "Matter", "change-the-state-of-matter-of", 14, 7, 9),
    ("2-1", "Measurement", "use-thermometer", 270, 135, 135),
    ("2-2", "Measurement", "measure-melting-point-known-substance", 218, 109, 109),
    ("2-3", "Measurement", "measure-melting-point-unknown-substance", 150, 75, 75),
    ("3-1", "Electricity", "power-component", 10, 5, 5),
    ("3-2", "Electricity", "power-component-renewable-vs-nonrenewable-energy", 10, 5, 5),
    ("3-3", "Electricity", "test-conductivity", 450, 225, 225),
    ("3-4", "Electricity", "test-conductivity-of-unknown-substances", 300, 150, 150),
    ("4-1", "Classification", "find-living-thing", 150, 75, 75),
    ("4-2", "Classification", "find-non-living-thing", 150, 75, 75),
    ("4-3", "Classification", "find-plant", 150, 75, 75),
    ("4-4", "Classification", "find-animal", 150, 75, 75),
    ("5-1", "Biology", "grow-plant", 62, 31, 33),
    ("5-2", "Biology", "grow-fruit", 62, 31, 33),
    ("6-1", "Chemistry", "chemistry-mix", 16, 8, 8),
    ("6-2", "Chemistry", "chemistry-mix-paint-secondary-color", 18, 9, 9),
    ("6-3", "Chemistry", "chemistry-mix-paint-tertiary-color", 18, 9, 9),
    ("7-1", "Biology", "lifespan-longest-lived", 62, 31, 32),
    ("7-2", "Biology", "lifespan-shortest-lived", 62, 31, 32),
    ("7-3", "Biology", "lifespan-longest-lived-then-shortest-lived", 62, 31, 32),
    ("8-1", "Biology", "identify-life-stages-1", 6, 3, 5),
    ("8-2", "Biology", "identify-life-stages-2", 4, 2, 4),
    ("9-1", "Forces", "inclined-plane-determine-angle", 84, 42, 42),
    ("9-2", "Forces", "inclined-plane-friction-named-surfaces", 692, 346, 348),
    ("9-3", "Forces", "inclined-plane-friction-unnamed-surfaces", 80, 40, 42),
    ("10-1", "Biology", "mendelian-genetics-known-plant", 60, 30, 30),
    ("10-2", "Biology", "mendelian-genetics-unknown-plant", 240, 120, 120),
]
SIZES = [sum(row[3:]) for row in TASK_TYPES]
OFFSETS = [0, *itertools.accumulate(SIZES)][:-1]  # first task id of each task type
NUM_TASKS = sum(SIZES)  # 7207
# Task types AgentGym's server left out; the paper's agent saw the 23 others.
AGENTGYM_SKIPPED = ("5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2")
AGENTGYM_TYPES = [k for k, row in enumerate(TASK_TYPES) if row[0] not in AGENTGYM_SKIPPED]
AGENTGYM_NUM_TASKS = sum(SIZES[k] for k in AGENTGYM_TYPES)  # 4,639
TASK_SETS = ("all", "agentgym")
CODES = [row[0] for row in TASK_TYPES]


def chosen_kinds(task_types: list[str] | str | None, task_set: str = "all") -> list[int]:
    """Indices into TASK_TYPES of the task types `tasks(split)` draws from, in the simulator's order: those
    of `task_set`, narrowed to the codes of `task_types` (a list such as ["4-1", "7-2"], or one
    comma-separated string) when it is given. An unknown code, or one its task set leaves out, raises."""
    allowed = AGENTGYM_TYPES if task_set == "agentgym" else list(range(len(TASK_TYPES)))
    if task_types is None:
        return allowed
    codes = [c.strip() for c in task_types.split(",")] if isinstance(task_types, str) else list(task_types)
    unknown = [c for c in codes if c not in CODES]
    if unknown or not codes:
        what = f"unknown SciWorld task_types {unknown}" if unknown else "SciWorld task_types is empty"
        raise ValueError(f"{what}; valid codes: {', '.join(CODES)}")
    outside = [c for c in codes if CODES.index(c) not in allowed]
    if outside:
        raise ValueError(f"SciWorld task_types {outside} are not in task_set {task_set!r} (AgentGym's server left out "
                         f"{', '.join(AGENTGYM_SKIPPED)}); drop them or use task_set 'all'")
    return [k for k in allowed if CODES[k] in codes]


def split_ids(split: str, kinds: list[int], interleave: bool = False) -> list[int]:
    """Task ids of the official `split` variations of the task types `kinds` (indices into TASK_TYPES):
    type after type, or with `interleave` round-robin over the types (the first variation of each, then
    the second, ...), so that any prefix of the list holds every type."""
    column = {"train": 0, "dev": 1, "val": 1, "test": 2}.get(split)  # "val": the official dev split
    if column is None:
        raise ValueError(f"SciWorld has splits 'train', 'dev' (also called 'val') and 'test', not {split!r}")
    ranges = []
    for kind in kinds:
        start = OFFSETS[kind] + sum(TASK_TYPES[kind][3:3 + column])
        ranges.append(range(start, start + TASK_TYPES[kind][3 + column]))
    if not interleave:
        return [t for r in ranges for t in r]
    return [t for row in itertools.zip_longest(*ranges) for t in row if t is not None]


def agentgym_task(n: int) -> int:
    """The task id here of AgentGym's `sciworld_<n>`. The original server lists the variations of every
    task type it keeps, type by type in the simulator's order, all variations of each (train, dev and
    test alike), and `n` indexes that list."""
    if not 0 <= n < AGENTGYM_NUM_TASKS:
        raise ValueError(f"sciworld_{n} is outside AgentGym's SciWorld list (0..{AGENTGYM_NUM_TASKS - 1})")
    for k in AGENTGYM_TYPES:
        if n < SIZES[k]:
            return OFFSETS[k] + n
        n -= SIZES[k]
    raise AssertionError("unreachable: n was checked against the list's length")

ACTIONS = [
    ("open OBJ / close OBJ", "open/close a container"),
    ("activate OBJ / deactivate OBJ", "activate/deactivate a device"),
    ("connect OBJ to OBJ", "connect electrical components"), ("disconnect OBJ", "disconnect electrical components"),
    ("use OBJ [on OBJ]", "use a device/item"), ("look around", "describe the current room"),
    ("look at OBJ", "describe an object in detail"), ("look in OBJ", "describe a container's contents"),
    ("read OBJ", "read a note or book"), ("move OBJ to OBJ", "move an object to a container"),
    ("pick up OBJ", "move an object to the inventory"), ("put down OBJ", "drop an inventory item"),
    ("pour OBJ into OBJ", "pour a liquid into a container"), ("dunk OBJ into OBJ", "dunk a container into a liquid"),
    ("mix OBJ", "chemically mix a container"), ("go to LOC", "move to a new location"), ("eat OBJ", "eat a food"),
    ("flush OBJ", "flush a toilet"), ("focus on OBJ", "signal intent on a task object (irreversible)"),
    ("wait", "take no action for 10 iterations"), ("wait1", "take no action for 1 iteration"),
    ("task", "describe current task"), ("inventory", "list your inventory"),
    ("check valid actions", "list every action that is valid right now (long)"),
]
CHECK_VALID = "check valid actions"


def instruction(actions: list[tuple[str, str]]) -> str:
    return ("You are an agent in ScienceWorld, a text-based science lab and home. Every round you get an observation; "
            "reply with your thought and one action to make progress on the given task. When the simulator asks you "
            "to disambiguate, answer with the number of the option you mean.\n\nActions (OBJ and LOC are names of "
            "things and places you have seen):\n" + "\n".join(f"- {a}: {d}" for a, d in actions) +
            "\n\nYour reply must use exactly this format:\nThought:\n<your reasoning>\n\nAction:\n<one action>")


INSTRUCTION = instruction(ACTIONS)
PAPER_INSTRUCTION = instruction([row for row in ACTIONS if row[0] != CHECK_VALID])  # the paper's action list

JAVA_HELP = ("SciWorld needs a Java runtime (8 or newer; 17 recommended) to run the ScienceWorld simulator. "
             "Install one (e.g. `apt-get install openjdk-17-jre-headless`) and put `java` on PATH or set JAVA_HOME.")
NO_MATCH = "No known action matches that input."
SIMPLIFICATIONS = {"easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction"}


def find_java(java: str | None = None) -> str:
    """Path of the java executable: the argument, else $JAVA_HOME/bin/java, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    candidate = java or (os.path.join(home, "bin", "java") if home else None) or shutil.which("java")
    if not candidate or not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise RuntimeError(f"{JAVA_HELP} (looked for: {candidate or 'java on PATH'})")
    return candidate


STARTUP_TIMEOUT = 120.0  # seconds a new JVM's simulator may take to construct (not a hung call)


def _launch_jvm(java: str, java_opts: list[str], timeout: float):
    """Start scienceworld.jar in a new JVM; return (gateway, simulator, process).

    Mirrors ScienceWorldEnv.__init__ but adds JVM options and a read timeout, and starts no callback
    server (the simulator never calls back into Python). The one non-public path is the Scala entry
    class `scienceworld.runtime.pythonapi.PythonInterface`, the object ScienceWorldEnv keeps as `.server`.
    """
    try:
        port, process = launch_gateway(classpath=JAR_PATH, javaopts=java_opts, java_path=java, cwd=BASEPATH,
                                       die_on_exit=True, return_proc=True)
    except (OSError, ValueError) as e:  # ValueError: the JVM exited before printing its port
        raise RuntimeError(f"could not start the ScienceWorld JVM ({java} {' '.join(java_opts)}): {e}. "
                           + JAVA_HELP) from e
    # No memory management: py4j would otherwise send "release object" messages from Python finalizers,
    # which log connection errors when the JVM is already gone; we only keep one long-lived Java object.
    # The simulator's construction (class loading, the JIT's first work) gets STARTUP_TIMEOUT: on 2 loaded cores
    # it outlasted a 5-s call timeout, which then failed a healthy start-up. Every later call gets `timeout`:
    # connections made from now on read it from the parameters, the one just used has its socket set here.
    parameters = GatewayParameters(port=port, auto_field=True, read_timeout=max(timeout, STARTUP_TIMEOUT),
                                   enable_memory_management=False)
    gateway = JavaGateway(gateway_parameters=parameters, java_process=process)
    simulator = gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
    parameters.read_timeout = timeout
    for connection in list(gateway._gateway_client.deque):  # py4j's pool of open connections
        connection.socket.settimeout(timeout)
    return gateway, simulator, process


class SciWorld:
    """One ScienceWorld episode at a time, on a JVM owned by this instance and reused across resets."""

    instruction = INSTRUCTION

    def __init__(self, step_limit: int = 100, java: str | None = None,
                 java_opts: tuple[str, ...] = ("-Xmx512m", "-XX:+UseSerialGC"), timeout: float = 60.0,
                 simplifications: str = "", task_set: str = "all", parser: str = "ours",
                 task_types: list[str] | str | None = None):
        if task_set not in TASK_SETS:
            raise ValueError(f"unknown SciWorld task_set {task_set!r}; choose 'all' (30 task types) or 'agentgym' "
                             "(the paper's 23, without 'check valid actions')")
        if parser not in ("ours", "agentgym"):
            raise ValueError(f"unknown SciWorld parser {parser!r}; choose 'ours' or 'agentgym'")
        self.task_set, self.parser = task_set, parser
        self.paper = task_set == "agentgym"
        self.task_types = task_types             # None: every type of the task set
        self.kinds = chosen_kinds(task_types, task_set)  # indices into TASK_TYPES that tasks(split) draws from
        self.instruction = PAPER_INSTRUCTION if self.paper else INSTRUCTION
        self.step_limit = step_limit            # the simulator's move limit, as envStepLimit in ScienceWorldEnv
        self.java = find_java(java)             # fail at construction, with what to install
        self.java_opts = list(java_opts)        # JVM flags; the heap cap keeps a pool of JVMs affordable
        self.timeout = timeout                  # seconds a single simulator call may take before it counts as hung
        self.simplifications = simplifications  # e.g. "easy"; "" is the standard benchmark
        unknown = set(filter(None, simplifications.split(","))) - SIMPLIFICATIONS
        if unknown:
            raise ValueError(f"unknown simplifications {sorted(unknown)}; choose from {sorted(SIMPLIFICATIONS)}")
        self.success, self.crashed, self.error = False, False, None
        self.done, self.score, self.task_id = True, 0, None
        self._gold: list[str] | None = None  # the expert's plan: the gold path of the current task, built on demand
        self._gold_error: str | None = None  # why the simulator could not build it (asked again: the same error)
        self._cursor = 0                     # how many of the plan's actions the expert has given
        self._gateway = self._sim = self._process = None
        self._start()

    # -- task metadata
    def tasks(self, split: str) -> list[int]:
        # Chosen task types come round-robin, so a prefix (train.py's --eval-tasks, evaluate.py's --limit)
        # holds every one of them, as MiniWoB's splits do; all types stay in the simulator's order.
        return split_ids(split, self.kinds, interleave=self.task_types is not None)

    def locate(self, task_id: int) -> tuple[str, int]:
        """(simulator task name, variation) of a task id."""
        if not 0 <= task_id < NUM_TASKS:
            raise ValueError(f"SciWorld task ids are 0..{NUM_TASKS - 1}, got {task_id}")
        kind = bisect.bisect_right(OFFSETS, task_id) - 1
        return TASK_TYPES[kind][2], task_id - OFFSETS[kind]

    def subtask(self, task_id: int) -> str:
        """Topic and task type, e.g. 'Matter/boil'."""
        self.locate(task_id)  # validates the id
        _, topic, name, *_ = TASK_TYPES[bisect.bisect_right(OFFSETS, task_id) - 1]
        return f"{topic}/{name}"

    # -- episode
    def reset(self, task_id: int, *, gold: bool = False) -> str:
        """Load task `task_id`; `gold=True` also has the simulator build its gold path now (slow, see the module
        docstring; `expert()` builds it on its first call instead, so a plain reset stays fast)."""
        name, variation = self.locate(task_id)
        if self.crashed or self._process is None or self._process.poll() is not None:
            self._restart()
        try:
            description, look = self._load(name, variation, gold)
        except Py4JError:  # the JVM died between episodes: one fresh start, then let errors surface
            self._restart()
            description, look = self._load(name, variation, gold)
        self.task_id, self.score, self.done, self.success = task_id, 0, False, False
        self._gold, self._gold_error, self._cursor = (self.gold_actions() if gold else None), None, 0
        return f"{description}\n{look}"

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.done:
            return "The episode is over. Start a new one with reset().", self.reward, True
        action, error = (agentgym_action if self.parser == "agentgym" else parse_action)(text)
        if error:
            return error, self.reward, False
        if self._process.poll() is not None:  # died since the last call: do not make py4j retry a dead port
            return self._crash(RuntimeError(f"the JVM exited with code {self._process.returncode}")), self.reward, True
        try:
            if action.lower().strip(" .") == CHECK_VALID and not self.paper:
                return "Valid actions: " + ", ".join(self.valid_actions()), self.reward, False
            observation = self._sim.step(action)
            score = int(round(100 * self._sim.getScore()))
            completed = self._sim.getCompleted() or self._sim.getNumMoves() > self.step_limit or score < 0
        except Py4JJavaError:  # the simulator threw on this input; the JVM itself is fine
            return f"The simulator could not process '{action}'. Try another action.", self.reward, False
        except Py4JError as e:      # JVM gone, or no answer within `timeout`
            return self._crash(e), self.reward, True
        self.score, self.done, self.success = score, bool(completed), score >= 100
        if observation.strip() == NO_MATCH and not self.paper:  # the paper's agent got the bare answer
            observation += (" Use one of the action forms from the instructions with names of things you have "
                            "seen, or 'check valid actions' to list the valid actions.")
        return observation, self.reward, self.done

    @property
    def reward(self) -> float:
        return max(-1.0, min(1.0, self.score / 100))

    def valid_actions(self) -> list[str]:
        """Every valid action/object combination in the current state (expensive; on demand only)."""
        # The JSON variant returns a plain string, so no Java list object is left behind per call.
        return [a["action"] for a in json.loads(self._sim.getValidActionObjectCombinationsJSON())["validActions"]]

    def gold_actions(self) -> list[str]:
        """The simulator's gold action sequence for the current task (needs `reset(task_id, gold=True)`)."""
        return list(self._sim.getGoldActionSequence())

    def expert(self) -> str:
        """The expert's reply ('Thought:\\n...\\n\\nAction:\\n<action>') for the current state: the next action
        of the simulator's gold path for the current task, one per call (warmstart.py asks once a turn).

        The gold path is built on the first call of an episode (`_build_gold`), not at reset, so RL's
        resets stay fast. It is a plan for the untouched task, played from a cursor: where the episode has
        left it (other actions in between, or dynamics that unfold differently in a reused JVM) the expert
        keeps following it, and the simulator's answers show the divergence. Raises RuntimeError when the
        simulator cannot build the path (it threw, timed out, or built none) or the plan is used up before
        the task is done; warmstart.py counts that as one failed demonstration."""
        if self.task_id is None or self.done:
            raise RuntimeError("the episode is over: reset the environment before asking the expert")
        if self._gold is None and self._gold_error is None:
            self._build_gold()
        name, variation = self.locate(self.task_id)
        if self._gold_error is not None:
            raise RuntimeError(f"no gold path for {name} variation {variation}: {self._gold_error}")
        if not self._gold:
            raise RuntimeError(f"the simulator built an empty gold path for {name} variation {variation}")
        if self._cursor >= len(self._gold):
            raise RuntimeError(f"all {len(self._gold)} actions of the gold path of {name} variation {variation} "
                               f"are played and the task is not done (score {self.score})")
        self._cursor += 1
        return (f"Thought:\nStep {self._cursor} of {len(self._gold)} of the plan.\n\n"
                f"Action:\n{self._gold[self._cursor - 1]}")

    @property
    def jvm_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()  # local sockets only
        if self._process is not None and self._process.poll() is None:
            self._process.kill()   # the simulator holds no state worth a graceful exit
            self._process.wait(timeout=10)
        self._gateway = self._sim = self._process = None
        self.done = True

    # -- JVM lifecycle
    def _start(self) -> None:
        self._gateway, self._sim, self._process = _launch_jvm(self.java, self.java_opts, self.timeout)
        self.crashed, self.error = False, None

    def _restart(self) -> None:
        self.close()
        self._start()

    def _load(self, name: str, variation: int, gold: bool) -> tuple[str, str]:
        self._sim.load(name, variation, self.simplifications, gold)
        # `look around` is a free action (no move), as AgentGym's reset did it.
        return self._sim.getTaskDescription(), self._sim.step("look around")

    def _build_gold(self) -> None:
        """Have the simulator build the gold path of the current task, leaving the episode where it was.

        `load(..., gold=True)` loads the task, runs the simulator's gold agent through it and loads it
        afresh, so it wipes the episode: the episode's actions (the simulator's own history, starting with
        the reset's free `look around`) are replayed after it. Asked on the first turn, that replay is the
        one free look. The cursor starts after the episode's actions that already follow the path.
        A Java exception (the gold agent failed) is kept in `_gold_error`, with the task reloaded as it
        was; a dead or hung JVM ends the episode as a crash, as in step()."""
        name, variation = self.locate(self.task_id)
        try:
            if self._process.poll() is not None:  # as in step(): do not make py4j retry a dead port
                raise Py4JError(f"the JVM exited with code {self._process.returncode}")
            played = list(self._sim.getActionHistory())
            try:
                self._sim.load(name, variation, self.simplifications, True)
                self._gold = list(self._sim.getGoldActionSequence())
            except Py4JJavaError as e:  # the gold agent threw: its half-played world is no episode's state
                self._gold_error = f"the simulator's gold agent failed ({str(e).splitlines()[0][:200]})"
                self._sim.load(name, variation, self.simplifications, False)
            for action in played:
                self._sim.step(action)
        except Py4JError as e:  # JVM gone, or no answer within `timeout` (building a gold path can be slow)
            self._crash(e)
            self._gold_error = f"the simulator crashed or stopped responding while building it ({self.error[:200]})"
            return
        agent = played[1:]  # after the reset's look around
        while (self._gold and self._cursor < min(len(agent), len(self._gold))
               and agent[self._cursor] == self._gold[self._cursor]):
            self._cursor += 1

    def _crash(self, e: Exception) -> str:
        self.crashed, self.error, self.done, self.success = True, f"{type(e).__name__}: {e}", True, False
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # a hung JVM would keep burning CPU; the next reset starts a new one
        return ("The ScienceWorld simulator crashed or stopped responding; this episode is over "
                f"and cannot be scored. ({self.error.splitlines()[0][:200]})")

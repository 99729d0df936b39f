"""BabyAI: minigrid's BabyAI gridworld levels behind a text interface of high-level actions.

The AgentGym environment wraps 40 BabyAI levels (task id -> level `id % 40`, seed `id // 40`). Every
turn the agent reads a text rendering of its 7x7 egocentric view ("There is a red ball 1 2 steps in
front of you and 1 steps to your left."; the k-th object of a kind carries the number k), its mission
and the high-level actions available right now, and answers with one of them:

    turn left | turn right | move forward | go to <obj> <k> | pickup <obj> <k> | go through <door> <k>
    | toggle and go through <door> <k> | toggle | drop | check available actions

"go to", "pickup" and "go through" are planned by breadth-first search over the cells the agent can
see, then executed as minigrid primitives one by one; execution stops early when a primitive changes
nothing (the way was blocked) or the episode ends. Every primitive counts toward the level's
`max_steps`, so the reward on success is minigrid's own `1 - 0.9 * steps / max_steps`; it is 0
otherwise, and the episode ends on success, on a failed mission or when the steps run out.

Departures from the original wrapper (agentenv-babyai):
- the mission is shown verbatim (the original rewrote "then" and "after you" as "and", which loses
  the order that BeforeInstr/AfterInstr missions check);
- object numbers follow the description order, also in actions, even when an earlier object of the
  same kind is unreachable (the original renumbered reachable objects only, so numbers could disagree);
- BFS only walks on cells seen to be free (the original also walked on unseen cells);
- "go through" ends one step beyond the door rather than on it; "toggle" also opens boxes (KeyInBox);
- "pick up" is accepted as well as "pickup" (the original prompt said one, the parser wanted the other),
  and a missing number means 1.

The levels are the original's, seed for seed (docs/babyai.md). Its level 3, `BabyAI-GoToObjS6-v0`, was
registered by the minigrid it ran on (2.1-2.3.1) as GoToObj with room size 4, which is minigrid 3.x's
`GoToObjS4-v0` (3.x refuses -v0, and its `GoToObjS6-v1` is another task: room size 6). minigrid is
pinned to 3.1.0: 3.2.0 changed how the Synth and Boss levels draw their missions (a locked room of a
rejected draw no longer carries over to the next draw), so some seeds got other missions. Each reset
builds its level anew, as the original server did (a reused level would carry state between tasks).

Task ids are AgentGym's own (`babyai_<n>` is task n here: level `n % 40`, seed `n // 40`; the
train split below is ids 0..39,999). `parser="agentgym"` (set by
`--prompt-style agentgym`) extracts the action as the original client did: the text after the first
`Action:` (`envs.agentgym_action`); the default takes the first line after a single `Action:`.

Splits: train = seeds 0..999 of every level, validation ("val") = seeds 50000..50004 and test = seeds
100000..100004 (200 tasks each), disjoint; "fresh" = seeds 200000..200009 (400 tasks), the held-out test of
the finite-demonstrations protocol (lab/protocol.py), outside every split and screen before it. The
paper tested on 90 tasks, listed in AgentGym-RL-Data-ID's `eval/babyai_test.json`: pass that file with
`--tasks-file` to play exactly those.

Run: `python -m pytest tests/test_babyai.py`.
"""
from __future__ import annotations

from collections import deque

import gymnasium as gym
import minigrid  # noqa: F401  (importing it registers the BabyAI levels with gymnasium)
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT
from minigrid.envs.babyai.core import roomgrid_level

from envs import agentgym_action, parse_action
from envs.babyai_expert import BabyAIExpert

# minigrid prints "Sampling rejected: ..." from level generation. Swapping sys.stdout around reset()
# (contextlib.redirect_stdout) is process-global and races when several envs reset in threads (one
# thread can restore another's buffer and lose stdout for good), so shadow `print` in that one module.
roomgrid_level.print = lambda *args, **kwargs: None

# (level, family); the order is the original's level list, so task id % 40 picks the same level. Level 3
# is the original's BabyAI-GoToObjS6-v0, which minigrid <= 2.3.1 registered as GoToObj(room_size=4):
# the same as GoToObjS4-v0 (tests/test_agentgym_ids.py builds it from the class to check).
LEVELS = [
    ("GoToRedBallGrey-v0", "GoTo"), ("GoToRedBall-v0", "GoTo"), ("GoToRedBallNoDists-v0", "GoTo"),
    ("GoToObjS4-v0", "GoTo"), ("GoToLocalS8N7-v0", "GoTo"), ("GoToObjMazeS7-v0", "GoTo"),
    ("GoToImpUnlock-v0", "GoTo"), ("GoToSeqS5R2-v0", "GoTo"), ("GoToRedBlueBall-v0", "GoTo"),
    ("GoToDoor-v0", "GoTo"), ("GoToObjDoor-v0", "GoTo"), ("Open-v0", "Open"), ("OpenRedDoor-v0", "Open"),
    ("OpenDoorLoc-v0", "Open"), ("OpenRedBlueDoorsDebug-v0", "Open"), ("OpenDoorsOrderN4Debug-v0", "Open"),
    ("Pickup-v0", "Pickup"), ("UnblockPickup-v0", "Pickup"), ("PickupLoc-v0", "Pickup"),
    ("PickupDistDebug-v0", "Pickup"), ("PickupAbove-v0", "Pickup"), ("PutNextLocalS6N4-v0", "PutNext"),
    ("PutNextS7N4Carrying-v0", "PutNext"), ("Unlock-v0", "Unlock"), ("UnlockLocalDist-v0", "Unlock"),
    ("KeyInBox-v0", "Unlock"), ("UnlockPickupDist-v0", "Unlock"), ("BlockedUnlockPickup-v0", "Unlock"),
    ("UnlockToUnlock-v0", "Unlock"), ("ActionObjDoor-v0", "Synth"), ("FindObjS7-v0", "Pickup"),
    ("KeyCorridorS6R3-v0", "Unlock"), ("OneRoomS20-v0", "Pickup"), ("MoveTwoAcrossS8N9-v0", "PutNext"),
    ("SynthS5R2-v0", "Synth"), ("SynthLoc-v0", "Synth"), ("SynthSeq-v0", "Synth"),
    ("MiniBossLevel-v0", "Boss"), ("BossLevel-v0", "Boss"), ("BossLevelNoUnlock-v0", "Boss"),
]
TRAIN_SEEDS = range(0, 1000)
TEST_SEEDS = range(100_000, 100_005)
VAL_SEEDS = range(50_000, 50_005)  # in-training evaluation and recipe choices; test is for final tables
# "fresh": 400 tasks that no published run, screen or recipe choice has seen (lab/protocol.py's test)
FRESH_SEEDS = range(200_000, 200_010)

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = 0, 1, 2, 3, 4, 5  # minigrid's action indices
VIEW = 7                             # minigrid's default agent_view_size
AGENT = (VIEW // 2, VIEW - 1)        # the agent's cell in the egocentric image; it faces -y
HEADINGS = [(0, -1), (1, 0), (0, 1), (-1, 0)]  # forward, right, back, left in image coordinates
PORTABLE = ("key", "ball", "box")

INSTRUCTION = """You are an exploration master that wants to finish every goal you are given. You are placed \
in a grid world of rooms and must accomplish a goal with actions. Every round you get an observation: what \
you see in front of you (objects are numbered per kind, e.g. "red ball 1"), what you carry, and the actions \
available now. Reply with your thought and exactly one action.

Actions:
- turn left / turn right: turn in place.
- move forward: move one step forward.
- go to <obj> <id>: walk until you face the object, e.g. "go to red ball 1".
- pickup <obj> <id>: walk to the object and pick it up (you can carry one object).
- go through <door> <id>: walk through an open door.
- toggle and go through <door> <id>: open a closed or locked door and walk through it; a locked door needs a \
key of the door's color in your hands.
- toggle: open or close the door right in front of you, or open the box in front of you.
- drop: put the carried object on the free cell in front of you.
- check available actions: list the actions you can take now.

Your reply must use exactly this format:
Thought:
<your reasoning>

Action:
<one action>"""


# The same contract in a quarter of the tokens (about 90 with SmolLM2's tokenizer, against 300): every
# episode carries the instruction, and on a 2-core CPU each of its tokens is paid in every training
# forward and backward. Opt-in (`brief=True`), for the CPU learning recipe.
BRIEF_INSTRUCTION = """You act in a grid world to reach the goal. Each turn, reply with one action:
turn left, turn right, move forward, go to <obj> <id>, pickup <obj> <id>, go through <door> <id>, \
toggle and go through <door> <id>, toggle, drop, check available actions.

Format:
Thought:
<short reasoning>

Action:
<one action>"""


# ---- the text view -------------------------------------------------------------------------------

def visible_objects(image) -> list[dict]:
    """Doors, keys, balls and boxes in the (7, 7, 3) egocentric image, nearest first, numbered per name."""
    objects = []
    for x in range(VIEW):
        for y in range(VIEW):
            if (x, y) == AGENT:  # minigrid draws the carried object on the agent's cell
                continue
            kind, color, state = (int(v) for v in image[x, y])
            kind = IDX_TO_OBJECT[kind]
            if kind not in PORTABLE and kind != "door":
                continue
            door_state = ("open", "closed", "locked")[state] + " " if kind == "door" else ""
            name = f"{IDX_TO_COLOR[color]} {door_state}{kind}"
            objects.append({"name": name, "kind": kind, "color": IDX_TO_COLOR[color],
                            "state": door_state.strip(), "cell": (x, y),
                            "front": AGENT[1] - y, "right": x - AGENT[0]})
    objects.sort(key=lambda o: (abs(o["front"]) + abs(o["right"]), o["front"], o["right"]))
    counts: dict[str, int] = {}
    for obj in objects:
        counts[obj["name"]] = counts.get(obj["name"], 0) + 1
        obj["label"] = f"{obj['name']} {counts[obj['name']]}"
    return objects


def describe(image, objects: list[dict], carrying) -> str:
    """The original's sentence style: objects with their offsets, the wall ahead, what is carried."""
    parts = []
    if objects:
        parts.append("In front of you in this room, you can see several objects:")
        for o in objects:
            if o["right"] == 0:
                where = f"right in front of you {o['front']} steps away."
            else:
                side = "right" if o["right"] > 0 else "left"
                where = f"{o['front']} steps in front of you and {abs(o['right'])} steps to your {side}."
            parts.append(f"There is a {o['label']} {where}")
    else:
        parts.append("You cannot see any objects within sight.")
    parts.append("The room has walls around you.")
    for steps in range(1, VIEW):  # the first wall straight ahead, if the agent can see it
        kind = IDX_TO_OBJECT[int(image[AGENT[0], AGENT[1] - steps, 0])]
        if kind == "wall":
            parts.append(f"You are facing a wall {steps} steps away.")
        if kind != "empty":
            break
    parts.append(f"You are carrying a {carrying.color} {carrying.type}." if carrying
                 else "You are not carrying anything.")
    return " ".join(parts)


# ---- planning inside the view --------------------------------------------------------------------

def _free(image, cell) -> bool:
    """A cell the agent has seen and may stand on: empty floor or an open door."""
    x, y = cell
    if not (0 <= x < VIEW and 0 <= y < VIEW):
        return False
    if cell == AGENT:
        return True
    kind, _, state = (int(v) for v in image[x, y])
    return IDX_TO_OBJECT[kind] in ("empty", "floor", "goal") or (IDX_TO_OBJECT[kind] == "door" and state == 0)


def plan_to_face(image, target) -> list[int] | None:
    """Shortest primitive sequence (BFS over cell and heading) that ends facing `target`; None if none."""
    start = (AGENT, 0)
    parent = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (x, y), h = state
        dx, dy = HEADINGS[h]
        if (x + dx, y + dy) == tuple(target):
            path = []
            while parent[state] is not None:
                state, action = parent[state]
                path.append(action)
            return path[::-1]
        for action, nxt in ((FORWARD, ((x + dx, y + dy), h)), (LEFT, ((x, y), (h - 1) % 4)),
                            (RIGHT, ((x, y), (h + 1) % 4))):
            if nxt not in parent and (action != FORWARD or _free(image, nxt[0])):
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None


def available_actions(image, objects: list[dict], carrying) -> tuple[dict[str, list[int]], dict[str, str]]:
    """High-level action -> primitive sequence, and action -> why it is not possible right now."""
    actions: dict[str, list[int]] = {"turn left": [LEFT], "turn right": [RIGHT]}
    errors: dict[str, str] = {}
    ahead = (AGENT[0], AGENT[1] - 1)
    ahead_kind = IDX_TO_OBJECT[int(image[ahead][0])]
    if _free(image, ahead):
        actions["move forward"] = [FORWARD]
    else:
        errors["move forward"] = f"You cannot move forward: there is a {ahead_kind} in front of you."
    for o in objects:
        label, path = o["label"], plan_to_face(image, o["cell"])
        verbs = ["go to"] + (["pickup"] if o["kind"] in PORTABLE else [])
        if o["kind"] == "door":
            verbs.append("go through" if o["state"] == "open" else "toggle and go through")
        if path is None:
            for verb in verbs:
                errors[f"{verb} {label}"] = f"You cannot {verb} {label}: there is no path to it in your view."
            continue
        if path:
            actions[f"go to {label}"] = path
        else:
            errors[f"go to {label}"] = f"You are already facing {label}."
        if o["kind"] in PORTABLE:
            if carrying is None:
                actions[f"pickup {label}"] = path + [PICKUP]
            else:
                errors[f"pickup {label}"] = (f"You cannot pick up {label}: you are already carrying a "
                                             f"{carrying.color} {carrying.type}. Drop it first.")
        elif o["state"] == "open":
            actions[f"go through {label}"] = path + [FORWARD, FORWARD]
        elif o["state"] == "closed" or (carrying and carrying.type == "key" and carrying.color == o["color"]):
            actions[f"toggle and go through {label}"] = path + [TOGGLE, FORWARD, FORWARD]
        else:
            errors[f"toggle and go through {label}"] = (f"You cannot open {label}: you need to carry a "
                                                        f"{o['color']} key.")
    _, ahead_color, ahead_state = (int(v) for v in image[ahead])
    locked = ahead_kind == "door" and ahead_state == 2
    if locked and not (carrying and carrying.type == "key" and carrying.color == IDX_TO_COLOR[ahead_color]):
        errors["toggle"] = f"The door in front of you is locked: you need to carry a {IDX_TO_COLOR[ahead_color]} key."
    elif ahead_kind in ("door", "box"):
        actions["toggle"] = [TOGGLE]
    else:
        errors["toggle"] = "There is nothing to toggle in front of you."
    if carrying is None:
        errors["drop"] = "You cannot drop anything: you are not carrying anything."
    elif ahead_kind == "empty":
        actions["drop"] = [DROP]
    else:
        errors["drop"] = f"You cannot drop here: there is a {ahead_kind} in front of you."
    actions["check available actions"] = []
    return actions, errors


def normalise(action: str) -> str:
    """Lower-case, single spaces, no quotes or final period; 'pick up' -> 'pickup'."""
    action = " ".join(action.lower().strip().strip("\"'`").rstrip(".").split())
    return action.replace("pick up", "pickup")


# ---- the environment -----------------------------------------------------------------------------

class BabyAI:
    """One BabyAI episode at a time, on a minigrid level built anew by each reset."""

    instruction = INSTRUCTION
    refused = False  # True after a step whose action was not carried out (rollout counts these turns)

    def __init__(self, list_actions: bool = True, brief: bool = False, parser: str = "ours"):
        if parser not in ("ours", "agentgym"):
            raise ValueError(f"unknown BabyAI parser {parser!r}; choose 'ours' or 'agentgym'")
        self.parser = parser              # "agentgym": the text after the first `Action:`, as the original client
        self.list_actions = list_actions  # append the available actions to every observation (original)
        self.instruction = BRIEF_INSTRUCTION if brief else INSTRUCTION
        self.success = False
        self.env = None
        self.done = True
        self.reward = 0.0
        self._expert = None  # envs.babyai_expert.BabyAIExpert for the current episode, made on demand

    # -- task metadata
    def tasks(self, split: str) -> list[int]:
        seeds = {"train": TRAIN_SEEDS, "val": VAL_SEEDS, "test": TEST_SEEDS, "fresh": FRESH_SEEDS}.get(split)
        if seeds is None:
            raise ValueError(f"BabyAI has splits 'train', 'val', 'test' and 'fresh', not {split!r}")
        return [seed * len(LEVELS) + level for seed in seeds for level in range(len(LEVELS))]

    def subtask(self, task_id: int) -> str:
        return LEVELS[task_id % len(LEVELS)][1]

    def level(self, task_id: int) -> str:
        return "BabyAI-" + LEVELS[task_id % len(LEVELS)][0]

    # -- episode
    def reset(self, task_id: int) -> str:
        # A new level object each time (cheap: docs/environments.md), as the original server made one per
        # reset: minigrid <= 3.1 keeps the last locked room of a Synth or Boss level across resets, so a reused
        # object would make a task's mission depend on the tasks played before it.
        if self.env is not None:
            self.env.close()
        self.env = gym.make(self.level(task_id)).unwrapped  # no wrappers: we drive it
        obs, _ = self.env.reset(seed=task_id // len(LEVELS))
        self.success, self.done, self.reward, self.refused = False, False, 0.0, False
        self._expert = None
        self._observe(obs["image"])
        return f"Your goal: {self.env.mission}\n{self._render('')}"

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.env is None or self.done:
            return "The episode is over. Start a new one with reset().", self.reward, True
        action, error = (agentgym_action if self.parser == "agentgym" else parse_action)(text)
        self.refused = True  # until the action is found among the available ones (rollout counts refusals)
        if error:
            return self._render(error), self.reward, False
        action = normalise(action)
        if action.startswith("check"):
            self.refused = False
            return "You can take the following actions: " + ", ".join(self.actions), self.reward, False
        if action not in self.actions and f"{action} 1" in self.actions:
            action = f"{action} 1"
        if action not in self.actions:
            reason = self.errors.get(action, f"'{action}' is not a recognised action right now.")
            return self._render(reason + " Choose one of the available actions."), self.reward, False
        self.refused = False
        return self._execute(action)

    def _execute(self, action: str) -> tuple[str, float, bool]:
        env, note, obs, truncated = self.env, "", None, False
        for primitive in self.actions[action]:
            before = _snapshot(env)
            obs, reward, terminated, truncated, _ = env.step(primitive)
            if terminated or truncated:
                self.done, self.success, self.reward = True, terminated and reward > 0, float(reward)
                break
            if _snapshot(env) == before:  # the primitive did nothing: stop rather than walk a stale plan
                note = f"You could not finish '{action}': something was in the way. "
                break
        self._observe(obs["image"])
        if self.success:
            note += "The task is completed. "
        elif self.done:
            note += "You ran out of steps. " if truncated else "The mission failed. "
        return self._render(note), self.reward, self.done

    def _observe(self, image) -> None:
        objects = visible_objects(image)
        self.description = describe(image, objects, self.env.carrying)
        self.actions, self.errors = available_actions(image, objects, self.env.carrying)

    def _render(self, note: str) -> str:
        text = (note.strip() + "\n" if note.strip() else "") + self.description
        if self.list_actions:
            text += "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in self.actions) + "]"
        return text

    def expert(self) -> str:
        """The expert's reply ('Thought:\\n...\\n\\nAction:\\n<action>') for the current state; see
        envs/babyai_expert.py. Its state lives until the next reset."""
        if self._expert is None:
            self._expert = BabyAIExpert(self)
        return self._expert.reply()

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
        self.env = None


def _snapshot(env) -> tuple:
    """What any primitive can change: position, heading, the carried object, the cell ahead."""
    ahead = env.grid.get(*env.front_pos)
    return (tuple(env.agent_pos), env.agent_dir, id(env.carrying), ahead.encode() if ahead else None)

"""An expert for the BabyAI text environment (envs/babyai.py), to make behaviour-cloning demonstrations.

minigrid ships a BabyAI bot (`minigrid.utils.baby_ai_bot.BabyAIBot`) that solves almost every level one
primitive at a time (turn left, turn right, forward, pickup, drop, toggle). Our agent acts through
high-level text actions instead ("go to red ball 1" = a whole walk), so the expert translates:

- it keeps a *shadow*: a deep copy of the unwrapped minigrid level plus a bot driving it, stepped in
  lockstep with the real level, and the bot's suggestion for the next primitive;
- each turn it deep-copies the shadow and lets the bot run ahead on the copy, which gives the bot's plan
  P as a list of primitives (up to HORIZON of them, or until the copy's episode ends);
- among the text actions available right now it takes the one whose primitive list is the longest
  prefix of P: walking to an object the bot is heading for becomes one "go to ..."/"pickup ..." action,
  and a single primitive ("turn left", "move forward", "toggle", "drop") matches P[:1] whenever the
  wrapper offers it;
- it advances the shadow by exactly those primitives, telling the bot each primitive taken (`replan`);
- before planning it compares the shadow with the real level (agent, carried object, grid, step count)
  and rebuilds the shadow from a deep copy of the real level and a fresh bot if they differ, e.g. when
  somebody else's action was executed in between, or a wrapper action stopped early (the new bot
  keeps the old one's map of seen cells, so it does not look around all over again).

The bot's gaps, and how the expert covers them:
- it may give up (asserts, an error after a box was opened) or replan forever (a stack that grows
  without end; `PushCountingStack` turns that into an error); the shadow is then rebuilt with a fresh
  bot that keeps the old bot's map of seen cells, and if that bot gives up at once it first opens
  the nearest locked door whose key it has seen (UnlockToUnlock: the bot otherwise keeps walking to the
  door whose key lies behind the other one; `open_known_locked_door`);
- it cannot see a key hidden in a box (KeyInBox): the expert puts "walk to the box and open it" on
  top of its plan (`open_key_boxes_first`);
- it does not know that it may already hold the object a "put" mission moves (PutNextS7N4Carrying;
  `skip_held_pickup`);
- when no text action matches at all (the bot wants 'done', gave up for good, or wants a primitive
  the wrapper does not offer right now), `fallback` walks on or turns.

Everything is deterministic given the task id: the bot has no randomness and the copies carry the
level's random generator along.

Use: `BabyAI.expert()` returns the reply text for the current state; or `BabyAIExpert(env).reply()`.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.verifier import ObjDesc
from minigrid.utils.baby_ai_bot import (BabyAIBot, DisappearedBoxError, GoNextToSubgoal, OpenSubgoal,
                                        PickupSubgoal, Subgoal)

DONE = 6        # minigrid's 'done' primitive: the bot's "I think the mission is complete"
HORIZON = 40    # the longest plan we look at; text actions are much shorter than this in practice
MAX_PUSHES = 100  # subgoals one replan may push before we call it a loop (a normal replan pushes < 20)
COLORS = "red|green|blue|purple|yellow|grey"


class BotLoops(Exception):
    """The bot's replanning went round in circles (see `PushCountingStack`)."""


class PushCountingStack(list):
    """The bot's subgoal stack, counting pushes so that a replanning loop ends in an error.

    `BabyAIBot.replan` keeps replanning while subgoals push new ones, and that need not end: e.g. a
    locked door whose key is behind that same door (unseen) makes it push "get the key", "explore",
    "open the nearest closed door" (that door again), "get the key", ... forever, with the stack and
    the memory growing without bound.
    """

    pushes = 0

    def append(self, subgoal):
        self.pushes += 1
        if self.pushes > MAX_PUSHES:
            raise BotLoops(f"more than {MAX_PUSHES} subgoals pushed in one replan")
        super().append(subgoal)


# What the bot raises when it cannot plan: asserts ("nothing left to explore", "no object matching the
# description" when a key is hidden in a box), its own error after a box was opened, and our loop guard.
BOT_GAVE_UP = (AssertionError, DisappearedBoxError, BotLoops)


@dataclass
class Shadow:
    env: object              # a private deep copy of the unwrapped minigrid level
    bot: BabyAIBot           # the bot driving `env`
    next_action: int | None  # the bot's suggestion for the current state; None when it gave up


# ---- the shadow ----------------------------------------------------------------------------------

def new_shadow(real_env, seen=None) -> Shadow:
    """A fresh bot on a deep copy of the real level, already asked for its first primitive.

    `seen` is the previous bot's map of cells seen so far: the new bot keeps it, so that it does not
    look around again (a fresh bot starts by exploring). When the bot gives up at once, e.g. it goes
    round in circles between two locked doors, it gets a second chance with a detour first.
    """
    shadow = fresh_shadow(real_env, seen, detour=False)
    if shadow.next_action is None:
        shadow = fresh_shadow(real_env, seen, detour=True)
    return shadow


def fresh_shadow(real_env, seen, detour: bool) -> Shadow:
    env = copy.deepcopy(real_env)
    bot = BabyAIBot(env)
    bot.stack = PushCountingStack(bot.stack)
    if seen is not None:
        bot.vis_mask |= seen
    skip_held_pickup(bot, env)
    open_key_boxes_first(bot, env)
    if detour and not open_known_locked_door(bot, env):
        return Shadow(env, bot, None)
    return Shadow(env, bot, replan(bot, None))


def skip_held_pickup(bot: BabyAIBot, env) -> None:
    """Drop 'walk to X, pick X up' from the top of the plan when X is already in the agent's hands.

    The bot plans "put X next to Y" as go-to X, pickup, go-to Y, drop; when the level starts with X
    in hand (PutNextS7N4Carrying, or a rebuild mid-mission) it would search for X forever.
    """
    if len(bot.stack) < 2 or env.carrying is None:
        return
    top, below = bot.stack[-1], bot.stack[-2]
    if (isinstance(top, GoNextToSubgoal) and isinstance(top.datum, ObjDesc)
            and isinstance(below, PickupSubgoal)
            and any(obj is env.carrying for obj in top.datum.obj_set)):
        del bot.stack[-2:]


class OpenBoxSubgoal(Subgoal):
    """Toggle the box in front of the agent, which the bot never does on its own."""

    def replan_before_action(self):
        return self.actions.toggle

    def replan_after_action(self, action_taken):
        if action_taken in (None, self.actions.toggle):
            self.bot.stack.pop()


def open_key_boxes_first(bot: BabyAIBot, env) -> None:
    """Put 'walk to the box, open it' on top of the plan when a key is hidden in a box (KeyInBox).

    The bot only looks for keys lying on the grid, so it gives up on a locked door whose key is in a
    box. Once the box is open the bot's next replan raises (it treats any opened box as a lost
    object); the expert then rebuilds the shadow with a fresh bot, which sees the key on the floor.
    """
    for box in env.grid.grid:
        if box is not None and box.type == "box" and box.contains is not None and box.contains.type == "key":
            bot.stack.append(OpenBoxSubgoal(bot))
            bot.stack.append(GoNextToSubgoal(bot, box))  # explores until it sees the box, if need be
            return


def open_known_locked_door(bot: BabyAIBot, env) -> bool:
    """Put 'open the nearest locked door whose key the bot has seen' on top of the plan, if there is one.

    The bot explores by opening the nearest closed door; when that door is locked and its key is
    behind another locked door (UnlockToUnlock), it loops: get the key, explore, the nearest door, get
    the key, ... Opening the door it does have a key for first breaks the circle.
    """
    doors, keys = [], set()
    for i, j in zip(*bot.vis_mask.nonzero()):
        cell = env.grid.get(i, j)
        if cell is not None and cell.type == "door" and cell.is_locked:
            doors.append((abs(i - env.agent_pos[0]) + abs(j - env.agent_pos[1]), int(i), int(j), cell))
        elif cell is not None and cell.type == "key":
            keys.add(cell.color)
    if env.carrying is not None and env.carrying.type == "key":
        keys.add(env.carrying.color)
    for *_, door in sorted(doors, key=lambda d: d[:3]):
        if door.color in keys:
            bot.stack.append(OpenSubgoal(bot))
            bot.stack.append(GoNextToSubgoal(bot, door, reason="Open"))  # fetches the key on its own
            return True
    return False


def replan(bot: BabyAIBot, action_taken: int | None) -> int | None:
    """The bot's next primitive after `action_taken`; None when it gives up (its state is then spoiled)."""
    bot.stack.pushes = 0
    try:
        return bot.replan(action_taken)
    except BOT_GAVE_UP:
        return None


def same_state(a, b) -> bool:
    """Whether two copies of a level are in the same state, as far as the bot and the episode care."""
    carried = [(env.carrying.type, env.carrying.color) if env.carrying else None for env in (a, b)]
    return (tuple(a.agent_pos) == tuple(b.agent_pos) and a.agent_dir == b.agent_dir
            and carried[0] == carried[1] and a.step_count == b.step_count
            and (a.grid.encode() == b.grid.encode()).all())


def roll(shadow: Shadow, candidates: list[list[int]]) -> tuple[list[int], bool]:
    """The bot's plan from the shadow's state, run on a throwaway copy; and whether it ends in success.

    Rolling stops early once no candidate (the primitive lists of the available text actions) can
    still match a longer prefix: looking further could not change the choice, and replans cost time.
    """
    env, bot = copy.deepcopy((shadow.env, shadow.bot))  # together, so the copied bot drives the copy
    action, plan = shadow.next_action, []
    while action not in (None, DONE) and len(plan) < HORIZON and could_extend(plan, candidates):
        plan.append(action)
        _, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return plan, terminated and reward > 0
        action = replan(bot, action)
    return plan, False


def could_extend(plan: list[int], candidates: list[list[int]]) -> bool:
    return any(len(c) > len(plan) and c[:len(plan)] == plan for c in candidates)


def advance(shadow: Shadow, primitives: list[int]) -> None:
    """Step the shadow's level by `primitives`, telling the bot each one, as the real level will be."""
    for primitive in primitives:
        _, _, terminated, truncated, _ = shadow.env.step(primitive)
        if terminated or truncated:
            shadow.next_action = None
            return
        shadow.next_action = replan(shadow.bot, primitive)


def best_match(actions: dict[str, list[int]], plan: list[int], success: bool) -> str | None:
    """The available text action whose primitives are the longest prefix of the plan.

    Ties (e.g. "move forward" and "go to red ball 1" are both one step) go to the first listed action,
    i.e. the plain move, unless the step completes the mission: then naming the object is the better
    demonstration.
    """
    best, best_key = None, (0, False)
    for name, primitives in actions.items():
        if not primitives or plan[:len(primitives)] != primitives:
            continue
        finishes_on_object = success and len(primitives) == len(plan) and name[-1].isdigit()
        key = (len(primitives), finishes_on_object)
        if key > best_key:
            best, best_key = name, key
    return best


# ---- thoughts ------------------------------------------------------------------------------------
# A target is (color or "", kind) of an object, EXPLORE, or None (a bare cell: a free spot to drop
# something on, or a cell next to a door the bot is returning to).

EXPLORE = "explore"


def bot_intent(bot: BabyAIBot | None):
    """What the bot's current subgoal heads for (it is the subgoal that suggested the next primitive)."""
    subgoal = bot.stack[-1] if bot is not None and bot.stack else None
    if not isinstance(subgoal, GoNextToSubgoal):
        return None
    if subgoal.reason == "Explore":
        return EXPLORE
    if isinstance(subgoal.datum, ObjDesc):
        return subgoal.datum.color or "", subgoal.datum.type or "object"
    if isinstance(subgoal.datum, WorldObj):
        return subgoal.datum.color, subgoal.datum.type
    return None


def matches(target, color: str, kind: str) -> bool:
    return isinstance(target, tuple) and target[0] in ("", color) and target[1] in ("object", kind)


def name(target: tuple[str, str]) -> str:
    return " ".join(["the"] + [word for word in target if word])


def in_mission(color: str, kind: str, mission: str) -> bool:
    """Whether the mission names an object like this one ('a red ball', 'the ball', 'an object')."""
    named = re.findall(rf"(?:\b({COLORS}) )?\b(ball|box|key|door|object)\b", mission)
    return any(matches(target, color, kind) for target in named)


def thought(action: str, intent, finishes: bool, real_env) -> str:
    """One short sentence on why `action`: what kind of action, on what, towards what."""
    for verb in ("toggle and go through", "go through", "go to", "pickup"):
        if action.startswith(verb + " "):
            return object_thought(verb, action[len(verb) + 1:], intent, finishes, real_env.mission)
    if action == "toggle":
        return toggle_thought(real_env.grid.get(*real_env.front_pos), finishes)
    if action == "drop":
        return drop_thought(real_env.carrying, finishes, real_env.mission)
    return move_thought(action, intent)


def object_thought(verb: str, label: str, intent, finishes: bool, mission: str) -> str:
    words = label.split()  # "red closed door 1"
    color, kind = words[0], words[-2]
    if verb == "go to":
        door_on_the_way = kind == "door" and not in_mission(color, kind, mission)
        if door_on_the_way and matches(intent, color, kind) and not finishes:
            return f"I walk to the {label} to {'unlock' if 'locked' in words else 'open'} it."
        if finishes or matches(intent, color, kind):
            return f"The {label} is in view; I walk to it."
        if intent == EXPLORE:
            return f"I walk to the {label} to explore further."
        return f"I walk to the {label} on my way to {name(intent)}." if intent else f"I walk to the {label}."
    if verb == "pickup":
        if finishes:
            return f"The {label} is what I must pick up; I take it."
        if in_mission(color, kind, mission):
            return f"I pick up the {label}, which my goal needs."
        return f"I pick up the {label} to {'unlock a door' if kind == 'key' else 'clear the way'}."
    if verb == "go through":
        text = f"I go through the {label}"
    elif "locked" in words:
        text = f"I unlock the {label} and go through it"
    else:
        text = f"I open the {label} and go through it"
    if intent in (None, EXPLORE) or matches(intent, color, kind):
        return text + " to explore."
    return text + f" towards {name(intent)}."


def toggle_thought(front, finishes: bool) -> str:
    """`front` is the box or door the wrapper lets us toggle (it offers "toggle" for nothing else)."""
    if front.type == "box":
        return "A box may hide what I need; I open it."
    door = f"{front.color} door"
    if finishes:
        return f"Opening the {door} in front of me completes my goal."
    if front.is_open:
        return f"I close the {door} in front of me."
    if front.is_locked:
        return f"I unlock the {door} with my key."
    return f"I open the {door} in front of me."


def drop_thought(carrying, finishes: bool, mission: str) -> str:
    what = f"{carrying.color} {carrying.type}" if carrying else "object"
    if finishes:
        return f"I put the {what} down here; that completes my goal."
    if carrying and in_mission(carrying.color, carrying.type, mission):
        return f"I put the {what} down for now to free my hands."
    return f"I drop the {what} out of the way."


def move_thought(action: str, intent) -> str:
    turn = action.startswith("turn")
    if intent == EXPLORE:
        return ("I cannot see what I need yet; I turn to look around." if turn
                else "I cannot see what I need yet; I explore ahead.")
    if intent:
        return f"I {'turn' if turn else 'step'} towards {name(intent)}."
    return "I turn to get into position." if turn else "I step into position."


# ---- the expert ----------------------------------------------------------------------------------

def fallback(actions: dict[str, list[int]]) -> tuple[str, str]:
    """An action when the bot has no usable plan: walk on, or turn where the way is blocked."""
    if "move forward" in actions:
        return "I have no plan yet; I move on to look around.", "move forward"
    return "I have no plan yet; I turn to look around.", "turn left"


class BabyAIExpert:
    """The expert for one episode of a `BabyAI` wrapper; make a new one after every reset."""

    def __init__(self, wrapper):
        self.wrapper = wrapper
        self.shadow: Shadow | None = None
        self.seen = None  # the latest bot's map of seen cells, handed on when the shadow is rebuilt

    def reply(self) -> str:
        thought_text, action = self.act()
        return f"Thought:\n{thought_text}\n\nAction:\n{action}"

    def act(self) -> tuple[str, str]:
        """(thought, text action) for the wrapper's current state; advances the shadow accordingly."""
        wrapper = self.wrapper
        if wrapper.env is None or wrapper.done:
            raise RuntimeError("the episode is over: reset the environment before asking the expert")
        real = wrapper.env
        shadow = self.shadow
        if shadow is None or shadow.next_action is None or not same_state(shadow.env, real):
            shadow = self.shadow = new_shadow(real, self.seen)
            self.seen = shadow.bot.vis_mask  # updated in place as this bot looks around
        actions = {a: p for a, p in wrapper.actions.items() if p and not a.startswith("check")}
        plan, success = [], False
        if shadow.next_action is not None:
            plan, success = roll(shadow, list(actions.values()))
        action = best_match(actions, plan, success)
        if action is None:
            # The bot wants 'done', gave up, or wants a primitive no text action offers right now; its
            # plan no longer says what will happen, so act on our own and rebuild the shadow next turn.
            self.shadow = None
            return fallback(actions)
        intent = bot_intent(shadow.bot)
        finishes = success and len(actions[action]) == len(plan)
        text = thought(action, intent, finishes, real)
        advance(shadow, actions[action])
        return text, action

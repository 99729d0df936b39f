"""AgentGym-RL's task ids, mapped to this project's: what `--tasks-file` of train.py and evaluate.py reads.

AgentGym-RL's data (the AgentGym-RL-Data-ID dataset: `train/<env>_train.json`, `eval/<env>_test.json`)
lists tasks as `[{"item_id": "sciworld_17"}, ...]`, where the number is the index the original env
server takes in `reset`. A tasks file here is such a list; its entries may also be plain strings
("sciworld_17") or plain integers (17), which are read as the same AgentGym index. Every entry must
name the env being run. Duplicates are dropped, the order is kept.

How an index maps, per env (`task_id`), exact or refused:
- sciworld: the original server lists every variation of the 23 task types it keeps, in the
  simulator's task order; `envs.sciworld.agentgym_task` walks the same list. Exact.
- babyai: level `n % 40` of the original's 40, seed `n // 40`, the rule used here too, on the original's
  levels: its level 3 (`BabyAI-GoToObjS6-v0`, which the minigrid it ran on built with room size 4) is
  `GoToObjS4-v0` here, and minigrid is pinned to 3.1.0, whose missions are the original's. Checked grid
  for grid on 3,953 random ids of all 40 levels against minigrid 2.3.1 (docs/babyai.md). Ids below
  40,000 are this project's train split (seeds 0-999): evaluate.py refuses to score a run on tasks it
  trained on.
- searchqa: the original Search-R1 server numbers the train rows of its data, then the test rows
  (its ids run 0..221,327 = 169,615 train + 51,713 test). SearchQA numbers `qa_train` then `qa_test`
  rows the same way, so with the same data files (env options) the mapping is exact; with the
  built-in stand-in questions there is nothing to map to, and it is refused.
- textcraft: refused. The original's goal order came from the file system's listing order of the
  recipe files (which also changed which recipes were kept), so its ids name different goals on
  different machines.
- webarena: `webarena_<n>` is config n of the 812 WebArena tasks on self-hosted sites. With the real
  configs loaded (`configs` option, e.g. "webarena" with the sites' URLs) it is task n. Exact. On the
  simulated sites, refused: they generate their own tasks, none of which is config n.

Test: `python -m pytest tests/test_agentgym_ids.py`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

_ITEM = re.compile(r"^(.+)_(\d+)$")
WHY_NOT = {
    "textcraft": ("TextCraft's AgentGym ids cannot be mapped: the original ordered its goals by the file "
                  "system's listing of the recipe files, which differs between machines"),
    "webarena": ("webarena ids name configs of the real WebArena (812 tasks on self-hosted sites); the "
                 "simulated sites here have their own generated tasks and none of those configs; load them with "
                 "--env-options '{\"configs\": \"webarena\", \"sites\": {...}, \"auth_dir\": ...}'"),
}


def read_items(path: str | Path, env: str) -> list[int]:
    """The AgentGym indices listed in a tasks file for `env`; ValueError (one line) when malformed."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(items, list) or not items:
        raise ValueError('expected a non-empty JSON list like [{"item_id": "sciworld_17"}, ...]')
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            item = item.get("item_id")
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append(item)
            continue
        match = _ITEM.match(item) if isinstance(item, str) else None
        if match is None:
            raise ValueError(f"entry {i} ({items[i]!r}) is not {{\"item_id\": \"<env>_<n>\"}}, \"<env>_<n>\" "
                             "or a non-negative integer")
        if match[1] != env:
            raise ValueError(f"entry {i} names {match[1]!r} ({match[0]}), but the env is {env!r}")
        out.append(int(match[2]))
    return list(dict.fromkeys(out))


def task_id(env: str, n: int, options: dict) -> int:
    """This project's task id of AgentGym's `<env>_<n>`, or ValueError (one line) saying why it has none."""
    if env == "webarena" and options.get("configs"):  # the real configs: task ids are their task_id
        return n
    if env in WHY_NOT:
        raise ValueError(WHY_NOT[env])
    if env == "sciworld":
        from envs.sciworld import agentgym_task
        return agentgym_task(n)
    if env == "babyai":
        return n
    if env == "searchqa":
        files = [options[key] for key in ("qa_train", "qa_test") if options.get(key)]
        if not files:
            raise ValueError("searchqa ids index the rows of the original data (train rows, then test rows); "
                             "give the same files as --env-options qa_train / qa_test (FlashRAG JSONL)")
        rows = sum(_count_rows(f) for f in files)
        if n >= rows:
            raise ValueError(f"searchqa_{n} is past the {rows} rows of {' + '.join(files)}")
        return n
    raise ValueError(f"no AgentGym id mapping is known for env {env!r}")


def task_ids(path: str | Path, env: str, options: dict) -> list[int]:
    """The task ids here of every entry of a tasks file, in order; ValueError (one line) otherwise."""
    return [task_id(env, n, options) for n in read_items(path, env)]


def _count_rows(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror})") from None

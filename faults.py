"""Fault points for the crash-anywhere resume test: SIGKILL this process at a named moment.

    TRAIN_FAULT=<point>:<n>[:<rank>] torchrun ... train.py ...     e.g. TRAIN_FAULT=before_latest:2:0

kills rank <rank> (default 0) the n-th time it reaches `point("<point>")`, as a power cut or the OOM
killer would: no exception, no `finally`, no flush. Unset (every run but the test's), `point` returns
after one comparison. The points:

    rollout_turn      rollout.py, every turn, after generation and before the env steps
    update            train.update, after a mini-batch's backward, before its optimizer step
    checkpoint_write  checkpoint.save, after the model and optimizer files, before the RNG state
    before_latest     checkpoint.save, after the checkpoint's rename, before `latest` moves to it
"""
from __future__ import annotations

import os
import signal
import sys

POINTS = ("rollout_turn", "update", "checkpoint_write", "before_latest")


def _parse(spec: str) -> tuple[str, int, int] | None:
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    count, _, rank = rest.partition(":")
    if name not in POINTS or not count.isdigit() or not (rank or "0").isdigit():
        raise ValueError(f"TRAIN_FAULT={spec!r}: expected <point>:<n>[:<rank>] with point one of {', '.join(POINTS)}")
    return name, int(count), int(rank or 0)


_FAULT = _parse(os.environ.get("TRAIN_FAULT", ""))
_seen: dict[str, int] = {}


def point(name: str) -> None:
    if _FAULT is None or _FAULT[0] != name or _FAULT[2] != int(os.environ.get("RANK", 0)):
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _FAULT[1]:
        print(f"fault point {name} #{_FAULT[1]} reached: SIGKILL rank {_FAULT[2]}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

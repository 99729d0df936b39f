"""Fault points for the crash and fault tests: SIGKILL this process, or fill its disk, at a named moment.

    TRAIN_FAULT=<point>:<n>[:<rank>] torchrun ... train.py ...     e.g. TRAIN_FAULT=before_latest:2:0

kills rank <rank> (default 0) the n-th time it reaches `point("<point>")`, as a power cut or the OOM
killer would: no exception, no `finally`, no flush. Unset (every run but the tests'), `point` returns
after one comparison. The points:

    rollout_turn      rollout.py, every turn, after generation and before the env steps
    update            train.update, after a mini-batch's backward, before its optimizer step
    checkpoint_write  checkpoint.save, after the model and optimizer files, before the RNG state
    before_latest     checkpoint.save, after the checkpoint's rename, before `latest` moves to it
    disk_full         checkpoint.save, after its directory is made: not a kill; from then on the kernel
                      refuses to grow any file of this process (RLIMIT_FSIZE 0: every write fails with
                      EFBIG, as writes to a full disk fail with ENOSPC), so the save meets a real write
                      error in whatever file it writes first (Python ignores the SIGXFSZ that comes with it)
"""
from __future__ import annotations

import os
import signal
import sys

POINTS = ("rollout_turn", "update", "checkpoint_write", "before_latest", "disk_full")


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
    if _seen[name] == _FAULT[1] and name == "disk_full":
        import resource
        print(f"fault point {name} #{_FAULT[1]} reached: rank {_FAULT[2]} can no longer grow files", file=sys.stderr,
              flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    elif _seen[name] == _FAULT[1]:
        print(f"fault point {name} #{_FAULT[1]} reached: SIGKILL rank {_FAULT[2]}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

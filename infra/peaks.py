"""Peak resident memory per phase of a run: which phase (loading, the warm start, generation, the update, the
weight sync, evaluation, a checkpoint) sets a rank's peak, to read beside the memory plan's phases (memplan.py).

    with peaks.phase("update", timing):     # timing["time/update"] += its seconds
        ...
    peaks.of_phases()   # {"update": bytes, ...}: the highest resident size seen inside each phase
    peaks.take()        # the same since the last take (a training step's, for metrics.jsonl)
    peaks.top()         # the process's peak over its whole life

Why: one figure for a whole run (ru_maxrss) said a LoRA run peaked over its plan (figures:
docs/performance.md), but not where; the update step alone matched the plan, so the excess was somewhere
else in the run, and only a phase-by-phase reading could say where.

How: Linux keeps a process's resident high-water mark (VmHWM in /proc/self/status) and resets it to the
current resident size when 5 is written to /proc/self/clear_refs (Linux >= 4.0). Each phase folds the mark
into the phases still open (nested ones count in their parents), then resets it; on leaving, the mark is
its peak. The reset also lowers getrusage's ru_maxrss, so `top` keeps the peaks read before each reset.
Off Linux, or where clear_refs cannot be written, no phase is recorded and `top` is ru_maxrss.
Test: tests/test_peaks.py.
"""
from __future__ import annotations

import contextlib
import resource
import time

_OPEN: list[str] = []          # the phases now running, outermost first
_RSS: dict[str, float] = {}    # phase -> its highest resident bytes so far
_STEP: dict[str, float] = {}   # the same since the last `take`
_TOP = [0.0]                   # the process's peak before the last reset
_WORKS = [True]                # clear_refs can be written


def _status(field: str) -> float | None:
    """A `field:  N kB` line of /proc/self/status, in bytes (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


def resident() -> float:
    """This process's resident bytes now (0 off Linux)."""
    return _status("VmRSS") or 0.0


def mark() -> float:
    """The resident high-water mark since the last reset (or the process's start), in bytes (0 off Linux)."""
    return _status("VmHWM") or 0.0


def _maxrss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KB on Linux


def _fold() -> None:
    """The marks since the last reset into every open phase and into the process's peak."""
    high = mark() or _maxrss()
    _TOP[0] = max(_TOP[0], high, _maxrss())
    for name in _OPEN:
        _RSS[name] = max(_RSS.get(name, 0.0), high)
        _STEP[name] = max(_STEP.get(name, 0.0), high)


def reset() -> bool:
    """Restart the high-water marks from now (the peaks so far kept in `top` and the open phases); False where
    the kernel's mark cannot be reset."""
    _fold()
    if _WORKS[0]:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            _WORKS[0] = False
    return _WORKS[0]


def enter(name: str) -> None:
    """Phase `name` begins: its peak counts from here (max over every time the phase runs)."""
    reset()
    _OPEN.append(name)


def leave() -> None:
    """The innermost open phase ends."""
    _fold()
    _OPEN.pop()


@contextlib.contextmanager
def phase(name: str, seconds: dict | None = None):
    """The code inside counted as phase `name`: its peak resident memory, and, given a dict `seconds`, its
    duration added to seconds["time/" + name] (a training step's timing in metrics.jsonl)."""
    enter(name)
    start = time.perf_counter()
    try:
        yield
    finally:
        if seconds is not None:
            seconds[f"time/{name}"] = seconds.get(f"time/{name}", 0.0) + time.perf_counter() - start
        leave()


def of_phases() -> dict[str, float]:
    """Each phase's peak resident bytes so far ({} where the mark cannot be reset: every phase would read the
    process's peak)."""
    return dict(_RSS) if _WORKS[0] else {}


def take() -> dict[str, float]:
    """Each phase's peak resident bytes since the last take (the phases that ran since), then forgets them."""
    out = dict(_STEP) if _WORKS[0] else {}
    _STEP.clear()
    return out


def top() -> float:
    """The process's peak resident bytes over its whole life, across resets (safe from any thread)."""
    return max(_TOP[0], mark(), _maxrss())


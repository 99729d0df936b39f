"""Environments that fail the way real ones do, for the fault tests of the training loop
(tests/test_faults.py). Each fails once per process, so the next training step shows recovery.

`HangingReset`: the toy Digits env whose first `reset` in this process never returns (a simulator
that hangs at start-up, a page that never loads).
`JVMKilledSciWorld`: the real ScienceWorld env whose JVM is killed with SIGKILL at its first step
in this process (the OOM killer, a JVM crash), before the step is sent to it. That step's reply is
replaced by a valid action, so that it reaches the dead JVM: the tiny model's replies rarely hold one,
and a malformed reply is answered without asking the simulator.
`JVMKilledAtExpert`: the real ScienceWorld env whose JVM is killed when its expert is first asked, before
the gold path is built (tests/test_sciworld.py: one failed demonstration, not a failed run).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil

from envs.sciworld import SciWorld
from tests.support.toy import Digits

_once = threading.Lock()
release = threading.Event()  # an in-process test sets it, so that no hung thread outlives the test


def _first_time() -> bool:
    return _once.acquire(blocking=False)


class HangingReset(Digits):
    def reset(self, task_id: int) -> str:
        if _first_time():
            release.wait()  # forever unless a test releases it: the rollout must give up on it, not wait
        return super().reset(task_id)


def _kill(pid: int) -> None:
    """SIGKILL `pid` and wait until it is dead: delivery is asynchronous, the next call must meet a dead JVM."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:  # py4j's watcher reaped it already
            return
        time.sleep(0.01)


class JVMKilledSciWorld(SciWorld):
    def step(self, text: str) -> tuple[str, float, bool]:
        if self.jvm_pid and _first_time():
            _kill(self.jvm_pid)
            text = "Thought:\nlook\n\nAction:\nlook around"
        return super().step(text)


class JVMKilledAtExpert(SciWorld):
    """The real ScienceWorld env whose JVM is killed the first time this instance's expert is asked,
    before the simulator has built the gold path (the JVM dies during a warm start)."""

    killed = False

    def expert(self) -> str:
        if self.jvm_pid and not self.killed:
            self.killed = True
            _kill(self.jvm_pid)
        return super().expert()

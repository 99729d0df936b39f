"""Calls into environments that may raise or hang: each becomes a value, never the batch's end.

A simulator can raise (a crashed JVM) or never return (a hung page load). `calls` runs env calls in a
thread pool and turns an exception into an error string and a call past its timeout into a
TimeoutError-style one; `replace_env` swaps such an env for a fresh one (a hung one is closed on a thread
nobody waits for). A hung call's thread cannot be stopped from Python: it is abandoned and counted
(`abandoned()`), and train.py / evaluate.py then end their process without waiting for it.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait


def _call(fn, *args):
    """Run an env call, turning any exception into a value: the env boundary must not kill the batch."""
    try:
        return fn(*args), None
    except Exception as exc:  # noqa: BLE001 - any simulator failure becomes a flagged episode
        return None, f"{type(exc).__name__}: {exc}"


_abandoned = 0  # env calls given up on by timeout in this process; their threads may still be running


def abandoned() -> int:
    return _abandoned


def calls(pool: ThreadPoolExecutor, jobs: list[tuple], timeout: float | None) -> list[tuple]:
    """Run each `(fn, *args)` in the pool; [(result, error)] in order. A call that has run for `timeout`
    seconds is given up on with a TimeoutError-style error; so are calls that could not even start
    because every pool thread is stuck (no call started or finished for `timeout` seconds)."""
    global _abandoned
    starts: list[float | None] = [None] * len(jobs)

    def run(i):
        starts[i] = time.monotonic()
        return _call(*jobs[i])

    futures = [pool.submit(run, i) for i in range(len(jobs))]
    if timeout is None:
        return [f.result() for f in futures]
    out: list[tuple | None] = [None] * len(jobs)
    pending, last = set(range(len(jobs))), time.monotonic()  # last: when a call last started or finished
    while pending:
        wait([futures[i] for i in pending], timeout=min(1.0, timeout))
        now = time.monotonic()
        for i in sorted(pending):
            name = getattr(jobs[i][0], "__name__", "call")
            if futures[i].done():
                out[i], last = futures[i].result(), now
            elif starts[i] is not None:
                last = max(last, starts[i])
                if now - starts[i] < timeout:
                    continue
                out[i] = (None, f"TimeoutError: env.{name} did not return within {timeout:g} s")
                _abandoned += 1
            elif now - last >= timeout and futures[i].cancel():
                out[i] = (None, f"TimeoutError: env.{name} could not start within {timeout:g} s (every env "
                                "thread is stuck in an earlier call)")
            else:
                continue
            pending.discard(i)
    return out


def replace_env(env, make_env, hung: bool = False):
    if hung:  # its close may hang as well: let it try on a thread nobody waits for
        threading.Thread(target=_call, args=(env.close,), name="close-hung-env", daemon=True).start()
    else:
        _call(env.close)
    return make_env()

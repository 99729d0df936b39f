"""When a rank dies, one readable line says which, how, at what memory, and the likely cause.

A rank killed by the kernel's out-of-memory killer leaves no traceback of its own: its peers fail in a
collective and torchrun prints a ChildFailedError wall with "Signal 9 (SIGKILL)" somewhere inside it.
Here each rank keeps a heartbeat, a tiny JSON file (its pid, resident memory now and at peak, the memory
plan's figures) rewritten every second in a directory shared by the ranks of one node. Then:

- a surviving rank that finds a peer's process gone (its watcher thread, or the SIGTERM torchrun sends
  to the survivors) prints, once: `error: rank 0 (pid 4242) died: killed by the kernel's out-of-memory
  killer, last seen at 13.3 GB resident (planned peak 5.2 GB, 11.0 GB a rank can have); ...`;
- the launcher, `python -m infra.lifeline [torchrun flags] train.py ...` (what run.sh runs), is torchrun itself
  in-process: when a worker fails it ends with the same line, now with the signal torchrun saw.

The kernel's own log (/dev/kmsg, readable as root) confirms an out-of-memory kill by pid when it can be
read; otherwise a SIGKILL at a resident size near the rank's share is reported as the likely cause.
Only ranks on this node are watched (a pid means nothing on another machine).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch.distributed as dist

from infra import console, peaks
from infra.distributed import print0
from infra.envcalls import abandoned

GB = 2**30
BEAT = 1.0  # seconds between heartbeats and peer checks
GRACE = 2.0  # seconds a rank exiting on an error waits for a peer that may be dying (stop())
_STATE = {"rank": None, "dir": None, "said": False, "note": None}
# The watcher thread and the main thread's exit (atexit, SIGTERM) may both find the dead peer at once. The
# line is written under this lock, so whichever finds the flag set waits for the other's line to be out:
# without it the main thread could exit (os._exit, or the interpreter stopping daemon threads) while the
# watcher was still printing, and the line was lost (seen under a loaded machine).
_SAYING = threading.RLock()  # re-entrant: a SIGTERM handler may run in the main thread mid-line


def directory() -> Path | None:
    """The node's heartbeat directory: the launcher's, or one per torchrun run id; None outside torchrun."""
    if os.environ.get("AGENTGYM_LIFELINE"):
        return Path(os.environ["AGENTGYM_LIFELINE"])
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id or "LOCAL_RANK" not in os.environ:
        return None
    return Path(tempfile.gettempdir()) / f"agentgym-lifeline-{run_id}"


def _rss() -> tuple[float, float]:
    """Resident bytes now and at peak (the whole process's, across infra/peaks.py's per-phase resets)."""
    return peaks.resident(), peaks.top()


def start(rank: int, note: str | None = None, plan: float | None = None, share: float | None = None) -> None:
    """Begin this rank's heartbeat and peer watch (a daemon thread), and say the memory plan on rank 0."""
    if rank == 0 and note:
        print(note, flush=True)
    _STATE.update(rank=rank, note=note, plan=plan, share=share, dir=directory())
    if _STATE["dir"] is None:
        return
    _STATE["dir"].mkdir(parents=True, exist_ok=True)
    beat()
    atexit.register(stop, GRACE)  # after a traceback: the cause if a peer died, and silence about this rank
    threading.Thread(target=_watch, name="lifeline", daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)


def planned() -> float | None:
    """This run's planned peak per rank in bytes (memplan.py), None when no plan was made."""
    return _STATE.get("plan")


def stop(grace: float = 0.0) -> None:
    """This rank is ending: if a peer died first (a collective then failed here), say so as the last line;
    then mark this rank's heartbeat as stopped, so that its peers stay quiet about it. At exit (`grace`
    seconds) a peer still running and not stopping is waited for: a SIGKILLed peer's sockets close (and the
    collective here fails) a moment before the kernel has finished with its process, and a rank that looked
    once in that moment found it alive and left without a word (seen on a loaded machine)."""
    if _STATE["dir"] is not None and not _STATE.get("stopped"):
        until = time.monotonic() + grace
        while not (dead := _dead_peer()) and time.monotonic() < until and _running_peer():
            time.sleep(0.05)
        if dead:
            _say_once(cause(dead))
        with _SAYING:  # a line the watcher is writing now is finished before this rank goes on to exit
            _STATE["stopped"] = True  # the watcher stays quiet from here; a SIGTERM may still say (_on_term)
        beat()


def beat() -> None:
    now, top = _rss()
    record = {"rank": _STATE["rank"], "pid": os.getpid(), "rss": now, "peak": top, "plan": _STATE.get("plan"),
              "share": _STATE.get("share"), "time": time.time(), "stopped": bool(_STATE.get("stopped"))}
    path = _STATE["dir"] / f"rank{_STATE['rank']}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:  # a full /tmp must not stop training
        pass


def beats(where: Path) -> list[dict]:
    out = []
    for path in sorted(where.glob("rank*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not yet reaped by torchrun, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def oom_killed(pid: int) -> bool:
    """Whether the kernel's log records an out-of-memory kill of `pid` (False when it cannot be read)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    found = False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # a record overwritten while reading: skip it
                continue
            if b"Killed process %d " % pid in record or b"Killed process %d\n" % pid in record:
                found = True
    finally:
        os.close(fd)
    return found


def cause(record: dict, signum: int | None = None) -> str:
    """One line about a dead rank from its last heartbeat and, when known, the signal that ended it."""
    rss, peak, plan, share = (record.get(k) for k in ("rss", "peak", "plan", "share"))
    oom = oom_killed(record["pid"])
    if oom:
        how = "killed by the kernel's out-of-memory killer (SIGKILL)"
    elif signum:
        how = f"killed by {signal.Signals(signum).name}" if signum in signal.Signals._value2member_map_ else \
            f"killed by signal {signum}"
    else:
        how = "its process is gone without a word of its own (a signal such as the out-of-memory killer's " \
              "SIGKILL, or a crash below Python)"
    seen = f"last seen at {rss / GB:.1f} GB resident (peak {peak / GB:.1f} GB"
    seen += f", planned peak {plan / GB:.1f} GB" if plan else ""
    seen += f", {share / GB:.1f} GB a rank can have)" if share else ")"
    near = share and peak and peak >= 0.8 * share
    if oom or (signum == signal.SIGKILL and near):
        hint = ("likely out of memory: lower --micro-tokens or turn on --checkpointing, use fewer ranks per node, "
                "or check what else uses this machine's memory")
    elif signum == signal.SIGKILL:
        hint = "SIGKILL came from outside the run (the out-of-memory killer if memory ran short elsewhere; check dmesg)"
    elif signum:
        hint = "see that rank's own output above"
    else:
        hint = "the launcher's last line names the signal"
    return f"error: rank {record['rank']} (pid {record['pid']}) died: {how}, {seen}; {hint}"


def _dead_peer() -> dict | None:
    for record in beats(_STATE["dir"]):
        if record["rank"] != _STATE["rank"] and not record.get("stopped") and not alive(record["pid"]):
            return record
    return None


def _running_peer() -> bool:
    """Whether a peer is alive and has not marked itself stopped (it may be dying this instant)."""
    return any(r["rank"] != _STATE["rank"] and not r.get("stopped") and alive(r["pid"]) for r in beats(_STATE["dir"]))


def _say_once(line: str) -> None:
    """Print the line once per process; on return it has been written, by this call or by an earlier one."""
    with _SAYING:
        if not _STATE["said"]:
            _STATE["said"] = True
            print(f"\n[rank {_STATE['rank']}] {line}", file=sys.stderr, flush=True)


def _watch() -> None:
    while not _STATE.get("stopped"):
        time.sleep(BEAT)
        with _SAYING:  # stop() marks the rank stopped under the lock: after it, not a beat nor a line more
            if _STATE.get("stopped"):
                return
            beat()
            if not _STATE["said"] and (dead := _dead_peer()):
                _say_once(cause(dead))


def _on_term(signum, frame) -> None:
    """torchrun stops the survivors with SIGTERM when a rank fails: say why before going."""
    dead = _dead_peer() if _STATE["dir"] else None
    if dead:
        _say_once(cause(dead))
    raise SystemExit(128 + signum)


def peak_report() -> str:
    """The peak resident memory of every rank against the plan, then each phase's peak on its largest rank
    (infra/peaks.py): a collective; rank 0 prints it at the end."""
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (peaks.top(), peaks.of_phases()))
    plan = _STATE.get("plan")
    text = ", ".join(f"{top / GB:.2f}" for top, _ in ranks)
    line = f"peak resident memory per rank: {text} GB" + (f" (planned peak {plan / GB:.2f} GB)" if plan else "")
    phases = {}
    for _, of in ranks:
        for name, value in of.items():
            phases[name] = max(phases.get(name, 0.0), value)
    if phases:
        line += "; by phase, largest rank: " + ", ".join(f"{k} {v / GB:.2f}" for k, v in phases.items())
    return line


def finish(env_pool, threads, engine, log, code: int = 0) -> None:
    """The end of a training run: close everything on every rank and end the process with `code` (a collective)."""
    stop()
    if log:  # the progress bar's last line before the memory report
        log.close()
    if not code:
        print0(peak_report())
    for env in env_pool:
        env.close()
    threads.shutdown(wait=not abandoned(), cancel_futures=True)
    try:
        dist.barrier()
    except RuntimeError:  # stopping on an error, a peer may be gone already: exit all the same
        if not code:
            raise
    if hasattr(engine, "close"):
        engine.close()
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()
    # Leave without the interpreter's teardown, everything being closed and flushed. Two threads would make
    # it fail: an env call that never returned (the interpreter would wait for it), and gloo's worker threads,
    # which outlive destroy_process_group while FSDP2's device mesh still refers to the group; destroying them
    # at teardown aborted a finished run now and then ("terminate called without an active exception",
    # SIGABRT: 1 in 6-8 runs of tests/support/sync_check.py, none in 14 after this).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """torchrun, in-process, ending with the one-line cause when a worker fails."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    where = Path(tempfile.mkdtemp(prefix="agentgym-lifeline-"))
    os.environ["AGENTGYM_LIFELINE"] = str(where)  # the workers inherit it
    try:
        with console.quiet():  # the known harmless warnings of other packages left out (console.py)
            run(parse_args(argv))
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr)
        records = {r["rank"]: r for r in beats(where)}
        failures = sorted(exc.failures.items(), key=lambda kv: (kv[1].exitcode >= 0, kv[1].timestamp))
        rank, failure = failures[0]  # a signalled rank first: the others usually died of its absence
        signum = -failure.exitcode if failure.exitcode < 0 else None
        record = records.get(rank, {"rank": rank, "pid": failure.pid, "rss": 0.0, "peak": 0.0})
        record["pid"] = failure.pid
        if signum:
            print(cause(record, signum), file=sys.stderr)
        elif failure.exitcode != 2:  # exit 2 is a config error, already said in one line
            print(f"error: rank {rank} exited with code {failure.exitcode}; its error is above", file=sys.stderr)
        return 1
    finally:
        for path in where.glob("*"):
            path.unlink(missing_ok=True)
        where.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a run shows on the console: its own lines. At start a short summary of the config (the whole
config is RUN_DIR/config.json); under the launcher (`python -m infra.lifeline ... train.py`, what run.sh
runs), the known harmless warnings of other packages left out.

A first `bash run.sh train --env textcraft --steps 20` printed 28 lines, and 19 of them came from other
packages: torchrun's OMP_NUM_THREADS banner, vLLM's FutureWarnings about `reduce_op`, "Triton not
available", NUMA binding notes, vLLM's weight-loading bar. `QUIET` lists each kind, one regular
expression per kind of line, with what it is and why it is harmless. Only those lines are dropped; every
other line passes unchanged, an unknown warning included, so a new problem still shows. This is a
filter on the console alone: no file a run writes is touched (none of these lines is written to one).

How: the launcher points its stdout and stderr, which torchrun's workers inherit, at two pipes (two
pseudo-terminals when they are a terminal); a thread for each copies it to where it pointed before,
line by line (`LineFilter`), dropping what `QUIET` names. A line still open after HOLD seconds (a
progress bar redrawn with \\r) is shown as it is, so the bar moves as before. At the end one line says
how many lines were left out. AGENTGYM_CONSOLE=all turns the filter off. `python train.py` and plain
torchrun show everything.

Tests: python -m pytest tests/test_console.py
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import sys
import threading

HOLD = 0.2    # seconds a line that has not ended waits for its end before it is shown anyway
DRAIN = 5.0   # seconds the launcher waits at the end for what its workers wrote last

# (pattern, then, what it is and why it is harmless). A line matching `pattern` (re.search) is dropped,
# and so are the lines right after it that match `then` (re.match): the rest of the same message.
QUIET = [
    (r"torch/distributed/run\.py:\d+\] (\*+|Setting OMP_NUM_THREADS environment variable .*)?\s*$", None,
     "torchrun's four-line banner: it sets OMP_NUM_THREADS=1 for each worker, its default whenever the "
     "variable is unset. Nothing to act on."),
    (r"vllm/triton_utils/dispatcher\.py:\d+: FutureWarning: `torch\.distributed\.reduce_op` is deprecated", r"  ",
     "vLLM's Triton dispatcher scans the attributes of torch.distributed, which touches the deprecated alias "
     "`reduce_op`; nothing calls it. `then` drops the source line Python prints below a warning."),
    (r"torch/_library/triton\.py:\d+\] Triton not available, find_triton_kernels = \[\]", None,
     "torch looks for Triton kernels in the custom ops vLLM registers. Triton is a GPU compiler, removed "
     "from the CPU install on purpose (vLLM's CPU build does not start with it)."),
    (r"utils\.cpp:\d+\] Warning: NUMA binding: Using MEMBIND policy", None,
     "vLLM's CPU worker binds its memory to its cores' NUMA node, as intended, and says so from C++ on "
     "every rank."),
    (r"^\r?Loading safetensors checkpoint shards: ", r"$",
     "vLLM's bar while it reads the model's weights at start-up (a fraction of a second for the small "
     "models; ours is the training bar). `then` drops the empty line the bar leaves when it closes."),
]


class LineFilter:
    """Bytes in, the same bytes out less the lines `quiet` names. Lines end at \\n; `flush()` gives
    back the start of a line that has not ended yet (a progress bar), and the rest of that line is
    then judged on its own text when it ends."""

    def __init__(self, quiet=QUIET):
        self.rules = [(re.compile(p), None if then is None else re.compile(then)) for p, then, _ in quiet]
        self.partial = b""    # the start of a line that has not ended yet
        self.then = None      # after a dropped line: the pattern of the lines that belong to it
        self.hidden = 0       # lines dropped so far

    def feed(self, data: bytes) -> bytes:
        *lines, self.partial = (self.partial + data).split(b"\n")
        return b"".join(line + b"\n" for line in lines if not self._drop(line.decode("utf-8", "replace")))

    def flush(self) -> bytes:
        out, self.partial, self.then = self.partial, b"", None
        return out

    def _drop(self, line: str) -> bool:
        if self.then is not None and self.then.match(line):
            self.hidden += 1
            return True
        for rule, then in self.rules:
            if rule.search(line):
                self.then, self.hidden = then, self.hidden + 1
                return True
        self.then = None
        return False


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:  # the terminal went away: keep draining the pipe, so that no worker blocks on it
            return


def _channel(fd: int) -> tuple[int, int]:
    """(read end, write end) to put in place of `fd`: a pipe, or, when `fd` is a terminal, a pseudo-terminal
    of the same size, so that the workers still write to a terminal (Python buffers by line, tqdm fits
    its bar to the width). Raw mode: the pseudo-terminal passes bytes as they are, the real one turns
    \\n into \\r\\n as before. A pseudo-terminal that cannot be had falls back to a pipe."""
    if not os.isatty(fd):
        return os.pipe()
    import fcntl
    import termios
    import tty

    try:
        read, write = os.openpty()
    except OSError:
        return os.pipe()
    try:
        tty.setraw(write)
        fcntl.ioctl(write, termios.TIOCSWINSZ, fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except (OSError, termios.error):
        os.close(read)
        os.close(write)
        return os.pipe()
    return read, write


def _pump(src: int, dst: int, lines: LineFilter) -> None:
    while True:
        if lines.partial and not select.select([src], [], [], HOLD)[0]:
            _write(dst, lines.flush())  # a line left open (a progress bar): show it as it stands
            continue
        try:
            data = os.read(src, 1 << 16)
        except OSError:  # a pseudo-terminal whose every writer has gone (EIO)
            data = b""
        if not data:  # every writer has closed the pipe
            break
        _write(dst, lines.feed(data))
    _write(dst, lines.flush())
    os.close(src)


@contextlib.contextmanager
def quiet():
    """Within the block, what this process and the processes it starts write to stdout and stderr goes
    through a LineFilter each on its way to the terminal; on a clean exit, one line says how many lines
    were left out."""
    if os.environ.get("AGENTGYM_CONSOLE") == "all":
        yield
        return
    pumps = []
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        stream.flush()
        terminal = os.dup(fd)
        read, write = _channel(fd)
        os.dup2(write, fd)  # inherited by every process started from here on
        os.close(write)
        lines = LineFilter()
        thread = threading.Thread(target=_pump, args=(read, terminal, lines), name=f"console-{fd}", daemon=True)
        thread.start()
        pumps.append((fd, stream, terminal, thread, lines))
    clean = False
    try:
        yield
        clean = True
    finally:
        for fd, stream, terminal, _, _ in pumps:
            stream.flush()
            os.dup2(terminal, fd)  # our end of the pipe closes: its pump ends once the workers' ends have
        for _, _, terminal, thread, _ in pumps:
            thread.join(DRAIN)
            if not thread.is_alive():
                os.close(terminal)
        hidden = sum(p[-1].hidden for p in pumps)
        if clean and hidden:
            print(f"console: {hidden} known harmless lines of other packages left out (infra/console.py; "
                  "AGENTGYM_CONSOLE=all shows all)", file=sys.stderr, flush=True)


def summary(cfg, d, world: int) -> list[str]:
    """The config in a few lines for the start of a run: what is trained, on which batches and turn
    budgets, where, and which generator. `d` is checks.derive(cfg)."""
    from infra.engines import engine_kind
    kl = "no KL term"
    if cfg.kl_coef:
        kl = f"KL {cfg.kl_coef:g} ({cfg.kl_kind}, " + ("in the reward)" if d.kl == "reward" else "loss)")
    lines = [f"run: {cfg.env}, model {cfg.model}, {cfg.algo}, {cfg.steps} steps (preset {cfg.preset or 'cpu'})",
             f"batch: {cfg.tasks_per_step} tasks x {cfg.samples_per_task} samples over {world} ranks, "
             f"lr {cfg.lr:g}, {kl}",
             f"horizon: {d.schedule.describe()}; {cfg.max_tokens} tokens a reply",
             f"device: {d.device}, {d.dtype}; generator: {engine_kind(cfg.engine, d.device)}"
             + (" (engine auto: infra/engines.engine_kind)" if cfg.engine == "auto" else "")]
    if cfg.bc_episodes:
        who = "expert" if cfg.bc_actor == "expert" else "self-played"  # --bc-actor policy: self-imitation
        lines.append(f"warm start: {cfg.bc_episodes} {who} episodes, lr {cfg.bc_lr:g}")
    return lines + [f"out: {d.out} (every setting: config.json)"]

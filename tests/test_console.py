"""The console: the config summary a run starts with is short and names what matters; the known
harmless warnings of other packages are dropped (lines as a real run printed them), every other line
passes, and under the launcher neither torchrun's banner nor a known warning reaches the console while
an unknown warning does; on a terminal, the workers still write to one of its size."""
import os
import subprocess
import sys
import textwrap

from launch import checks
import config
from infra import console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# As `bash run.sh train --env textcraft` printed them (two of each came from the two ranks; the venv's
# path made generic)
KNOWN = """\
W1127 15:34:58.505000 3433 torch/distributed/run.py:874] 
W1127 15:34:58.505000 3433 torch/distributed/run.py:874] *****************************************
W1127 15:34:58.505000 3433 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment variable for each \
process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal \
performance in your application as needed. 
W1127 15:34:58.505000 3433 torch/distributed/run.py:874] *****************************************
[rank0]:W1127 15:35:25.273000 3625 torch/_library/triton.py:53] Triton not available, find_triton_kernels = []
/opt/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: \
`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: \
`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[rank1]:[W1127 15:35:26.855102773 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory \
allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function \
init_cpu_memory_env)
\rLoading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]
\rLoading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 323.39it/s]

"""
OURS = """\
memory plan: 1.99 GB per rank at peak, of 11.6 GB a rank can have (MemAvailable, 2 ranks here)

saved checkpoint step 2 in 0.2s -> runs/textcraft-grpo/checkpoints/latest
/site-packages/somepkg/mod.py:12: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use it
  value = torch.distributed.reduce_op
/site-packages/vllm/other.py:7: UserWarning: something new
  call()
W1127 15:34:58.505000 3433 torch/distributed/run.py:874] node_rank is only used for static rdzv_backend.
Traceback (most recent call last):
  File "train.py", line 485, in <module>
"""


def test_summary_is_short_and_names_the_key_fields():
    runs = [(config.parse(["--env", "textcraft", "--steps", "20"]), 2),
            (config.parse(["--preset", "smollm2", "--env", "babyai"]), 2),
            (config.parse(["--preset", "paper", "--env", "sciworld", "--algo", "reinforce++"]), 8)]
    for cfg, world in runs:
        d = checks.derive(cfg)
        lines = console.summary(cfg, d, world)
        assert 3 <= len(lines) <= 7, lines
        assert all(len(line) <= 100 and "\n" not in line for line in lines), lines
        text = "\n".join(lines)
        for field in (cfg.env, cfg.model, cfg.algo, f"{cfg.steps} steps", f"lr {cfg.lr:g}", d.out, d.device,
                      d.dtype, f"{cfg.tasks_per_step} tasks x {cfg.samples_per_task} samples", d.schedule.describe()):
            assert field in text, (field, lines)
    assert "KL 0.001 (k3, in the reward)" in text and "config.json" in text


def test_known_warnings_are_dropped_and_every_other_line_passes():
    lines = console.LineFilter()
    assert lines.feed(KNOWN.encode()) == b""
    assert lines.hidden == KNOWN.count("\n")
    assert lines.feed(OURS.encode()) == OURS.encode()  # look-alikes from other places, and our own lines
    # a known warning written in pieces is still one line; a progress bar's open line is held, then shown
    triton = KNOWN.split("\n")[4] + "\n"
    assert lines.feed(triton[:30].encode()) == b"" and lines.feed(triton[30:].encode()) == b""
    assert lines.partial == b"" and lines.hidden == KNOWN.count("\n") + 1
    assert lines.feed("\rtrain:  50%|#####     | 1/2".encode()) == b""
    assert lines.flush() == "\rtrain:  50%|#####     | 1/2".encode()
    # the rest of the bar's line is judged on its own: a known warning printed under the bar goes
    assert lines.feed(triton.encode() + b"\rtrain: 100%\n") == b"\rtrain: 100%\n"


def test_every_pattern_says_what_it_is_and_why_it_is_harmless():
    for pattern, then, why in console.QUIET:
        assert len(why.split()) >= 8, pattern


def test_under_the_launcher_known_warnings_stay_off_the_console_and_unknown_ones_show(tmp_path):
    """Two ranks under lifeline.py (torchrun in-process) warn through Python's warnings module: a known
    warning from a file that stands in for vLLM's dispatcher (its source line too), and an unknown one."""
    fake = tmp_path / "site-packages" / "vllm" / "triton_utils" / "dispatcher.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("\n" * 137 + '        if hasattr(value, "__dict__"):\n')
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(f"""\
        import sys, warnings
        warnings.warn_explicit("`torch.distributed.reduce_op` is deprecated, please use "
                               "`torch.distributed.ReduceOp` instead", FutureWarning, {str(fake)!r}, 138)
        warnings.warn("a warning nobody has seen before", UserWarning)
        print("our own line", flush=True)
        """))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "AGENTGYM_CONSOLE")}
    proc = subprocess.run([sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", "2", str(worker)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("our own line") == 2
    assert "OMP_NUM_THREADS" not in proc.stderr and "reduce_op" not in proc.stderr
    assert 'hasattr(value, "__dict__")' not in proc.stderr
    assert proc.stderr.count("UserWarning: a warning nobody has seen before") == 2
    assert proc.stderr.count('warnings.warn("a warning nobody has seen before"') == 2  # its source line
    assert proc.stderr.strip().splitlines()[-1].startswith("console: 8 known harmless lines")
    shown = subprocess.run([sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", "2", str(worker)],
                           cwd=ROOT, env={**env, "AGENTGYM_CONSOLE": "all"}, capture_output=True, text=True,
                           timeout=120)
    assert "OMP_NUM_THREADS" in shown.stderr and shown.stderr.count("reduce_op") == 2


def test_on_a_terminal_the_workers_still_write_to_one_of_its_size(tmp_path):
    """A progress bar fits itself to the terminal: behind the filter, workers get a pseudo-terminal of the
    launcher's terminal's size, not a pipe."""
    import fcntl
    import struct
    import termios

    worker = tmp_path / "worker.py"
    worker.write_text("import os, sys\nprint('worker sees', sys.stderr.isatty(), os.get_terminal_size(2).columns)\n")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "AGENTGYM_CONSOLE"}
    proc = subprocess.Popen([sys.executable, "-m", "infra.lifeline", "--standalone", "--nproc_per_node", "1", str(worker)],
                            cwd=ROOT, env=env, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:  # every writer of the terminal has gone
            break
        if not data:
            break
        out += data
    os.close(master)
    assert proc.wait(timeout=120) == 0, out
    assert b"worker sees True 100" in out, out

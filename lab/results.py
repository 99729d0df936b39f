"""Result folders (results/<name>/): the evidence of a run and its evaluations, small enough to commit,
from which every table is regenerated (lab/tables.py).

    python -m lab.report --publish runs/babyai-smollm2 results/babyai-smollm2 untrained=runs/.../eval-untrained ...
    python -m lab.report --unpack results/NAME/evals/untrained runs/eval-untrained   # an evaluation back

Everything a table needs and no weights: run/ (train.py's config.json, metrics.jsonl, in-training
validation outcomes evals.jsonl, provenance.jsonl), one evals/<label>/ per evaluation (its settings,
per-task outcomes, the mix of actions per subtask over all its transcripts and how many of those actions
the env refused, a few trimmed transcripts to read, every transcript as evaluate.py wrote it, compressed
(transcripts-all.jsonl.xz: `xz -dc` reads it), the commits that produced them), control/ when the recipe
has a same-time imitation control (that training run's own config.json, metrics.jsonl, provenance.jsonl),
manifest.json and tables.md. `publish` writes a folder, `unpack` gives an evaluation back, `refresh` makes
its derived counts again; its tables are lab/tables.py's, rebuilt from these files only. lab/report.py's
command line calls them. Tests: python -m pytest tests/test_report.py
"""
from __future__ import annotations

import json
import lzma
import re
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from envs import parse_action
from envs.webarena import _BLOCK
from infra.runlog import provenance
from lab.stats import load_transcripts, summarize
from lab.tables import render

RUN_FILES = ("config.json", "metrics.jsonl", "evals.jsonl", "provenance.jsonl", "warmstart.jsonl")
OUTCOME_KEYS = ("task_id", "subtask", "sample", "budget", "reward", "success", "turns", "end")
SIZE_LIMIT = 2_000_000  # bytes: a result folder is evidence, not an archive


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-").lower() or "eval"


def trim(messages: list[dict], chars: int = 1500, head: int = 3, tail: int = 12) -> list[dict]:
    """A transcript cut for committing: each message at most `chars` characters, and of a long episode
    the first `head` and last `tail` messages with a note of how many were left out between them."""
    cut = [{**m, "content": m["content"][:chars] + (f" [... {len(m['content']) - chars} characters cut]"
                                                     if len(m["content"]) > chars else "")} for m in messages]
    if len(cut) > head + tail:
        cut = cut[:head] + [{"role": "note", "content": f"[{len(cut) - head - tail} messages cut]"}] + cut[-tail:]
    return cut


WEB_ENVS = ("miniwob", "webarena")  # their replies end with the action in a ```block```, as the env reads it


def reply_action(text: str, env: str = "") -> str:
    """The action of an assistant reply as `env` reads it ("" when it has none): the first ```block``` in
    the web envs, the first line after `Action:` in the others."""
    if env in WEB_ENVS:

        match = _BLOCK.search(text)
        return match[1].strip() if match else ""

    action, error = parse_action(text)
    return "" if error else action


def action_mix(records: list[dict], env: str = "") -> dict[str, dict[str, int]]:
    """{subtask: {verb: assistant turns}} over the records' transcripts: what a model does, not only how
    often it wins. The verb is the first word of the action ("go", "pickup", "toggle"; "pick up" counts
    as "pickup"; "click", "type" on the web), or "(invalid)" for a reply without one. A drift of one
    action into every subtask (an RL run rewarding GoTo's "go to" everywhere) shows here before it shows
    in success."""
    mix = defaultdict(Counter)
    for r in records:
        for m in r["messages"]:
            if m["role"] != "assistant":
                continue
            words = reply_action(m["content"], env).lower().split()
            verb = "(invalid)" if not words else "pickup" if words[:2] == ["pick", "up"] else words[0]
            mix[r["subtask"]][verb] += 1
    return {sub: dict(c.most_common()) for sub, c in sorted(mix.items())}


# What each env's next observation says when it did not carry out the reply's action (envs/babyai.py
# step; envs/miniwob.py and envs/webarena.py report it after "PREVIOUS ACTION:").
REFUSALS = {"babyai": ("Choose one of the available actions.", "Invalid reply:", "Invalid action:"),
            "sciworld": ("No known action matches that input.", "Invalid reply:")}  # envs/sciworld.py NO_MATCH
REFUSALS.update(dict.fromkeys(WEB_ENVS, ("PREVIOUS ACTION: Attempt to", "PREVIOUS ACTION: Invalid",
                                         "The browser could not do it")))


def refused_turns(records: list[dict], env: str) -> dict[str, dict[str, int]] | None:
    """{subtask: {"observed": assistant turns followed by an observation, "refused": those whose action
    the env refused}} (an action not available in that state, a reply without one); an episode's last
    turn has no observation in the transcript, so it is not counted. None for an env without known
    refusal messages. A model can win less by acting worse or by wasting turns on actions the world
    does not take: this tells the two apart."""
    marks = REFUSALS.get(env)
    if marks is None:
        return None
    counts = defaultdict(Counter)
    for r in records:
        msgs = r["messages"]
        for m, after in zip(msgs, msgs[1:]):
            if m["role"] == "assistant" and after["role"] == "user":
                counts[r["subtask"]]["observed"] += 1
                counts[r["subtask"]]["refused"] += any(k in after["content"] for k in marks)
    return {sub: {"observed": c["observed"], "refused": c["refused"]} for sub, c in sorted(counts.items())}


def publish(run_dir: Path | None, dest: Path, evals: list[tuple[str, Path]], keep: int = 3,
            limit: int = SIZE_LIMIT, control: Path | None = None) -> str:
    """Copy the evidence of a run and its evaluations into `dest` (the files listed at the top) and
    write tables.md; returns the tables. Refuses a `dest` that holds files; removes what it wrote when
    the folder ends up over `limit` bytes, and says which files are the largest."""

    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"error: {dest} holds files already; remove it or choose another name")
    for d in (run_dir, control):
        if d is not None and not (d / "config.json").exists():
            raise SystemExit(f"error: {d} has no config.json: not a train.py output directory")
    for label, src in evals:
        if not (src / "results.json").exists():
            raise SystemExit(f"error: {src} has no results.json: not a finished evaluate.py output ({label})")
    dest.mkdir(parents=True, exist_ok=True)
    manifest = {"run": str(run_dir) if run_dir else None, "evals": [], "published": provenance(), "by_subtask": True}
    if control is not None:
        manifest["control"] = str(control)
    for folder, src in (("run", run_dir), ("control", control)):
        if src is not None:
            (dest / folder).mkdir()
            for name in RUN_FILES:
                if (src / name).exists():
                    shutil.copyfile(src / name, dest / folder / name)
    for label, src in evals:
        folder = dest / "evals" / _slug(label)
        if folder.exists():
            raise SystemExit(f"error: two evaluations are named {_slug(label)!r}; give them different labels")
        folder.mkdir(parents=True)
        result = json.loads((src / "results.json").read_text())
        settings = {**result["config"], "model": result["model"], "max_tokens": result["max_tokens"],
                    "temperature": result["temperature"], "reward_scale": result["reward_scale"]}
        (folder / "config.json").write_text(json.dumps(settings, indent=2) + "\n")
        records = sorted(load_transcripts(src / "transcripts.jsonl", result["config"]["k"])[0],
                         key=lambda r: (r["budget"], r["task_id"], r["sample"]))
        (folder / "outcomes.jsonl").write_text("".join(json.dumps({k: r[k] for k in OUTCOME_KEYS}) + "\n"
                                                       for r in records))
        (folder / "actions.json").write_text(json.dumps(action_mix(records, result["config"]["env"]), indent=1) + "\n")
        if (refused := refused_turns(records, result["config"]["env"])) is not None:
            (folder / "refused.json").write_text(json.dumps(refused, indent=1) + "\n")
        wins = [r for r in records if r["success"]]
        shown = (wins[:1] + [r for r in records if not r["success"]] + wins[1:])[:keep]  # a success, then failures
        (folder / "transcripts.jsonl").write_text("".join(
            json.dumps({**{k: r[k] for k in OUTCOME_KEYS}, "error": r.get("error", "")[:300],
                        "messages": trim(r["messages"])}) + "\n" for r in shown))
        # every episode, byte for byte, for a later question no table foresaw (SciWorld's 400 are ~50 KB)
        (folder / "transcripts-all.jsonl.xz").write_bytes(lzma.compress((src / "transcripts.jsonl").read_bytes()))
        if (src / "provenance.jsonl").exists():
            shutil.copyfile(src / "provenance.jsonl", folder / "provenance.jsonl")
        manifest["evals"].append({"label": label, "dir": f"evals/{_slug(label)}", "source": str(src)})
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    md = render(dest)
    (dest / "tables.md").write_text(md)
    files = sorted((p.stat().st_size, str(p.relative_to(dest))) for p in dest.rglob("*") if p.is_file())
    if sum(size for size, _ in files) > limit:
        shutil.rmtree(dest)
        biggest = ", ".join(f"{name} {size / 1e6:.2f} MB" for size, name in files[::-1][:3])
        raise SystemExit(f"error: the result folder would hold {sum(s for s, _ in files) / 1e6:.2f} MB, over the "
                         f"{limit / 1e6:.1f} MB limit (largest: {biggest}); nothing was kept")
    return md


def unpack(folder: Path, dest: Path) -> Path:
    """A published evaluation back into an evaluate.py output directory: its transcripts byte for byte,
    and results.json recomputed from them (lab.stats.summarize, as evaluate.py does). run.sh uses it for
    the untrained model, evaluated once for all seeds: a later seed's folder cites seed 0's evaluation
    instead of spending half an hour sampling it again."""

    if (dest / "results.json").exists():
        raise SystemExit(f"error: {dest} holds an evaluation already; remove it or choose another name")
    settings = json.loads((folder / "config.json").read_text())
    text = lzma.decompress((folder / "transcripts-all.jsonl.xz").read_bytes())
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "transcripts.jsonl").write_bytes(text)
    records = load_transcripts(dest / "transcripts.jsonl", settings["k"])[0]
    extra = ("model", "max_tokens", "temperature", "reward_scale")  # what publish added to the config
    config = {k: v for k, v in settings.items() if k != "reward_scale"}
    result = {"config": config, **{k: settings[k] for k in extra}, **summarize(records), "unpacked_from": str(folder)}
    (dest / "results.json").write_text(json.dumps(result, indent=2))
    if (folder / "provenance.jsonl").exists():
        shutil.copyfile(folder / "provenance.jsonl", dest / "provenance.jsonl")
    return dest


def refresh(dest: Path) -> list[Path]:
    """Each evaluation's files derived from its transcripts (actions.json, refused.json) made again from its
    transcripts-all.jsonl.xz: what a folder published before a count existed gains it. Returns the files written."""
    written = []
    for e in json.loads((dest / "manifest.json").read_text())["evals"]:
        folder = dest / e["dir"]
        env, k = (json.loads((folder / "config.json").read_text())[key] for key in ("env", "k"))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "transcripts.jsonl"
            path.write_bytes(lzma.decompress((folder / "transcripts-all.jsonl.xz").read_bytes()))
            records = sorted(load_transcripts(path, k)[0], key=lambda r: (r["budget"], r["task_id"], r["sample"]))
        (folder / "actions.json").write_text(json.dumps(action_mix(records, env), indent=1) + "\n")
        written.append(folder / "actions.json")
        if (refused := refused_turns(records, env)) is not None:
            (folder / "refused.json").write_text(json.dumps(refused, indent=1) + "\n")
            written.append(folder / "refused.json")
    return written

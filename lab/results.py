"""Result folders (results/<name>/): the evidence of a run and its evaluations, small enough to commit,
and every table regenerated from those files alone (lab/stats.py's numbers: success, the task-clustered
SE, Pass@k, the paired task-level bootstrap; and the in-training validation curve).

    python -m lab.report --publish runs/babyai-smollm2 results/babyai-smollm2 untrained=runs/.../eval-untrained ...
    python -m lab.report results/babyai-smollm2      # every table of that folder, from its files only

Everything a table needs and no weights: run/ (train.py's config.json, metrics.jsonl, in-training
validation outcomes evals.jsonl, provenance.jsonl), one evals/<label>/ per evaluation (its settings,
per-task outcomes, the mix of actions per subtask over all its transcripts and how many of those actions
the env refused, a few trimmed transcripts to read, every transcript as evaluate.py wrote it, compressed
(transcripts-all.jsonl.xz: `xz -dc` reads it), the commits that produced them), control/ when the recipe
has a same-time imitation control (that training run's own config.json, metrics.jsonl, provenance.jsonl),
manifest.json and tables.md. `publish` writes a folder, `render` rebuilds every table from its files only; lab/report.py's
command line calls both. Tests: python -m pytest tests/test_report.py
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
from lab.stats import (clustered_se, k_values, load_transcripts, naive_se, paired, paired_cells, paired_columns,
                       paired_table, pairs, progress, score_stats, scored, stats, summarize, task_means)

RUN_FILES = ("config.json", "metrics.jsonl", "evals.jsonl", "provenance.jsonl", "warmstart.jsonl")
OUTCOME_KEYS = ("task_id", "subtask", "sample", "budget", "reward", "success", "turns", "end")
SIZE_LIMIT = 2_000_000  # bytes: a result folder is evidence, not an archive


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


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


def _canonical(key: str, value) -> str:
    """A setting as compared across evaluations: env options as the JSON they mean (run.sh passes them
    without spaces, a hand-typed command with them), everything else as written."""
    if key == "env_options" and isinstance(value, str):
        try:
            return json.dumps(json.loads(value or "{}"), sort_keys=True)
        except ValueError:
            pass
    return json.dumps(value)


def _commit(rows: list[dict]) -> str:
    if not rows:
        return "not recorded"
    seen = list(dict.fromkeys(f"{r['commit'] or 'unknown'}{' (uncommitted changes)' if r['dirty'] else ''}"
                              for r in rows))
    return ", then ".join(seen) + f"; CPU {rows[-1]['cpu']}"


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


def render(dest: Path, resamples: int = 10_000, seed: int = 0) -> str:
    """The markdown tables of a result folder, computed from its files only."""
    manifest = json.loads((dest / "manifest.json").read_text())
    runs = [(e["label"], _jsonl(dest / e["dir"] / "outcomes.jsonl")) for e in manifest["evals"]]
    settings = {e["label"]: json.loads((dest / e["dir"] / "config.json").read_text()) for e in manifest["evals"]}
    lines = [f"# {dest.name}", "", f"Generated by `python -m lab.report results/{dest.name}` from that folder's files.", ""]
    if (dest / "run").exists():
        cfg = json.loads((dest / "run" / "config.json").read_text())
        lines += [f"Training run: env `{cfg['env']}`, model `{cfg['model']}`, {cfg['algo']}, {cfg['steps']} steps; "
                  f"commit {_commit(_jsonl(dest / 'run' / 'provenance.jsonl'))}.", ""]
    if (dest / "control").exists():
        lines += [control_line(dest / "control"), ""]
    if runs:
        lines += ["## Evaluations", ""]
        decoding = ("split", "k", "temperature", "top_p", "max_tokens", "max_context", "prompt_style", "env_options")
        for e in manifest["evals"]:
            s = settings[e["label"]]
            lines.append(f"- {e['label']}: model `{s['model']}`, " + ", ".join(f"{k} {s.get(k)}" for k in decoding)
                         + f"; commit {_commit(_jsonl(dest / e['dir'] / 'provenance.jsonl'))}")
        differ = [k for k in decoding[1:] if len({_canonical(k, settings[label].get(k)) for label, _ in runs}) > 1]
        if differ:
            lines.append(f"- NOTE: the evaluations differ in {', '.join(differ)}: not the same decoding")
        lines += elsewhere(dest, manifest["evals"], settings)
        ks = sorted({j for _, recs in runs for j in k_values(min(len(g) for g in pairs(recs).values()))})
        score = scored([r for _, recs in runs for r in recs])
        figures = ["progress", "mean score (paper)"] if score else ["Avg reward"]
        head = ["evaluation", "turns", "tasks", "episodes", "success %", "SE (tasks)", "SE (naive)", *figures,
                *[f"Pass@{j} %" for j in ks], *([f"Pass@{j}, score > 0 %" for j in ks] if score else [])]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, recs in runs:
            for budget in sorted({r["budget"] for r in recs}):
                rs = [r for r in recs if r["budget"] == budget]
                kmin = min(len(g) for g in pairs(rs).values())
                row = stats(rs, [j for j in ks if j <= kmin])
                more = score_stats(rs, [j for j in ks if j <= kmin]) if score else {}
                se = clustered_se(list(task_means(rs).values()))
                cells = [label, budget, row["tasks"], row["episodes"], f"{100 * row['success']:.1f}",
                         f"{100 * se:.1f}", f"{100 * naive_se(row['success'], row['episodes']):.1f}",
                         *([f"{more['progress']:.3f}"] if score else []), f"{row['avg_reward']:.3f}",
                         *[f"{100 * row[f'pass@{j}']:.1f}" if f"pass@{j}" in row else "" for j in ks],
                         *[f"{100 * more[f'pass@{j} score>0']:.1f}" if f"pass@{j} score>0" in more else ""
                           for j in (ks if score else [])]]
                lines.append("| " + " | ".join(map(str, cells)) + " |")
        if score:
            lines += ["", "Success: a score of 100. Progress: the score with a failure counted as 0 (the mean of "
                      "max(reward, 0)). Mean score (paper): the mean reward, a failure -1. Pass@k %: some of k "
                      "samples succeeded; Pass@k, score > 0 (AgentGym-RL's): some of k samples scored above 0."]
        lines += paired_table(runs, resamples, seed)
        if manifest.get("by_subtask"):
            lines += subtask_table(runs, resamples, seed)
        lines += actions_table([(e["label"], dest / e["dir"] / "actions.json") for e in manifest["evals"]])
    lines += validation_curve(dest / "run")
    return "\n".join(lines) + "\n"


def elsewhere(dest: Path, evals: list[dict], settings: dict[str, dict]) -> list[str]:
    """A note for each evaluation made on another machine than the folder's training run (its provenance
    names another CPU), saying what its files show. run.sh evaluates the untrained model once, in seed 0's
    result folder; a later seed's folder holds that evaluation again (`lab.report --unpack`)."""
    run = _jsonl(dest / "run" / "provenance.jsonl")
    if not run:
        return []
    base = json.loads((dest / "run" / "config.json").read_text()).get("model")
    lines = []
    for e in evals:
        prov = _jsonl(dest / e["dir"] / "provenance.jsonl")
        if not prov or prov[-1]["cpu"] == run[-1]["cpu"]:
            continue
        mine, others = settings[e["label"]], [settings[o["label"]] for o in evals if o is not e]
        lacks = "".join(f"; its config.json has no {k} (the others: "  # a setting added after it was made
                        f"{', '.join(sorted({str(s[k]) for s in others if k in s}))})"
                        for k in sorted({k for s in others for k in s} - set(mine)))
        reused = (" run.sh evaluates the untrained model once, in seed 0's result folder, and a later seed takes "
                  "that evaluation back out of it (`python -m lab.report --unpack`)." if mine.get("model") == base else "")
        lines.append(f"- NOTE: {e['label']} was evaluated on another machine than this training run: CPU "
                     f"{prov[-1]['cpu']} (run/provenance.jsonl: {run[-1]['cpu']}), into `{mine.get('out')}`{lacks}.{reused}")
    return lines


def control_line(folder: Path) -> str:
    """One sentence on the imitation control's own training run: from which model, how many demonstrations
    and optimizer steps in how long, against the time it was given (RL's steps' wall time)."""
    cfg = json.loads((folder / "config.json").read_text())
    rows = _jsonl(folder / "warmstart.jsonl")
    done = next((r for r in rows if r.get("done")), None)
    nll = [r["nll"] for r in rows if "nll" in r]
    did = (f"{done['demonstrations']} successful demonstrations, {done['optimizer_steps']} optimizer steps in "
           f"{done['seconds']:.0f} s" + (f", NLL {nll[0]:.3f} -> {nll[-1]:.3f} per token" if nll else "")
           if done else "no warmstart.jsonl (published before the warm start logged itself)")
    return (f"Imitation control: from `{cfg['model']}`, {cfg['bc_episodes']} expert episodes played, imitated for at "
            f"most {cfg['bc_seconds']:g} s (RL's steps' time): {did}; commit "
            f"{_commit(_jsonl(folder / 'provenance.jsonl'))}.")


def subtask_table(runs: list[tuple[str, list[dict]]], resamples: int = 10_000, seed: int = 0) -> list[str]:
    """The paired differences within each subtask (task type): the same bootstrap over that subtask's tasks
    (none when there is only one evaluation)."""
    heads, keys = paired_columns(scored([r for _, recs in runs for r in recs]))  # the whole folder's reward
    lines = []
    for sub in sorted({r["subtask"] for _, recs in runs for r in recs}):
        for d in paired([(label, [r for r in recs if r["subtask"] == sub]) for label, recs in runs], resamples, seed):
            if "skipped" not in d:
                lines.append(f"| {sub} | {d['budget']} | {d['after']} | {d['before']} | {d['success']['tasks']} | "
                             + " | ".join(paired_cells(d, keys)) + " |")
    head = ["", "## Paired differences per subtask (the same bootstrap, over that subtask's tasks)", "",
            "| subtask | turns | after | before | tasks | " + " | ".join(heads) + " |", "|" + "---|" * (5 + len(heads))]
    return head + lines if lines else []


def actions_table(files: list[tuple[str, Path]], top: int = 5) -> list[str]:
    """Per subtask, each evaluation's share of assistant turns for the `top` verbs most used over all of
    them (folders published before actions.json existed have none: no table)."""
    mixes = [(label, json.loads(f.read_text())) for label, f in files if f.exists()]
    if not mixes:
        return []
    refused = {label: json.loads(f.with_name("refused.json").read_text()) for label, f in files
               if f.with_name("refused.json").exists()}
    totals = Counter()
    for _, mix in mixes:
        for counts in mix.values():
            totals.update(counts)
    verbs = [v for v, _ in totals.most_common(top)]
    extra = ["refused by the env (of turns with an observation)"] if refused else []
    lines = ["", "## Actions per subtask (share of assistant turns, %; each evaluation's actions.json"
             + (" and refused.json" if refused else "") + ")", "",
             "| subtask | evaluation | turns | " + " | ".join(verbs + ["other"] + extra) + " |",
             "|" + "---|" * (len(verbs) + 4 + len(extra))]
    for sub in sorted({s for _, mix in mixes for s in mix}):
        for label, mix in mixes:
            counts = mix.get(sub, {})
            n = sum(counts.values())
            if n:
                shown = [counts.get(v, 0) for v in verbs]  # other: counted, not 100 minus rounded shares ("-0")
                cells = [100 * c / n for c in shown] + [100 * (n - sum(shown)) / n]
                if refused:
                    seen = refused.get(label, {}).get(sub, {}).get("observed", 0)
                    cells.append(100 * refused[label][sub]["refused"] / seen if seen else None)
                lines.append(f"| {sub} | {label} | {n} | "
                             + " | ".join("" if c is None else f"{c:.0f}" for c in cells) + " |")
    if refused:
        lines += ["", "| evaluation | turns followed by an observation | refused by the env, % |", "|---|---|---|"]
        for label, _ in mixes:
            if label in refused:
                seen = sum(c["observed"] for c in refused[label].values())
                lines.append(f"| {label} | {seen} | {100 * sum(c['refused'] for c in refused[label].values()) / max(seen, 1):.1f} |")
    return lines


def validation_curve(run: Path) -> list[str]:
    """The in-training evaluations, recomputed from evals.jsonl, each checked against metrics.jsonl."""
    rows = _jsonl(run / "evals.jsonl")
    if not rows:
        return []
    metrics = {}
    for m in _jsonl(run / "metrics.jsonl"):  # a resumed run appends: the last row of a step wins
        metrics[m["step"]] = m
    points = defaultdict(dict)
    for r in rows:  # the last outcome of a task at an evaluation point wins (a resumed run re-evaluates)
        points[(r["step"], r["eval"])][r["task_id"]] = r
    score = scored(rows)
    figures = "progress | mean score (paper)" if score else "Avg reward"
    lines = ["", "## Validation curve (in-training evaluation on the validation split, run/evals.jsonl)", "",
             f"| steps trained | tasks | success % | SE (tasks) | {figures} | equals metrics.jsonl |",
             "|---|---|---|---|---|---|" + ("---|" if score else "")]
    trained = lambda key: key[0] + (key[1] != "eval_start")  # noqa: E731  eval_start: before step's update
    for (step, name), by_task in sorted(points.items(), key=lambda kv: trained(kv[0])):
        ok = [float(r["success"]) for r in by_task.values()]
        success, reward = sum(ok) / len(ok), sum(r["reward"] for r in by_task.values()) / len(ok)
        logged = metrics.get(step, {}).get(f"{name}/success")
        same = "no row" if logged is None else "yes" if abs(logged - success) < 1e-5 else f"NO ({100 * logged:.1f})"
        shown = (f"{sum(map(progress, by_task.values())) / len(ok):.3f} | " if score else "") + f"{reward:.3f}"
        lines.append(f"| {trained((step, name))} | {len(ok)} | {100 * success:.1f} | {100 * clustered_se(ok):.1f} "
                     f"| {shown} | {same} |")
    return lines


def seeds_table(dests: list[Path], resamples: int = 10_000, seed: int = 0) -> str:
    """Several result folders of one recipe, one per training seed, evaluated alike: every paired
    difference (later minus earlier evaluation, same labels in each folder) per seed with its task-level
    interval, whether that interval lies above 0, and the mean over seeds of the point differences; in
    success points, and in mean reward too where the reward is more than success; for a `scored` reward
    (SciWorld's) in success, progress and the paper's mean score. Then each seed's RL run: steps,
    seconds, the share of constant groups, the CPU."""
    per_seed, dense, score = [], False, False
    for dest in dests:
        manifest = json.loads((dest / "manifest.json").read_text())
        runs = [(e["label"], _jsonl(dest / e["dir"] / "outcomes.jsonl")) for e in manifest["evals"]]
        dense |= any(r["reward"] != float(r["success"]) for _, recs in runs for r in recs)
        score |= scored([r for _, recs in runs for r in recs])
        per_seed.append({(d["after"], d["before"], d["budget"]): d for d in paired(runs, resamples, seed)})
    keys = [k for k in per_seed[0] if all(k in s and "success" in s[k] for s in per_seed)]
    names = [d.name for d in dests]
    lines = [f"# {len(dests)} seeds: {', '.join(names)}", "",
             f"Generated by `python -m lab.report {' '.join(f'results/{n}' for n in names)}`. Later minus earlier "
             f"evaluation on the same tasks [task-level bootstrap 95% interval, {resamples:,} resamples]."]
    titles = {"success": "Success, points", "progress": "Progress (the score with a failure counted as 0)",
              "reward": "Mean score (paper: the mean reward, a failure -1)" if score
              else "Mean reward (the env's own: a score where it has one)"}
    metrics = [("success", 100, 1), *([("progress", 1, 3)] if score else []), *([("reward", 1, 3)] if dense else [])]
    for metric, scale, digits in metrics:
        title = titles[metric]
        lines += ["", f"## {title}", "",
                  "| turns | after | before | " + " | ".join(names) + " | intervals above 0 | mean over seeds |",
                  "|" + "---|" * (len(names) + 5)]
        for after, before, budget in keys:
            cells = [s[(after, before, budget)][metric] for s in per_seed]
            shown = [f"{scale * c['diff']:+.{digits}f} [{scale * c['lo']:+.{digits}f}, {scale * c['hi']:+.{digits}f}]"
                     for c in cells]
            above = sum(c["lo"] > 0 for c in cells)
            mean = sum(c["diff"] for c in cells) / len(cells)
            lines.append(f"| {budget} | {after} | {before} | " + " | ".join(shown) +
                         f" | {above} of {len(cells)} | {scale * mean:+.{digits}f} |")
    runs = [(name, dest) for name, dest in zip(names, dests) if (dest / "run" / "metrics.jsonl").exists()]
    if runs:
        lines += ["", "## The RL runs", "",
                  "Constant groups: the share of a step's groups whose samples all scored alike (no advantage, "
                  "nothing to learn).", "",
                  "| seed folder | RL steps | RL seconds | constant groups, mean | per step | CPU |", "|---|---|---|---|---|---|"]
        for name, dest in runs:
            steps = {r["step"]: r for r in _jsonl(dest / "run" / "metrics.jsonl") if "skipped" in r}  # resumed: once
            skipped = [steps[k]["skipped"] for k in sorted(steps)]
            seconds = sum(r.get("time/step", 0) for r in steps.values())
            prov = _jsonl(dest / "run" / "provenance.jsonl")
            cpu = prov[-1]["cpu"] if prov else "not recorded"
            mean = f"{sum(skipped) / len(skipped):.2f}" if skipped else "-"
            lines.append(f"| {name} | {len(steps)} | {seconds:,.0f} | {mean} | {', '.join(f'{x:.2f}' for x in skipped)} "
                         f"| {cpu} |")
    return "\n".join(lines) + "\n"

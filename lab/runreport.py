"""The run report: one self-contained HTML page per training run (RUN_DIR/report.html) that opens
offline, showing what the run's files hold:

1. training curves (mean reward, success, validation success, KL, entropy, sampler gap, step time), one
   inline SVG each, with the ScalingInter horizon stages shaded (schedule.py);
2. the before/after table of evaluations with task-level bootstrap intervals, when evaluate.py outputs
   are given as LABEL=EVAL_DIR (the numbers are lab/stats.py's: `compare` and `paired_table`), and the
   validation curve recomputed from evals.jsonl (lab/tables.py's `validation_curve`);
3. an episode viewer: the episodes infra/runlog.py kept at the first step, each evaluation step and the last
   step (episodes.jsonl), every turn's observation and reply, the tokens the loss trains on
   highlighted, each reply's advantage, the reward, and for a browser env a screenshot of the page.

    python -m lab.report RUN_DIR [LABEL=EVAL_DIR ...]     # writes RUN_DIR/report.html (run.sh does after training)

No CDN, no external file: the charts are drawn here as SVG, the page forbids every fetch (its Content
Security Policy) so that model text shown in it cannot load anything. Test: tests/test_runreport.py
(opens the page in Chromium).
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import schedule as schedules
from lab import stats, tables

CURVES = (  # (metrics.jsonl key, title); "validation" joins eval_start/success and eval/success
    ("reward", "mean reward (training episodes)"),
    ("success", "success rate (training episodes)"),
    ("validation", "validation success (held-out tasks, by steps trained)"),
    ("kl", "KL to the reference"),
    ("entropy", "policy entropy (per trained token)"),
    ("sampler_gap", "sampler gap (|trainer - sampler| logprob per token)"),
    ("time/step", "step time (s)"),
)
STAGE_FILL = ("#e8f3e8", "#d2e9d2", "#bcdfbc", "#a6d5a6")
esc = html.escape


def write(run_dir: str | Path, evals: list[tuple[str, Path]] = ()) -> Path:
    """Write RUN_DIR/report.html; returns its path."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"error: {run_dir} has no metrics.jsonl: not a train.py output directory")
    path = run_dir / "report.html"
    path.write_text(page(run_dir, list(evals)))
    return path


def page(run_dir: Path, evals: list[tuple[str, Path]]) -> str:
    cfg = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    metrics = {}
    for row in tables._jsonl(run_dir / "metrics.jsonl"):  # a resumed run appends: the last row of a step wins
        metrics[row["step"]] = row
    sched = schedules.parse(cfg["horizon"]) if "horizon" in cfg else None
    prov = tables._jsonl(run_dir / "provenance.jsonl")
    title = f"{cfg.get('env', '?')}, {cfg.get('algo', '?')}, {len(metrics)} of {cfg.get('steps', '?')} steps"
    head = (f"<p>Run directory <code>{esc(str(run_dir))}</code>; model <code>{esc(str(cfg.get('model')))}</code>; "
            f"{esc(str(cfg.get('tasks_per_step')))} tasks x {esc(str(cfg.get('samples_per_task')))} samples per "
            f"step; horizon {esc(sched.describe() if sched else '?')}; commit {esc(tables._commit(prov))}.</p>"
            f"<details><summary>config.json</summary><pre>{esc(json.dumps(cfg, indent=2))}</pre></details>")
    parts = [head, "<h2>Training curves</h2>", curves(metrics, sched),
             "<h2>Evaluations</h2>", evaluations(run_dir, evals),
             "<h2>Episodes as the trainer saw them</h2>", viewer(run_dir, metrics)]
    return TEMPLATE.format(title=esc(title), body="\n".join(parts))


# ------------------------------------------------------------------ charts (inline SVG)

def series(metrics: dict, key: str) -> list[tuple[float, float]]:
    """(x, y) points of one curve: training metrics at their step; validation success at the number of
    steps trained when it was measured (eval_start: before step 0's update, eval: after step s's)."""
    steps = sorted(metrics)
    if key == "validation":
        pts = [(s, metrics[s]["eval_start/success"]) for s in steps if "eval_start/success" in metrics[s]]
        pts += [(s + 1, metrics[s]["eval/success"]) for s in steps if "eval/success" in metrics[s]]
        return sorted(pts)
    return [(s, metrics[s][key]) for s in steps if isinstance(metrics[s].get(key), (int, float))]


def _num(v: float) -> str:
    return f"{v:.4g}"


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round values (steps of 1, 2, 2.5 or 5 times a power of ten) inside [lo, hi]."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round((first + i) * step, 12) for i in range(int((hi - first * step) / step + 1e-9) + 1)]


def chart(key: str, title: str, pts: list[tuple[float, float]], sched, xmax: int,
          width: int = 280, height: int = 196) -> str:
    """One curve as an SVG figure: stage bands behind, a y grid at round values, points with a tooltip each."""
    left, right, top, bottom = 44, 10, 8, 30
    w, h = width - left - right, height - top - bottom
    ys = [y for _, y in pts]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if key in ("reward", "success", "validation"):  # rates share one scale
        lo, hi = min(lo, 0.0), max(hi, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - (abs(lo) * 0.1 or 1.0), hi + (abs(hi) * 0.1 or 1.0)
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    sx = lambda x: left + w * x / max(xmax, 1)  # noqa: E731
    sy = lambda y: top + h * (hi - y) / (hi - lo)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="{esc(title)}">']
    if sched is not None and sched.stage_length:  # ScalingInter stages: shaded bands, labelled with the budget
        for i, budget in enumerate(sched.budgets):
            a = i * sched.stage_length
            if a >= xmax:  # a stage the run never reached
                break
            b = xmax if i + 1 == len(sched.budgets) else min((i + 1) * sched.stage_length, xmax)
            out.append(f'<rect class="stage" x="{sx(a):.1f}" y="{top}" width="{max(sx(b) - sx(a), 0):.1f}" '
                       f'height="{h}" fill="{STAGE_FILL[min(i, len(STAGE_FILL) - 1)]}"/>'
                       f'<text x="{sx(a) + 3:.1f}" y="{top + 11}" class="lab">{budget} turn{"s" * (budget != 1)}</text>')
    for y in ticks(lo, hi):
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>'
                   f'<text x="{left - 4}" y="{sy(y) + 3:.1f}" class="tick" text-anchor="end">{_num(y)}</text>')
    every = max(1, math.ceil(xmax / 8))
    for x in range(0, xmax + 1, every):
        out.append(f'<text x="{sx(x):.1f}" y="{top + h + 14}" class="tick" text-anchor="middle">{x}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" class="frame"/>'
               f'<text x="{left + w / 2:.1f}" y="{height - 3}" class="tick" text-anchor="middle">training step</text>')
    if pts:
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{line}" class="curve"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{3 if len(pts) < 60 else 1.5}" class="pt">'
                f'<title>step {x}: {y:.6g}</title></circle>' for x, y in pts]
    else:
        out.append(f'<text x="{left + w / 2:.1f}" y="{top + h / 2:.1f}" class="tick" text-anchor="middle">'
                   'not logged in this run</text>')
    out.append("</svg>")
    return (f'<figure class="chart" data-curve="{esc(key)}"><figcaption>{esc(title)}</figcaption>'
            + "".join(out) + "</figure>")


def curves(metrics: dict, sched) -> str:
    xmax = max(metrics, default=0) + 1  # the validation curve reaches steps + 1 (steps trained)
    return '<div class="charts">' + "".join(chart(k, t, series(metrics, k), sched, xmax) for k, t in CURVES) + "</div>"


# ------------------------------------------------------------------ tables (lab/stats.py's markdown, as HTML)

def _inline(text: str) -> str:
    text = esc(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def markdown_html(lines: list[str], table_class: str = "") -> str:
    """lab/stats.py's markdown (tables, ## headings, lines) as HTML, cell for cell: the page shows exactly
    the numbers `python -m lab.report` prints."""
    out, rows = [], []

    def flush():
        if rows:
            head, body = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-:") for c in r)]
            out.append(f'<table class="{table_class}"><thead><tr>' + "".join(f"<th>{_inline(c)}</th>" for c in head)
                       + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r)
                                                         + "</tr>" for r in body) + "</tbody></table>")
            rows.clear()
    for line in lines:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        flush()
        if line.startswith("#"):
            out.append(f"<h3>{_inline(line.lstrip('#').strip())}</h3>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def evaluations(run_dir: Path, evals: list[tuple[str, Path]]) -> str:
    parts = []
    if evals:
        summaries, records = stats.load_evals(evals)
        parts.append("<h3>Before / after (evaluate.py outputs, success by subtask)</h3>")
        parts.append(markdown_html(stats.compare(summaries).splitlines(), "compare"))
        parts.append(markdown_html(stats.paired_table(records), "paired"))
    else:
        parts.append("<p>No evaluations given. <code>python -m lab.report RUN_DIR before=EVAL_DIR after=EVAL_DIR</code> "
                     "adds the before/after table with task-level bootstrap intervals.</p>")
    curve = tables.validation_curve(run_dir)
    parts.append(markdown_html(curve, "validation") if curve else
                 "<p>No in-training evaluation in this run (train.py --eval-every).</p>")
    return "\n".join(parts)


# ------------------------------------------------------------------ episode viewer

def episodes(run_dir: Path) -> dict[int, list[dict]]:
    """episodes.jsonl by step; of a step logged twice (a resumed run) the last rows win."""
    kept = {}
    for row in tables._jsonl(run_dir / "episodes.jsonl"):
        kept[(row["step"], row["slot"])] = row
    by_step = {}
    for (step, _), row in sorted(kept.items()):
        by_step.setdefault(step, []).append(row)
    return by_step


def episode_html(row: dict) -> str:
    adv = ", ".join(f"{a:+.3f}" for a in row["advantages"]) or "none (nothing trained)"
    summary = (f"task {row['task_id']} &middot; reward {row['reward']:.3f} &middot; "
               f"{'success' if row['success'] else 'no success'} &middot; {row['turns']} turn{'s' * (row['turns'] != 1)}"
               f" &middot; ended: {esc(row['end'])} &middot; advantage per reply: {adv}")
    body, replies = [], sum(s["trained"] for s in row["segments"])
    seen = 0
    for s in row["segments"]:
        if s["trained"]:
            seen += 1
            tip = f"reply {seen}: {s['tokens']} trained tokens, advantage {s['advantage']:+.4f}"
            body.append(f'<span class="trained" title="{esc(tip)}">{esc(s["text"])}</span>'
                        f'<span class="adv">A {s["advantage"]:+.3f}'
                        + (f" &middot; reward {row['reward']:.3f}" if seen == replies else "") + "</span>")
        else:
            body.append(f'<span class="ctx">{esc(s["text"])}</span>')
    shot = (f'<figure class="shot"><img alt="the page at the end of the episode" '
            f'src="data:image/jpeg;base64,{row["screenshot"]}"><figcaption>the page at the end of this episode'
            f'</figcaption></figure>' if row.get("screenshot") else "")
    error = f'<p class="error">env error: {esc(row["error"])}</p>' if row.get("error") else ""
    return (f'<details class="episode" data-step="{row["step"]}" data-task="{row["task_id"]}"><summary>{summary}'
            f'</summary>{error}<pre class="seq">{"".join(body)}</pre>{shot}</details>')


def viewer(run_dir: Path, metrics: dict) -> str:
    by_step = episodes(run_dir)
    if not by_step:
        return "<p>No episodes were logged (episodes.jsonl is written by train.py at its first, evaluation and last steps).</p>"
    head = ("<p>The first episodes of rank 0 at the first step, at each evaluation step and at the last. "
            '<span class="trained">Highlighted</span>: the tokens the loss trains on (loss mask 1: the sampled reply '
            'and its end-of-turn token); <span class="ctx">grey</span>: the prompt, role headers and observations '
            "(mask 0). After each reply: its advantage (the GRPO/RLOO scalar every token of it gets, or the mean "
            "over its tokens for per-token estimators); the reward sits on the last trained token. "
            '<button type="button" id="open-all">open all</button> <button type="button" id="close-all">close all'
            "</button></p>")
    rows = ["| step | horizon | episodes | mean reward | success | advantages (min, max) | trained tokens |",
            "|---|---|---|---|---|---|---|"]
    for step, eps in by_step.items():
        adv = [a for e in eps for a in e["advantages"]]
        tokens = sum(s["tokens"] for e in eps for s in e["segments"] if s["trained"])
        rows.append(f"| {step} | {metrics.get(step, {}).get('horizon', '')} | {len(eps)} | "
                    f"{sum(e['reward'] for e in eps) / len(eps):.3f} | {sum(e['success'] for e in eps)} of {len(eps)} | "
                    + (f"{min(adv):+.3f}, {max(adv):+.3f}" if adv else "") + f" | {tokens} |")
    parts = [head, markdown_html(rows, "logged")]
    for step, eps in by_step.items():
        parts.append(f'<h3>step {step}</h3>' + "".join(episode_html(e) for e in eps))
    return "\n".join(parts)


TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Run report: {title}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1240px; padding: 0 1em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ border-bottom: 1px solid #ccc; margin-top: 1.6em; }} h3 {{ font-size: 1.05em; }}
code, pre {{ font: 12px/1.4 ui-monospace, monospace; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 10px; }}
.chart {{ margin: 0; border: 1px solid #ddd; padding: 4px; width: min-content; }} .chart figcaption {{ font-size: 12px; font-weight: 600; }}
.grid {{ stroke: #eee; }} .frame {{ fill: none; stroke: #999; }} .tick, .lab {{ font-size: 10px; fill: #555; }}
.lab {{ fill: #2a6b2a; }} .curve {{ fill: none; stroke: #1f5fa8; stroke-width: 1.6; }} .pt {{ fill: #1f5fa8; }}
table {{ border-collapse: collapse; margin: .5em 0 1em; }} th, td {{ border: 1px solid #ccc; padding: 2px 7px; text-align: right; }}
th {{ background: #f3f3f3; }} td:nth-child(-n+2) {{ text-align: left; }}
details.episode {{ border: 1px solid #ccc; margin: 4px 0; padding: 3px 8px; }} details.episode summary {{ cursor: pointer; }}
.seq {{ white-space: pre-wrap; word-break: break-word; background: #fafafa; padding: 6px; max-height: 40em; overflow: auto; }}
.ctx {{ color: #777; }} .trained {{ background: #fff1a8; color: #000; border-bottom: 2px solid #e0b400; }}
.adv {{ font-size: 11px; background: #1f5fa8; color: #fff; padding: 0 4px; margin: 0 3px; border-radius: 3px; }}
.shot img {{ max-width: 640px; border: 1px solid #aaa; }} .error {{ color: #a00; }}
</style></head><body>
<h1>Run report: {title}</h1>
{body}
<script>
for (const [id, open] of [["open-all", true], ["close-all", false]]) {{
  const button = document.getElementById(id);
  if (button) button.addEventListener("click", () => {{
    for (const d of document.querySelectorAll("details.episode")) d.open = open;
  }});
}}
</script>
</body></html>
"""

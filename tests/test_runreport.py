"""The run report (lab/runreport.py) and the episodes it shows (infra/runlog.py): an episode cut into trained and
untrained segments token for token, with each reply's advantage; a chart's stage bands; then the real
page of a real train.py run and two evaluate.py runs, opened in Chromium (Playwright, Debian's
chromium as the browser envs use it): no script error, no request beyond the file itself, one SVG per
curve, table cells equal to the result files, an episode that opens on a click and shows its trained
tokens; and a MiniWoB++ page's screenshot, logged and shown."""
from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

import evaluate as E
from lab import stats as R
from infra import runlog
from lab import runreport
import schedule
from models import tiny
from rollout import ChatFormat, Episode
from tests.test_report import evals, run_dir  # noqa: F401 - the shared train.py run and evaluations

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny.tiny_model_dir())


def two_turn_episode(tok, obs: str = "Turn 1 scored 0.00. More digits.") -> Episode:
    """prompt, reply 1 (eos-closed), observation, reply 2 (cut by its token cap), as rollout.py builds them."""
    chat = ChatFormat(tok)
    ep = Episode(7, 0, chat.prompt("Reply with digits only.", "Task 7: digits"), 0)
    ep.prompt_len = len(ep.ids)
    r1, r2 = chat.encode("12 34") + [chat.eos_id], chat.encode("56")
    ep.append(r1, True, [-0.5] * len(r1))
    ep.append(chat.observation(obs, stopped=True), False)
    ep.append(r2, True, [-0.5] * len(r2))
    ep.reward, ep.turns, ep.end = 0.25, 2, "horizon"
    return ep


def test_episode_record_segments_are_the_trained_tokens(tok):
    ep = two_turn_episode(tok)
    full = [0] * ep.prompt_len + ep.mask                                         # (L,) as collate aligns it
    adv = torch.arange(len(full), dtype=torch.float) * torch.tensor(full, dtype=torch.float)  # distinct per token
    row = runlog.episode_record(3, 0, ep, torch.tensor(full), adv, tok)
    assert [s["trained"] for s in row["segments"]] == [0, 1, 0, 1]
    assert sum(s["tokens"] for s in row["segments"]) == len(ep.ids)
    assert "".join(s["text"] for s in row["segments"]) == tok.decode(ep.ids, skip_special_tokens=False)
    p, n1 = ep.prompt_len, row["segments"][1]["tokens"]
    assert row["segments"][1]["text"] == "12 34" + tok.eos_token  # the end-of-turn token is trained
    assert "<|im_start|>user" in row["segments"][2]["text"] and "More digits." in row["segments"][2]["text"]
    n3 = row["segments"][3]["tokens"]
    assert row["advantages"] == [pytest.approx(p + (n1 - 1) / 2), pytest.approx(len(full) - 1 - (n3 - 1) / 2)]
    assert (row["step"], row["task_id"], row["reward"], row["turns"]) == (3, 7, 0.25, 2)
    # a failed env's episode: collate zeroes its mask, so nothing of it is trained and no reply has an advantage
    failed = runlog.episode_record(3, 1, ep, torch.zeros(len(full)), adv, tok)
    assert [s["trained"] for s in failed["segments"]] == [0] and failed["advantages"] == []


def test_long_observations_are_cut_replies_never(tok):
    ep = two_turn_episode(tok, obs="word " * 3000)
    full = torch.tensor([0] * ep.prompt_len + ep.mask)
    row = runlog.episode_record(0, 0, ep, full, full.float(), tok)
    obs = row["segments"][2]["text"]
    assert len(obs) < runlog.CONTEXT_CHARS + 100 and "characters cut" in obs
    assert row["segments"][3]["text"] == "56" and row["advantages"] == [1.0, 1.0]


def test_logging_steps():
    assert [s for s in range(10) if runlog.episode_step(s, 10, 4)] == [0, 3, 7, 9]
    assert [s for s in range(5) if runlog.episode_step(s, 5, 0)] == [0, 4]


def test_chart_shades_the_stages():
    svg = runreport.chart("reward", "r", [(0, 0.1), (1, 0.5), (2, 0.2), (3, 0.9)], schedule.parse("1,2,4@2"), 4)
    assert svg.count('class="stage"') == 2 and ">1 turn<" in svg and ">2 turns<" in svg and ">4 turns<" not in svg
    assert svg.count("<circle") == 4 and "step 3: 0.9" in svg
    assert 'class="stage"' not in runreport.chart("kl", "k", [(0, 1.0)], schedule.parse("3"), 1)
    assert "not logged in this run" in runreport.chart("kl", "k", [], None, 1)


# ------------------------------------------------------------------ the page, in the browser

def open_page(path: Path, actions):
    """Load a file in Chromium and run `actions(page)`; returns its result, the page's errors (script
    errors and console errors) and every URL it requested."""
    from playwright.sync_api import sync_playwright

    from envs.chromium import chromium_path

    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=["--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        page.on("request", lambda req: requests.append(req.url))
        page.goto(path.resolve().as_uri(), wait_until="load")
        try:
            return actions(page), errors, requests
        finally:
            browser.close()


def table_cells(page, selector: str) -> list[dict]:
    """Rows of a table as {header: cell text}."""
    return page.eval_on_selector(selector, """t => {
        const head = [...t.querySelectorAll("thead th")].map(h => h.textContent);
        return [...t.querySelectorAll("tbody tr")].map(r =>
            Object.fromEntries([...r.children].map((c, i) => [head[i], c.textContent])));
    }""")


def test_report_in_chromium(run_dir, evals, tmp_path):  # noqa: F811 - fixtures from tests.test_report
    proc = subprocess.run([sys.executable, "-m", "lab.report", str(run_dir), *[f"{label}={d}" for label, d in evals]],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = run_dir / "report.html"
    assert proc.stdout.strip() == f"report: {path}"
    logged = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    # 2 steps with --eval-every 1: both steps log rank 0's episodes (2 a rank: 2 tasks x 2 samples / 2 ranks)
    assert [(r["step"], r["slot"]) for r in logged] == [(0, 0), (0, 1), (1, 0), (1, 1)]

    def look(page):
        seen = {"curves": page.eval_on_selector_all("figure.chart", "fs => fs.map(f => f.dataset.curve)"),
                "svgs": page.eval_on_selector_all("figure.chart > svg", "s => s.length"),
                "points": {k: page.eval_on_selector_all(f'figure.chart[data-curve="{k}"] circle', "c => c.length")
                           for k in ("reward", "validation")},
                "compare": table_cells(page, "table.compare"), "paired": table_cells(page, "table.paired"),
                "validation": table_cells(page, "table.validation"),
                "closed": page.eval_on_selector_all("details.episode", "ds => ds.filter(d => !d.open).length")}
        first = page.locator("details.episode").first
        first.locator("summary").click()
        seen["opened"] = first.evaluate("d => d.open")
        seen["trained"] = first.locator("span.trained").first.inner_text()
        seen["visible"] = first.locator("span.trained").first.is_visible()
        seen["adv"] = first.locator("span.adv").first.inner_text()
        page.click("#open-all")
        seen["all_open"] = page.eval_on_selector_all("details.episode", "ds => ds.every(d => d.open)")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        return seen

    seen, errors, requests = open_page(path, look)
    assert errors == []
    assert requests == [path.resolve().as_uri()]  # self-contained: nothing else is fetched
    assert seen["curves"] == [k for k, _ in runreport.CURVES] and seen["svgs"] == len(runreport.CURVES) == 7
    assert seen["points"] == {"reward": 2, "validation": 3}  # 2 steps; validation before RL and after each step
    # the before/after table: each evaluation's success % as evaluate.py wrote it in results.json
    (all_row,) = [r for r in seen["compare"] if r["subtask"] == "all"]
    for label, d in evals:
        success = json.loads((d / "results.json").read_text())["budgets"]["1"]["all"]["success"]
        assert all_row[f"{label} success %"] == f"{100 * success:.1f}"
    diff = R.paired([(label, E.load_transcripts(d / "transcripts.jsonl", 4)[0]) for label, d in evals])[0]["success"]
    assert seen["paired"][0]["success, points [95% interval]"] == \
        f"{100 * diff['diff']:+.1f} [{100 * diff['lo']:+.1f}, {100 * diff['hi']:+.1f}]"
    # the validation curve: each point's success % is the mean of its rows in evals.jsonl
    outcomes = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    for row, point in zip(seen["validation"], [(0, "eval_start"), (0, "eval"), (1, "eval")]):
        mine = [o["success"] for o in outcomes if (o["step"], o["eval"]) == point]
        assert row["success %"] == f"{100 * sum(mine) / len(mine):.1f}" and row["equals metrics.jsonl"] == "yes"
    # the episode viewer: closed at first, opened by a click, its trained tokens highlighted and visible
    assert seen["closed"] == 4 and seen["opened"] and seen["visible"] and seen["all_open"]
    trained = [s for s in logged[0]["segments"] if s["trained"]]
    assert seen["trained"] == trained[0]["text"] and seen["adv"].startswith(f"A {trained[0]['advantage']:+.3f}")


def test_screenshot_of_a_browser_env(run_dir, tok, tmp_path):  # noqa: F811
    from envs.miniwob import MiniWoB

    env = MiniWoB(pages=["click-button"])
    try:
        env.reset(env.tasks("val")[0])
        ep = two_turn_episode(tok)
        full = torch.tensor([0] * ep.prompt_len + ep.mask)
        run = tmp_path / "run"
        shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "report.html"))
        cfg = SimpleNamespace(steps=2, eval_every=0)
        runlog.log_episodes(run, 1, cfg, [ep], {"mask": full[None]}, full[None].float(), tok, [env])
    finally:
        env.close()
    row = json.loads((run / "episodes.jsonl").read_text().splitlines()[-1])
    from PIL import Image
    image = Image.open(io.BytesIO(base64.b64decode(row["screenshot"])))
    # the page's 160 x 210 task area, its grey margin cut away (at most 640 pixels wide, never enlarged)
    assert image.format == "JPEG" and 150 <= image.width <= 200 and 200 <= image.height <= 260
    assert image.getpixel((5, 5))[2] < 100  # the task's yellow instruction bar, top left (blue channel low)
    path = runreport.write(run)
    size, errors, _ = open_page(path, lambda page: page.locator("details.episode img").evaluate(
        "img => { img.closest('details').open = true; return [img.complete, img.naturalWidth]; }"))
    assert errors == [] and size == [True, image.width]

"""MiniWoB++ (Liu et al. 2018; Farama's `miniwob` package): real web tasks in Chromium, read as text.

The benchmark is the package's own `html/` folder: one page per task (`miniwob/<page>.html`), whose
JavaScript draws a random problem, states it in an utterance ("Click on the "Yes" button.") and
scores the episode itself (`core.endEpisode`). A local HTTP server on 127.0.0.1 serves that folder
(some pages refuse `file://`), and the browser backend of the web env (envs/browser.py: one Chromium
per process, one browser context per env) plays it.

Task id = (page, seed): `seed * len(pages) + page index`, so the first ids of a split cover every page.
Reset opens the page in a fresh context, calls `Math.seedrandom(seed)` and `core.startEpisodeReal()`,
and waits for `WOB_TASK_READY`; every observation waits for the task's images (icons have no size, so
no tree line, until theirs has loaded). The same id gives the same utterance and tree, ids included.
Test seeds are 0 .. test_seeds-1, train seeds the next train_seeds, validation ("val") seeds the next
val_seeds: the splits never share a problem.
The subtask of a task is its page name, so evaluate.py reports per page.

The observation is the web env's (envs/webarena.py): `OBSERVATION:`, the tabs, the accessibility tree
(`[id] role 'name'` lines), `URL:`, `OBJECTIVE:` (the utterance), `PREVIOUS ACTION:`; the actions are
its grammar (click [id], type [id] [text] [0|1], hover, press, scroll, ..., stop [answer]), so one agent
prompt serves both envs. The reward is the page's raw reward `WOB_RAW_REWARD_GLOBAL` (1 success, -1
failure, partial on a few pages), returned on the step where `WOB_DONE_GLOBAL` turns true, which ends
the episode. Until then every step reports -1, and `stop` ends the episode with -1: a page that has not
judged the episode by the end of the turn budget (or that the agent gives up on) counts as MiniWoB's own
timeout, `core.endEpisode(-1, false, 'timed out')` (core.js). A 0 there would pay an agent for stalling:
a wrong click that ends the episode costs -1, and RL from a weak warm start learned within two steps to
avoid ending episodes at all.

Departures from MiniWoB++:
- No real-time limit. The pages end an episode after `core.EPISODE_MAX_TIME` (10 s) with reward -1 and
  decay the reward with wall time (`WOB_REWARD_GLOBAL`); a CPU model thinks for longer than that per
  turn. The limit is set to about 11 days after the page loads, and the raw reward is used.
- The reward display and the click canvas that core.js draws beside the task are hidden: they are the
  harness's, not the task's (a "Time left" counter would change the observation every step).
- Icon-only controls (the email pages' trash, star, reply and forward icons, drawn by CSS `content:`,
  and focusable ones such as a slider's handle) have no accessible name, so the tree would drop them;
  before each observation such elements get an `aria-label` from their class or id (e.g. 'trash'),
  given again each time (an opened folder's icon reads 'hitarea collapsable'). Clickable text that is
  no link to the browser (a span with a click handler and a pointer cursor, as click-link's links)
  gets the role link.
- The tree keeps every element a task needs (browser.Context(exact=False), envs/axtree.py): a text is
  not dropped for repeating words of the instruction above it or a line's id, and a textarea shows
  `multiline: True`.
- Before each observation the page settles (browser.Context._quiet): what it shows a moment after an
  action (use-autocomplete's suggestions, 300 ms after a keystroke) is in that action's observation.
- In a list of several choices (<select multiple>, click-scroll-list) a click adds or removes an option,
  as ctrl+click does.
- Ids are numbered 1, 2, ... in order of first appearance in the episode (browser.Context's
  stable_ids), not Chrome's DOM node ids, which differ between contexts for the same page.
- Data mode "train" (`core.setDataMode`, which a few -nl and -turk pages read) for both splits; our
  splits are by seed.
- The pages' own server is the only site an episode reaches (sandbox.py, docs/web.md).

90 of the 130 pages are offered. Left out (LEFT_OUT, with the reason; docs/web.md lists them):
dragging and text selection (drag-*, daily-calendar, highlight-text*, resize-textarea, text-editor);
drawing and pixel coordinates (draw-*, bisect-angle, circle-center, find-midpoint, right-angle,
hot-cold, click-pie*); shapes and colours that the accessibility tree does not carry (SVG or canvas:
click-color, click-shades, click-shape, count-shape, count-sides, identify-shape, visual-addition,
use-colorwheel*, tic-tac-toe); real time (chase-circle, moving-items, simon-says, stock-market,
hover-shape); native date/time pickers that neither `type` nor key presses fill (enter-date,
enter-time; tested). grid-coordinate (its 25 circles are listed in a fixed order), ascending-numbers
(its hidden squares are listed in the numbers' order), use-slider, use-slider-2, form-sequence (a
handle is focused by a click or Tab, and arrow keys move it) and click-scroll-list are offered: the
tests solve them. Of the other offered pages the tests solve ten (the expert's) and navigate-tree;
the rest were judged from their source and their first observation, not each solved.

Options: pages (a list of page names; default all offered), test_seeds, train_seeds, val_seeds, width, height, brief
(a 140-token instruction instead of the web env's 530, for the CPU recipe).
Test: python -m pytest tests/test_miniwob.py. Bench: python bench/envs.py --envs miniwob --pool 16.
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import threading
import time
from pathlib import Path

from . import browser, miniwob_expert
from .webarena import _BLOCK, HELP, INSTRUCTION, act, observation, parse

LEFT_OUT = {
    **dict.fromkeys(["drag-box", "drag-circle", "drag-cube", "drag-items", "drag-items-grid", "drag-shapes",
                     "drag-shapes-2", "drag-single-shape", "drag-sort-numbers", "resize-textarea", "daily-calendar"],
                    "dragging"),
    **dict.fromkeys(["highlight-text", "highlight-text-2", "text-editor"], "selecting text with the mouse"),
    **dict.fromkeys(["draw-circle", "draw-line", "bisect-angle", "circle-center", "find-midpoint", "right-angle",
                     "hot-cold", "click-pie", "click-pie-nodelay"],
                    "drawing or clicking at pixel coordinates"),
    **dict.fromkeys(["click-color", "click-shades", "click-shape", "count-shape", "count-sides", "identify-shape",
                     "visual-addition", "use-colorwheel", "use-colorwheel-2", "tic-tac-toe"],
                    "shapes or colours that the accessibility tree does not carry"),
    **dict.fromkeys(["chase-circle", "moving-items", "simon-says", "stock-market", "hover-shape"], "real time"),
    **dict.fromkeys(["enter-date", "enter-time"], "a native date/time picker that neither `type` nor key presses fill"),
}
MAX_TIME_MS = 1_000_000_000  # ~11.6 days; not more: setTimeout fires at once for delays above 2**31 - 1 ms
READY_WAIT_S = 5.0
PUBLIC = "http://miniwob.farama.org"  # the pages' host as the observation names it
TYPABLE = ("textbox", "searchbox", "combobox", "spinbutton")  # spinbutton: <input type=number> (use-spinner)

INSTRUCTION_MINIWOB = INSTRUCTION.replace(
    "The homepage http://homepage.com lists the websites you can visit. You are already logged in on every site.",
    "Each task is a small web page; the objective says what to do on it. The episode ends when the page "
    "has judged your actions.")

# The whole instruction in about 140 tokens instead of about 530: every token of it is prefilled in
# every rollout and run forward and backward in every update, which on 2 CPU cores is most of a step's
# time. Opt-in (`brief=True`), for the CPU learning recipe; same grammar, same reply format.
BRIEF_INSTRUCTION = """You operate a web page to complete a task. Each turn you see the page as an accessibility tree, \
one element per line as [id] role 'name', and the OBJECTIVE.
Actions: click [id], type [id] [text] [press_enter_after=0|1], hover [id], press [key_comb], scroll [up|down], \
stop [answer].
Reply with one short sentence, then end with "In summary, the next action I will perform is" followed by \
one action inside ``````, e.g. In summary, the next action I will perform is ```click [12]```"""

UNJUDGED = -1.0  # the reward of an episode the page has not judged (yet): MiniWoB's timeout reward

# Run in the page after load: the harness's own widgets out of sight, no real-time limit.
_SETUP = """(() => {
  const style = document.createElement("style");
  style.textContent = "#reward-display, #click-canvas { display: none !important; }";
  document.head.appendChild(style);
  core.EPISODE_MAX_TIME = %d;
  if (core.setDataMode) core.setDataMode("train");
  Math.seedrandom(%d);
  core.startEpisodeReal();
  return true;
})()"""

# Before each observation (see the docstring): name the icon-only controls (no text, no label, drawn by
# CSS `content:` or a background image, or focusable such as a slider's handle) after their class or
# id, and show clickable text (a span or div whose own cursor is a pointer, e.g. click-link's links) as
# a link: the tree would otherwise show the former not at all and the latter as plain text. A name
# given here is given again each time (data-wa-named), since a class changes: an opened folder's icon.
_ANNOTATE = """(() => {
  const native = new Set(["A", "BUTTON", "INPUT", "TEXTAREA", "SELECT", "OPTION", "LABEL"]);
  for (const e of document.querySelectorAll("#area *")) {
    const ours = e.hasAttribute("data-wa-named");
    if (native.has(e.tagName) || e.hasAttribute("role") || e.hasAttribute("aria-label") && !ours || e.children.length) continue;
    const style = getComputedStyle(e);
    if (e.textContent.trim()) {
      const parent = e.parentElement && getComputedStyle(e.parentElement).cursor;
      if (style.cursor === "pointer" && parent !== "pointer") e.setAttribute("role", "link");
      continue;
    }
    if (style.content === "normal" && style.backgroundImage === "none" && style.cursor !== "pointer" && e.tabIndex < 0) continue;
    const name = (e.id || e.className || "").toString().replace(/[-_]+/g, " ").trim();
    if (name && e.getAttribute("aria-label") !== name) { e.setAttribute("aria-label", name); e.setAttribute("data-wa-named", ""); }
  }
  return true;
})()"""

# Wait until the task's images are decoded. Icons drawn by CSS (`content: url(...)`, e.g. the email
# pages' trash icon) have no size until their file has loaded, and the tree drops elements of no size:
# about one observation in 20 lacked every icon of a freshly drawn inbox.
_IMAGES = r"""(async () => {
  const urls = new Set([...document.querySelectorAll("#area img")].map(img => img.src));
  for (const e of document.querySelectorAll("#area *")) {
    const style = getComputedStyle(e);
    for (const value of [style.content, style.backgroundImage]) {
      const m = /url\("?([^")]+)"?\)/.exec(value);
      if (m) urls.add(m[1]);
    }
  }
  const loads = [...urls].map(url => { const i = new Image(); i.src = url; return i.decode().catch(() => null); });
  // At most 2 s, and a timer beside the frame: a page Chrome deems hidden never runs animation frames.
  // The timers are cleared after use: a pending one would keep the browser's settling wait going.
  let timer;
  await Promise.race([Promise.all(loads), new Promise(done => { timer = setTimeout(done, 2000); })]);
  clearTimeout(timer);
  await new Promise(done => { requestAnimationFrame(() => done()); timer = setTimeout(done, 100); });
  clearTimeout(timer);
  return urls.size;
})()"""

# The -nl pages in "train" data mode return {utterance, fields} from getUtterance, not the string.
_STATE = """[WOB_TASK_READY, WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL,
             (u => typeof u === "string" ? u : u.utterance)(core.getUtterance())]"""


def html_dir() -> Path:
    """The `html/` folder of the installed miniwob package, found without importing it (it needs gymnasium)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MiniWoB++ is not installed: pip install --no-deps miniwob==1.1.0 (its html/ folder "
                           "is the benchmark; the package itself is not imported)")
    return Path(list(spec.submodule_search_locations)[0]) / "html"


def all_pages() -> list[str]:
    return sorted(p.stem for p in (html_dir() / "miniwob").glob("*.html"))


def offered_pages() -> list[str]:
    return [p for p in all_pages() if p not in LEFT_OUT]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    # Without a charset Chrome reads the pages as Windows-1252: unicode-test's "ÖK" would show as "Ã–K".
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8"}

    def log_message(self, *args):  # one line per file per episode would flood the training log
        pass


_server: http.server.ThreadingHTTPServer | None = None
_lock = threading.Lock()


def server_url() -> str:
    """The base URL of the process's one HTTP server over the html/ folder (started on first use)."""
    global _server
    with _lock:
        if _server is None:
            handler = functools.partial(_Quiet, directory=str(html_dir()))
            _server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            _server.daemon_threads = True
            threading.Thread(target=_server.serve_forever, name="miniwob-http", daemon=True).start()
        return f"http://127.0.0.1:{_server.server_address[1]}"


class MiniWoB:
    """MiniWoB++ pages in the browser backend, in the web env's text interface."""

    instruction = INSTRUCTION_MINIWOB

    def __init__(self, pages: list[str] | None = None, test_seeds: int = 100, train_seeds: int = 10_000,
                 val_seeds: int = 100, width: int = 1280, height: int = 720, brief: bool = False):
        self.instruction = BRIEF_INSTRUCTION if brief else INSTRUCTION_MINIWOB
        known = set(all_pages())
        self.pages = list(pages) if pages else offered_pages()
        unknown = [p for p in self.pages if p not in known]
        if unknown:
            raise ValueError(f"unknown MiniWoB++ pages {unknown}; the package has {len(known)}, e.g. click-button")
        self.test_seeds, self.train_seeds, self.val_seeds = test_seeds, train_seeds, val_seeds
        # The server's port changes from run to run; the observation shows a fixed public name instead,
        # so that the same task gives the same text in every process.
        self.view = browser.Context(width=width, height=height, to_public=lambda u: u.replace(server_url(), PUBLIC),
                                    to_local=lambda u: u.replace(PUBLIC, server_url()), stable_ids=True,
                                    origins=[server_url()], exact=False)
        self.task = None
        self.success = self.done = False

    # ------------------------------------------------------------------ protocol
    def tasks(self, split: str) -> list[int]:
        seeds = {"test": range(self.test_seeds), "train": range(self.test_seeds, self.test_seeds + self.train_seeds)}
        seeds["val"] = range(seeds["train"].stop, seeds["train"].stop + self.val_seeds)
        if split not in seeds:
            raise ValueError(f"unknown split {split!r}; choose 'train', 'val' or 'test'")
        return [seed * len(self.pages) + i for seed in seeds[split] for i in range(len(self.pages))]

    def page_seed(self, task_id: int) -> tuple[str, int]:
        return self.pages[task_id % len(self.pages)], task_id // len(self.pages)

    def subtask(self, task_id: int) -> str:
        return self.page_seed(task_id)[0]

    def reset(self, task_id: int) -> str:
        page, seed = self.page_seed(task_id)
        self.task, self.previous = (page, seed), "None"
        self.success = self.done = False
        self.reward = UNJUDGED
        self.view.open(f"{PUBLIC}/miniwob/{page}.html")  # a fresh context: ids start over, same seed same ids
        self.view.script(_SETUP % (MAX_TIME_MS, seed))
        deadline = time.monotonic() + READY_WAIT_S
        state = self.view.script(_STATE)
        while state is not None and not state[0] and time.monotonic() < deadline:  # a few pages load data first
            time.sleep(0.05)
            state = self.view.script(_STATE)
        self.utterance = state[3] if state else "(the page did not load; reset again)"
        self.first, self._plan = self.observe(), None
        return self.first

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.task is None:
            return "No task is loaded: call reset(task_id) first.", UNJUDGED, False
        if self.done:
            return "The episode is over. Call reset(task_id) for a new task.", self.reward, True
        match = _BLOCK.search(text if isinstance(text, str) else "")
        self.previous = self._execute(match[1].strip()) if match else f"Invalid reply: no action found. {HELP}"
        if not self.done:
            state = self.view.script(_STATE)
            if state is not None and state[1]:  # the page judged the episode
                self.reward, self.done = float(state[2]), True
                self.success = self.reward > 0
        if self.done:
            return f"{self.previous}\nThe episode is over: the page gave reward {self.reward:g}.", self.reward, True
        return self.observe(), UNJUDGED, False

    def expert(self) -> str:
        """The scripted expert's reply for the current state (envs/miniwob_expert.py): the whole plan is
        read from the episode's first observation, one step per call."""
        if self.task is None or self.done:
            raise RuntimeError("the episode is over: reset the environment before asking the expert")
        if self._plan is None:
            self._plan = miniwob_expert.plan(self.task[0], self.first)
        step = self._plan.pop(0) if self._plan else ("The plan is done but the page has not ended.", "stop [done]")
        return miniwob_expert.reply(*step)

    def close(self) -> None:
        self.task = None
        self.view.close()

    def observe(self) -> str:
        self.view.script(_IMAGES)
        self.view.script(_ANNOTATE)
        return observation(self.view, self.utterance, self.previous)

    # ------------------------------------------------------------------ actions
    def _execute(self, action: str) -> str:
        """Run one action; return the PREVIOUS ACTION text (its description, or what was wrong)."""
        parsed = parse(action)
        if isinstance(parsed, str):
            return f"Invalid action {action[:100]!r}: {parsed}. {HELP}"
        name, args = parsed
        if name == "stop":
            self.done = True  # reward stays UNJUDGED: the page never judged the episode
            return f"stop [{args[0][:200]}]"
        return act(self.view, action, name, args, TYPABLE, "a textbox, searchbox, combobox or spinbutton", hint="")

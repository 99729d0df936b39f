"""Web navigation (WebArena, as wrapped by AgentGym), on offline simulated sites or on the real ones.

The agent browses four simulated sites (envs/websites/: a shop, its admin panel and CMS, a forum, a
git host) in WebArena's text interface. Each observation is WebArena's CoT prompt template
(`OBSERVATION:` / `URL:` / `OBJECTIVE:` / `PREVIOUS ACTION:`) around the page text of
`TextObervationProcessor`: the open tabs (`Tab 0 (current): <title> | Tab 1: ...`), a blank line,
then the accessibility tree of the current viewport, one `[id] role 'name'` line per node indented
by depth. Only nodes in the viewport are shown and can be acted on; `scroll [down|up]` moves it (a
window of `viewport_lines` lines in the text backend, of the browser's height in pixels in Chromium). The reply's first triple-backtick
block is the action, in WebArena's id-based grammar: click [id], type [id] [text] [0|1] (Enter after
unless 0), hover [id], press [key_comb], scroll [up|down], new_tab, tab_focus [i], close_tab,
goto [url], go_back, go_forward, stop [answer]. The previous-action line repeats WebArena's wording
(`click [12] where [12] is link 'Orders'`) and carries the error when an action was malformed or
impossible; such actions change nothing and never raise.

Tasks come from a seed in WebArena's three evaluation kinds: info (the `stop` answer must match,
after normalisation, e.g. `$1,234.50` == `1234.5`), nav (the URL when stopping must match: same host
and path, the target's query parameters present) and state (a program checks the sites' data, e.g.
an order was placed or an issue closed). Reward is 1 or 0 on `stop`, which ends the episode.

Two backends show the same sites (`backend` option): "text" (default, envs/websites/textview.py)
renders the node trees in Python, about a millisecond a step, for CPU training; "browser"
(envs/browser.py) serves the sites as web apps on 127.0.0.1 ports (envs/websites/server.py) and reads
Chromium's accessibility tree, as WebArena does. On the same task the same actions give the same
rewards and the same ids, roles and names (tests/test_browser.py).

The real WebArena: `configs` (a directory of WebArena task configs, or one JSON list of them) and `sites`
(each site's URL) load those tasks instead, in the browser, scored by WebArena's own evaluators
(envs/webarena_configs.py): `--env-options '{"configs": "config_files", "sites": {"shopping":
"http://host:7770", ...}, "auth_dir": ".auth"}'`; `"configs": "webarena"` loads the 812 original
configs of the libwebarena package. Task ids are then the configs' task_id.

Departures from WebArena: the local sites are small Python simulations, not the docker images; data
and tasks are generated (a few hundred tasks, about 35 templates) instead of the 812 human-written
ones; `type` replaces a field's text instead of appending to it; with the text backend no site is ever
fetched (a URL outside the simulated hosts gets an error page). In the browser an episode reaches only
its sites (the local servers, or the configured WebArena sites): any other address, scheme or host is
refused for every request, with a clear observation (envs/sandbox.py, docs/web.md).
Test: `python -m pytest tests/test_webarena.py tests/test_browser.py tests/test_webarena_configs.py
tests/test_webarena_812.py`.
"""
from __future__ import annotations

import copy
import re

from .websites import build_world, make_sites, make_tasks
from .websites.page import parse_url, url_matches
from .websites.textview import TextView

INSTRUCTION = """You are an autonomous agent that operates a web browser to complete web-based tasks. You act by issuing specific actions.

Each turn you get:
- the objective: the task you must complete;
- the accessibility tree of the current web page: a simplified view of the page, one element per line as [id] role 'name';
- the URL of the current page, and the open tabs;
- the previous action, to track your progress (it also reports an action that failed).

Page operation actions:
`click [id]`: click the element with this id.
`type [id] [content] [press_enter_after=0|1]`: type content into the field with this id; Enter is pressed afterwards unless press_enter_after is 0.
`hover [id]`: hover over the element with this id.
`press [key_comb]`: press a key combination (e.g. Enter, PageDown, Ctrl+a).
`scroll [direction=down|up]`: scroll the page to see other parts of it.

Tab management actions:
`new_tab`: open a new, empty tab.
`tab_focus [tab_index]`: switch to the tab with this index.
`close_tab`: close the current tab.

URL navigation actions:
`goto [url]`: open a URL.
`go_back`: go to the previously viewed page.
`go_forward`: go to the next page (after a go_back).

Completion action:
`stop [answer]`: issue it when you think the task is done. If the objective asks for a text answer, put it in the brackets; if the task is impossible, answer "N/A".

The homepage http://homepage.com lists the websites you can visit. You are already logged in on every site.

Rules:
1. Only issue an action that is valid for the current observation.
2. Issue exactly one action per reply.
3. Reason step by step, then give the action.
4. Write the action in the correct format: end with the phrase "In summary, the next action I will perform is" followed by the action inside ``````, for example "In summary, the next action I will perform is ```click [1234]```".
5. Issue stop when the objective is reached; write nothing after it."""

HELP = ("Put exactly one action inside a pair of ``` and its arguments inside [], e.g. ```click [1234]```. "
        "Actions: click [id], type [id] [text] [0|1], hover [id], press [key_comb], scroll [up|down], new_tab, "
        "tab_focus [tab_index], close_tab, goto [url], go_back, go_forward, stop [answer].")
_BLOCK = re.compile(r"```(.*?)```", re.DOTALL)
_MODIFIERS = {"ctrl", "control", "alt", "shift", "meta", "cmd", "command"}
_KEYS = {k.lower() for k in ["Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Home", "End", "PageUp",
                             "PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Left", "Right"]}
_MAX_ACTION_CHARS = 2000  # a 10k-character `type` is a degenerate reply, not a web action


def observation(view, objective: str, previous: str) -> str:
    """WebArena's observation text: the tabs, the accessibility tree and URL of a view, the objective, and
    what the previous action did (shared by every env that speaks this interface, e.g. MiniWoB++)."""
    tabs, tree, address = view.observe()
    return f"OBSERVATION:\n{tabs}\n\n{tree}\nURL: {address}\nOBJECTIVE: {objective}\nPREVIOUS ACTION: {previous}"


def normalize(answer: str) -> str:
    """Case, spaces, quotes and a final period ignored; numbers compared as numbers ($ and , dropped)."""
    s = " ".join(answer.strip().strip("\"'` ").lower().split()).rstrip(".").strip()
    number = s.replace("$", "").replace(",", "")
    return str(float(number)) if re.fullmatch(r"-?\d+(\.\d+)?", number) else s



def act(view, action: str, name: str, args: tuple, typable=("textbox", "searchbox", "combobox"),
        typable_text: str = "a textbox or searchbox", hint: str = "; scroll to see other parts of the page",
        refused: tuple = ()) -> str:
    """One parsed action other than stop, run on a page `view` (WebArena's and MiniWoB++'s alike): the PREVIOUS
    ACTION text, i.e. what was done (with the element it touched and any error the page gave), or why it was
    not done: an id that is not in the view, text typed into what takes none, an error of a `refused` action."""
    said = f"{'goto' if name == 'go' else name} [{args[0]}]" if args else name
    if name in ("click", "hover", "type"):
        eid = args[0]
        content = view.describe(eid)
        if content is None:
            return (f'Attempt to perform "{name}" on element "[{eid}]" but no matching element was found in the '
                    f"current view. Check the ids in the observation{hint}.")
        if name == "type" and content.split(" ", 1)[0] not in typable:
            return f"Attempt to type into [{eid}], which is {content}; only {typable_text} accepts text."
        said = (f"type [{eid}] [{args[1][:100]}] [{int(args[2])}]" if name == "type" else f"{name} [{eid}]") + \
            f" where [{eid}] is {content}"
    error = view.call(name, *args)
    if error and name in refused:
        return f"Invalid action {action[:100]!r}: {error}. {HELP}"
    return f"{said} ({error})" if error else said


def parse(action: str) -> tuple[str, tuple] | str:
    """(name, arguments) of one action in WebArena's grammar, or what is wrong with it."""
    if not action:
        return "the ``` block is empty"
    if len(action) > _MAX_ACTION_CHARS:
        return f"longer than {_MAX_ACTION_CHARS} characters"
    name = (action.split("[")[0] if "[" in action else action.split()[0]).strip().lower()
    if name in ("click", "hover", "type"):
        if name == "type" and not re.search(r"\[[01]\]\s*$", action):
            action += " [1]"  # as WebArena: Enter is pressed unless told otherwise
        pattern = r"type ?\[(\d+)\] ?\[(.+)\] ?\[([01])\]\s*$" if name == "type" else rf"{name} ?\[(\d+)\]"
        m = re.search(pattern, action, re.IGNORECASE)
        if m is None:
            form = "type [id] [text] [0|1]" if name == "type" else f"{name} [id]"
            return f"write it as {form} with a number as id"
        return (name, (int(m[1]), m[2], m[3] == "1")) if name == "type" else (name, (int(m[1]),))
    if name == "press":
        m = re.search(r"press ?\[(.+)\]", action, re.IGNORECASE)
        if m is None:
            return "write it as press [key_comb]"
        combo = m[1].strip()
        *mods, key = combo.split("+") if combo != "+" else ["+"]
        if any(x.strip().lower() not in _MODIFIERS for x in mods) or not (len(key) == 1 or key.lower() in _KEYS):
            return (f"unknown key combination {combo[:50]!r}. Use key names such as Enter, Tab, PageDown, ArrowLeft, "
                    "or single characters, joined by + with Ctrl, Alt, Shift or Meta")
        return name, (combo,)
    if name == "scroll":
        m = re.search(r"scroll ?\[?(up|down)\]?", action, re.IGNORECASE)
        return ("scroll", (m[1].lower(),)) if m else "write it as scroll [down] or scroll [up]"
    if name == "goto":
        m = re.search(r"goto ?\[(.+)\]", action, re.IGNORECASE)
        if m is None:
            return "write it as goto [url]"
        address = m[1].strip()
        if re.match(r"[a-z][a-z0-9+.-]*:(?!\d)", address, re.IGNORECASE) and "://" not in address:
            return "go", (address,)  # about:, data:, javascript:, view-source:, ...: the browser refuses all but about:blank
        address = address if "://" in address else "http://" + address
        try:
            parse_url(address)
        except ValueError as error:  # urllib rejects e.g. a malformed IPv6 host
            return f"the URL cannot be parsed ({error})"
        return "go", (address,)
    if name == "tab_focus":
        m = re.search(r"tab_focus ?\[(\d+)\]", action, re.IGNORECASE)
        return ("tab_focus", (int(m[1]),)) if m else "give the index of an open tab as tab_focus [i]"
    if name == "stop":
        m = re.search(r"stop ?\[(.*)\]", action, re.IGNORECASE | re.DOTALL)
        return "stop", (m[1].strip() if m else "",)
    if name in ("new_tab", "close_tab", "go_back", "go_forward"):
        return name, ()
    return f"unknown action {name[:30]!r}"


class WebArena:
    """WebArena's text interface on the local sites, or on the real ones.

    Options: seed (sites and tasks), viewport_lines (text backend), per_template, test_every (every n-th
    task is test, every 2n-th after it validation); backend
    ("text" or "browser"), width, height, viewport_only (browser); configs, sites, auth_dir, judge,
    skip_unsupported (real WebArena tasks, envs/webarena_configs.py).
    """

    instruction = INSTRUCTION

    def __init__(self, seed: int = 0, viewport_lines: int = 50, per_template: int = 8, test_every: int = 5,
                 backend: str = "text", width: int = 1280, height: int = 720, viewport_only: bool = True,
                 configs: str | None = None, sites: dict[str, str] | None = None, auth_dir: str | None = None,
                 judge: str | None = None, skip_unsupported: bool = False):
        if backend not in ("text", "browser"):
            raise ValueError(f"unknown backend {backend!r}; choose 'text' (fast, Python) or 'browser' (Chromium)")
        self.viewport, self.test_every, self.backend = viewport_lines, test_every, backend
        self.configs = None
        if configs is not None:  # the real WebArena: its task configs, its sites, always in the browser
            from . import webarena_configs
            self.configs = webarena_configs.load(configs, sites or {}, auth_dir, judge, skip_unsupported)
            self.task_list, self.backend = self.configs.tasks, "browser"
            self._by_id = {t.config["task_id"]: t for t in self.task_list}
            to_local, to_public = self.configs.to_local, self.configs.to_public
        else:
            self.world0 = build_world(seed)  # pristine data; every episode plays on a deep copy
            self.task_list = make_tasks(self.world0, seed, per_template)
        if self.backend == "browser":
            from . import browser
            if self.configs is None:
                from .websites import server
                self.server = server.shared()
                to_local, to_public = self.server.to_local, self.server.to_public
                origins = [f"http://127.0.0.1:{port}" for port in self.server.ports.values()]
            else:
                origins = list(self.configs.sites.values())
            # The episode may reach its sites only (sandbox.py, docs/web.md): model actions are untrusted.
            self.view = browser.Context(width=width, height=height, viewport_only=viewport_only,
                                        to_local=to_local, to_public=to_public, origins=origins)
        self.task = None
        self.success = self.done = False

    # ------------------------------------------------------------------ protocol
    def tasks(self, split: str) -> list[int]:
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}; choose 'train', 'val' or 'test'")
        if self.configs is not None:  # WebArena's configs are one evaluation set, numbered by their task_id
            if split == "val":
                raise ValueError("the real WebArena configs are one evaluation set: there is no validation split")
            return list(self._by_id)
        # every test_every-th task is test; of the others, every (2 * test_every)-th after that is validation
        te = self.test_every
        return [i for i in range(len(self.task_list))
                if ("test" if i % te == 0 else "val" if i % (2 * te) == 1 else "train") == split]

    def _task(self, task_id: int):
        if self.configs is None:
            return self.task_list[task_id]
        if task_id not in self._by_id:
            raise ValueError(f"no loaded WebArena config has task_id {task_id} (loaded: {len(self._by_id)} configs)")
        return self._by_id[task_id]

    def subtask(self, task_id: int) -> str:
        return self._task(task_id).site

    def reset(self, task_id: int) -> str:
        self.task = self._task(task_id)
        self.success = self.done = False
        self.previous, self.reward = "None", 0.0
        if self.configs is not None:
            self.view.open(self.task.start_url, storage_state=self.configs.storage_state(self.task))
        elif self.backend == "text":
            self.world = copy.deepcopy(self.world0)
            self.view = TextView(make_sites(self.world), self.viewport)
            self.view.open(self.task.start_url)
        else:
            self.world = copy.deepcopy(self.world0)
            key = f"{id(self):x}"  # this env's world on the shared server, chosen by a cookie
            self.server.open_world(key, self.world)
            self.view.open(self.task.start_url, cookies=[{"name": "wa_world", "value": key, "url": "http://127.0.0.1"}])
        return self.observe()

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.task is None:
            return "No task is loaded: call reset(task_id) first.", 0.0, False
        if self.done:
            return ("The episode is over (stop was issued). Call reset(task_id) for a new task.",
                    float(self.success), True)
        match = _BLOCK.search(text if isinstance(text, str) else "")
        if match is None:
            self.previous = f"Invalid reply: no action found. {HELP}"
        else:
            self.previous = self._execute(match[1].strip())
        if self.done:
            verdict = "passed" if self.success else "did not pass"
            return f"{self.previous}\nThe episode is over: the task check {verdict}.", self.reward, True
        return self.observe(), 0.0, False

    def close(self) -> None:
        self.task = None
        if self.backend == "browser":
            self.view.close()
            if self.configs is None:
                self.server.close_world(f"{id(self):x}")

    def observe(self) -> str:
        return observation(self.view, self.task.objective, self.previous)

    # ------------------------------------------------------------------ actions
    def _execute(self, action: str) -> str:
        """Run one action; return the PREVIOUS ACTION text (its description, or what was wrong)."""
        parsed = parse(action)
        if isinstance(parsed, str):
            return f"Invalid action {action[:100]!r}: {parsed}. {HELP}"
        name, args = parsed
        if name == "stop":
            self.reward, problem = self._evaluate(args[0])
            self.success, self.done = self.reward == 1.0, True
            return f"stop [{args[0][:200]}]" + (f" (the task could not be scored: {problem})" if problem else "")
        return act(self.view, action, name, args, refused=("new_tab", "tab_focus"))

    def _evaluate(self, answer: str) -> tuple[float, str]:
        """(score, "") or (0, why it could not be scored: the browser died, or a site's API did not answer)."""
        task = self.task
        if self.configs is not None:
            from .browser import PlaywrightError
            try:
                return self.configs.evaluate(task, answer, self.view), ""
            except (PlaywrightError, OSError) as error:  # OSError: the shop's REST API did not answer
                return 0.0, (str(error).splitlines() or [type(error).__name__])[0][:200]
        if task.kind == "info":
            return float(any(normalize(answer) == normalize(a) for a in task.answers)), ""
        if task.kind == "nav":
            return float(url_matches(self.view.url(), task.url)), ""
        return float(bool(task.check(self.world))), ""

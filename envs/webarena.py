"""Web navigation (WebArena, as wrapped by AgentGym), on offline simulated sites.

The agent browses four simulated sites (envs/websites/: a shop, its admin panel and CMS, a forum, a
git host) in WebArena's text interface. Each observation is WebArena's CoT prompt template
(`OBSERVATION:` / `URL:` / `OBJECTIVE:` / `PREVIOUS ACTION:`) around the page text of
`TextObervationProcessor`: the open tabs (`Tab 0 (current): <title> | Tab 1: ...`), a blank line,
then the accessibility tree of the current viewport, one `[id] role 'name'` line per node indented
by depth. Only nodes in the viewport are shown and can be acted on; long pages are cut into windows
of `viewport_lines` lines that `scroll [down|up]` moves through. The reply's first triple-backtick
block is the action, in WebArena's id-based grammar: click [id], type [id] [text] [0|1] (Enter after
unless 0), hover [id], press [key_comb], scroll [up|down], new_tab, tab_focus [i], close_tab,
goto [url], go_back, go_forward, stop [answer]. The previous-action line repeats WebArena's wording
(`click [12] where [12] is link 'Orders'`) and carries the error when an action was malformed or
impossible; such actions change nothing and never raise.

Tasks come from a seed in WebArena's three evaluation kinds: info (the `stop` answer must match,
after normalisation, e.g. `$1,234.50` == `1234.5`), nav (the URL when stopping must match: same host
and path, the target's query parameters present) and state (a program checks the sites' data, e.g.
an order was placed or an issue closed). Reward is 1 or 0 on `stop`, which ends the episode.

Departures from WebArena: the sites are small Python simulations, not the docker images; data and
tasks are generated (a few hundred tasks, about 35 templates) instead of the 812 human-written ones;
there is no LLM-judged fuzzy match; `type` replaces a field's text instead of appending to it; and
no site is ever fetched (a URL outside the simulated hosts gets an error page).
Test: `python -m pytest tests/test_webarena.py`.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from .websites import build_world, make_sites, make_tasks
from .websites.page import Node, heading, id_base, link, parse_url, render, text, url, url_matches

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
_KEYS = {k.lower(): k for k in ["Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Home", "End", "PageUp",
                                "PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Left", "Right"]}
_MAX_ACTION_CHARS = 2000  # a 10k-character `type` is a degenerate reply, not a web action
_MAX_TABS = 10  # every observation lists each tab's title, so tabs cost a page render each


def normalize(answer: str) -> str:
    """Case, spaces, quotes and a final period ignored; numbers compared as numbers ($ and , dropped)."""
    s = " ".join(answer.strip().strip("\"'` ").lower().split()).rstrip(".").strip()
    number = s.replace("$", "").replace(",", "")
    return str(float(number)) if re.fullmatch(r"-?\d+(\.\d+)?", number) else s


@dataclass
class Tab:
    history: list[str]
    index: int = 0
    scroll: int = 0                                   # which viewport window is shown
    values: dict[str, str] = field(default_factory=dict)  # form fields typed/toggled on this page
    focus: str = ""                                   # field of the focused text box (for press [Enter])
    flash: str = ""                                   # the site's message after a form submission

    @property
    def url(self) -> str:
        return self.history[self.index]


class WebArena:
    """Simulated WebArena. Options: seed (sites and tasks), viewport_lines, per_template, test_every."""

    instruction = INSTRUCTION

    def __init__(self, seed: int = 0, viewport_lines: int = 50, per_template: int = 8, test_every: int = 5):
        self.world0 = build_world(seed)  # pristine data; every episode plays on a deep copy
        self.task_list = make_tasks(self.world0, seed, per_template)
        self.viewport, self.test_every = viewport_lines, test_every
        self.task = None
        self.success = self.done = False

    # ------------------------------------------------------------------ protocol
    def tasks(self, split: str) -> list[int]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; choose 'train' or 'test'")
        return [i for i in range(len(self.task_list)) if (i % self.test_every == 0) == (split == "test")]

    def subtask(self, task_id: int) -> str:
        return self.task_list[task_id].site

    def reset(self, task_id: int) -> str:
        self.task = self.task_list[task_id]
        self.world = copy.deepcopy(self.world0)
        self.sites = make_sites(self.world)
        self.tabs, self.current = [Tab([self.task.start_url])], 0
        self.success = self.done = False
        self.previous = "None"
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
            return f"{self.previous}\nThe episode is over: the task check {verdict}.", float(self.success), True
        return self.observe(), 0.0, False

    def close(self) -> None:
        self.task = None

    # ------------------------------------------------------------------ pages
    def _page(self, address: str) -> tuple[str, list[Node]]:
        if address == "about:blank":
            return "", []
        host, path, query = parse_url(address)
        site = self.sites.get(host)
        if site is None:
            reachable = ", ".join(url(h) for h in self.sites)
            return host or address, [heading("This site can't be reached"),
                                     text(f"The server of {host or address!r} could not be found. "
                                          f"Reachable sites: {reachable}.")]
        page = site.page(path, query)
        if page is None:
            return "404 Not Found", [heading("404: Page Not Found"), text(f"There is no page at {path} on {host}."),
                                     link("Go to the homepage", "http://homepage.com")]
        return page

    def _render(self, tab: Tab) -> tuple[dict[int, str], dict[int, Node], list[int]]:
        """The line of each id, the node of each id, and the ids shown in the current viewport window."""
        title, body = self._page(tab.url)
        if tab.flash:
            body = [Node("alert", tab.flash)] + body
        lines, nodes = render(title, body, id_base(tab.url), tab.values)
        windows = max(1, -(-(len(lines) - 1) // self.viewport))
        tab.scroll = max(0, min(tab.scroll, windows - 1))
        start = 1 + tab.scroll * self.viewport
        shown = [lines[0][0]] + [i for i, _ in lines[start:start + self.viewport]]
        return dict(lines), nodes, shown

    def observe(self) -> str:
        tab = self.tabs[self.current]
        lines, _, shown = self._render(tab)
        titles = [f"Tab {i}{' (current)' if i == self.current else ''}: {self._page(t.url)[0]}"
                  for i, t in enumerate(self.tabs)]
        tree = "\n".join(lines[i] for i in shown)
        return (f"OBSERVATION:\n{' | '.join(titles)}\n\n{tree}\nURL: {tab.url}\n"
                f"OBJECTIVE: {self.task.objective}\nPREVIOUS ACTION: {self.previous}")

    def _navigate(self, tab: Tab, address: str, flash: str = "") -> None:
        if address != tab.url:
            del tab.history[tab.index + 1:]
            tab.history.append(address)
            tab.index += 1
        tab.scroll, tab.values, tab.focus, tab.flash = 0, {}, "", flash

    def _submit(self, tab: Tab, node: Node, nodes: dict[int, Node]) -> None:
        values = {n.field: n.value for n in nodes.values() if n.field}
        values.update(tab.values)
        self._navigate(tab, *node.handler(values))

    # ------------------------------------------------------------------ actions
    def _execute(self, action: str) -> str:
        """Run one action; return the PREVIOUS ACTION text (its description, or what was wrong)."""
        def invalid(why: str) -> str:
            return f"Invalid action {action[:100]!r}: {why}. {HELP}"
        if not action:
            return invalid("the ``` block is empty")
        if len(action) > _MAX_ACTION_CHARS:
            return invalid(f"longer than {_MAX_ACTION_CHARS} characters")
        name = (action.split("[")[0] if "[" in action else action.split()[0]).strip().lower()
        tab = self.tabs[self.current]
        if name in ("click", "hover", "type"):
            if name == "type" and not re.search(r"\[[01]\]\s*$", action):
                action += " [1]"  # as WebArena: Enter is pressed unless told otherwise
            pattern = r"type ?\[(\d+)\] ?\[(.+)\] ?\[([01])\]\s*$" if name == "type" else rf"{name} ?\[(\d+)\]"
            m = re.search(pattern, action, re.IGNORECASE)
            if m is None:
                form = "type [id] [text] [0|1]" if name == "type" else f"{name} [id]"
                return invalid(f"write it as {form} with a number as id")
            lines, nodes, shown = self._render(tab)
            eid = int(m[1])
            if eid not in shown:
                return (f'Attempt to perform "{name}" on element "[{eid}]" but no matching element was found in the '
                        "current view. Check the ids in the observation; scroll to see other parts of the page.")
            node, content = nodes[eid], lines[eid].strip().split(" ", 1)[1]
            if name == "type":
                if node.role not in ("textbox", "searchbox"):
                    return (f"Attempt to type into [{eid}], which is {content}; only a textbox or searchbox "
                            "accepts text.")
                tab.values[node.field], tab.focus = m[2], node.field
                if m[3] == "1" and node.handler:
                    self._submit(tab, node, nodes)
                return f"type [{eid}] [{m[2][:100]}] [{m[3]}] where [{eid}] is {content}"
            if name == "click":
                if node.role == "link" and node.href:
                    self._navigate(tab, node.href)
                elif node.role == "button" and node.handler:
                    self._submit(tab, node, nodes)
                elif node.role == "checkbox":
                    tab.values[node.field] = "false" if tab.values.get(node.field, node.value) == "true" else "true"
                elif node.role in ("textbox", "searchbox"):
                    tab.focus = node.field
            return f"{name} [{eid}] where [{eid}] is {content}"
        if name == "press":
            m = re.search(r"press ?\[(.+)\]", action, re.IGNORECASE)
            return invalid("write it as press [key_comb]") if m is None else self._press(tab, m[1].strip())
        if name == "scroll":
            m = re.search(r"scroll ?\[?(up|down)\]?", action, re.IGNORECASE)
            if m is None:
                return invalid("write it as scroll [down] or scroll [up]")
            tab.scroll += 1 if m[1].lower() == "down" else -1
            self._render(tab)  # clamps the window to the page
            return f"scroll [{m[1].lower()}]"
        if name == "goto":
            m = re.search(r"goto ?\[(.+)\]", action, re.IGNORECASE)
            if m is None:
                return invalid("write it as goto [url]")
            address = m[1].strip()
            address = address if address == "about:blank" or "://" in address else "http://" + address
            try:
                parse_url(address)
            except ValueError as error:  # urllib rejects e.g. a malformed IPv6 host
                return invalid(f"the URL cannot be parsed ({error})")
            self._navigate(tab, address)
            return f"goto [{address}]"
        if name == "new_tab":
            if len(self.tabs) >= _MAX_TABS:
                return invalid(f"at most {_MAX_TABS} tabs can be open; close_tab first")
            self.tabs.append(Tab(["about:blank"]))
            self.current = len(self.tabs) - 1
            return "new_tab"
        if name == "tab_focus":
            m = re.search(r"tab_focus ?\[(\d+)\]", action, re.IGNORECASE)
            if m is None or int(m[1]) >= len(self.tabs):
                return invalid(f"give the index of an open tab, from 0 to {len(self.tabs) - 1}")
            self.current = int(m[1])
            return f"tab_focus [{self.current}]"
        if name == "close_tab":
            del self.tabs[self.current]
            self.tabs = self.tabs or [Tab(["about:blank"])]  # as a browser: closing the last tab leaves a blank one
            self.current = len(self.tabs) - 1
            return "close_tab"
        if name in ("go_back", "go_forward"):
            step = -1 if name == "go_back" else 1
            if not 0 <= tab.index + step < len(tab.history):
                return f"{name} (there is no {'previous' if step < 0 else 'next'} page in this tab)"
            tab.index += step
            tab.scroll, tab.values, tab.focus, tab.flash = 0, {}, "", ""
            return name
        if name == "stop":
            m = re.search(r"stop ?\[(.*)\]", action, re.IGNORECASE | re.DOTALL)
            answer = m[1].strip() if m else ""
            self.success, self.done = self._evaluate(answer), True
            return f"stop [{answer[:200]}]"
        return invalid(f"unknown action {name[:30]!r}")

    def _press(self, tab: Tab, combo: str) -> str:
        *mods, key = combo.split("+") if combo != "+" else ["+"]
        if any(m.strip().lower() not in _MODIFIERS for m in mods) or not (len(key) == 1 or key.lower() in _KEYS):
            return (f"Invalid action: unknown key combination {combo[:50]!r}. Use key names such as Enter, Tab, "
                    f"PageDown, ArrowLeft, or single characters, joined by + with Ctrl, Alt, Shift or Meta. {HELP}")
        key = _KEYS.get(key.lower(), key)
        mods = sorted(m.strip().lower() for m in mods)
        if key == "Enter" and not mods and tab.focus:
            lines, nodes, _ = self._render(tab)
            node = next((n for n in nodes.values() if n.field == tab.focus and n.handler), None)
            if node is not None:
                self._submit(tab, node, nodes)
        elif key in ("PageDown", "PageUp") and not mods:
            tab.scroll += 1 if key == "PageDown" else -1
            self._render(tab)
        elif mods == ["alt"] and key in ("ArrowLeft", "Left", "ArrowRight", "Right"):
            return self._execute("go_back" if "Left" in key else "go_forward")
        return f"press [{combo}]"

    def _evaluate(self, answer: str) -> bool:
        task = self.task
        if task.kind == "info":
            return any(normalize(answer) == normalize(a) for a in task.answers)
        if task.kind == "nav":
            return url_matches(self.tabs[self.current].url, task.url)
        return bool(task.check(self.world))

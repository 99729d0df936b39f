"""A headless Chromium shared by many environments, seen and driven the way WebArena does it.

Each environment owns a `Context`, one browser context (its own cookies and tabs) of the process's one
Chromium (envs/chromium.py: `Browser`, `shared`), so 16-32 concurrent episodes cost one browser. The
contexts call into Playwright's private event-loop thread, so envs stepped from a thread pool
(rollout.py) share the browser safely. A browser that died (killed, crashed) is launched again at the
next `Context.open` (the env's reset); a step on a dead browser returns an error text instead.

The observation is WebArena's accessibility-tree text, rendered by envs/axtree.py from two CDP calls.
Actions take an id from the last observation: click, hover, type (click, select all, type, Enter),
press, scroll (one viewport), tabs, goto, go_back / go_forward. Each returns "" or what went wrong.
A native drop-down (<select>) shows its options even while closed (they have no box then); `type`
into it or `click` on an option chooses that option, as a person picks from the open list; in a list
that holds several choices (<select multiple>), `click` on an option adds or removes it (ctrl+click).
A click whose target another element covers is not made: the error names what covers it.
Departures: `type` replaces the field's text (WebArena appends), as the text renderer does; Chrome's
`url` property of the root is left out (newer Chrome than WebArena's; the URL line has it).

The agent's actions are untrusted model output, so a context reaches only its `origins` (the task's
sites) and about:blank: envs/sandbox.py holds them and the three layers that keep it there (`goto`
refuses other addresses; a refusing proxy that only the allowed origins bypass; a tab left elsewhere is
blanked after each action and before each observation).
Before each observation the page is let settle (`_quiet`): until no short timer (<= 1 s) is pending
and the DOM has not changed for 40 ms, at most 1.5 s, so that what a page shows a moment after an
action (an autocomplete's list) is in the observation that action returns.
Tested through tests/test_browser.py (drop-downs and settling: tests/test_miniwob.py).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from typing import Callable, Iterable

from playwright.async_api import Error as PlaywrightError

from . import axtree
from .chromium import Browser, shared
from .sandbox import Sandbox

MAX_TABS = 10
_MODIFIERS = {"ctrl": "Control", "control": "Control", "alt": "Alt", "shift": "Shift", "meta": "Meta",
              "cmd": "Meta", "command": "Meta"}
_KEYS = {k.lower(): k for k in ["Enter", "Tab", "Escape", "Backspace", "Delete", "Space", "Home", "End", "PageUp",
                                "PageDown", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"]}
_KEYS.update({"left": "ArrowLeft", "right": "ArrowRight", "up": "ArrowUp", "down": "ArrowDown"})


# Mark the element behind an accessibility node so that a locator finds it. A text node acts through
# its element, the document through <html>, and a node inside a text box's closed (user-agent) shadow
# tree, such as its value, through the box: locators cannot see into that tree and would wait out
# their whole timeout.
_MARK = """function(mark) {
  let e = this.nodeType === 9 ? this.documentElement : this.nodeType === 3 ? this.parentElement : this;
  while (e && e.getRootNode() instanceof ShadowRoot) e = e.getRootNode().host;
  if (!e || !e.setAttribute) return false;
  e.setAttribute("data-wa-act", mark);
  return true;
}"""


QUIET_MS, QUIET_MAX_S, SHORT_TIMER_MS = 40, 1.5, 1000

# In every frame before its own scripts: count pending short timers and note the time of the last DOM
# change, so that `_quiet` can wait until the page is done updating (e.g. an autocomplete opening its
# list 300 ms after a keystroke).
_WATCH = """(() => {
  if (window.__waQuiet) return;
  const pending = new Set(), set = window.setTimeout, clear = window.clearTimeout;
  let last = performance.now();
  window.setTimeout = function (callback, delay, ...rest) {
    if (typeof callback !== "function" || delay > %d) return set.call(window, callback, delay, ...rest);
    const id = set.call(window, function () { pending.delete(id); return callback.apply(this, arguments); }, delay, ...rest);
    pending.add(id);
    return id;
  };
  window.clearTimeout = function (id) { pending.delete(id); return clear.call(window, id); };
  // The envs' own marks and names (data-wa-*, aria-label, role: envs/miniwob.py) are no page update.
  const ours = r => r.type === "attributes" && /^(data-wa-|aria-label$|role$)/.test(r.attributeName);
  new MutationObserver(records => { if (!records.every(ours)) last = performance.now(); })
    .observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
  window.__waQuiet = () => [pending.size, performance.now() - last];
})()""" % SHORT_TIMER_MS


# What covers the centre of an element (where a click lands), or null when the element itself would get
# the click: "role 'text'" of the outermost covering element that does not contain this one. Playwright
# would wait out its whole timeout and say only "Timeout exceeded".
_COVER = """e => {
  e.scrollIntoView({block: "nearest", inline: "nearest"});
  const box = e.getClientRects()[0];
  if (!box || !box.width || !box.height) return null;
  const hit = e.ownerDocument.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
  if (!hit || e.contains(hit) || hit.contains(e)) return null;
  let c = hit;
  while (c.parentElement && !c.parentElement.contains(e)) c = c.parentElement;
  const text = (c.innerText || c.getAttribute("aria-label") || "").replace(/\\s+/g, " ").trim();
  return `${c.getAttribute("role") || c.tagName.toLowerCase()} '${text.slice(0, 80)}'`;
}"""


_TOGGLE = """o => {
  o.selected = !o.selected;
  for (const type of ["input", "change"]) o.closest("select").dispatchEvent(new Event(type, {bubbles: true}));
  return "";
}"""


class Context:
    """One browser context: tabs, cookies, and the ids of the last observation."""

    def __init__(self, browser: Browser | None = None, width: int = 1280, height: int = 720,
                 viewport_only: bool = True, to_local: Callable[[str], str] = str, to_public: Callable[[str], str] = str,
                 stable_ids: bool = False, origins: Iterable[str] = (), exact: bool = True):
        self.browser = browser or shared()
        self.sandbox = Sandbox(origins, to_public)  # the only sites it may reach (envs/sandbox.py)
        self.exact = exact  # WebArena's text rules exactly (axtree.render); False: MiniWoB++'s exceptions
        self.viewport = {"width": width, "height": height}
        self.viewport_only, self.to_local, self.to_public = viewport_only, to_local, to_public
        # DOM node ids continue the counter of whatever renderer process Chrome hands the tab (it reuses
        # them), so the same page can show other ids in another context. With stable_ids, ids are numbered
        # 1, 2, ... in order of first appearance since `open`: the same page and actions give the same ids.
        self.stable_ids, self._numbers = stable_ids, {}
        self.context = None
        self.pages: list = []
        self.current = 0
        self.shown: dict[int, tuple[int, str]] = {}  # id -> (backend DOM node id, "role 'name' props")
        self._marks = itertools.count()
        self._navs: dict = {}  # page -> [navigation requests, load events], to wait for a navigation an action started
        self._cdps: dict = {}  # page -> its CDP session

    # ------------------------------------------------------------------ lifecycle
    def open(self, url: str, cookies: list[dict] = (), storage_state: str | None = None) -> None:
        """A fresh context (cookies, or a Playwright storage-state file of a login) with one tab at `url`."""
        self.browser.run(self._open(url, list(cookies), storage_state))

    async def _open(self, url, cookies, storage_state):
        await self._close()
        self._numbers = {}
        chromium = await self.browser.chromium()
        self.context = await chromium.new_context(viewport=self.viewport, storage_state=storage_state,
                                                  **self.sandbox.context_options())
        await self.context.add_init_script(_WATCH)
        self.context.set_default_timeout(10000)  # a stuck action is an error text, not a hang (10 s: a busy machine is slow)
        self.context.set_default_navigation_timeout(20000)
        if cookies:
            await self.context.add_cookies(cookies)
        self.pages, self.current = [], 0
        for address in url.split(" |AND| "):  # a WebArena task may open several tabs; the first is current
            self.pages.append(await self._new_page())
            await self._goto(self.pages[-1], address.strip())
        await self.sandbox.guard(self.pages)
        await self.page.bring_to_front()

    def close(self) -> None:
        if self.context is not None:
            self.browser.run(self._close())

    async def _new_page(self):
        page = await self.context.new_page()
        counts = self._navs[page] = [0, 0]

        def requested(request):
            if request.is_navigation_request() and request.frame == page.main_frame:
                counts[0] += 1
        page.on("request", requested)
        page.on("load", lambda _: counts.__setitem__(1, counts[1] + 1))
        return page

    async def _close(self):
        self._navs, self._cdps = {}, {}
        context, self.context, self.pages = self.context, None, []
        if context is not None:
            try:
                await context.close()
            except PlaywrightError:  # the browser died with it
                pass

    @property
    def page(self):
        return self.pages[self.current]

    def url(self) -> str:
        return self.to_public(self.page.url)

    def call(self, name: str, *args) -> str:
        """Run action `name`; "" on success, else the error as text. A dead browser is an error, not a crash."""
        if self.context is None or not self.alive():
            return "The browser is not running (it stopped or was killed); it restarts at the next reset."
        try:
            return self.browser.run(self._call(name, args))
        except PlaywrightError as error:
            lines = str(error).splitlines()
            cover = next((line.strip(" -") for line in lines if "intercepts pointer events" in line), "")
            return f"The browser could not do it: {lines[0][:300]}" + (f" ({cover[:200]})" if cover else "")

    async def _call(self, name: str, args) -> str:
        try:
            said = await getattr(self, "_" + name)(*args) or ""
        finally:
            refused = await self.sandbox.guard(self.pages)
        return "; ".join(filter(None, [said, refused]))

    def alive(self) -> bool:
        chromium = self.browser._chromium
        return chromium is not None and chromium.is_connected()

    # ------------------------------------------------------------------ observation
    def observe(self) -> tuple[str, str, str]:
        """(tabs line, accessibility tree text, public URL) of the current tab."""
        if self.context is None or not self.alive():
            return "Tab 0 (current): ", "The browser is not running; it restarts at the next reset.", "about:blank"
        try:
            return self.browser.run(self._observe())
        except PlaywrightError as error:  # the browser died during this call
            return "Tab 0 (current): ", f"The page cannot be read: {str(error).splitlines()[0][:200]}", "about:blank"

    async def _observe(self):
        await self.sandbox.guard(self.pages)
        await self._quiet(self.page)
        titles = []
        for i, page in enumerate(self.pages):
            try:
                title = await page.title()
            except PlaywrightError:  # a tab mid-navigation
                title = ""
            titles.append(f"Tab {i}{' (current)' if i == self.current else ''}: {title}")
        tree = await self._tree(self.page)
        return " | ".join(titles), tree, self.to_public(self.page.url)

    async def _cdp(self, page):
        """The page's CDP session, opened once per tab (it survives navigations)."""
        if page not in self._cdps:
            self._cdps[page] = await page.context.new_cdp_session(page)
        return self._cdps[page]

    async def _tree(self, page) -> str:
        cdp = await self._cdp(page)
        nodes = (await cdp.send("Accessibility.getFullAXTree"))["nodes"]
        snap = await cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []})
        text, self.shown = axtree.render(nodes, snap, self.viewport, self.viewport_only,
                                         self._numbers if self.stable_ids else None, self.exact)
        return text

    def describe(self, element_id: int) -> str | None:
        """ "role 'name' props" of an element of the last observation, or None when it was not shown."""
        return self.shown[element_id][1] if element_id in self.shown else None

    # ------------------------------------------------------------------ actions
    async def _element(self, element_id: int):
        """A Playwright locator for an id of the last observation (the DOM node is marked to find it)."""
        b = self.shown[element_id][0]
        cdp = await self._cdp(self.page)
        target = (await cdp.send("DOM.resolveNode", {"backendNodeId": b}))["object"]["objectId"]
        mark = str(next(self._marks))
        found = await cdp.send("Runtime.callFunctionOn", {
            "objectId": target, "arguments": [{"value": mark}], "returnByValue": True, "functionDeclaration": _MARK})
        await cdp.send("Runtime.releaseObject", {"objectId": target})
        if not found.get("result", {}).get("value"):
            raise PlaywrightError("the element is no longer on the page")
        return self.page.locator(f"[data-wa-act='{mark}']")

    async def _settle(self, page, before: list[int]) -> None:
        """Wait until a navigation that the action started has loaded its page.

        `load_state` alone is not enough: right after a click the old document is still the loaded
        one, so it returns at once, and the next observation would read the old page or none.
        """
        await asyncio.sleep(0.05)  # a navigation started by a script (Enter submits by script) begins a moment later
        counts = self._navs.get(page, before)
        deadline = time.monotonic() + 20
        while counts[0] > before[0] and counts[1] <= before[1] and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _quiet(self, page) -> None:
        """Wait until the page is done updating: no short timer pending and no DOM change for QUIET_MS, at
        most QUIET_MAX_S (a page that animates for ever is observed as it is then)."""
        deadline = time.monotonic() + QUIET_MAX_S
        while True:
            try:
                timers, idle = await page.evaluate("window.__waQuiet ? window.__waQuiet() : [0, 1e9]")
            except PlaywrightError:  # mid-navigation
                timers, idle = 1, 0
            if (timers == 0 and idle >= QUIET_MS) or time.monotonic() >= deadline:
                return
            await asyncio.sleep(max(0.01, (QUIET_MS - idle) / 1000) if timers == 0 else 0.02)

    async def _acting(self, action):
        """Run an action coroutine on the current tab and wait for what it loads."""
        page = self.page
        before = list(self._navs.get(page, [0, 0]))
        result = await action
        await self._settle(page, before)
        return result

    async def _click(self, element_id: int):
        element = await self._element(element_id)
        if await element.evaluate("e => e.tagName") == "OPTION":  # an option of a closed <select> cannot be clicked
            if await element.evaluate("e => !!e.closest('select')?.multiple"):
                # A list that holds several choices: a click adds or removes this one, as ctrl+click does
                # (the grammar has no modifier for a click).
                return await element.evaluate(_TOGGLE)
            label = await element.evaluate("e => e.label")
            return await self._select(element.locator("xpath=ancestor::select[1]"), label)
        cover = await element.evaluate(_COVER)
        if cover:
            return f"not clicked: the element is covered by {cover}, which would get the click; close or use that first"
        await self._acting(element.click())

    async def _select(self, select, text: str):
        """Choose the option of a native <select> whose label is `text` (case and spaces ignored)."""
        labels = await select.evaluate("e => [...e.options].map(o => o.label)")
        wanted = " ".join(text.split()).lower()
        match = next((label for label in labels if " ".join(label.split()).lower() == wanted), None)
        if match is None:  # select_option would wait out its whole timeout for an option that is not there
            return f"no option {text[:50]!r} in this list; its options are {labels[:20]}"
        await self._acting(select.select_option(label=match))

    async def _hover(self, element_id: int):
        await (await self._element(element_id)).hover()

    async def _type(self, element_id: int, text: str, enter: bool):
        element = await self._element(element_id)
        if await element.evaluate("e => e.tagName") == "SELECT":  # a drop-down: typing picks the option named so
            return await self._select(element, text)
        await element.click()
        await self.page.keyboard.press("ControlOrMeta+a")  # replace, as the text renderer does
        await self.page.keyboard.insert_text(text)  # one input event, not a key event per character: faster
        if enter:
            # A locator's press (not keyboard.press) waits for a navigation its key handler starts, even one
            # a script starts: waiting for the request to show up instead misses it on a busy machine.
            await self._acting(element.press("Enter"))

    async def _press(self, combo: str):
        if combo.lower() in ("alt+arrowleft", "alt+left"):  # headless Chrome ignores history shortcuts
            return await self._go_back()
        if combo.lower() in ("alt+arrowright", "alt+right"):
            return await self._go_forward()
        *mods, key = combo.split("+") if combo != "+" else ["+"]
        keys = [_MODIFIERS[m.strip().lower()] for m in mods] + [_KEYS.get(key.lower(), key)]
        focused = self.page.locator("*:focus")
        if await focused.count():  # through the focused element, so that a navigation it starts is awaited
            await self._acting(focused.first.press("+".join(keys)))
        else:
            await self._acting(self.page.keyboard.press("+".join(keys)))

    async def _scroll(self, direction: str):
        sign = "-" if direction == "up" else ""
        await self.page.evaluate(f"window.scrollBy(0, {sign}window.innerHeight)")

    async def _new_tab(self):
        if len(self.pages) >= MAX_TABS:
            return f"at most {MAX_TABS} tabs can be open; close_tab first"
        self.pages.append(await self._new_page())
        self.current = len(self.pages) - 1

    async def _tab_focus(self, index: int):
        if not 0 <= index < len(self.pages):
            return f"give the index of an open tab, from 0 to {len(self.pages) - 1}"
        self.current = index
        await self.page.bring_to_front()

    async def _close_tab(self):
        page = self.pages.pop(self.current)
        self._cdps.pop(page, None)
        self._navs.pop(page, None)
        await page.close()
        if not self.pages:  # as a browser: closing the last tab leaves a blank one
            self.pages.append(await self._new_page())
        self.current = len(self.pages) - 1
        await self.page.bring_to_front()

    async def _goto(self, page, url: str):
        try:
            await page.goto(self.to_local(url), wait_until="load")
        except PlaywrightError as error:  # e.g. an unknown host: Chrome shows its error page
            return f"the page could not be loaded ({str(error).splitlines()[0][:200]})"

    async def _go(self, url: str):
        local = self.to_local(url)
        if not self.sandbox.allowed(local):  # the first line: the browser never sees the address
            return self.sandbox.refusal(local)
        return await self._goto(self.page, url)

    async def _go_back(self):
        if await self.page.go_back(wait_until="load") is None:
            return "there is no previous page in this tab"

    async def _go_forward(self):
        if await self.page.go_forward(wait_until="load") is None:
            return "there is no next page in this tab"

    # ------------------------------------------------------------------ for evaluators and tests
    def raw_url(self) -> str:
        """The current tab's URL as the browser has it (not mapped to public names)."""
        return self.page.url

    def load(self, url: str) -> None:
        """Open a URL as it is in the current tab (an evaluator visiting a page)."""
        self.browser.run(self.page.goto(url, wait_until="load"))

    def content(self) -> str:
        return self.browser.run(self.page.content())

    def script(self, expression: str):
        """The value of a JavaScript expression in the current tab, or None when it throws."""
        try:
            return self.browser.run(self.page.evaluate(f"() => {expression}"))
        except PlaywrightError:
            return None

    def read(self, url: str | None, expression: str | None, prep: list[str] = ()):
        """What WebArena's program_html reads, as its text: `str()` of the value of a JavaScript expression
        (so null is "None", as in WebArena; "" when it throws), or the page's HTML for None, after the
        `prep` statements, in a new tab at `url` that is closed afterwards (the current tab for None).
        The agent's own tab is never moved: a later `last` target and url_match still see its page."""
        return self.browser.run(self._read(url, expression, list(prep)))

    async def _read(self, url, expression, prep):
        page = self.page
        if url is not None:
            page = await self.context.new_page()
            await page.goto(url, wait_until="load")
        try:
            if expression is None:
                return await page.content()
            try:
                for statement in prep:
                    await page.evaluate(f"() => {statement}")
            except PlaywrightError:  # as WebArena: a failing preparation stops the others, the reading goes on
                pass
            try:
                return str(await page.evaluate(f"() => {expression}"))
            except PlaywrightError:
                return ""
        finally:
            if url is not None:
                await page.close()

    def screenshot(self, path: str, clip: dict | None = None) -> None:
        """A PNG of the current page; `clip` {x, y, width, height} in CSS pixels keeps one region."""
        self.browser.run(self.page.screenshot(path=path, clip=clip))

"""The fast backend: a browser simulated in Python over the sites' node trees, no HTML, no HTTP.

It has the same small interface as the Chromium backend (envs/browser.py `Context`): `open(url)`,
`observe() -> (tabs line, tree text, URL)`, `describe(id)` (the element's "role 'name' props", or None
when it is not in view) and `call(action, *args) -> ""` or what went wrong. The page text is WebArena's
accessibility-tree rendering of page.render; long pages are cut into windows of `viewport_lines` lines
that `scroll` moves through (the browser scrolls by a viewport of pixels instead). Form values live in
the tab until a submission hands them to a handler, as a browser's form does; a site's message after a
submission shows as an `alert` first on the next page. This is what CPU training wants (about a
millisecond a step); tests/test_browser.py checks that both backends agree on the local sites.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import page_at
from .page import Node, id_base, render

MAX_TABS = 10  # every observation lists each tab's title, so tabs cost a page render each


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


class TextView:
    def __init__(self, sites: dict[str, object], viewport_lines: int = 50):
        self.sites, self.viewport = sites, viewport_lines
        self.tabs, self.current = [Tab(["about:blank"])], 0

    def open(self, url: str) -> None:
        self.tabs, self.current = [Tab([url])], 0

    def close(self) -> None:
        pass

    @property
    def tab(self) -> Tab:
        return self.tabs[self.current]

    def url(self) -> str:
        return self.tab.url

    # ------------------------------------------------------------------ pages
    def _render(self, tab: Tab) -> tuple[dict[int, str], dict[int, Node], list[int]]:
        """The line of each id, the node of each id, and the ids shown in the current viewport window."""
        title, body = page_at(self.sites, tab.url)
        if tab.flash:
            body = [Node("alert", tab.flash)] + body
        lines, nodes = render(title, body, id_base(tab.url), tab.values)
        windows = max(1, -(-(len(lines) - 1) // self.viewport))
        tab.scroll = max(0, min(tab.scroll, windows - 1))
        start = 1 + tab.scroll * self.viewport
        shown = [lines[0][0]] + [i for i, _ in lines[start:start + self.viewport]]
        return dict(lines), nodes, shown

    def observe(self) -> tuple[str, str, str]:
        lines, _, shown = self._render(self.tab)
        titles = [f"Tab {i}{' (current)' if i == self.current else ''}: {page_at(self.sites, t.url)[0]}"
                  for i, t in enumerate(self.tabs)]
        return " | ".join(titles), "\n".join(lines[i] for i in shown), self.tab.url

    def describe(self, element_id: int) -> str | None:
        lines, _, shown = self._render(self.tab)
        return lines[element_id].strip().split(" ", 1)[1] if element_id in shown else None

    def _navigate(self, tab: Tab, address: str, flash: str = "", submitted: bool = False) -> None:
        # As Chrome: a link or goto to the page already shown replaces it, while a form submission is a
        # new history entry even when it comes back to the same URL (go_back then shows that page again).
        if address != tab.url or submitted:
            del tab.history[tab.index + 1:]
            tab.history.append(address)
            tab.index += 1
        tab.scroll, tab.values, tab.focus, tab.flash = 0, {}, "", flash

    def _submit(self, tab: Tab, node: Node, nodes: dict[int, Node]) -> None:
        values = {n.field: n.value for n in nodes.values() if n.field}
        values.update(tab.values)
        self._navigate(tab, *node.handler(values), submitted=True)

    # ------------------------------------------------------------------ actions
    def call(self, name: str, *args) -> str:
        return getattr(self, "_" + name)(*args) or ""

    def _click(self, element_id: int):
        tab = self.tab
        _, nodes, _ = self._render(tab)
        node = nodes[element_id]
        if node.role == "link" and node.href:
            self._navigate(tab, node.href)
        elif node.role == "button" and node.handler:
            self._submit(tab, node, nodes)
        elif node.role == "checkbox":
            tab.values[node.field] = "false" if tab.values.get(node.field, node.value) == "true" else "true"
        elif node.role in ("textbox", "searchbox"):
            tab.focus = node.field

    def _hover(self, element_id: int):
        pass

    def _type(self, element_id: int, text: str, enter: bool):
        tab = self.tab
        _, nodes, _ = self._render(tab)
        node = nodes[element_id]
        tab.values[node.field], tab.focus = text, node.field
        if enter and node.handler:
            self._submit(tab, node, nodes)

    def _press(self, combo: str):
        *mods, key = combo.split("+") if combo != "+" else ["+"]
        key, mods, tab = key.lower(), sorted(m.strip().lower() for m in mods), self.tab
        if key == "enter" and not mods and tab.focus:
            _, nodes, _ = self._render(tab)
            node = next((n for n in nodes.values() if n.field == tab.focus and n.handler), None)
            if node is not None:
                self._submit(tab, node, nodes)
        elif key in ("pagedown", "pageup") and not mods:
            self._scroll("down" if key == "pagedown" else "up")
        elif mods == ["alt"] and key in ("arrowleft", "left"):
            return self._go_back()
        elif mods == ["alt"] and key in ("arrowright", "right"):
            return self._go_forward()

    def _scroll(self, direction: str):
        self.tab.scroll += 1 if direction == "down" else -1
        self._render(self.tab)  # clamps the window to the page

    def _new_tab(self):
        if len(self.tabs) >= MAX_TABS:
            return f"at most {MAX_TABS} tabs can be open; close_tab first"
        self.tabs.append(Tab(["about:blank"]))
        self.current = len(self.tabs) - 1

    def _tab_focus(self, index: int):
        if not 0 <= index < len(self.tabs):
            return f"give the index of an open tab, from 0 to {len(self.tabs) - 1}"
        self.current = index

    def _close_tab(self):
        del self.tabs[self.current]
        self.tabs = self.tabs or [Tab(["about:blank"])]  # as a browser: closing the last tab leaves a blank one
        self.current = len(self.tabs) - 1

    def _go(self, address: str):
        self._navigate(self.tab, address)

    def _go_back(self):
        return self._history(-1)

    def _go_forward(self):
        return self._history(1)

    def _history(self, step: int):
        tab = self.tab
        if not 0 <= tab.index + step < len(tab.history):
            return f"there is no {'previous' if step < 0 else 'next'} page in this tab"
        tab.index += step
        tab.scroll, tab.values, tab.focus, tab.flash = 0, {}, "", ""

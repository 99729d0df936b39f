"""Pages as accessibility trees: the node type the simulated sites build, and WebArena's text rendering.

A site answers a URL with a title and a list of `Node`s. `render` numbers the nodes depth-first and
writes one line per node, as WebArena's `TextObervationProcessor.parse_accessibility_tree` does:

    [1600] RootWebArea 'One Stop Market' focused: True
    	[1602] link 'My Account'
    	[1603] link 'My Wish List'

that is `[id] role repr(name)` plus `property: value` pairs, indented by one tab per depth. Ids start
at a base derived from the URL path, so a page keeps its ids across scrolls and visits (stable for an
agent), while a stale id from another page usually points at nothing instead of at a random element
(in a real browser the ids are DOM node ids, unique per document).

Interactivity lives on the nodes: a link has `href`; a button or checkbox has a `handler` that takes
the page's form values and returns (next URL, flash message); a text box stores what is typed under
its `field` key, and its `handler` is what pressing Enter in it does (one-line fields submit their
form; multi-line ones, like a comment box, have none). Also here: `Task`, the record of one
generated task, and URL helpers. Tested through tests/test_webarena.py.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qsl, urlencode, urlsplit

Handler = Callable[[dict[str, str]], tuple[str, str]]  # form values -> (next URL, flash message)


@dataclass
class Node:
    role: str
    name: str = ""
    children: list[Node] = field(default_factory=list)
    props: dict[str, Any] = field(default_factory=dict)
    href: str = ""                  # link: where a click goes
    handler: Handler | None = None  # button/checkbox: what a click does; text box: what Enter does
    field: str = ""                 # text box / checkbox: key of its value in the form
    value: str = ""                 # initial value of that field


# Builders, so that site code reads like the page it describes.
def text(s: str) -> Node:
    return Node("StaticText", s)


def heading(s: str) -> Node:
    return Node("heading", s)


def link(name: str, href: str) -> Node:
    return Node("link", name, href=href)


def button(name: str, handler: Handler) -> Node:
    return Node("button", name, handler=handler)


def textbox(name: str, key: str, value: str = "", submit: Handler | None = None,
            required: bool = False, role: str = "textbox") -> Node:
    return Node(role, name, props={"required": required}, field=key, value=value, handler=submit)


def checkbox(name: str, key: str, checked: bool) -> Node:
    return Node("checkbox", name, field=key, value="true" if checked else "false")


def group(role: str, name: str, *children: Node) -> Node:
    return Node(role, name, list(children))


def row(*cells: str | Node) -> Node:
    """A table row: strings become cells, nodes (links, buttons) stay as they are."""
    return Node("row", "", [Node("cell", c) if isinstance(c, str) else c for c in cells])


@dataclass
class Task:
    """One generated task. `kind` is WebArena's evaluation kind: "info" (string match of the stop
    answer), "nav" (URL match when stopping) or "state" (a program checks the sites' final state)."""
    site: str                      # subtask: shopping, shopping_admin, reddit, gitlab
    kind: str
    template: str                  # which generator made it (for analysis and scripted tests)
    objective: str
    start_url: str
    answers: tuple[str, ...] = ()  # info: accepted answers
    url: str = ""                  # nav: the target URL
    check: Callable[[dict], bool] | None = None  # state: world -> passed
    params: dict[str, Any] = field(default_factory=dict)  # the quantities named in the objective


# ----------------------------------------------------------------------------- rendering

def id_base(url: str) -> int:
    """First id of a page: 1000..9900 in steps of 100, from the URL without its query."""
    return 100 * (zlib.crc32(url.split("?")[0].encode()) % 90 + 10)


# WebArena drops these roles when they have no name and no properties (their children move up a
# level), and drops a StaticText whose text already shows in one of the three lines above it.
_SKIPPED = {"generic", "img", "list", "strong", "paragraph", "banner", "navigation", "Section", "LabelText",
            "Legend", "listitem"}


def walk(title: str, body: list[Node], base: int):
    """(id, node, depth, value_id) of every node, root first, depth-first: the one numbering that the
    text renderer and the HTML server (server.py) share, so both backends show the same ids.

    A text box or search box also reserves the next id for its value (a StaticText child, as in
    Chrome's tree) even while it is empty: typing must not shift the ids of the elements after it,
    since in a browser the DOM does not change while one types. Other nodes have value_id None.
    """
    counter = [base]

    def visit(node: Node, depth: int):
        node_id = counter[0]
        counter[0] += 1
        value_id = None
        if node.role in ("textbox", "searchbox"):
            value_id = counter[0]
            counter[0] += 1
        yield node_id, node, depth, value_id
        for child in node.children:
            yield from visit(child, depth + 1)

    yield from visit(Node("RootWebArea", title, body, props={"focused": True}), 0)


def render(title: str, body: list[Node], base: int,
           values: dict[str, str]) -> tuple[list[tuple[int, str]], dict[int, Node]]:
    """(id, line) pairs of the accessibility tree, root first, and the node behind each shown id.

    `values` holds what the agent typed or toggled; a text box shows its value as a StaticText
    child, as Chrome's accessibility tree does. Every node consumes an id, shown or not.
    """
    lines: list[tuple[int, str]] = []
    nodes: dict[int, Node] = {}

    def emit(node_id: int, node: Node, depth: int, props: dict) -> bool:
        shown = not (node.role in _SKIPPED and not node.name.strip() and not props)
        if node.role == "StaticText" and (not node.name or any(node.name in line for _, line in lines[-3:])):
            shown = False
        if shown:
            extra = "".join(f" {k}: {v}" for k, v in props.items())
            lines.append((node_id, "\t" * depth + f"[{node_id}] {node.role} {node.name!r}{extra}"))
            nodes[node_id] = node
        return shown

    hidden: list[int] = []  # tree depths of the hidden ancestors of the current node
    for node_id, node, depth, value_id in walk(title, body, base):
        while hidden and hidden[-1] >= depth:
            hidden.pop()
        shown_depth = depth - len(hidden)
        props = dict(node.props)
        current = values.get(node.field, node.value) if node.field else ""
        if node.role == "checkbox":
            props["checked"] = current
        if not emit(node_id, node, shown_depth, props):
            hidden.append(depth)
        elif value_id is not None and current:
            emit(value_id, text(current), shown_depth + 1, {})
    return lines, nodes


# ----------------------------------------------------------------------------- URLs

def url(host: str, path: str = "/", **query: Any) -> str:
    q = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    return f"http://{host}{path}" + (f"?{urlencode(q)}" if q else "")


def parse_url(address: str) -> tuple[str, str, dict[str, str]]:
    """(host, path, query) with a lowercase host, no trailing slash and the first value per key."""
    if "://" not in address:
        address = "http://" + address
    parts = urlsplit(address.strip())
    host = (parts.hostname or "").lower()
    host = host[4:] if host.startswith("www.") else host
    path = parts.path.rstrip("/") or "/"
    query: dict[str, str] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(k, v)
    return host, path, query


def url_matches(address: str, target: str) -> bool:
    """WebArena's url_match: same host and path, and every query parameter of the target present
    with the same value (case and surrounding spaces ignored); extra parameters are allowed."""
    h1, p1, q1 = parse_url(address)
    h2, p2, q2 = parse_url(target)
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    return h1 == h2 and p1.lower() == p2.lower() and all(norm(q1.get(k, "")) == norm(v) for k, v in q2.items())


def slug(name: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())

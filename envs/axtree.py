"""WebArena's accessibility-tree text (its `TextObervationProcessor`), from Chromium's CDP.

One `[id] role 'name'` line per node of `Accessibility.getFullAXTree`, its properties appended (minus
WebArena's ignored ones), indented by depth; a node without a name, an unnamed generic-like node and a
StaticText already shown in the three lines above are left out (their children move up); with
`viewport_only`, so is a node less than 60% inside the viewport. Node boxes come from one
`DOMSnapshot.captureSnapshot` call instead of WebArena's two CDP calls per node. Ids are the DOM node
ids, as in WebArena, except on the local sites, whose elements carry the text renderer's id
(`data-wa-id`, envs/websites/server.py), so both backends show the same ids.

With `exact=False` (MiniWoB++), two departures keep every element a task needs in sight: a StaticText
is dropped only when the role, name and properties of an element on one of the three lines above
contain it (a link, a button, a checkbox: the text repeats the name of what shows it), not when only
another text contains it (an instruction that quotes it: navigate-tree's target followed its own
name in the instruction) nor only a line's id (use-slider-2's value '3' below the line `[3] ...`); and
the `multiline` property is kept, so a textarea (`textbox '' multiline: True`) differs from a one-line
text box (click-widget). Tested in tests/test_miniwob.py.
"""
from __future__ import annotations

IGNORED = {"focusable", "editable", "readonly", "level", "settable", "multiline", "invalid", "url"}
UNNAMED_HIDDEN = {"generic", "img", "list", "strong", "paragraph", "banner", "navigation", "Section", "LabelText",
                  "Legend", "listitem"}
IN_VIEW = 0.6  # WebArena's IN_VIEWPORT_RATIO_THRESHOLD


def render(nodes: list[dict], snap: dict, viewport: dict, viewport_only: bool,
           numbers: dict | None = None, exact: bool = True) -> tuple[str, dict[int, tuple[int, str]]]:
    """(tree text, shown) from the CDP AX nodes and a DOM snapshot; `shown` maps each printed id to
    (backend DOM node id, "role 'name' props"). `numbers`, when given, renumbers ids 1, 2, ... in order
    of first appearance and keeps that numbering across calls. `exact`: WebArena's rules exactly (see
    the module's docstring for the two departures without it)."""
    ignored = IGNORED if exact else IGNORED - {"multiline"}
    doc, strings = snap["documents"][0], snap["strings"]
    dom = doc["nodes"]
    backend = dom["backendNodeId"]
    attrs = [{strings[a[i]]: strings[a[i + 1]] for i in range(0, len(a), 2)} for a in dom["attributes"]]
    index = {b: i for i, b in enumerate(backend)}
    boxes: dict[int, list[float]] = {}
    for i, (x, y, w, h) in zip(doc["layout"]["nodeIndex"], doc["layout"]["bounds"]):
        b = backend[i]
        if b in boxes:  # a text split over lines: the union of its boxes
            x0, y0, w0, h0 = boxes[b]
            x1, y1 = min(x, x0), min(y, y0)
            x, y, w, h = x1, y1, max(x + w, x0 + w0) - x1, max(y + h, y0 + h0) - y1
        boxes[b] = [x, y, w, h]
    view = (doc.get("scrollOffsetX", 0), doc.get("scrollOffsetY", 0), viewport["width"], viewport["height"])

    def in_view(b: int, parent_in_view: bool) -> bool:
        if b not in index:  # inside a text box's shadow tree, which the snapshot leaves out
            return parent_in_view
        if b not in boxes or boxes[b][2] == 0 or boxes[b][3] == 0:
            return False  # not rendered, or invisible (WebArena drops both)
        if not viewport_only:
            return True
        x, y, w, h = boxes[b]
        across = max(0, min(x + w, view[0] + view[2]) - max(x, view[0]))
        down = max(0, min(y + h, view[1] + view[3]) - max(y, view[1]))
        return across * down / (w * h) >= IN_VIEW

    def wa_id(b: int, value_id: int | None, role: str) -> int:
        if role == "RootWebArea":  # the document node: the local sites put its id on <html>
            b = next((b for b, a in zip(backend, attrs) if "data-wa-id" in a), b)
        i = index.get(b)
        own = attrs[i].get("data-wa-id") if i is not None else None
        if own is None and i is not None and dom["parentIndex"][i] >= 0:
            parent = attrs[dom["parentIndex"][i]]
            if "data-wa-text" in parent:  # the text of a page StaticText: the <p> carries its id
                own = parent.get("data-wa-id")
        if own is None and value_id is not None and role == "StaticText":
            return value_id  # a text box's value, drawn inside the box's shadow tree
        return int(own) if own is not None else b

    by_id = {}
    for node in nodes:  # a few nodes are repeated in the tree: keep the first
        by_id.setdefault(node["nodeId"], node)
    lines: list[str] = []
    names: list[str | None] = []  # per line: "role 'name' props" of an element, None for a text
    shown_ids: dict[int, tuple[int, str]] = {}

    def visit(node: dict, depth: int, value_id: int | None, parent_in_view: bool) -> None:
        role = node.get("role", {}).get("value", "")
        name = node.get("name", {}).get("value")
        b = node.get("backendDOMNodeId")
        props = [f"{p['name']}: {p['value']['value']}" for p in node.get("properties", [])
                 if p["name"] not in ignored and "value" in p.get("value", {})]
        visible = b is not None and (role == "RootWebArea" or in_view(b, parent_in_view))
        if role == "option" and b is not None and b not in boxes:  # a closed <select>'s options have no box
            visible = parent_in_view
        shown = name is not None and visible
        if shown and not name.strip() and (role in UNNAMED_HIDDEN and not props or role == "listitem"):
            shown = False
        if shown and role == "StaticText" and (not name or any(name in line for line in lines[-3:]) if exact else
                                               any(name in other for other in names[-3:] if other is not None)):
            shown = False
        if shown:
            node_id = wa_id(b, value_id, role)
            if numbers is not None:
                node_id = numbers.setdefault(node_id, len(numbers) + 1)
            content = f"{role} {name!r}" + "".join(" " + p for p in props)
            lines.append("\t" * depth + f"[{node_id}] {content}")
            names.append(None if role == "StaticText" else content)
            shown_ids.setdefault(node_id, (b, content))
        if role in ("textbox", "searchbox") and b in index and "data-wa-value" in attrs[index[b]]:
            value_id = int(attrs[index[b]]["data-wa-value"])
        for child in node.get("childIds", []):
            if child in by_id:
                visit(by_id[child], depth + 1 if shown else depth, value_id, visible)

    visit(nodes[0], 0, None, True)
    return "\n".join(lines), shown_ids

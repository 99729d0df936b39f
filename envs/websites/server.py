"""The simulated sites as real web apps: HTML pages with links, forms and server-side state.

One uvicorn server (Starlette app) in a background thread listens on 127.0.0.1, one port per site
(shop, admin, forum, git host, homepage), as WebArena serves each site on its own port. A page is the
site's node tree (page.py) written as HTML: a link is an `<a href>`, a button submits the page's
one form, a one-line text box is an `<input>` where Enter submits (its own handler), a multi-line one
a `<textarea>`, a checkbox an `<input type=checkbox>`, other nodes `<div role=...>` with the node's name
as `aria-label`, so that Chrome's accessibility tree has the node's role and name. Every element
carries `data-wa-id`, the id the text renderer gives it (page.walk), so both backends show the same ids.

A POST re-renders the page from the current state, finds the button (or text box) by its id, calls
its handler with the form's values and redirects (303) to the URL the handler returns; the handler's
message shows on the next page as an `alert`, as in the text renderer. Pages are sent with
`Cache-Control: no-store`, so going back re-reads the state, as the text renderer re-renders it.

State: many episodes share one server. Each browser context sends a `wa_world` cookie naming its
world, a deep copy of the seed's data that the env registers with `open_world` at reset and reads
back for the task's state check (the same process, so no API is needed).
Site hosts keep their public names in the observation; `to_local` / `to_public` map them to and from
127.0.0.1 ports, as WebArena maps its docker ports to public names.
Tested through tests/test_browser.py.
"""
from __future__ import annotations

import asyncio
import html
import socket
import threading
import time
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from . import HOME, admin, forum, gitlab, make_sites, page_at, shop
from .page import Node, id_base, walk

HOSTS = (shop.HOST, admin.HOST, forum.HOST, gitlab.HOST, HOME)
COOKIE = "wa_world"

# Enter in a one-line field submits with that field's own handler. Without this, the browser's
# implicit submission would click the form's first button (e.g. "Search" instead of "Add to Cart").
_ENTER = """document.addEventListener("keydown", (e) => {
  const t = e.target;
  if (e.key !== "Enter" || t.tagName !== "INPUT" || t.type === "checkbox") return;
  e.preventDefault();
  if (!t.dataset.waSubmit) return;
  const form = document.getElementById("wa"), act = document.createElement("input");
  act.type = "hidden"; act.name = "_wa"; act.value = t.dataset.waSubmit;
  form.appendChild(act); form.submit();
});"""
_STYLE = ("body{font:14px sans-serif;margin:8px 16px;max-width:1100px}p{margin:2px 0}h1,h2{margin:8px 0 4px}"
          "[role=row]{display:flex;gap:12px;border-bottom:1px solid #ddd}[role=row]>*{flex:1}"
          "[role=article]{border:1px solid #ccc;margin:4px 0;padding:4px}[role=alert]{background:#ffd;padding:4px}"
          "[role=banner],[role=navigation]{display:flex;gap:10px;background:#eef;padding:4px;align-items:center}"
          "textarea{width:400px;height:40px}")


def _attrs(**kv) -> str:
    return "".join(f' {k.replace("_", "-")}="{html.escape(str(v))}"' for k, v in kv.items() if v is not None)


def to_html(title: str, body: list[Node], base: int, local, flash: str = "") -> str:
    """The page as an HTML document; `local` maps a public URL to the address the browser can reach."""
    order = walk(title, body, base)
    next(order)  # the root: the document itself
    esc = html.escape

    def element(node: Node) -> str:
        node_id, same, _, value_id = next(order)
        assert same is node, "HTML and walk() must number the same nodes"
        inner = "".join(element(child) for child in node.children)
        required = "true" if node.props.get("required") else "false"  # Chrome omits it on a searchbox unless set
        if node.role == "StaticText":
            return f"<p{_attrs(data_wa_id=node_id, data_wa_text='')}>{esc(node.name)}</p>"
        if node.role == "heading":
            return f"<h2{_attrs(data_wa_id=node_id)}>{esc(node.name)}</h2>{inner}"
        if node.role == "link":
            return f"<a{_attrs(data_wa_id=node_id, href=local(node.href))}>{esc(node.name)}</a>{inner}"
        if node.role == "button":
            attrs = _attrs(form="wa", name="_wa", value=node_id, data_wa_id=node_id)
            return f"<button{attrs}>{esc(node.name)}</button>"
        if node.role == "checkbox":
            checked = "" if node.value == "true" else None
            attrs = _attrs(form="wa", type="checkbox", name=node.field, value="true", aria_label=node.name,
                           data_wa_id=node_id, checked=checked)
            return f"<input{attrs}>"
        if node.role in ("textbox", "searchbox") and node.handler is not None:
            kind = "search" if node.role == "searchbox" else "text"
            attrs = _attrs(form="wa", type=kind, name=node.field, value=node.value, aria_label=node.name,
                           aria_required=required, data_wa_id=node_id, data_wa_value=value_id, data_wa_submit=node_id)
            return f"<input{attrs}>"
        if node.role in ("textbox", "searchbox"):
            attrs = _attrs(form="wa", name=node.field, aria_label=node.name, aria_required=required,
                           data_wa_id=node_id, data_wa_value=value_id)
            return f"<textarea{attrs}>{esc(node.value)}</textarea>"
        label = node.name or None
        shown = esc(node.name) if node.name and not node.children else ""
        return f"<div{_attrs(role=node.role, aria_label=label, data_wa_id=node_id)}>{shown}{inner}</div>"

    content = "".join(element(n) for n in body)
    # The form is hidden and empty (its controls join it by form="wa"): a visible <form> around the page
    # would add a `form ''` node to the accessibility tree that the text renderer does not have.
    return (f"<!doctype html><html data-wa-id='{base}'><head><meta charset='utf-8'><title>{esc(title)}</title><style>{_STYLE}</style>"
            f"</head><body><form id='wa' method='post' hidden><input type='hidden' name='_wa_flash'"
            f" value='{esc(flash, quote=True)}'></form>{content}<script>{_ENTER}</script></body></html>")


class SiteServer:
    """The sites on 127.0.0.1 ports, serving many worlds at once (one per browser context)."""

    def __init__(self):
        self.worlds: dict[str, dict] = {}
        sockets = []
        self.ports: dict[str, int] = {}
        for host in HOSTS:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))  # a free port: parallel test runs must not collide
            sockets.append(sock)
            self.ports[host] = sock.getsockname()[1]
        self.hosts = {port: host for host, port in self.ports.items()}
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=sockets)),
                                        name="site-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the site server did not start; see the log above")
            time.sleep(0.01)

    def open_world(self, key: str, world: dict) -> None:
        """Serve `world` (build_world's data) to every request that carries the cookie wa_world=key."""
        self.worlds[key] = {"world": world, "sites": make_sites(world), "flash": ""}

    def close_world(self, key: str) -> None:
        self.worlds.pop(key, None)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ URL mapping
    def to_local(self, address: str) -> str:
        parts = urlsplit(address if "://" in address else "http://" + address)
        host = (parts.hostname or "").lower().removeprefix("www.")
        if host not in self.ports or parts.port not in (None, 80):
            return address
        rest = address.split(parts.netloc, 1)[1]
        return f"http://127.0.0.1:{self.ports[host]}{rest or '/'}"

    def to_public(self, address: str) -> str:
        parts = urlsplit(address)
        if parts.hostname != "127.0.0.1" or parts.port not in self.hosts:
            return address
        return f"http://{self.hosts[parts.port]}" + address.split(parts.netloc, 1)[1]

    # ------------------------------------------------------------------ requests
    async def _handle(self, request: Request) -> Response:
        entry = self.worlds.get(request.cookies.get(COOKIE, ""))
        if entry is None:
            return HTMLResponse("<title>No world</title><h1>No world is open for this browser context</h1>", 400)
        host = self.hosts[request.scope["server"][1]]
        public = f"http://{host}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        title, body = page_at(entry["sites"], public)
        if request.method == "GET":
            flash, entry["flash"] = entry["flash"], ""
            if flash:
                body = [Node("alert", flash)] + body
            page = to_html(title, body, id_base(public), self.to_local, flash)
            return HTMLResponse(page, headers={"Cache-Control": "no-store"})
        form = await request.form()
        if form.get("_wa_flash"):  # the page had an alert: it took an id, so the ids after it moved by one
            body = [Node("alert", str(form["_wa_flash"]))] + body
        nodes = {node_id: node for node_id, node, _, _ in walk(title, body, id_base(public))}
        # a browser sends a checked box only, and line breaks as \r\n
        values = {n.field: n.value for n in nodes.values() if n.field}
        values.update({k: str(v).replace("\r\n", "\n") for k, v in form.items() if not k.startswith("_wa")})
        values.update({n.field: "true" if n.field in form else "false" for n in nodes.values() if n.role == "checkbox"})
        action = str(form.get("_wa", ""))
        node = nodes.get(int(action)) if action.isdigit() else None
        if node is None or node.handler is None:
            entry["flash"] = "This form is out of date; the page was reloaded."
            return RedirectResponse(self.to_local(public), 303)
        target, entry["flash"] = node.handler(values)
        return RedirectResponse(self.to_local(target), 303)


_shared: SiteServer | None = None
_lock = threading.Lock()


def shared() -> SiteServer:
    """The process's one site server, started on first use (every env instance shares it)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = SiteServer()
        return _shared

"""What an episode's browser context may reach: its task's sites and about:blank, nothing else.

The agent's actions are untrusted model output, so a `browser.Context` reaches only its `origins` (the
task's sites, as scheme://host:port) and about:blank. `Sandbox` holds those origins and keeps the
context to them in three layers (docs/web.md):
1. `goto` refuses any other address before the browser sees it (`Sandbox.allowed`, `Sandbox.refusal`:
   file:, data:, chrome:, view-source:, javascript:, another host or port), with an error text that
   lists the allowed sites.
2. In the browser, for every request of the context (navigations, frames, redirects, scripts, images,
   fetches, WebSockets, popups): the context's proxy (`Sandbox.context_options`) is a local server that
   refuses everything (`_Refuse`, 403 and a "Refused" page), and only the allowed origins bypass it.
   Playwright's `route` is not used for this: it never sees a redirect's next hop (measured: a 302 to
   another host was followed). Service workers are blocked, downloads refused.
3. After each action and before each observation, a tab whose address is neither allowed nor the
   proxy's refusal (e.g. a non-network scheme) is replaced by a blank page with the refusal text
   (`Sandbox.guard`).
The browser itself is envs/chromium.py (the process) and envs/browser.py (contexts, observations, actions).
Tested through tests/test_browser.py (test_a_page_reaches_only_the_allowed_origins,
test_goto_refuses_other_schemes_and_hosts, test_web_env_refuses_local_files).
"""
from __future__ import annotations

import html
import http.server
import threading
from typing import Callable, Iterable
from urllib.parse import urlsplit

from playwright.async_api import Error as PlaywrightError

REFUSED_TITLE = "Refused: outside the task's sites"
_REFUSED = ("<!doctype html><title>" + REFUSED_TITLE + "</title><h1>" + REFUSED_TITLE + "</h1>"
            "<p>The browser refused {url}: an episode may visit only the sites of its task. Go back, or open one "
            "of the task's sites.</p>")
_lock = threading.Lock()


def origin(url: str) -> str | None:
    """scheme://host:port of an http(s) URL (the default port written out), else None."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # e.g. a port that is no number
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.hostname}:{port}"


class _Refuse(http.server.BaseHTTPRequestHandler):
    """The proxy of every context: it answers every request with 403 and the refusal page, and
    forwards nothing. Allowed origins bypass it, so whatever reaches it is outside the task."""

    def _refuse(self):
        body = _REFUSED.format(url=html.escape(self.path[:300])).encode()
        try:
            self.send_response(403)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command not in ("HEAD", "CONNECT"):  # Chrome shows its own error page for a refused tunnel
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the browser dropped the request (a page closed
            pass  # mid-load): nothing to tell it, and socketserver would print a traceback for it

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_CONNECT = _refuse

    def log_message(self, *args):
        pass


_refuser: http.server.ThreadingHTTPServer | None = None


def refuser() -> str:
    """The address of the process's one refusing proxy (started on first use)."""
    global _refuser
    with _lock:
        if _refuser is None:
            _refuser = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
            _refuser.daemon_threads = True
            threading.Thread(target=_refuser.serve_forever, name="refusing-proxy", daemon=True).start()
        return f"http://127.0.0.1:{_refuser.server_address[1]}"


class Sandbox:
    """The sites one browser context may reach, and the checks that keep it there."""

    def __init__(self, origins: Iterable[str] = (), to_public: Callable[[str], str] = str):
        # The only origins the context may reach (local addresses, as the browser sees them), besides
        # about:blank. None given: no site at all.
        self.origins = {o for o in map(origin, origins) if o}
        self.to_public = to_public

    def allowed(self, url: str) -> bool:
        return url == "about:blank" or origin(url) in self.origins

    def refusal(self, url: str) -> str:
        sites = ", ".join(sorted(self.to_public(o.rsplit(":", 1)[0] if o.endswith(":80") else o) for o in self.origins))
        if url.startswith("chrome-error:"):  # Chrome's error page: a site that is down, or a refused https address
            what = "the page could not be loaded (an address outside this task's sites is refused)"
        else:
            what = f"refused: {self.to_public(url)[:200]} is outside this task's sites"
        return f"{what}; an episode may visit only {sites or 'no site'}"

    def context_options(self) -> dict:
        """The keyword arguments of Playwright's `new_context` that keep a context to the allowed origins."""
        # Every request goes to the refusing proxy unless its origin is allowed (Chrome's bypass rules match
        # host and port; Playwright removes Chrome's implicit bypass of loopback addresses, tested).
        bypass = ",".join(sorted(o.split("://", 1)[1] for o in self.origins))
        return {"service_workers": "block", "accept_downloads": False, "proxy": {"server": refuser(), "bypass": bypass}}

    async def guard(self, pages) -> str:
        """The last line: a tab at an address outside the allowed origins that is not the proxy's refusal
        page (a non-network scheme, Chrome's error page) is replaced by a blank page with the refusal.
        Returns what was refused, for the action's error text."""
        said = []
        for page in pages:
            url = page.url
            if self.allowed(url):
                continue
            said.append(self.refusal(url))
            try:
                refused_page = url.startswith(("http:", "https:")) and await page.title() == REFUSED_TITLE
            except PlaywrightError:
                refused_page = False
            if not refused_page:
                await page.goto("about:blank")
                await page.set_content(_REFUSED.format(url=html.escape(url[:300])))
        return "; ".join(said)

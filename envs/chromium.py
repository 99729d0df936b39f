"""The process's one headless Chromium, and the event-loop thread that drives it.

`Browser` is one Chromium process (Debian's `chromium`, driven by Playwright through
`executable_path`), shared by every environment of the process (`shared`); each environment opens its
own browser context on it (envs/browser.py: `Context`). Playwright runs on a private event-loop thread
and `Browser.run` calls into it from any thread, so envs stepped from a thread pool (rollout.py) share
the browser safely. A browser that died (killed, crashed) is launched again by the next
`Browser.chromium` (a context's open, i.e. the env's reset). Playwright's own browser download is not
used.
Tested through tests/test_browser.py (test_killed_browser_restarts_at_reset,
test_many_contexts_share_one_browser).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import threading

import psutil
from playwright.async_api import async_playwright

_lock = threading.Lock()


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise RuntimeError("Chromium is not installed: run `apt-get install -y chromium` (as root; Debian's package), "
                           "or set CHROMIUM=/path/to/chrome. Playwright's own browser download is not used.")
    return path


class Browser:
    """One Chromium process and the event-loop thread that drives it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="browser-loop", daemon=True).start()
        self._playwright = self._chromium = None
        self._launch = asyncio.Lock()
        self.launches = 0

    def run(self, coro, timeout: float = 120.0):
        """Run a coroutine on the browser's loop from any thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def chromium(self):
        """The live browser, launched (again) when there is none or it died."""
        async with self._launch:  # many contexts resetting at once must not launch many browsers
            if self._chromium is None or not self._chromium.is_connected():
                if self._playwright is None:
                    self._playwright = await async_playwright().start()
                self._chromium = await self._playwright.chromium.launch(
                    executable_path=chromium_path(), headless=True,
                    args=["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
                self.launches += 1
            return self._chromium

    def pid(self) -> int | None:
        """The browser's process id (for tests that kill it): the Chromium process that is no child type."""
        for child in psutil.Process().children(recursive=True):
            try:
                if "chrom" in child.name() and "--type=" not in " ".join(child.cmdline()):
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None


_shared: Browser | None = None


def shared() -> Browser:
    global _shared
    with _lock:
        if _shared is None:
            _shared = Browser()
        return _shared

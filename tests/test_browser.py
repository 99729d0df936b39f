"""The Chromium backend on the local sites (served over HTTP), against the fast text backend.

A scripted episode per site (the solver of tests/test_webarena.py, reading only the observation) runs
on the text backend; its actions are replayed in the browser, and every observation must carry the
same (id, role, name) lines, tabs and URL, and the episode the same reward. Then: the real viewport
cuts a long page and scrolling moves it; bad actions give clear observations; a killed browser is
launched again at the next reset; one browser process serves many contexts at once.
Needs Debian's chromium (`apt-get install -y chromium`): without it these tests fail, they do not skip.

Run: python -m pytest tests/test_browser.py
"""
import http.server
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs import browser, make
from tests.support.adversarial import adversarial_replies
from tests.test_webarena import LINE, Agent, solve

SCRIPTED = [("shopping", "buy"), ("shopping", "order_total"), ("shopping_admin", "set_price"),
            ("reddit", "create_post"), ("gitlab", "label_issues"), ("gitlab", "close_issue")]


class Recorder(Agent):
    """The scripted agent, keeping each action and the observation it produced."""

    def __init__(self, env, task_id):
        super().__init__(env, task_id)
        self.log = [(None, self.obs)]

    def act(self, action):
        super().act(action)
        self.log.append((action, self.obs))
        return self


def seen(observation):
    """What must agree: tabs line, (id, role, name) of every element, URL."""
    head, rest = observation.split("\n\n", 1)
    tree, url = rest.split("\nURL: ")
    elements = [(int(m[2]), m[3], m[5], len(m[1])) for m in map(LINE.match, tree.splitlines()) if m]
    return head, elements, url.split("\n")[0]


@pytest.fixture(scope="module")
def envs():
    # Whole pages on both sides (no viewport windows), so that scrolling differences do not matter here.
    text = make("webarena", viewport_lines=100_000)
    web = make("webarena", backend="browser", viewport_only=False)
    yield text, web
    web.close()


@pytest.mark.parametrize("site,template", SCRIPTED)
def test_backends_agree_on_a_scripted_episode(envs, site, template):
    text, web = envs
    task_id = next(i for i, t in enumerate(text.task_list) if (t.site, t.template) == (site, template))
    agent = Recorder(text, task_id)
    final = solve(agent, text.task_list[task_id])
    agent.act(final)
    assert agent.reward == 1.0
    obs = web.reset(task_id)
    for k, (action, expected) in enumerate(agent.log):
        if action is not None:
            obs, reward, done = web.step(f"In summary, the next action I will perform is ```{action}```")
        if k + 1 < len(agent.log):  # the last one is the verdict, not a page
            assert seen(obs) == seen(expected), (action, obs, expected)
    assert (reward, done, web.success) == (1.0, True, True), obs
    web.reset(task_id)
    assert web.step("```stop [N/A]```")[1] == 0.0 and web.success is False  # a fresh world, a wrong answer


def test_backends_agree_on_history_and_tabs(envs):
    """Back and forward over links, a form that returns to its own page, a link to the page shown; tabs."""
    text, web = envs
    task_id = next(i for i, t in enumerate(text.task_list) if t.site == "shopping")
    pages = [text.reset(task_id), web.reset(task_id)]
    steps = ["link 'Electronics'", "button 'Add to Wish List'", "go_back", "go_back", "go_forward", "go_forward",
             "link 'Electronics'", "go_back", "new_tab", "goto [http://reddit.com/forums]", "link 'books'",
             "tab_focus [0]", "go_forward", "tab_focus [1]", "go_back", "close_tab", "close_tab", "go_back"]
    for step in steps:
        if step.startswith(("link", "button")):
            role, name = step.split(" ", 1)
            element = re.search(rf"\[(\d+)\] {role} {re.escape(name)}", pages[0])[1]
            step = f"click [{element}]"
        pages = [env.step(f"```{step}```")[0] for env in (text, web)]
        if "URL: about:blank" in pages[0]:  # an empty tab: only its root, whose id Chrome picks; nothing to act on
            assert [seen(p)[0::2] for p in pages] == [seen(pages[0])[0::2]] * 2 and len(seen(pages[1])[1]) == 1
            continue
        assert seen(pages[0]) == seen(pages[1]), (step, pages)
        assert pages[0].split("PREVIOUS ACTION: ")[1] == pages[1].split("PREVIOUS ACTION: ")[1]


def test_viewport_scrolling_and_bad_actions():
    env = make("webarena", backend="browser", height=400)  # the order grid is about 750 px tall
    try:
        t = next(i for i, x in enumerate(env.task_list) if x.site == "shopping_admin")
        env.reset(t)
        orders = next(m[1] for m in re.finditer(r"\[(\d+)\] link 'Orders'", env.observe()))
        first = env.step(f"```click [{orders}]```")[0]
        rows = lambda o: {m for m in re.findall(r"\[(\d+)\] row", o)}  # noqa: E731
        assert "URL: http://luma.com/admin/sales/order" in first and 5 < len(rows(first)) < 36  # the viewport cuts
        second = env.step("```scroll [down]```")[0]
        assert rows(second) - rows(first)  # new rows came into view
        stale = min(rows(first) - rows(second), key=int)
        assert "no matching element" in env.step(f"```click [{stale}]```")[0]
        link = re.search(r"\[(\d+)\] link", second)[1]
        assert "only a textbox or searchbox accepts text" in env.step(f"```type [{link}] [hello]```")[0]
        obs, reward, done = env.step("```goto [http://example.invalid/secret]```")
        assert "refused: http://example.invalid/secret is outside this task's sites" in obs
        assert (reward, done) == (0.0, False) and "URL: http://luma.com/admin/sales/order" in obs
        assert "unknown key combination" in env.step("```press [Hyper+Q]```")[0]
        assert "Invalid action" in env.step("```tab_focus [4]```")[0]
        assert "there is no next page" in env.step("```go_forward```")[0]
        for k, reply in enumerate(adversarial_replies(40, ["click", "type", "[9999]", "[1]", "scroll", "stop",
                                                           "goto", "[luma.com/admin]", "```"], seed=5)):
            obs, reward, done = env.step(reply)
            assert isinstance(obs, str) and reward in (0.0, 1.0)
            if done:
                env.reset(t)
    finally:
        env.close()


def test_killed_browser_restarts_at_reset():
    env = make("webarena", backend="browser")
    try:
        env.reset(0)
        browser = env.view.browser
        launches, pid = browser.launches, browser.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not env.view.alive():
                break
            time.sleep(0.05)
        obs, reward, done = env.step("```scroll [down]```")
        assert "browser is not running" in obs and (reward, done) == (0.0, False)
        obs = env.reset(0)
        assert browser.launches == launches + 1 and "RootWebArea 'One Stop Market'" in obs
    finally:
        env.close()


def test_many_contexts_share_one_browser():
    envs = [make("webarena", backend="browser") for _ in range(6)]
    task_ids = [i for i, t in enumerate(envs[0].task_list) if t.template == "wish_add"][:6]

    def episode(k):  # each env adds a different product to its own world's wish list
        env, task = envs[k], envs[k].task_list[task_ids[k]]
        agent = Agent(env, task_ids[k])
        return solve(agent, task) and agent.act("stop []").reward

    try:
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(episode, range(6))) == [1.0] * 6
        assert len({id(e.view.browser) for e in envs}) == 1
        initial = envs[0].world0["store"].wishlist
        for k, env in enumerate(envs):  # each context changed its own world only
            added = [env.world["store"].product(p).name for p in env.world["store"].wishlist if p not in initial]
            assert added == [env.task_list[task_ids[k]].params["product"]]
    finally:
        for env in envs:
            env.close()


SHOWN = {"shopping": "http://onestopmarket.com/", "shopping_admin": "http://luma.com/admin/sales/order/view/order_id/000000103",
         "reddit": "http://reddit.com/forums", "gitlab": "http://gitlab.com/byteblaze/dotfiles/-/issues"}


def test_screenshot_of_each_site(tmp_path):
    """What the agent sees, beside what a person sees. WEB_SCREENSHOTS=docs writes the README's copies."""
    out = os.environ.get("WEB_SCREENSHOTS") or tmp_path
    env = make("webarena", backend="browser", width=1000, height=560)
    try:
        for site, address in SHOWN.items():
            env.reset(next(i for i, t in enumerate(env.task_list) if t.site == site))
            obs = env.step(f"```goto [{address}]```")[0]
            assert f"URL: {address}" in obs and "RootWebArea" in obs and "404" not in obs
            path = os.path.join(out, f"web-{site}.png")
            env.view.screenshot(path)
            with open(path, "rb") as f:
                assert f.read(8) == b"\x89PNG\r\n\x1a\n"
            with open(os.path.join(out, f"web-{site}.txt"), "w") as f:
                f.write(obs.split("\nOBJECTIVE:")[0] + "\n")
    finally:
        env.close()


# ---------------------------------------------------------------------- only the task's sites
SECRET = "s3cret-4e1f"


class _Site(http.server.BaseHTTPRequestHandler):
    """The allowed site: a page that reaches for the other host in every way a page can."""
    other = 0  # the disallowed server's port

    def do_GET(self):
        other = f"http://127.0.0.1:{self.other}"
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"{other}/after-redirect")
            self.end_headers()
            return
        body = (f"<title>Allowed</title><a href='{other}/linked'>to the other host</a> <a href='/redirect'>redirect</a>"
                f"<iframe src='{other}/framed'></iframe><img src='{other}/image.png'><script src='{other}/s.js'></script>"
                f"<script>fetch('{other}/fetched').catch(() => 0); new WebSocket('ws://127.0.0.1:{self.other}/ws');"
                f"window.open('{other}/popup');</script>")
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class _Secret(http.server.BaseHTTPRequestHandler):
    """The disallowed host: it counts every request that reaches it and answers with the secret."""
    hits: list = []

    def do_GET(self):
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(f"<title>{SECRET}</title>{SECRET}".encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def two_sites():
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for handler in (_Site, _Secret)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    _Site.other = servers[1].server_address[1]
    yield [f"http://127.0.0.1:{server.server_address[1]}" for server in servers]
    for server in servers:
        server.shutdown()


def test_a_page_reaches_only_the_allowed_origins(two_sites, tmp_path):
    """Links, redirects, frames, images, scripts, fetches, WebSockets and popups of an allowed page never
    reach another host (here another port of 127.0.0.1): the browser itself refuses them."""
    allowed, other = two_sites
    view = browser.Context(origins=[allowed])
    _Secret.hits.clear()
    try:
        view.open(allowed + "/")
        time.sleep(0.5)  # the page's own requests (frame, image, script, fetch, WebSocket, popup) have been made
        tabs, tree, url = view.observe()
        assert "RootWebArea 'Allowed'" in tree and url == allowed + "/" and SECRET not in tree
        link = re.search(r"\[(\d+)\] link 'to the other host'", tree)[1]
        said = view.call("click", int(link))
        tabs, tree, url = view.observe()
        assert SECRET not in tree + tabs and f"refused: {other}/linked is outside this task's sites" in said
        assert "RootWebArea \"Refused: outside the task's sites\"" in tree
        assert view.call("go_back") == "" and view.observe()[2] == allowed + "/"
        redirect = re.search(r"\[(\d+)\] link 'redirect'", view.observe()[1])[1]
        said = view.call("click", int(redirect))
        tabs, tree, url = view.observe()
        assert f"refused: {other}/after-redirect" in said and SECRET not in tree and url == other + "/after-redirect"
        assert _Secret.hits == []  # nothing reached the other host
    finally:
        view.close()


def test_goto_refuses_other_schemes_and_hosts(two_sites, tmp_path):
    allowed, other = two_sites
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    view = browser.Context(origins=[allowed])
    _Secret.hits.clear()
    try:
        view.open(allowed + "/")
        for address in [secret.as_uri(), "file:///etc/hostname", f"data:text/html,{SECRET}", "chrome://version",
                        f"view-source:{other}/", f"javascript:document.write('{SECRET}')", other + "/",
                        "http://169.254.169.254/latest/meta-data/", f"http://localhost:{other.rsplit(':', 1)[1]}/"]:
            said = view.call("go", address)
            tabs, tree, url = view.observe()
            assert said.startswith("refused: ") and f"may visit only {allowed}" in said, (address, said)
            assert url == allowed + "/" and SECRET not in tree + tabs, address
        assert _Secret.hits == []
        assert view.call("go", allowed + "/other") == "" and view.observe()[2] == allowed + "/other"
    finally:
        view.close()


def test_web_env_refuses_local_files(tmp_path):
    """The web env's `goto` with a file URL, as a model may write it: a clear observation, nothing read."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    env = make("webarena", backend="browser")
    try:
        env.reset(0)
        for address in [secret.as_uri(), "file:///etc/hostname", "view-source:http://onestopmarket.com/"]:
            obs, reward, done = env.step(f"```goto [{address}]```")
            assert f"goto [{address}] (refused: " in obs and SECRET not in obs and (reward, done) == (0.0, False)
            assert "URL: http://onestopmarket.com" in obs
    finally:
        env.close()

"""The Chromium backend on the local sites (served over HTTP), against the fast text backend.

A scripted episode per site (the solver of tests/test_webarena.py, reading only the observation) runs
on the text backend; its actions are replayed in the browser, and every observation must carry the
same (id, role, name) lines, tabs and URL, and the episode the same reward. Then: the real viewport
cuts a long page and scrolling moves it; bad actions give clear observations; a killed browser is
launched again at the next reset; one browser process serves many contexts at once.
Needs Debian's chromium (`apt-get install -y chromium`): without it these tests fail, they do not skip.

Run: python -m pytest tests/test_browser.py
"""
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs import make
from tests.adversarial import adversarial_replies
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
        assert "could not be loaded" in obs and (reward, done) == (0.0, False)
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

"""MiniWoB++ in the real browser: the scripted expert, reading only the observation text, reaches reward 1
on ten pages of different kinds (buttons, links, text, checkboxes, login form, drop-down, tabs, email
icons, radio buttons, non-ASCII labels); a wrong click gets the page's -1; the same task id gives the
same text; bad actions give clear observations and change nothing (a drop-down refuses an unknown
option, then takes a known one); `stop` ends with -1 (the page never judged the episode); a killed
browser is launched again at the next reset and the episode plays as before. The pages that the tree's
rules or the grammar once kept out are solved from the text: navigate-tree's targets, click-widget's
textareas, use-autocomplete's suggestions (in the observation of the keystroke that opens them; a
click they cover says so), grid-coordinate, ascending-numbers, the sliders, click-scroll-list; the
date and time pickers that stay left out are shown not to fill.
Needs Debian's chromium and the miniwob package (requirements.txt): without them these tests fail.

Run: python -m pytest tests/test_miniwob.py
"""
import os
import re
import signal
import time

import pytest

from envs import make
from envs.miniwob import LEFT_OUT, all_pages, offered_pages
from envs.miniwob_expert import PLANNERS, objective, quoted


def element(obs, role, name):
    """The id of the first element with this role and exactly this name."""
    m = re.search(rf"\[(\d+)\] {role} '{re.escape(name)}'", obs)
    assert m, f"no {role} {name!r} in\n{obs}"
    return m[1]


SOLVED = list(PLANNERS)


@pytest.fixture(scope="module")
def env():
    env = make("miniwob", pages=SOLVED)
    yield env
    env.close()


def act(env, action):
    return env.step(f"Let me do it.\nIn summary, the next action I will perform is ```{action}```")


def test_pages_splits_and_subtasks():
    assert len(all_pages()) == 130 and set(LEFT_OUT) <= set(all_pages())
    assert len(offered_pages()) == 130 - len(LEFT_OUT) and "click-button" in offered_pages()
    env = make("miniwob", pages=["click-button", "enter-text"], test_seeds=3, train_seeds=5)
    test, train = env.tasks("test"), env.tasks("train")
    assert len(test) == 6 and len(train) == 10 and not set(test) & set(train)
    assert {env.page_seed(t)[1] for t in test} == {0, 1, 2} and {env.page_seed(t)[1] for t in train} == set(range(3, 8))
    assert [env.subtask(t) for t in test[:2]] == ["click-button", "enter-text"]
    with pytest.raises(ValueError, match="unknown MiniWoB"):
        make("miniwob", pages=["click-buton"])


@pytest.mark.parametrize("page", SOLVED)
def test_expert_reaches_reward_1(env, page):
    """The expert (envs/miniwob_expert.py) reads only the text and completes the page, in replies the
    env parses like a model's."""
    for seed in (3,):  # more seeds pass too (train seeds 100-129: 300 of 300 episodes); one keeps it fast
        task_id = seed * len(SOLVED) + SOLVED.index(page)
        obs = env.reset(task_id)
        assert env.subtask(task_id) == page and "URL: http://miniwob.farama.org/miniwob/" in obs
        for turn in range(8):
            reply = env.expert()
            assert reply.startswith(("Click", "Type")) and "In summary, the next action I will perform is ```" in reply
            obs, reward, done = env.step(reply)
            if done:
                break
            assert reward == -1.0 and "Invalid" not in obs and "could not" not in obs, obs
        assert (reward, done, env.success) == (1.0, True, True), (page, seed, obs)
        assert "The episode is over: the page gave reward 1" in obs
        with pytest.raises(RuntimeError, match="reset"):
            env.expert()


def test_expert_without_a_plan_stops():
    env = make("miniwob", pages=["click-dialog"])
    try:
        env.reset(0)
        reply = env.expert()
        assert reply.endswith("```stop [no plan]```") and env.step(reply)[1:] == (-1.0, True)
    finally:
        env.close()


def test_wrong_answer_gets_the_page_reward(env):
    obs = env.reset(SOLVED.index("click-button"))
    right = quoted(objective(obs))[0]
    wrong = next(n for n in re.findall(r"\] button '([^']*)'", obs) if n != right)
    obs, reward, done = act(env, f"click [{element(obs, 'button', wrong)}]")
    assert (reward, done, env.success) == (-1.0, True, False)
    assert act(env, "click [1]")[1:] == (-1.0, True)  # after the end: the same verdict, nothing runs


def test_same_seed_same_text(env):
    task_id = 5 * len(SOLVED) + SOLVED.index("email-inbox-delete")
    first = env.reset(task_id)
    act(env, "scroll [down]")
    assert env.reset(task_id) == first
    other = env.reset(task_id + len(SOLVED))  # the next seed: another problem
    assert objective(other) != objective(first)


def test_bad_actions_give_clear_observations(env):
    obs = env.reset(SOLVED.index("enter-text"))
    box, button = element(obs, "textbox", ""), element(obs, "button", "Submit")
    cases = [("no block at all", "no action found"),
             ("```fly [3]```", "unknown action 'fly'"),
             ("```click [99999]```", "no matching element was found"),
             (f"```type [{button}] [hello]```", "only a textbox, searchbox, combobox or spinbutton accepts text"),
             ("```press [Ctrl+Nope]```", "unknown key combination"),
             ("```goto [http://elsewhere.invalid/]```", "refused: http://elsewhere.invalid/ is outside this task's "
              "sites; an episode may visit only http://miniwob.farama.org"),
             ("```goto [file:///etc/hostname]```", "refused: file:///etc/hostname")]
    for reply, says in cases:
        obs, reward, done = env.step(reply)
        assert says in obs.split("PREVIOUS ACTION:")[1] and (reward, done) == (-1.0, False), (reply, obs)
    obs = env.reset(SOLVED.index("choose-list"))
    combo, submit = re.search(r"\[(\d+)\] combobox", obs)[1], element(obs, "button", "Submit")
    item = re.fullmatch(r"Select (.*) from the list and click Submit\.", objective(obs))[1]
    obs, reward, done = act(env, f"type [{combo}] [No such item]")
    assert "no option 'No such item' in this list; its options are [" in obs and not done
    act(env, f"type [{combo}] [{item.upper()}]")  # typing into a drop-down picks the option of that name
    assert act(env, f"click [{submit}]")[1:] == (1.0, True)
    env.reset(SOLVED.index("choose-list"))
    obs, reward, done = act(env, "stop [I give up]")
    assert (reward, done, env.success) == (-1.0, True, False)


def test_killed_browser_restarts_at_next_reset(env):
    task_id = SOLVED.index("click-button")
    expected = env.reset(task_id)
    pid, launches = env.view.browser.pid(), env.view.browser.launches
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while env.view.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    obs, reward, done = act(env, "click [2]")
    assert "The browser is not running" in obs and (reward, done) == (-1.0, False)
    assert env.reset(task_id) == expected and env.view.browser.launches == launches + 1
    obs, reward, done = act(env, f"click [{element(expected, 'button', quoted(objective(expected))[0])}]")
    assert (reward, done) == (1.0, True)


# ---------------------------------------------------------------------- pages once left out or unsolvable
def play(page, seed, solver, turns=30):
    """Run `solver(observation) -> action` on one page and seed; the final (reward, done) and observation."""
    env = make("miniwob", pages=[page])
    try:
        obs, reward, done = env.reset(seed), -1.0, False
        for _ in range(turns):
            obs, reward, done = act(env, solver(obs))
            if done:
                break
        return reward, done, obs
    finally:
        env.close()


def tree(obs):
    return obs.split("\nURL: ")[0]


@pytest.mark.parametrize("seed", [10, 18, 0])
def test_navigate_tree_shows_its_target(seed):
    """WebArena's rule drops a text that one of the three lines above contains; here the instruction
    quotes the target, so under that rule the target's line vanished once its folder was open."""
    def solver(obs):
        target = quoted(objective(obs))[0]
        shown = re.search(rf"\[(\d+)\] StaticText '{re.escape(target)}'", tree(obs))
        if shown:
            return f"click [{shown[1]}]"
        folder = re.search(r"\[(\d+)\] generic 'hitarea expandable", obs)[1]
        return f"click [{folder}]"
    assert play("navigate-tree", seed, solver)[:2] == (1.0, True)


def test_the_tree_exception_against_webarena_rule():
    env = make("miniwob", pages=["navigate-tree"])
    try:
        obs = env.reset(10)
        target = quoted(objective(obs))[0]
        for _ in range(5):  # open every folder
            folder = re.search(r"\[(\d+)\] generic 'hitarea expandable", obs)
            if folder is None:
                break
            obs = act(env, f"click [{folder[1]}]")[0]
        assert re.search(r"generic 'hitarea collapsable", obs)  # a name from a class follows the class
        assert f"StaticText '{target}'" in tree(obs)
        env.view.exact = True  # WebArena's rule: the instruction above quotes the name, the line goes
        assert f"StaticText '{target}'" not in tree(env.observe())
    finally:
        env.close()
    env = make("miniwob", pages=["click-button"])  # where a text repeats an element's name, the rule holds
    try:
        obs = env.reset(0)
        buttons = re.findall(r"\] button '([^']+)'", obs)
        assert buttons and not any(f"StaticText '{name}'" in obs for name in buttons)
    finally:
        env.close()


def test_click_widget_tells_a_textarea_from_a_text_box():
    def solver(obs):
        kind = quoted(objective(obs))[0]
        assert "multiline: False" in obs and "multiline: True" in obs
        wanted = {"textarea": "textbox '' multiline: True", "text": "textbox '' multiline: False"}[kind]
        target = re.search(r"\[(\d+)\] " + re.escape(wanted), obs)[1]
        return f"click [{target}]"
    assert play("click-widget", 0, solver, turns=1)[:2] == (1.0, True)


def test_autocomplete_suggestions_show_after_typing():
    env = make("miniwob", pages=["use-autocomplete"])
    try:
        obs = env.reset(0)
        start, end = quoted(objective(obs))
        box, submit = re.search(r"\[(\d+)\] textbox", obs)[1], element(obs, "button", "Submit")
        obs = act(env, f"type [{box}] [{start}] [0]")[0]  # the list opens 300 ms after the keystroke
        choice = re.search(rf"\[(\d+)\] StaticText '({re.escape(start)}[^']*{re.escape(end)})'", tree(obs))
        assert choice, obs
        obs, reward, done = act(env, f"click [{submit}]")  # the list covers Submit
        assert "not clicked: the element is covered by ul '" in obs and choice[2] in obs and not done
        act(env, f"click [{choice[1]}]")
        assert act(env, f"click [{submit}]")[1:] == (1.0, True)
    finally:
        env.close()


def test_grid_coordinate_by_the_order_of_its_circles():
    """25 unnamed circles, drawn column by column from x = -2, each from y = 2 down."""
    def solver(obs):
        x, y = map(int, re.search(r"\((-?\d),(-?\d)\)", objective(obs)).groups())
        circles = re.findall(r"\[(\d+)\] graphics-symbol ''", obs)
        assert len(circles) == 25
        return f"click [{circles[(x + 2) * 5 + (2 - y)]}]"
    for seed in (0, 1):
        assert play("grid-coordinate", seed, solver, turns=1)[:2] == (1.0, True)


def test_ascending_numbers_by_the_order_of_the_squares():
    def solver(obs):
        first = re.search(r"\[(\d+)\] StaticText '1'", tree(obs)) or re.search(r"\[(\d+)\] graphics-symbol", obs)
        return f"click [{first[1]}]"
    assert play("ascending-numbers", 1, solver, turns=6)[:2] == (1.0, True)


def slider_solver(obs):
    """Tab to the next handle whose value is off, then arrow keys; Submit when every value is right."""
    goal = objective(obs)  # "Select -99 with the slider ..." or "Set the sliders to the combination [12,3,11] ..."
    wanted = [int(v) for v in re.findall(r"-?\d+", goal.split("[")[1] if "[" in goal else goal)[:1 if "[" not in goal else None]]
    values = [int(v) for v in re.findall(r"handle[^\n]*\n\t*\[\d+\] StaticText '(-?\d+)'", obs)]
    focused = [i for i, line in enumerate(re.findall(r"generic 'ui slider handle[^\n]*", obs)) if "focused: True" in line]
    if focused and values[focused[0]] != wanted[focused[0]]:
        return "press [ArrowRight]" if values[focused[0]] < wanted[focused[0]] else "press [ArrowLeft]"
    if values != wanted:
        return "press [Tab]"
    for box, checked in re.findall(r"\[(\d+)\] checkbox ''[^\n]* checked: (\w+)", obs)[:1]:  # form-sequence: the 1st one
        if checked == "false":
            return f"click [{box}]"
    return f"click [{element(obs, 'button', 'Submit')}]"


@pytest.mark.parametrize("page,seed", [("use-slider", 0), ("use-slider-2", 1), ("form-sequence", 1)])
def test_sliders_move_with_the_keyboard(page, seed):
    assert play(page, seed, slider_solver, turns=40)[:2] == (1.0, True)


def test_scroll_list_takes_several_choices():
    def solver(obs):
        names = re.fullmatch(r"Select (.*) from the scroll list and click Submit\.", objective(obs))[1].split(", ")
        todo = [n for n in names if not re.search(rf"option '{re.escape(n)}'[^\n]* selected: True", obs)]
        return f"click [{element(obs, 'option', todo[0]) if todo else element(obs, 'button', 'Submit')}]"
    assert play("click-scroll-list", 3, solver, turns=4)[:2] == (1.0, True)


def test_date_and_time_pickers_stay_empty():
    """Why enter-date and enter-time are left out: neither `type` nor key presses into the picker's
    fields set a value, and Submit then scores -1."""
    for page in ("enter-date", "enter-time"):
        env = make("miniwob", pages=[page])
        try:
            obs = env.reset(1)
            fields = re.findall(r"\[(\d+)\] spinbutton '(\w+)", obs)
            assert len(fields) == 3
            for field, _ in fields:
                obs = act(env, f"type [{field}] [11] [0]")[0]
                obs = act(env, f"click [{field}]")[0]
                for key in "11":
                    obs = act(env, f"press [{key}]")[0]
            assert len(re.findall(r"spinbutton .*valuetext: $", tree(obs), re.MULTILINE)) == 3  # all still empty
            assert act(env, f"click [{element(obs, 'button', 'Submit')}]")[1:] == (-1.0, True)
        finally:
            env.close()

"""A scripted expert for ten MiniWoB++ pages (envs/miniwob.py), for behaviour-cloning demonstrations.

It reads only what the agent reads: the first observation text of an episode (the utterance after
`OBJECTIVE:` and the accessibility-tree lines `[id] role 'name'`), and plans every action of the
episode from it. Ids are stable within an episode (browser.Context's stable_ids), so the plan holds
until the page gives its verdict. Each step is a (thought, action) pair; the thought names the target
in words ("the button 'Yes'") before the action names its id, which is the lookup the agent must learn:
find the line with that name, copy the number in front of it.

Pages: PLANNERS' keys, ten kinds (a button, a link, typing, checkboxes, a login form, a drop-down,
tabs, an icon in an email list, radio buttons, non-ASCII labels). Any other page gets `stop`, which
ends the episode with reward -1 (the page never judged it, envs/miniwob.py): the warm start imitates
only successful episodes, so those never count.

Use: `MiniWoB.expert()` returns the reply for the current state (the tests check that it reaches reward
1), or `plan(page, observation)` returns the whole list of steps.
"""
from __future__ import annotations

import re


def element(obs: str, role: str, name: str) -> str:
    """The id of the first element with this role and exactly this name."""
    m = re.search(rf"\[(\d+)\] {role} '{re.escape(name)}'", obs)
    if not m:
        raise LookupError(f"no {role} {name!r} in the observation")
    return m[1]


def objective(obs: str) -> str:
    return obs.split("\nOBJECTIVE: ", 1)[1].split("\nPREVIOUS ACTION:", 1)[0]


def quoted(text: str) -> list[str]:
    return re.findall(r'"([^"]*)"', text)


def _click(obs, role, name):
    return f"Click the {role} '{name}'.", f"click [{element(obs, role, name)}]"


def _submit(obs):
    return _click(obs, "button", "Submit")


def _button(obs, goal):  # click-button; unicode-test's labels are e.g. "ÖK", "ヘルプ"
    return [_click(obs, "button", quoted(goal)[0])]


def _link(obs, goal):  # the links are spans with a click handler, shown as links; case matters
    return [_click(obs, "link", quoted(goal)[0])]


def _enter_text(obs, goal):
    text = quoted(goal)[0]
    return [(f'Type "{text}" into the textbox.', f"type [{element(obs, 'textbox', '')}] [{text}] [0]"), _submit(obs)]


def _checkboxes(obs, goal):
    wanted = re.fullmatch(r"Select (.*) and click Submit\.", goal)[1]
    names = [] if wanted == "nothing" else wanted.split(", ")
    return [_click(obs, "checkbox", n) for n in names] + [_submit(obs)]


def _login(obs, goal):
    user, password = quoted(goal)
    boxes = re.findall(r"\[(\d+)\] textbox ''", obs)
    return [(f'Type the username "{user}".', f"type [{boxes[0]}] [{user}] [0]"),
            (f'Type the password "{password}".', f"type [{boxes[1]}] [{password}] [0]"),
            _click(obs, "button", "Login")]


def _list(obs, goal):  # the options of the closed drop-down are in the tree: clicking one selects it
    item = re.fullmatch(r"Select (.*) from the list and click Submit\.", goal)[1]
    return [_click(obs, "option", item), _submit(obs)]


def _tab(obs, goal):
    return [_click(obs, "link", re.fullmatch(r"Click on (.*)\.", goal)[1])]


def _email_delete(obs, goal):  # the trash icon of the sender's row: the first one after the name
    sender = re.fullmatch(r"Find the email by (.*) and click the trash icon to delete it\.", goal)[1]
    inbox = obs.split("heading 'Primary'", 1)[1]  # the utterance above the inbox names the sender too
    after = inbox.split(f"StaticText '{sender}'", 1)[1]
    trash = re.search(r"\[(\d+)\] image 'trash'", after)[1]
    return [(f"Click the trash icon in the email by {sender}.", f"click [{trash}]")]


def _radio(obs, goal):
    return [_click(obs, "radio", re.search(r"Select (.*) and click Submit", goal)[1]), _submit(obs)]


PLANNERS = {"click-button": _button, "unicode-test": _button, "click-link": _link, "enter-text": _enter_text,
            "click-checkboxes": _checkboxes, "login-user": _login, "choose-list": _list, "click-tab": _tab,
            "email-inbox-delete": _email_delete, "click-option": _radio}


def plan(page: str, obs: str) -> list[tuple[str, str]]:
    """Every (thought, action) that completes this page's problem, read from its first observation; a
    page without a planner, or an observation it cannot read, gets a single `stop`."""
    planner = PLANNERS.get(page)
    if planner is None:
        return [(f"I have no plan for the page {page}.", "stop [no plan]")]
    try:
        return planner(obs, objective(obs))
    except (LookupError, TypeError, ValueError, IndexError) as exc:  # e.g. a page that did not load
        return [(f"I cannot read this page ({exc}).", "stop [no plan]")]


def reply(thought: str, action: str) -> str:
    """The reply in the web env's format (envs/webarena.py's INSTRUCTION, rule 4)."""
    return f"{thought} In summary, the next action I will perform is ```{action}```"

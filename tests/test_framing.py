"""AgentGym's framing (`--prompt-style agentgym`) with the tiny model and a real engine:

- the first prompt is the chat template's rendering of [user: instruction, assistant: acknowledgement,
  user: first observation] (three templates), and our style stays [system, user];
- token-exact bookkeeping: the canned assistant turn lies in the prompt with loss mask 0 in the trained
  batch, and the mask is 1 on exactly the tokens the engine sampled;
- instruction files replace the env's wording; TextCraft drops its worked example in this style;
- checks.check and evaluate.check turn bad prompt styles, instruction files and task files into
  one-line errors before anything heavy starts.
"""
from __future__ import annotations

import json

import pytest

from launch import checks
import config as configs
import engine as engines
import evaluate as E
from infra import framing
from models import tiny
from batch import collate
from envs.textcraft import TextCraft
from infra.framing import ACKNOWLEDGEMENT, Framing
from rollout import ChatFormat, Play, rollout
from tests.test_rollout import Recorder, eos_prone_state, runs, tokenizer_for
from tests.support.toy import Digits


@pytest.fixture(scope="module")
def model_dir():
    return tiny.tiny_model_dir()


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = engines.make_engine(model_dir, "hf", max_model_len=2048)
    eng.sync_weights(eos_prone_state(model_dir).items())
    return eng


@pytest.mark.parametrize("template", ["tiny", "qwen2.5", "llama3"])
def test_agentgym_prompt_is_the_template_rendering(model_dir, template):
    tok = tokenizer_for(model_dir, template)
    chat = ChatFormat(tok)
    ids = chat.prompt("Do the task.", "You see a door.", ACKNOWLEDGEMENT)
    expected = tok.apply_chat_template([{"role": "user", "content": "Do the task."},
                                        {"role": "assistant", "content": ACKNOWLEDGEMENT},
                                        {"role": "user", "content": "You see a door."}],
                                       add_generation_prompt=True, tokenize=False)
    assert tok.decode(ids) == expected
    ours = tok.apply_chat_template([{"role": "system", "content": "Do the task."},
                                    {"role": "user", "content": "You see a door."}], add_generation_prompt=True,
                                   tokenize=False)
    assert tok.decode(chat.prompt("Do the task.", "You see a door.")) == ours != expected


def test_acknowledgement_is_prompt_and_never_trained(engine, model_dir):
    tok = tokenizer_for(model_dir, "tiny")
    chat = ChatFormat(tok)
    rec = Recorder(engine)
    tasks = [(t, t) for t in range(4)]
    style = Framing("agentgym")
    episodes, _ = rollout(rec, chat, [Digits(turns=3) for _ in tasks], Digits, tasks,
                          Play(3, max_tokens=10, seed=5, framing=style))
    batch = collate(episodes, tok.pad_token_id or 0)
    ack = chat.encode(ACKNOWLEDGEMENT)
    trained = []
    for row, ep in enumerate(episodes):
        assert [m["role"] for m in ep.messages[:3]] == ["user", "assistant", "user"]
        assert ep.messages[0]["content"] == Digits.instruction and ep.messages[1]["content"] == ACKNOWLEDGEMENT
        prompt = ep.ids[:ep.prompt_len]
        start = next(i for i in range(len(prompt)) if prompt[i:i + len(ack)] == ack)  # the canned turn's tokens
        mask = batch["mask"][row]
        assert mask[:ep.prompt_len].sum() == 0 and mask[start:start + len(ack)].sum() == 0
        assert mask.sum() == sum(ep.mask) > 0
        for idx in runs(ep.mask):
            trained.append(tuple(ep.response[i] for i in idx))
    assert sorted(trained) == sorted(map(tuple, rec.samples))  # the mask is exactly the sampled tokens


def test_instructions_file_and_zero_shot_textcraft(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"textcraft": "Craft things. Thought:/Action: replies."}))
    env = TextCraft()
    assert framing.make("agentgym", "textcraft", str(path)).opening(env) == (
        "Craft things. Thought:/Action: replies.", ACKNOWLEDGEMENT)
    assert framing.make("ours", "textcraft", str(path)).opening(env) == ("Craft things. Thought:/Action: replies.", None)
    text, ack = framing.make("agentgym", "textcraft").opening(env)
    assert "Example:" in env.instruction and "Example:" not in text and text in env.instruction
    assert framing.make("agentgym", "webarena").acknowledgement == "Ok."
    assert framing.env_options("agentgym", "sciworld", {}) == {"parser": "agentgym"}
    assert framing.env_options("agentgym", "sciworld", {"parser": "ours"}) == {"parser": "ours"}
    assert framing.env_options("ours", "babyai", {"brief": True}) == {"brief": True}
    with pytest.raises(ValueError, match="no instruction text for 'babyai'.*keys: textcraft"):
        framing.make("agentgym", "babyai", str(path))
    with pytest.raises(ValueError, match="prompt-style"):
        framing.make("agentgim", "babyai")


def test_bad_paper_mode_flags_are_one_line_errors(tmp_path):
    tasks = tmp_path / "textcraft_test.json"
    tasks.write_text(json.dumps([{"item_id": "textcraft_0"}]))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    cases = [(["--prompt-style", "agentgim"], "unknown --prompt-style"),
             (["--instructions-file", str(broken)], "not JSON"),
             (["--instructions-file", str(tmp_path / "none.json")], "cannot read"),
             (["--tasks-file", str(tasks)], "file system's listing"),
             (["--env", "babyai", "--tasks-file", str(tasks)], "names 'textcraft'")]
    for argv, message in cases:
        out = ["--out", str(tmp_path / "eval")]
        for problem in (checks.check(configs.parse(argv + out), 1), E.check(E.parse(argv + out))):
            assert problem is not None and message in problem and "\n" not in problem, (argv, problem)
    out = ["--out", str(tmp_path / "eval")]
    assert E.check(E.parse(["--tasks", "1", "--tasks-file", str(tasks)] + out)).startswith("--tasks and --tasks-file")
    good = tmp_path / "babyai_test.json"
    good.write_text(json.dumps([{"item_id": "babyai_7"}, {"item_id": "babyai_90"}]))
    cfg = E.parse(["--env", "babyai", "--tasks-file", str(good), "--prompt-style", "agentgym"] + out)
    assert checks.check(configs.parse(["--env", "babyai", "--tasks-file", str(good)] + out), 1) is None
    assert E.check(cfg) is None and E.select_tasks(cfg, None) == [7, 90]
    assert E.derive(cfg).env_options == {"parser": "agentgym"} and E.derive(cfg).framing.style == "agentgym"

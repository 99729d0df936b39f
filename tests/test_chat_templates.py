"""Chat templates that rewrite their history (rollout.ChatFormat): Qwen3 (thinking on and off) and a
DeepSeek-R1-distill-style template that drops earlier reasoning, on the tiny model's tokenizer (built
offline). The templates below are written after the public templates' behaviour (Qwen3's official one
without its tool branches; R1 distills' without tool calls): test data, not the models' files.

What is checked: the episode's ids are the first prompt the template renders, then each reply exactly as
sampled (the loss mask covers exactly those ids), then the template's text between a closed assistant
turn and the next reply, written out here by hand; the template itself would render the same history
differently (the rewrite the bookkeeping must not follow); a template whose delta is not one constant
text is refused with a one-line reason.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine as engines
from models import tiny
from rollout import ChatFormat, Expert, Play, rollout
from tests.support.toy import Digits
from tests.test_rollout import Recorder  # keeps what the engine sampled

QWEN3 = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string and not"
    "(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- else %}{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")

BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
R1 = (
    "{% set ns = namespace(system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}"
    "{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}{%- endif %}"
    "{%- endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}")

# (template, options) -> (first prompt's text around the observation, text between a closed reply and the
# next one around the observation), written out from the templates' behaviour.
SYSTEM = Digits.instruction
EXPECTED = {
    "qwen3-no-thinking": ((f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n",
                           "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
                          ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")),
    "qwen3-thinking": ((f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
                       ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")),
    "r1-distill": ((f"{BOS}{SYSTEM}{USER}", f"{ASSISTANT}<think>\n"), (USER, f"{ASSISTANT}<think>\n")),
}
CLOSE_AFTER_STOP = {"qwen3-no-thinking": "\n", "qwen3-thinking": "\n", "r1-distill": ""}


@pytest.fixture(scope="module")
def model_dir():
    return tiny.tiny_model_dir()


def chat_for(model_dir, name) -> ChatFormat:
    tok = AutoTokenizer.from_pretrained(model_dir)
    if name == "r1-distill":  # the padded embedding rows give room for R1's special tokens
        tok.add_special_tokens({"bos_token": BOS, "eos_token": EOS, "additional_special_tokens": [USER, ASSISTANT]})
        tok.chat_template = R1
    else:
        tok.add_tokens(["<think>", "</think>"])  # Qwen3's are added tokens, not special ones
        tok.chat_template = QWEN3
    return ChatFormat(tok, template_options={"enable_thinking": False} if name == "qwen3-no-thinking" else None)


@pytest.fixture(scope="module")
def hf_engine(model_dir):
    """The transformers engine on tiny-model weights under which the end-of-turn tokens of both templates
    have a few percent probability a position, so replies both stop and hit their token cap."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        mean = model.model(torch.randint(0, 1400, (4, 40), generator=gen)).last_hidden_state.mean((0, 1))
        for name in EXPECTED:
            model.model.embed_tokens.weight[chat_for(model_dir, name).eos_id] = 1.6 * mean / mean.norm()
    eng = engines.make_engine(model_dir, "hf", max_model_len=2048)
    eng.sync_weights(model.state_dict().items())
    return eng


class Thinking(Digits):
    """Digits whose expert reasons before it answers, in the reasoning models' own markup (`opened`: the
    generation prompt has already opened the reasoning block, as R1 distills' does)."""
    opened = False

    def expert(self) -> str:
        head = "" if self.opened else "<think>\n"
        return f"{head}Turn {self.t + 1}: digits score.\n</think>\n\n{self.t + 1}{self.t + 1}"


def expected_ids(chat, name, ep, replies: list[list[int]]) -> list[int]:
    """The episode's ids as the model saw them, built from the hand-written texts of EXPECTED."""
    (p_open, p_close), (o_open, o_close) = EXPECTED[name]
    observations = [m["content"] for m in ep.messages if m["role"] == "user"]
    ids = chat.encode(p_open) + chat.encode(observations[0], plain=True) + chat.encode(p_close)
    for k, reply in enumerate(replies):
        ids += reply
        if k + 1 < len(observations):
            close = CLOSE_AFTER_STOP[name] if reply[-1] == chat.eos_id else chat.tok.eos_token + CLOSE_AFTER_STOP[name]
            ids += chat.encode(close + o_open) + chat.encode(observations[k + 1], plain=True) + chat.encode(o_close)
    return ids


def sampled_runs(ep) -> list[list[int]]:
    runs, cur = [], []
    for t, m in zip(ep.response, ep.mask):
        if m:
            cur.append(t)
        elif cur:
            runs, cur = runs + [cur], []
    return runs + ([cur] if cur else [])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_sampled_replies_are_trained_and_the_rest_is_the_templates_delta(hf_engine, model_dir, name):
    chat = chat_for(model_dir, name)
    rec = Recorder(hf_engine)
    tasks = [(t, t) for t in range(6)]
    episodes, _ = rollout(rec, chat, [Digits(turns=3) for _ in tasks], Digits, tasks, Play(3, max_tokens=10, seed=3))
    trained, stopped = [], 0
    for ep in episodes:
        replies = sampled_runs(ep)
        assert ep.turns == 3 and len(replies) == 3 and len(ep.mask) == len(ep.response)
        assert ep.ids == expected_ids(chat, name, ep, replies)
        trained += replies
        stopped += sum(r[-1] == chat.eos_id for r in replies)
    assert sorted(map(tuple, trained)) == sorted(map(tuple, rec.samples)), "the trained ids are the sampled ids"
    assert 0 < stopped < len(trained), "both stopped and token-capped replies should occur"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_reasoning_stays_in_the_history_the_template_would_rewrite(model_dir, name):
    """Replies with reasoning (the env's scripted expert as the actor): each is kept as written, while the
    template, rendering the same conversation, drops or moves it: the stream follows the sampling."""
    chat = chat_for(model_dir, name)
    env = Thinking(turns=3)
    env.opened = name == "r1-distill"
    episodes, _ = rollout(Expert(chat), chat, [env], Thinking, [(4, 0)], Play(3, max_tokens=64))
    ep = episodes[0]
    replies = sampled_runs(ep)
    texts = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    assert ep.turns == 3 and replies == [chat.encode(t) + [chat.eos_id] for t in texts]
    assert all("</think>" in t for t in texts)
    assert ep.ids == expected_ids(chat, name, ep, replies)
    as_template = chat.encode(chat.render(ep.messages[:-1]))  # the template's own rendering of the history
    assert as_template != ep.ids[:len(as_template)] and "Turn 1: digits" not in chat.decode(as_template)


REFUSED = {
    "the message count up front": "{{ messages | length }}{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}",
    "turn numbers": "{% for m in messages %}{{ m['role'] }} {{ loop.index }}: {{ m['content'] }}<|im_end|>{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}",
    "no assistant content": "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}"
                            "<|im_end|>{% endfor %}",
}


@pytest.mark.parametrize("template", list(REFUSED.values()), ids=list(REFUSED))
def test_a_template_without_a_constant_delta_is_refused_in_one_line(model_dir, template):
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = template
    with pytest.raises(ValueError, match="cannot be played token-exactly") as err:
        ChatFormat(tok)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_options_from_the_command_line_reach_the_template(model_dir, thinking, tmp_path):
    """--chat-template-options '{"enable_thinking": ...}' through train.py's and evaluate.py's parsed and
    checked configs into Qwen3's template: thinking off opens every reply with an empty reasoning block."""
    import json

    from launch import checks
    import config
    import evaluate

    flag = ["--chat-template-options", json.dumps({"enable_thinking": thinking})]
    train_cfg, eval_cfg = config.parse(flag + ["--out", str(tmp_path / "run")]), evaluate.parse(flag)
    assert checks.check(train_cfg, 1) is None and evaluate.check(eval_cfg) is None
    expected = EXPECTED["qwen3-thinking" if thinking else "qwen3-no-thinking"]
    for options in (checks.derive(train_cfg).chat_options, evaluate.derive(eval_cfg).chat_options):
        assert options == {"enable_thinking": thinking}
        chat = ChatFormat(chat_for(model_dir, "qwen3-thinking").tok, template_options=options)
        ids = chat.prompt(SYSTEM, "OBS")
        assert chat.tok.decode(ids) == expected[0][0] + "OBS" + expected[0][1]
        assert chat.tok.decode(chat.observation("OBS", stopped=True)) == "\n" + expected[1][0] + "OBS" + expected[1][1]


@pytest.mark.parametrize("text, words", [("{not json", "--chat-template-options is not a JSON object"),
                                         ("[1]", "--chat-template-options must be a JSON object")])
def test_chat_template_options_that_are_no_json_object_are_one_line(text, words):
    from launch import checks
    import config
    import evaluate

    for problem in (checks.check(config.parse(["--chat-template-options", text]), 1),
                    evaluate.check(evaluate.parse(["--chat-template-options", text]))):
        assert problem.startswith(words) and "\n" not in problem


def test_a_chat_template_option_the_template_does_not_read_is_refused(model_dir):
    tok = chat_for(model_dir, "qwen3-thinking").tok
    with pytest.raises(ValueError, match="the chat template reads no enable_thinkng: drop it"):
        ChatFormat(tok, template_options={"enable_thinkng": False})

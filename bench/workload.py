"""The workload of bench/train_step.py: the model it trains (`--model`) and the synthetic episodes that
stand in for a rollout (bench/rollout.py measures the rollout itself).

Models (`--model`): `tiny` (models/tiny.py's, vocabulary 1,472); `small`, a Qwen2-shaped model of `--hidden`
and `--layers` on the tiny tokenizer; `bigvocab`, a Qwen2-shaped model with Qwen2.5's vocabulary of
152,064 (`--vocab`) and an untied LM head, as Qwen2.5-7B has, on the tiny model's body (hidden 64,
2 layers, unless `--hidden`/`--layers`): the cost and memory of the LM head and its logits almost
alone; `smollm2`, SmolLM2-135M-Instruct (vocabulary 49,152, 30 layers, hidden 576) with its own
tokenizer. `small` and `bigvocab` are saved by rank 0 into a temporary directory (engines load from one).

Synthetic episodes: random token ids (of the tokenizer, special ones excepted) with the layout of a
multi-turn episode: a prompt of about `--prompt` tokens (mask 0), then assistant replies of up to
`--reply` tokens (mask 1; half run to the cap, the others stop earlier), each but the last followed by
an observation of about `--obs` tokens (mask 0). A share `--done-share` of the episodes ends at a turn
drawn uniformly from 1 to `--turns` (the env said done); the others run all `--turns` turns (the
horizon). Rewards are 0/1 in groups of `--samples`. Defaults follow the model: for `smollm2` the
BabyAI layout of the smollm2 preset (prompt 560, 8 turns of 40-token replies, observations 150, 30%
ending early: about 1,700 tokens per episode; BabyAI's first prompt is 380-690 tokens with SmolLM2's
tokenizer, an observation turn 60-370); for the others TextCraft's on the tiny tokenizer (prompt 700,
1 to 6 turns of 48 tokens, observations 30).

    torchrun --standalone --nproc_per_node 2 bench/train_step.py --model bigvocab   # uses both
"""
from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models import tiny as tiny_recipe  # noqa: E402
from models import resolve_model  # noqa: E402
from rollout import Episode  # noqa: E402

# synthetic episode layout per model: (prompt, turns, reply, obs, done_share)
LAYOUT = {"smollm2": (560, 8, 40, 150, 0.3),  # BabyAI with SmolLM2 (the smollm2 preset: 8 turns, 40 tokens)
          "default": (700, 6, 48, 30, 1.0)}   # TextCraft on the tiny tokenizer (the old defaults)
QWEN25_VOCAB = 152064


def model_dir(args, rank: int) -> tuple[str, str | None]:
    """The tiny model, SmolLM2, or a Qwen2-shaped model (`small`, `bigvocab`) on the tiny tokenizer,
    saved by rank 0 into a temporary directory (engines load from a directory). Returns (path, dir to
    delete)."""
    if rank == 0:  # rank 0 builds (converts) first, so ranks do not race to build it
        resolve_model("smollm2" if args.model == "smollm2" else "tiny")
    dist.barrier()
    if args.model in ("tiny", "smollm2"):
        return resolve_model(args.model), None
    tiny = resolve_model("tiny")
    path = [None]
    if rank == 0:
        from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

        base = Qwen2Config.from_pretrained(tiny)
        if args.model == "small":
            hidden, layers, vocab, tie = args.hidden or 256, args.layers or 4, base.vocab_size, True
        else:  # bigvocab: the tiny body, Qwen2.5's vocabulary, an untied head (as Qwen2.5-7B)
            hidden, layers, vocab, tie = args.hidden or base.hidden_size, args.layers or base.num_hidden_layers, \
                args.vocab, False
        heads = max(1, hidden // 64) if args.model == "small" or args.hidden else base.num_attention_heads
        shape = dict(tiny_recipe.MODEL, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),  # grouped KV as in Qwen2
                     tie_word_embeddings=tie)
        config = Qwen2Config(vocab_size=vocab, pad_token_id=base.pad_token_id, bos_token_id=None,
                             eos_token_id=base.eos_token_id, **shape)
        torch.manual_seed(0)
        path[0] = tempfile.mkdtemp(prefix="bench-train-step-")
        Qwen2ForCausalLM(config).save_pretrained(path[0])
        AutoTokenizer.from_pretrained(tiny).save_pretrained(path[0])
    dist.broadcast_object_list(path, src=0)
    return path[0], path[0] if rank == 0 else None


def synthetic(args, allowed: list[int]) -> list[Episode]:
    """The whole step's episodes (identical on every rank); each rank takes its contiguous share.
    Token ids are drawn from `allowed`. The episodes of a group share their prompt token for token, as
    rollout.py's do (the instruction and the task's first observation)."""
    rng = random.Random(args.seed)
    token = lambda: allowed[rng.randrange(len(allowed))]  # noqa: E731
    out = []
    for i in range(args.episodes):
        if i % args.samples == 0:
            prompt = [token() for _ in range(args.prompt + rng.randint(-args.prompt // 10, args.prompt // 10))]
        ep = Episode(i // args.samples, i // args.samples, list(prompt), len(prompt))
        done = args.done_share >= 1 or rng.random() < args.done_share
        turns = rng.randint(1, args.turns) if done else args.turns
        for turn in range(turns):
            n = args.reply if rng.random() < 0.5 else rng.randint(max(1, args.reply // 4), args.reply)
            ep.append([token() for _ in range(n)], True, [-rng.random() * 5 for _ in range(n)])
            if turn + 1 < turns:
                ep.append([token() for _ in range(rng.randint(args.obs // 2, args.obs * 3 // 2))], False)
        ep.turns, ep.reward = turns, float(rng.random() < 0.3)
        ep.success, ep.end = ep.reward > 0, "done" if done else "horizon"
        out.append(ep)
    return out

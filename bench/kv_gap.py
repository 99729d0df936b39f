"""How far a KV-cache dtype moves the generator off the policy the trainer scores: the sampled tokens'
logprobs from vLLM (SmolLM2, bf16 weights, KV cache in `--kv-cache-dtype`) against a float32
transformers forward over the same ids.

    python bench/kv_gap.py --kv-cache-dtype auto        # the model's dtype (bf16): the baseline gap
    python bench/kv_gap.py --kv-cache-dtype fp8_e4m3    # half the bytes attention reads

Prompts are real mid-episode BabyAI contexts: each transcript of a published evaluation (`--transcripts`)
cut before its last assistant turn, rendered with the chat template; one reply of up to 40 tokens each
at temperature 1, as in the recipe. Prints the mean and largest |engine - reference| logprob over the
sampled tokens. The recipe's loss uses the trainer's own logprobs, so a gap here is the share of
off-policy sampling a cheaper cache would add (the rollout/training mismatch), not an error in the loss.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--transcripts", type=Path,
                   default=Path("results/babyai-smollm2-seed0/evals/warm-start/transcripts-all.jsonl.xz"))
    p.add_argument("--prompts", type=int, default=16)
    args = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from bench.machine import cpu_name
    from engine import make_engine
    from models import resolve_model

    torch.set_num_threads(1)
    model_dir = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    raw = args.transcripts.read_bytes()
    for line in (lzma.decompress(raw) if args.transcripts.suffix == ".xz" else raw).decode().splitlines():
        messages = json.loads(line)["messages"]
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if len(turns) >= 2:
            text = tok.apply_chat_template(messages[:turns[-1]], add_generation_prompt=True, tokenize=False)
            prompts.append(tok(text, add_special_tokens=False)["input_ids"])
        if len(prompts) == args.prompts:
            break
    engine = make_engine(model_dir, "vllm", "cpu", "bfloat16", 2048, 0, max_seqs=len(prompts),
                         vllm=dict(compile="off", kv_cache_dtype=args.kv_cache_dtype))
    sp = SamplingParams(max_tokens=40, temperature=1.0, logprobs=0, detokenize=False,
                        stop_token_ids=[tok.eos_token_id])
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=q) for q in prompts], [sp] * len(prompts),
                               use_tqdm=False)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gaps = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outs):
            ids = list(out.outputs[0].token_ids)
            sampled = torch.tensor([pos[t].logprob for t, pos in zip(ids, out.outputs[0].logprobs)],
                                   dtype=torch.float64)
            logits = reference(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].double()
            ref = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
            gaps.append(sampled - ref)
    gap = torch.cat(gaps).abs()
    print(f"CPU: {cpu_name()}; KV cache {args.kv_cache_dtype}; {len(prompts)} prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {len(gap)} sampled tokens; "
          f"|engine - float32 reference| logprob: mean {gap.mean():.4f}, largest {gap.max():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

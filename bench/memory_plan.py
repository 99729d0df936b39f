"""Per-rank memory budget of train.py, by arithmetic alone: will a model train at this world size, dtype
and micro-batch budget on a GPU of this size? And the same formulas against what bench/train_step.py
measured on this machine's CPU.

    python bench/memory_plan.py --model qwen2.5-7b --world 8 --gpu-gb 80                # the paper's setting
    python bench/memory_plan.py --model smollm2-135m --world 2 --device cpu --engine none --kl-coef 0
    python bench/memory_plan.py --model path/to/config.json --world 4 --no-checkpointing
    python bench/memory_plan.py --compare /tmp/smollm2.json /tmp/tiny.json   # bench/train_step.py --json

Models: built-in `qwen2.5-7b` and `smollm2-135m` configs, `tiny`/`smollm2` (tiny.resolve_model's
directories), or any HF config.json (or a directory holding one). Dimensions: P parameters, L layers,
H hidden, I intermediate, V vocabulary, kv = key/value heads x head_dim, W ranks, T tokens of the
largest micro-batch (rows x padded width, at most `--micro-tokens`), c bytes of the compute dtype
(2 for bfloat16, 4 for float32). The rows, as train.py's step (FSDP2, `distributed.shard`) holds them:

  sharded fp32 parameters  4P/W   the fp32 masters: FSDP2 keeps no other fp32 copy (MixedPrecisionPolicy
                                  casts them to bf16 at each all-gather)
  sharded fp32 gradients   4P/W   reduce_dtype float32, kept from the first backward to zero_grad
  AdamW moments            8P/W   exp_avg and exp_avg_sq, fp32, sharded
  unsharded compute copies c x (root + 2 blocks): the root group (embeddings, untied head, final norm)
                                  stays all-gathered from its forward to its post-backward; the blocks
                                  one at a time, plus the next one prefetched
  unsharded gradients      root x (c + 4 if bf16), + V x H x c if the head is tied: the head and
                                  embedding gradients before their fp32 reduce-scatter (a tied head's
                                  two contributions exist apart before they are summed; a block's
                                  gradient is small next to these)
  reference model          4P/W sharded (train.main reshards the frozen reference after scoring;
                                  FSDP2's default would keep its embeddings and head whole, as it
                                  reshards a root only in backward, which a frozen model never runs)
  LM-head slice            28 x n x V bytes, n = min(T, LOGIT_ELEMENTS // V) (batch.py): logits in c
                                  and fp32, logsumexp and softmax temporaries, their gradients, for the
                                  slice being recomputed in backward (measured: batch.head_logprobs
                                  forward + backward of 4096 tokens at SmolLM2's shape, H 576 and V
                                  49,152, peaks 29 bytes per slice element above its inputs and weight
                                  gradient in bf16, 26 in fp32)
  activations              checkpointing: L x T x H x c (each block's input) + 2 x T x A (the block
                                  being recomputed, and its gradients); without: L x T x A + T x A,
                                  A = c(8H + 3kv + 5I) + 16H bytes a token (q, k, v, rope, attention and
                                  MLP tensors in c, the RMSNorms' fp32 copies); plus 3 x T x H x c
                                  (embedding output, final hidden states and their gradient)
  generator                GPU vLLM: 0 while training (sleep level 2), `--gpu-util` x GPU during
                                  rollouts (weights P x c, the rest KV cache of 2 x L x kv x c a
                                  token); CPU vLLM: P x c + its KV cache, always (engine.kv_cache_gib:
                                  `--seqs` x `--max-context` tokens + 25%, 1 to 8 GiB);
                                  HF engine: P x c always
  runtime                  `--runtime-gb` (CUDA context, allocator slack); on CPU the process's
                                  resident size after imports (measured: ~390 MB here)

Loading: every rank reads the whole model in fp32 into host memory (`from_pretrained`, then
`fully_shard` keeps its slice): up to 4P bytes of host RAM per rank at the peak, W x 4P per node; a
checkpoint stored in fp32 is memory-mapped instead, and the ranks share its pages.

Printed: the table of rows for the training phase (forward/backward of one micro-batch) and the
rollout phase (training state resident, gradients freed, the generator awake), their totals, and
whether each fits `--gpu-gb`. `--compare` prints, for each bench JSON, the estimate next to the peak
RSS that bench/train_step.py measured per rank (ranks that did not run its plain baseline).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from batch import LOGIT_ELEMENTS  # noqa: E402

GB, MB = 2**30, 2**20
SLICE_BYTES = 28  # bytes per element of one LM-head slice at its peak (see the docstring)
BUILTIN = {  # HF config.json fields of the built-in models
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2"),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, model_type="llama"),
}


def vllm_cpu_kv_gib(s: "Shape", dtype: str, max_context: int, seqs: int, cap: int = 8) -> int:
    """engine.kv_cache_gib's sizing of vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE): `seqs` sequences of
    `max_context` tokens plus a quarter for prefix caching, whole GiB between 1 and `cap`."""
    need = 2 * s.L * s.kv * (4 if dtype == "float32" else 2) * max_context * seqs * 1.25 / GB
    return int(min(cap, max(1, -(-need // 1))))


@dataclass
class Shape:
    H: int
    I: int
    L: int
    heads: int
    kv_heads: int
    head_dim: int
    V: int
    tied: bool
    bias: bool  # q/k/v projection biases (Qwen2)

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def block(self) -> int:
        """Parameters of one decoder block."""
        q, o = self.H * self.heads * self.head_dim, self.heads * self.head_dim * self.H
        bias = (self.heads * self.head_dim + 2 * self.kv) if self.bias else 0
        return q + 2 * self.H * self.kv + o + bias + 3 * self.H * self.I + 2 * self.H

    @property
    def root(self) -> int:
        """Parameters of the root FSDP group: embeddings, the untied head, the final norm."""
        return self.V * self.H * (1 if self.tied else 2) + self.H

    @property
    def params(self) -> int:
        return self.L * self.block + self.root


def shape(config: dict) -> Shape:
    heads = config["num_attention_heads"]
    return Shape(H=config["hidden_size"], I=config["intermediate_size"], L=config["num_hidden_layers"], heads=heads,
                 kv_heads=config.get("num_key_value_heads") or heads,
                 head_dim=config.get("head_dim") or config["hidden_size"] // heads, V=config["vocab_size"],
                 tied=bool(config.get("tie_word_embeddings", False)),
                 bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)))


def load_config(name: str) -> dict:
    if name in BUILTIN:
        return BUILTIN[name]
    if name in ("tiny", "smollm2"):
        from tiny import resolve_model
        name = resolve_model(name)
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    return json.loads(path.read_text())


def plan(s: Shape, world: int, dtype: str, checkpointing: bool, tokens: int, kl: bool, engine: str, device: str,
         gpu_gb: float = 80.0, gpu_util: float = 0.5, runtime: float = 0.0, max_context: int = 3072,
         seqs: int = 16) -> dict:
    """Bytes per rank of each row, for the training phase and the rollout phase."""
    c = 2 if dtype == "bfloat16" else 4
    P, W, T = s.params, world, tokens
    A = c * (8 * s.H + 3 * s.kv + 5 * s.I) + 16 * s.H           # activation bytes of one block, per token
    n = min(T, max(1, LOGIT_ELEMENTS // s.V))
    acts = (s.L * T * s.H * c + 2 * T * A) if checkpointing else (s.L * T * A + T * A)
    train = {
        "sharded fp32 parameters (masters)": 4 * P / W,
        "sharded fp32 gradients": 4 * P / W,
        "AdamW moments (fp32)": 8 * P / W,
        "unsharded compute copies (root + 2 blocks)": c * (s.root + 2 * s.block),
        "unsharded root gradients (+ fp32 for reduce)":
            s.root * (c + (4 if c != 4 else 0)) + (s.V * s.H * c if s.tied else 0),
        "reference model (sharded)": (4 * P / W) if kl else 0.0,
        f"LM-head slice ({n} tokens x {s.V})": SLICE_BYTES * n * s.V,
        f"activations ({T} tokens, {'checkpointing' if checkpointing else 'no checkpointing'})":
            acts + 3 * T * s.H * c,
    }
    engine_bytes = {"none": 0.0, "hf": P * c,
                    "vllm": (P * c + vllm_cpu_kv_gib(s, dtype, max_context, seqs) * GB) if device == "cpu" else 0.0
                    }[engine]
    train["generator (" + ("asleep" if engine == "vllm" and device == "cuda" else engine) + ")"] = engine_bytes
    train["runtime"] = runtime
    rollout = {k: v for k, v in train.items()
               if k.startswith(("sharded fp32 par", "AdamW", "reference", "runtime"))}
    gen = engine_bytes if not (engine == "vllm" and device == "cuda") else gpu_util * gpu_gb * GB
    rollout["generator (awake)"] = gen
    kv_tokens = None
    if engine == "vllm" and device == "cuda":
        kv_tokens = max(0.0, gen - P * c - 0.05 * gen) / (2 * s.L * s.kv * c)  # ~5% for vLLM's activations
    return {"train": train, "rollout": rollout, "params": P, "kv_tokens": kv_tokens, "load": 4 * P}


def show(name: str, s: Shape, p: dict, args) -> None:
    print(f"# {name}: {p['params'] / 1e9:.3f}B parameters (L {s.L}, H {s.H}, I {s.I}, V {s.V}, kv {s.kv}, "
          f"{'tied' if s.tied else 'untied'} head); world {args.world}, {args.dtype}, {args.device}, engine "
          f"{args.engine}, kl {'on' if args.kl_coef > 0 else 'off'}, micro-batch {args.micro_tokens} tokens")
    rows = [("per rank", "training (GB)", "rollout (GB)")]
    keys = list(dict.fromkeys(list(p["train"]) + list(p["rollout"])))
    for k in keys:
        a, b = p["train"].get(k), p["rollout"].get(k)
        rows.append((k, "" if a is None else f"{a / GB:.2f}", "" if b is None else f"{b / GB:.2f}"))
    t, r = sum(p["train"].values()), sum(p["rollout"].values())
    rows.append(("total", f"{t / GB:.2f}", f"{r / GB:.2f}"))
    print(table(rows))
    if args.device == "cuda":
        for phase, total in (("training", t), ("rollout", r)):
            verdict = "fits" if total <= args.gpu_gb * GB else "does NOT fit"
            print(f"{phase}: {total / GB:.1f} GB of {args.gpu_gb:g} GB: {verdict}")
        if p["kv_tokens"] is not None:
            print(f"vLLM KV cache at --gpu-util {args.gpu_util}: about {p['kv_tokens']:.0f} tokens")
    print(f"loading: up to {p['load'] / GB:.2f} GB of host RAM per rank (the whole model in fp32), "
          f"{args.world * p['load'] / GB:.1f} GB for {args.world} ranks on one node (less when the checkpoint "
          f"is fp32 on disk: its memory-mapped pages are shared)")


def compare(paths: list[str]) -> None:
    """Estimates against bench/train_step.py's measured peak RSS (MB), side by side."""
    rows = [("run", "rank", "after imports", "load: est | measured", "step: est | measured",
             "est / measured")]
    for path in paths:
        f = json.loads(Path(path).read_text())
        a, world = f["args"], f["world"]
        s = shape(f["config"])
        tokens = f.get("max_slots") or a["micro_tokens"]
        for rank, m in enumerate(f["memory"]):
            if rank == 0 and not a["no_plain"]:
                continue  # rank 0 also held the plain transformers baseline
            base = m["imports"] * MB
            p = plan(s, world, a["dtype"], a["checkpointing"], tokens, a["kl_coef"] > 0, a["engine"], "cpu",
                     runtime=base, max_context=a.get("max_context", 3072), seqs=a["episodes"] // world)
            step = sum(p["train"].values())
            engine = p["train"][[k for k in p["train"] if k.startswith("generator")][0]]
            load = base + p["load"] + engine
            name = (f"{a['model']} {a['dtype']}{' ckpt' if a['checkpointing'] else ''} "
                    f"kl {a['kl_coef']:g} {a['engine']} T={tokens}")
            rows.append((name, str(rank), f"{m['imports']:.0f}", f"{load / MB:.0f} | {m['loaded']:.0f}",
                         f"{step / MB:.0f} | {m['step']:.0f}", f"{step / MB / m['step']:.2f}"))
            print(f"# {name}, rank {rank}: " + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in p["train"].items()))
    print(table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-7b",
                        help="qwen2.5-7b, smollm2-135m, tiny, smollm2, or an HF config.json / model directory")
    parser.add_argument("--world", type=int, default=8, help="FSDP2 ranks")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="compute dtype")
    parser.add_argument("--no-checkpointing", action="store_true", help="activation checkpointing off")
    parser.add_argument("--micro-tokens", type=int, default=16384, help="token budget of one micro-batch")
    parser.add_argument("--kl-coef", type=float, default=0.001, help="0: no reference model")
    parser.add_argument("--engine", choices=("vllm", "hf", "none"), default="vllm")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU")
    parser.add_argument("--gpu-util", type=float, default=0.5,
                        help="vLLM's gpu_memory_utilization (engine.make_engine's default 0.5)")
    parser.add_argument("--runtime-gb", type=float, default=1.0, help="CUDA context and allocator slack per rank")
    parser.add_argument("--max-context", type=int, default=16384, help="token cap of an episode (CPU vLLM's KV)")
    parser.add_argument("--seqs", type=int, default=16, help="episodes per rank (CPU vLLM's KV cache)")
    parser.add_argument("--compare", nargs="+", metavar="JSON", help="bench/train_step.py --json files")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return
    s = shape(load_config(args.model))
    runtime = args.runtime_gb * GB if args.device == "cuda" else 0.0
    p = plan(s, args.world, args.dtype, not args.no_checkpointing, args.micro_tokens, args.kl_coef > 0, args.engine,
             args.device, args.gpu_gb, args.gpu_util, runtime, args.max_context, args.seqs)
    show(args.model, s, p, args)


def table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


if __name__ == "__main__":
    main()

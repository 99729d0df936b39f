"""The project's own generator: a decode loop over a transformers model's modules, for CUDA machines
without vLLM (`--engine torch`; `auto` picks it there). It runs on the CPU too, which is how it is tested.

    engine = TorchEngine(model_dir, "cuda", "bfloat16")
    engine.generate(prompts, Sampling(...)) -> [Sample(ids, logprobs)]     # engine.py's contract

Why not transformers' `generate`: on a GPU its decode step is far from the memory-bandwidth bound
(figures: docs/gpu.md): a Python loop of one kernel launch per operation and a sync a step, a fresh
prefill of the whole conversation every turn, a cache grown by `torch.cat`, KV heads copied (3 -> 9 on
SmolLM2) under a padding mask, and every step's logits kept in fp32. Here:

1. **KV rows kept across turns.** A turn's prompt is the last turn's prompt, its reply and the new
   observation, so each prompt is matched to the previous call's row with the longest cached prefix
   (`match`, by chained hashes of 32-token blocks, then checked token by token) and only its new tokens
   are prefilled. Identical remainders are prefilled once: a group's n samples share one first prompt.
2. **One shape per call.** A call's KV is one (rows, kv heads, W, head dim) tensor per layer, W fixed for
   the call (the longest prompt + reply, rounded up), written in place at each row's own position: no
   growth, no padding of positions. So every decode step of a call has the same shapes and, on CUDA, is
   captured once as a CUDA graph and replayed: one launch a step instead of one per kernel.
3. **Grouped-query attention without copied heads.** The G query heads that share a KV head are laid out
   as G query positions of that head, so SDPA runs on the KV heads as they are stored, with a mask that
   lets row b see positions <= its own (`attend`).
4. **Sampling inside the step, seeded per request** (infra/decode_sampling.py): a request's sample does
   not depend on the batch it ran in, and no per-row torch.Generator (which a graph cannot take) is needed.
   The logprob is the raw model's (before temperature and top-p), as the trainer scores it.
5. **The host looks every CHECK_EVERY steps** whether every row has stopped (a stop id or its cap).
6. **On CUDA the engine owns its stream and device** (infra/decode_cuda.py): warm-up, capture and replay
   share one stream, and the caller's stream is current again however the call ends. A capture that fails
   gives that call eager steps and is tried again on the next call, at most CAPTURE_TRIES times in a row.
   SDPA's kernel is chosen, not left to torch (`BACKENDS`).
7. **On the CPU, weights packed once per weight sync and attention over the kept positions**
   (infra/decode_cpu.py), both on by default in float32.

`sync_weights` copies the new weights in and drops every cached row (their KV came from the old
weights); `sleep()` frees the cache. Llama-shaped decoders only (Llama, Qwen2, Qwen3, Mistral without
sliding windows): `supports` says why another is refused.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from infra import decode_kernel
from infra.decode_cpu import Linears, PackedLinears, attend_kept, can_pack
from infra.decode_cuda import capture, on_stream
from infra.decode_sampling import request_seed, sample, uniform
from infra.samples import Sample, Sampling, copy_weights

BLOCK = 32           # tokens per hashed block of the prefix match
WIDTH_STEP = 64      # a call's KV width is rounded up to this (SDPA's mask alignment; fewer distinct shapes)
CHECK_EVERY = 8      # decode steps between the host's looks at "has every row stopped?"
CAPTURE_TRIES = 3    # failed CUDA graph captures in a row after which the engine decodes eagerly for good
# SDPA's kernels, by device type, in order of preference; pinned because torch's own choice differs by
# version and by cuDNN, and the tests exercised only the CPU's. CUDA: the memory-efficient kernel alone. It
# takes an arbitrary additive mask (flash attention takes none), runs under graph capture at any query length
# (torch turned cuDNN attention off under CUDA graphs for query lengths not divisible by 128 in some
# versions, and decode's query length is the GQA group: 3 for SmolLM2), and is the same kernel whatever cuDNN
# is installed; with no fallback listed, inputs it refuses raise "No available kernel" instead of quietly
# running another kernel. CPU: torch's CPU flash kernel (its default here; it takes masks), math if it refuses.
BACKENDS = {"cuda": [SDPBackend.EFFICIENT_ATTENTION], "cpu": [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]}
SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def supports(config) -> str | None:
    """None if this decode loop computes the model exactly as transformers does, else why not."""
    if config.model_type not in SUPPORTED:
        return f"--engine torch runs {', '.join(SUPPORTED)} decoders, not {config.model_type!r}; use --engine hf"
    if getattr(config, "use_sliding_window", False) or (
            config.model_type == "mistral" and getattr(config, "sliding_window", None)):
        return "--engine torch has no sliding-window attention; use --engine hf"
    return None


# ---- the model's forward over cached rows -------------------------------------------------------------

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """A Llama-style RMSNorm module applied to x: in float32 as torch's one fused op (the module runs seven: cast,
    square, mean, add, rsqrt, multiply, multiply by the weight; the same values); in other dtypes the module
    itself, whose rounding (the weight times the value cast back to the dtype) the fused op does not follow."""
    if x.dtype == torch.float32 and hasattr(norm, "variance_epsilon"):
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


def attention_bias(visible: torch.Tensor, g: int, dtype: torch.dtype) -> torch.Tensor:
    """visible (b, s, W) bool -> (b, 1, G*s, W) additive mask in the model's dtype (0 seen, -inf hidden), laid
    out as `attend`'s query rows. Made once per forward and shared by every layer: given the bool mask, SDPA
    would expand and convert it again in each of them (30 for SmolLM2). Position 0 is always visible, so no
    row is all -inf (which would give NaN)."""
    b, s, width = visible.shape
    rows = visible[:, None, None].expand(b, 1, g, s, width).reshape(b, 1, g * s, width)
    return torch.zeros(rows.shape, dtype=dtype, device=rows.device).masked_fill_(~rows, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """q (b, s, H, D) against the cache k, v (b, Hkv, W, D); bias (b, 1, G*s, W) from `attention_bias`.
    Returns (b, s, H*D). The G = H / Hkv query heads of one KV head become G x s query rows of that head: no
    KV head is copied (transformers' repeat_kv copies them, once per layer and step)."""
    b, s, heads, dim = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    q = q.view(b, s, kv_heads, g, dim).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * s, dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)       # (b, Hkv, G*s, D)
    return out.view(b, kv_heads, g, s, dim).permute(0, 3, 1, 2, 4).reshape(b, s, heads * dim)


@dataclass
class Cache:
    """A call's KV: per layer (rows, Hkv, W, D) keys and values, and the token ids whose KV each row holds."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    ids: list[list[int]]

    @property
    def width(self) -> int:
        return self.keys[0].shape[2]


def gather_rows(cache: Cache, idx: torch.Tensor) -> None:
    """Replace the cache's rows by its rows `idx` (a prompt's unit per row), one layer at a time: each
    layer's units are freed as its rows arrive, so the peak is the rows plus one layer of units, as
    memplan.torch_engine_rows plans, not the rows plus every unit."""
    for layer in range(len(cache.keys)):
        cache.keys[layer] = cache.keys[layer][idx]
        cache.values[layer] = cache.values[layer][idx]


def block_hashes(ids: list[int], n: int) -> list[int]:
    """Chained hashes of ids[:32], ids[:64], ... over the first n tokens: equal hashes, equal prefixes."""
    out, h = [], 0
    for k in range(n // BLOCK):
        h = hash((h, tuple(ids[k * BLOCK:(k + 1) * BLOCK])))
        out.append(h)
    return out


def match(prompt: list[int], cache: Cache | None, index: dict[int, int]) -> tuple[int, int]:
    """(row, m): the previous call's row holding the longest prefix of `prompt`, and how many tokens of it
    (at most len(prompt) - 1: the last prompt token is fed to the first decode step); (-1, 0) if none."""
    if cache is None:
        return -1, 0
    row, depth = -1, 0
    for k, h in enumerate(block_hashes(prompt, len(prompt) - 1)):  # chained: the first miss ends the walk
        if h not in index:
            break
        row, depth = index[h], (k + 1) * BLOCK
    if row < 0:
        return -1, 0
    cached = cache.ids[row]
    if cached[:depth] != prompt[:depth]:  # a hash collision
        return -1, 0
    m, end = depth, min(len(cached), len(prompt) - 1)
    while m < end and cached[m] == prompt[m]:
        m += 1
    return row, m


class TorchEngine:
    """engine.py's generator contract over a transformers model, decoded by this file's own loop."""

    def __init__(self, model_dir: str, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 prefill_tokens: int | None = None, graphs: bool | None = None, packed: bool | None = None,
                 kept_attention: bool | None = None, kernel: bool | None = None):
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        if cuda and self.device.index is None:  # "cuda" is the current device: name it, so every call runs there
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(self.device).eval()
        if problem := supports(self.model.config):
            raise ValueError(problem)
        self.decoder = self.model.get_decoder()
        attn = self.decoder.layers[0].self_attn
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.heads = self.model.config.num_attention_heads
        self.kv_heads = self.model.config.num_key_value_heads
        self.prefill_tokens = prefill_tokens or (16384 if cuda else 2048)  # tokens per prefill chunk
        self.graphs = cuda if graphs is None else graphs
        self.capture_failures = 0  # in a row; CAPTURE_TRIES of them turn graphs off
        self.backends = BACKENDS[self.device.type]
        # the CPU's levers (module docstring, 7): packed weights where oneDNN packs them; decode attention as
        # matrix products over the kept positions where steps run eagerly (a CUDA graph needs fixed shapes), in
        # float32 (in bf16 its products would round the scores to bf16, where SDPA's kernel keeps them in fp32)
        self.packed = can_pack(self.device, self.model.dtype) if packed is None else packed
        self.kept_attention = (not self.graphs and self.model.dtype == torch.float32) if kept_attention is None \
            else kept_attention
        # eager decode steps' attention as one C++ loop over the kept positions (infra/decode_kernel.py), where it
        # builds; by default wherever kept attention is on (float32 on the CPU)
        self.kernel = False
        if kernel or (kernel is None and self.kept_attention and not cuda):
            why = decode_kernel.problem(self.device, self.model.dtype)
            if why and kernel:
                raise ValueError(why)
            if why:
                print(f"warning: {why}; decode attention runs as matrix products instead", flush=True)
            self.kernel = why is None
        self.linears: Linears | None = None  # built on the first call after every weight change (`_linears`)
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.gen = torch.Generator().manual_seed(seed)  # seeds of unseeded requests
        self.cache: Cache | None = None
        self.index: dict[int, int] = {}
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "graph_captures": 0,
                      "capture_failures": 0}

    # -- one layer stack over (rows, positions) --
    def _layers(self, h, rows: slice, pos, cache: Cache, cos, sin, width: int, kept: int | None = None):
        """h (b, s, hidden) at positions pos (b, s) of the cache's rows `rows`; their KV written there. `kept`:
        attention over the first `kept` positions only (every pos below it: the C++ loop where `self.kernel`, else
        `attend_kept`), else SDPA over all."""
        b, s, _ = h.shape
        loop = kept is not None and self.kernel  # s == 1 here: decode steps are the only callers with `kept`
        if not loop:
            visible = torch.arange(kept or width, device=h.device)[None, None, :] <= pos[:, :, None]  # (b, s, W)
            bias = attention_bias(visible, self.heads // self.kv_heads, h.dtype)                   # (b, 1, G*s, W)
        c, n = cos[pos][:, :, None], sin[pos][:, :, None]                                       # (b, s, 1, D)
        where = pos[:, None, :, None].expand(b, self.kv_heads, s, self.head_dim)                # KV slots written
        lin = self.linears
        for i, (layer, keys, values) in enumerate(zip(self.decoder.layers, cache.keys, cache.values)):
            a = layer.self_attn
            x = rms_norm(layer.input_layernorm, h)
            q, k, v = lin.qkv(i, x)
            q = q.reshape(b, s, self.heads, self.head_dim)
            k = k.reshape(b, s, self.kv_heads, self.head_dim)
            v = v.reshape(b, s, self.kv_heads, self.head_dim)
            if hasattr(a, "q_norm"):  # Qwen3 normalises q and k per head before RoPE
                q, k = rms_norm(a.q_norm, q), rms_norm(a.k_norm, k)
            q, k = q * c + _rotate_half(q) * n, k * c + _rotate_half(k) * n
            keys, values = keys[rows], values[rows]                                            # views
            # scatter_, not index_put_: a plain kernel, safe inside a CUDA graph (duplicate padding slots are harmless)
            keys.scatter_(2, where, k.transpose(1, 2))                                           # (b, Hkv, s, D)
            values.scatter_(2, where, v.transpose(1, 2))
            if loop:
                out = decode_kernel.attend_loop(q, keys, values, pos[:, 0], self.scale)
            elif kept is None:
                out = attend(q, keys, values, bias, self.scale)
            else:
                out = attend_kept(q, keys, values, bias, self.scale, kept)
            h = h + lin.o(i, out)
            h = h + lin.mlp(i, rms_norm(layer.post_attention_layernorm, h))
        return h

    def _rope(self, width: int):
        positions = torch.arange(width, device=self.device)[None]
        dummy = torch.zeros(1, dtype=self.model.dtype, device=self.device)
        cos, sin = self.decoder.rotary_emb(dummy, positions)                                    # (1, W, D)
        return cos[0], sin[0]

    def scope(self):
        """What a call runs under: SDPA's chosen kernels (BACKENDS) and, on CUDA, the engine's device and stream."""
        stack = contextlib.ExitStack()
        if self.stream is not None:
            stack.enter_context(on_stream(self.stream))
        stack.enter_context(sdpa_kernel(self.backends))
        return stack

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("an empty prompt: every prompt needs at least one token")
        if self.linears is None:
            self.linears = PackedLinears(self.decoder, self.model.get_output_embeddings()) if self.packed else \
                Linears(self.decoder, self.model.get_output_embeddings())
        with self.scope():
            return self._generate(prompts, params)

    def _generate(self, prompts: list[list[int]], params: Sampling) -> list[Sample]:
        caps, seeds = params.caps(len(prompts)), params.seeds(len(prompts))
        width = -(-max(len(p) + cap for p, cap in zip(prompts, caps)) // WIDTH_STEP) * WIDTH_STEP
        cos, sin = self._rope(width)
        unit_of = self._build(prompts, width, cos, sin)
        cache = self.cache  # self.index stays empty until this call's rows are complete
        if len(set(unit_of)) < len(prompts):  # a unit shared by several prompts (a group's one prompt): copied out
            gather_rows(cache, torch.tensor(unit_of, device=self.device))
            order = list(range(len(prompts)))  # row r is prompt r
        else:
            order = sorted(range(len(prompts)), key=unit_of.__getitem__)  # row r is unit r: prompt order[r]
        samples = self._decode([prompts[i] for i in order], [caps[i] for i in order], [seeds[i] for i in order],
                               params, cache, cos, sin)
        cache.ids = [prompts[i] + s.ids[:-1] for i, s in zip(order, samples)]  # the last sampled token has no KV yet
        self.cache, self.index = cache, {}
        for r, ids in enumerate(cache.ids):
            for h in block_hashes(ids, len(ids)):
                self.index.setdefault(h, r)
        out = [None] * len(prompts)
        for i, s in zip(order, samples):
            out[i] = s
        return out

    def _build(self, prompts, width, cos, sin) -> list[int]:
        """This call's prefill units, one per distinct (source row, matched prefix, remainder), numbered by
        the remainder's length so that a prefill chunk is a slice of rows; their KV: the matched prefix
        copied from the previous call's rows, the remainder prefilled. Leaves the units' cache in
        self.cache; returns the unit of each prompt."""
        # the old cache and its index leave the engine together: an exception anywhere from here on (in the
        # prefill, in decode) leaves no index into rows that are gone. An empty index matches nothing, so
        # its cache is not even read
        old, index = (self.cache, self.index) if self.index else (None, {})
        self.cache, self.index = None, {}
        found = {}
        for i, p in enumerate(prompts):
            row, m = match(p, old, index)
            found.setdefault((row, m, tuple(p[m:len(p) - 1])), []).append(i)
        plan = sorted(found.items(), key=lambda kv: len(kv[0][2]))  # [((row, m, tail), prompts)], shortest first
        unit_of = [0] * len(prompts)
        for u, (_, members) in enumerate(plan):
            for i in members:
                unit_of[i] = u
        shape = (len(plan), self.kv_heads, width, self.head_dim)
        new = Cache([], [], [])
        src = torch.tensor([max(row, 0) for (row, _, _), _ in plan], device=self.device)
        for layer in range(len(self.decoder.layers)):  # a layer at a time: old and new rows never both whole
            for old_t, new_t in ((None, new.keys), (None, new.values)) if old is None else \
                    ((old.keys, new.keys), (old.values, new.values)):
                t = torch.zeros(shape, dtype=self.model.dtype, device=self.device)  # finite: masked keys meet 0 weights
                if old_t is not None:
                    w = min(width, old_t[layer].shape[2])
                    t[:, :, :w] = old_t[layer][src, :, :w]
                    old_t[layer] = None
                new_t.append(t)
        self.cache = new
        self.stats["reused_tokens"] += sum(m for (_, m, _), _ in plan)
        start = next((u for u, ((_, _, tail), _) in enumerate(plan) if tail), len(plan))
        while start < len(plan):  # chunks of units under the token budget (lengths ascend: little padding)
            end = start + 1
            while end < len(plan) and len(plan[end][0][2]) * (end + 1 - start) <= self.prefill_tokens:
                end += 1
            n = len(plan[end - 1][0][2])
            ids = torch.zeros(end - start, n, dtype=torch.long)
            pos = torch.zeros(end - start, n, dtype=torch.long)
            for j, ((_, m, tail), _) in enumerate(plan[start:end]):
                ids[j, :len(tail)] = torch.tensor(tail)
                pos[j] = torch.arange(m, m + n).clamp_(max=width - 1)  # padding past the tail: rewritten later
            h = self.decoder.embed_tokens(ids.to(self.device))
            self._layers(h, slice(start, end), pos.to(self.device), new, cos, sin, width)
            self.stats["prefill_tokens"] += sum(len(tail) for (_, _, tail), _ in plan[start:end])
            start = end
        return unit_of

    def _decode(self, prompts, caps, seeds, params: Sampling, cache: Cache, cos, sin) -> list[Sample]:
        """Every row of `cache` (row r: prompts[r]) decoded to its stop or cap, one step a loop turn."""
        R, dev, steps = len(prompts), self.device, max(caps)
        tok = torch.tensor([p[-1] for p in prompts], device=dev)
        pos = torch.tensor([len(p) - 1 for p in prompts], device=dev)
        cap = torch.tensor(caps, device=dev)
        seeds = torch.tensor([request_seed(s, self.gen) for s in seeds], device=dev)
        stops = torch.tensor(list(params.stop_ids) or [-1], device=dev)
        count = torch.zeros(R, dtype=torch.long, device=dev)
        done = torch.zeros(R, dtype=torch.bool, device=dev)
        out_ids = torch.zeros(R, steps, dtype=torch.long, device=dev)
        out_lp = torch.zeros(R, steps, dtype=torch.float32, device=dev)
        width, head = cache.width, self.linears.head
        column = torch.zeros(R, 1, dtype=torch.long, device=dev)  # the step's output column
        longest = max(len(p) for p in prompts)  # step t's positions are below longest + t: what attention keeps

        def step(kept=None):
            h = self._layers(self.decoder.embed_tokens(tok)[:, None], slice(None), pos[:, None], cache, cos, sin, width,
                             kept)
            logits = head(rms_norm(self.decoder.norm, h[:, 0])).float()                                   # (R, V)
            token, logprob = sample(logits, uniform(seeds, pos + 1), params.temperature, params.top_p)
            live = ~done
            out_ids.scatter_(1, column, token[:, None])
            out_lp.scatter_(1, column, logprob[:, None])
            column.add_(1)
            # a row that stops here still moves on once (its last token's KV is then written, harmlessly);
            # rows stopped before stay where they are, rewriting that same KV
            tok.copy_(torch.where(live, token, tok))
            pos.copy_(torch.where(live, pos + 1, pos).clamp_(max=width - 1))
            count.add_(live.long())
            done.copy_(done | (live & ((token[:, None] == stops).any(-1) | (count >= cap))))

        graph, t, timed_from = None, 0, None
        while t < steps:
            if t == 2:  # two eager steps warm up (cuBLAS workspaces, on this same stream); then the graph, or eager
                if self.graphs and self.capture_failures < CAPTURE_TRIES:
                    graph = self._try_capture(step)
                timed_from = self._clock()
            if graph is not None:
                graph.replay()
            else:
                step(min(longest + t, width) if self.kept_attention or self.kernel else None)
            t += 1
            if t % CHECK_EVERY == 0 and bool(done.all()):
                break
        if timed_from is not None:  # steady-state steps (bench/generate.py reads these)
            self.stats["steady_s"] = self.stats.get("steady_s", 0.0) + self._clock() - timed_from
            self.stats["steady_steps"] = self.stats.get("steady_steps", 0) + t - 2
        self.stats["decode_steps"] += t
        ids, lps, counts = out_ids.tolist(), out_lp.tolist(), count.tolist()
        return [Sample(ids[r][:counts[r]], lps[r][:counts[r]]) for r in range(R)]

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _try_capture(self, step):
        """The decode step as a CUDA graph (its kernels recorded once, replayed with one launch), or None: a
        failed capture costs this call its graph, not the run; the next call tries again, until CAPTURE_TRIES
        failures in a row turn graphs off for good."""
        try:
            graph = self._capture(step)
        except RuntimeError as exc:  # eager steps give the same tokens, slower
            self.capture_failures += 1
            self.stats["capture_failures"] += 1
            later = (f"tried again on the next call ({CAPTURE_TRIES - self.capture_failures} more tries)"
                     if self.capture_failures < CAPTURE_TRIES else "not tried again")
            print(f"warning: infra/decode.py could not capture its step as a CUDA graph ({str(exc)[:160]}); this "
                  f"call decodes eagerly, capture {later}", flush=True)
            return None
        self.capture_failures = 0
        self.stats["graph_captures"] += 1
        return graph

    def _capture(self, step):
        return capture(step, self.stream)

    def reset(self) -> None:
        """Drop every cached row (after a weight change their KV is stale)."""
        self.cache, self.index = None, {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, named_tensors)
        self.linears = None  # packed copies of the old weights: packed again on the next call
        self.reset()

    def sleep(self) -> None:
        self.linears = None  # the packed copies' memory too, while the trainer updates
        self.reset()

    def wake(self) -> None:
        pass

    def close(self) -> None:
        self.reset()

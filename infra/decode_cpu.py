"""The decode loop's levers on a CPU (infra/decode.py): its linear layers through weights packed once per
weight sync, and eager decode steps' attention over the kept positions only.

1. **Packed weights** (`PackedLinears`). oneDNN multiplies a weight reordered once into its blocked layout
   instead of reordering a plain weight on every call; q/k/v run as one product, gate/up as one, then o,
   down and the LM head. The packed copies belong to the weights they were made from: the engine drops them
   on every weight sync and sleep and packs again on the next call. `Linears` is the plain path, each
   module's own call, with the same three methods the layer stack calls.
2. **Attention over the kept positions** (`attend_kept`). A decode step has few query rows; two matrix
   products over the positions any row has written so far serve them better than SDPA's flash kernel
   (made for many rows) over the whole width of the call's cache.

Both are on by default in float32 on the CPU; in bf16, packing only where oneDNN multiplies bf16 natively
(`can_pack`), and SDPA kept (its kernel keeps the scores in fp32). What each measured: docs/performance.md.
Tests: python -m pytest tests/test_decode.py -k "kept or packed or levers"
"""
from __future__ import annotations

import torch


def attend_kept(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
                kept: int) -> torch.Tensor:
    """decode.attend as two matrix products over the first `kept` cached positions only (the rest of the width is
    not yet written for any row; `bias` covers at least `kept` of them): the grouped query rows of a KV head
    multiply that head's keys and values in place, as views (no head copied, no row gathered). On the CPU,
    for decode's few query rows, this beats SDPA's flash kernel, which is made for many
    (docs/performance.md). Softmax in float32 whatever the model's dtype, as the flash kernel accumulates."""
    b, s, heads, dim = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    q = q.view(b, s, kv_heads, g, dim).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * s, dim)
    k, v = k[:, :, :kept], v[:, :, :kept]                                              # views (b, Hkv, kept, D)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias[..., :kept])   # (b, Hkv, G*s, kept)
    weights = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype)
    out = torch.matmul(weights, v)                                                     # (b, Hkv, G*s, D)
    return out.view(b, kv_heads, g, s, dim).permute(0, 3, 1, 2, 4).reshape(b, s, heads * dim)


class Linears:
    """A decoder's linear layers as the layer stack calls them: each module's own call (the plain path)."""

    def __init__(self, decoder, head):
        self.decoder, self.head_module = decoder, head

    def qkv(self, i: int, x: torch.Tensor):
        a = self.decoder.layers[i].self_attn
        return a.q_proj(x), a.k_proj(x), a.v_proj(x)

    def o(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.decoder.layers[i].self_attn.o_proj(x)

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self.decoder.layers[i].mlp(x)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_module(x)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights here: on a CPU, float32 always, bfloat16 only where oneDNN multiplies it
    natively (AVX512-BF16, AMX; without them it refuses to pack)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) through a weight packed by `pack`: oneDNN's matmul reads the packed layout as it is."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def pack(weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Several linear layers of one input as one: their weights stacked (out rows after out rows) and
    reordered once into oneDNN's blocked layout. oneDNN otherwise copies a plain weight into that layout
    on every call; and one wide product of a few rows runs faster than three narrow ones
    (docs/performance.md)."""
    weight = torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights) if len(weights) > 1 else weights[0])
    if all(b is None for b in biases):
        return weight, None
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])


class PackedLinears(Linears):
    """The same layers through weights packed once (`pack`): q, k and v as one product, gate and up as one,
    o, down and the LM head each alone. The packed copies are made from the model's weights when built, so a
    weight sync must build them again (TorchEngine drops them on every sync and sleep)."""

    def __init__(self, decoder, head):
        super().__init__(decoder, head)
        self.layers = []
        for layer in decoder.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            up = [m.gate_proj, m.up_proj]
            self.layers.append({"qkv": pack([l.weight for l in qkv], [l.bias for l in qkv]),
                                "split": [l.out_features for l in qkv],
                                "o": pack([a.o_proj.weight], [a.o_proj.bias]),
                                "gate_up": pack([l.weight for l in up], [l.bias for l in up]),
                                "down": pack([m.down_proj.weight], [m.down_proj.bias]), "act": m.act_fn})
        self.head_packed = pack([head.weight], [head.bias])

    def qkv(self, i, x):
        p = self.layers[i]
        return packed_linear(x, *p["qkv"]).split(p["split"], -1)

    def o(self, i, x):
        return packed_linear(x, *self.layers[i]["o"])

    def mlp(self, i, x):
        p = self.layers[i]
        gate, up = packed_linear(x, *p["gate_up"]).chunk(2, -1)
        return packed_linear(p["act"](gate) * up, *p["down"])

    def head(self, x):
        return packed_linear(x, *self.head_packed)

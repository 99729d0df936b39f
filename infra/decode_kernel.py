"""Decode attention on the CPU as one C++ loop that reads each cached key and value once (`--engine torch`).

A decode step has one query token per row; grouped-query attention gives each KV head G query heads (3 on
SmolLM2). Written as matrix products (decode_cpu.attend_kept), that is a batch of (G x D) @ (D x n) products:
a BLAS kernel made for large tiles packs the keys into a buffer before it multiplies three rows by them, and
the step reads the KV cache several times over. Here, per (row, KV head), one loop:

    s[g, t] = scale * q[g] . k[t]            for t <= last[row]   (the row's own positions, nothing masked)
    p[g, :] = softmax(s[g, :])               in float32
    out[g]  = sum_t p[g, t] * v[t]

Each key and value is read once, from the cache as it lies (a view, any row and head strides), so the loop
runs near the machine's read bandwidth. Scores, softmax and sums are float32 whatever the cache's dtype (as
SDPA's CPU kernel accumulates); only the order of the float sums differs from the matrix products
(tests/test_decode.py checks them equal within float32 rounding, and the sampled tokens equal).

The source is compiled once per machine at first use (torch.utils.cpp_extension, the compiler that builds
Python packages, `-O3 -march=native`; about half a minute, then cached under torch's extensions directory by
a name that carries the source's and the CPU's fingerprint, so a different CPU never loads a build made for
another). `problem()` says why it cannot run here (no compiler, a failed build), and the engine then keeps
decode_cpu.attend_kept. Figures: docs/performance.md.
"""
from __future__ import annotations

import hashlib
import platform

import torch

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

template <typename T>
static void attend_rows(const T* qp, const T* kp, const T* vp, T* op, const int64_t* last, int64_t B, int64_t H,
                        int64_t G, int64_t D, int64_t W, int64_t ks0, int64_t ks1, int64_t ks2, int64_t vs0,
                        int64_t vs1, int64_t vs2, float scale) {
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(G * D), s, out(G * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / H, h = i % H;
      const int64_t n = std::min<int64_t>(last[b] + 1, W);  // positions 0..last[b]: the row's own, all written
      s.resize(G * n);
      for (int64_t j = 0; j < G * D; ++j) q[j] = static_cast<float>(qp[i * G * D + j]) * scale;
      const T* kb = kp + b * ks0 + h * ks1;
      const T* vb = vp + b * vs0 + h * vs1;
      for (int64_t t = 0; t < n; ++t) {  // scores: each key read once, for the G query heads of its KV head
        const T* kt = kb + t * ks2;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = q.data() + g * D;
          float acc = 0.f;
          for (int64_t d = 0; d < D; ++d) acc += qg[d] * static_cast<float>(kt[d]);
          s[g * n + t] = acc;
        }
      }
      for (int64_t g = 0; g < G; ++g) {  // softmax in float32, its normaliser applied to the output
        float* sg = s.data() + g * n;
        float m = sg[0];
        for (int64_t t = 1; t < n; ++t) m = std::max(m, sg[t]);
        float z = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          sg[t] = std::exp(sg[t] - m);
          z += sg[t];
        }
        const float inv = 1.f / z;
        for (int64_t t = 0; t < n; ++t) sg[t] *= inv;
      }
      std::fill(out.begin(), out.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {  // weighted values: each value read once
        const T* vt = vb + t * vs2;
        for (int64_t g = 0; g < G; ++g) {
          const float w = s[g * n + t];
          float* og = out.data() + g * D;
          for (int64_t d = 0; d < D; ++d) og[d] += w * static_cast<float>(vt[d]);
        }
      }
      for (int64_t j = 0; j < G * D; ++j) op[i * G * D + j] = static_cast<T>(out[j]);
    }
  });
}

// q (B, H, G, D); k, v (B, H, W, D), unit stride along D; last (B,) int64: row b attends to positions 0..last[b]
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor last, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "decode_attention: q, k, v must be 4-d");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: keys and values need unit stride along D");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "decode_attention: one dtype");
  TORCH_CHECK(last.scalar_type() == torch::kLong && last.numel() == q.size(0), "decode_attention: last is (B,) int64");
  auto qc = q.contiguous();
  auto lc = last.contiguous();
  auto out = torch::empty_like(qc);
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), W = k.size(2);
  if (q.scalar_type() == torch::kFloat) {
    attend_rows<float>(qc.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                       lc.data_ptr<int64_t>(), B, H, G, D, W, k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                       v.stride(1), v.stride(2), static_cast<float>(scale));
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "decode_attention: float32 or bfloat16");
    using bf = at::BFloat16;
    attend_rows<bf>(qc.data_ptr<bf>(), k.data_ptr<bf>(), v.data_ptr<bf>(), out.data_ptr<bf>(), lc.data_ptr<int64_t>(),
                    B, H, G, D, W, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                    static_cast<float>(scale));
  }
  return out;
}
"""

# -ffast-math lets the compiler vectorise the float sums (reassociated) and call glibc's vector exp; it is a
# compile flag only: linked into a shared library it would set flush-to-zero for the whole process (gcc's
# crtfastmath.o), which tests/test_decode.py rules out
FLAGS = ["-O3", "-march=native", "-ffast-math"]
_built: dict[str, object] = {}  # "module" or "error", once per process


def _cpu_fingerprint() -> str:
    """The CPU's model name and flags: a build made with -march=native runs only where they are the same."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "".join(lines)


def _module():
    if not _built:
        from torch.utils.cpp_extension import load_inline

        tag = hashlib.sha256((SOURCE + _cpu_fingerprint() + torch.__version__).encode()).hexdigest()[:12]
        try:
            _built["module"] = load_inline(f"decode_attention_{tag}", cpp_sources=[SOURCE],
                                           functions=["decode_attention"], extra_cflags=FLAGS,
                                           verbose=False)
        except (RuntimeError, OSError, ImportError) as exc:  # no compiler, no ninja, a failed build
            _built["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
    return _built.get("module")


def problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the kernel runs here, else why not (one line). Builds it on the first call."""
    if device.type != "cpu":
        return f"the decode attention kernel is a CPU loop; on {device.type} the engine uses SDPA"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"the decode attention kernel takes float32 or bfloat16, not {dtype}"
    if _module() is None:
        return f"the decode attention kernel did not build here ({_built.get('error')}); a C++ compiler and ninja " \
               f"are needed (bash run.sh installs ninja; Debian: apt-get install g++)"
    return None


def attend_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, last: torch.Tensor, scale: float) -> torch.Tensor:
    """decode.attend for one query token a row: q (b, 1, H, D) against the cache k, v (b, Hkv, W, D); row r sees
    positions 0..last[r]. Returns (b, 1, H*D), as `attend`."""
    b, s, heads, dim = q.shape
    assert s == 1, "the decode attention kernel serves decode steps (one query token a row)"
    kv_heads = k.shape[1]
    out = _module().decode_attention(q.reshape(b, kv_heads, heads // kv_heads, dim), k, v, last, scale)
    return out.view(b, 1, heads * dim)

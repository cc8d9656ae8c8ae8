"""A matrix-vector kernel for decoding on the CPU: y = x @ weight + bias (then GELU) for <= 16 rows.

Batch-1 decoding reads every weight once per token, so its speed is set by how fast the
weights stream from memory, not by arithmetic. This kernel has each thread read one
contiguous slice of the weight front to back, the access pattern that memory serves fastest.

It is a small C++ extension compiled on first use (torch.utils.cpp_extension.load_inline,
cached by torch under ~/.cache/torch_extensions, so later processes only load it). Where it
cannot be built (no compiler, no ninja) `gemv` returns None and the caller falls back to
its own path; set GPT2_GEMV=0 to turn it off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time

import torch

_SOURCE = r"""
#include <torch/extension.h>
#include <omp.h>
#include <algorithm>
#include <vector>

static constexpr int64_t kMaxRows = 16;  // decoding and short prompts; past this a matrix product wins

// W stored (K, N) row-major (the block weights). Each thread takes a band of W's rows, a
// contiguous slice of memory, and sums its part of every output into a private buffer; after
// a barrier the threads add the buffers up column by column. (Splitting the columns instead
// would make every thread hop across every row: ~10% slower here.) R rows of W at a time, so
// each partial sum is loaded and stored once per R fused multiply-adds; 8 measured best.
static void gemv_kn(const float* x, const float* w, const float* b, float* y, float* part,
                    int64_t M, int64_t K, int64_t N, int threads) {
  constexpr int R = 8;
  constexpr int64_t chunk = 512;  // columns at a time: R rows of W stay in L1 across the M rows of x
  #pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t band = ((K + nt - 1) / nt + R - 1) / R * R;
    const int64_t k0 = std::min(K, t * band), k1 = std::min(K, k0 + band);
    float* acc = part + t * M * N;
    std::fill(acc, acc + M * N, 0.f);
    for (int64_t k = k0; k < k1; k += R) {
      const int rows = (int)std::min<int64_t>(R, k1 - k);  // R but at the end of a band
      const float* wk = w + k * N;
      for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t n1 = std::min(N, n0 + chunk);
        for (int64_t r = 0; r < M; ++r) {
          const float* xr = x + r * K + k;
          float* o = acc + r * N;
          if (rows == R) {
            #pragma omp simd
            for (int64_t n = n0; n < n1; ++n) {
              float s = o[n];
              for (int j = 0; j < R; ++j) s += xr[j] * wk[j * N + n];  // unrolled: R is constant
              o[n] = s;
            }
          } else {
            for (int j = 0; j < rows; ++j) {
              #pragma omp simd
              for (int64_t n = n0; n < n1; ++n) o[n] += xr[j] * wk[j * N + n];
            }
          }
        }
      }
    }
    #pragma omp barrier
    const int64_t cols = (N + nt - 1) / nt;
    const int64_t c0 = std::min(N, t * cols), c1 = std::min(N, c0 + cols);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = c0; n < c1; ++n) {
        float s = b ? b[n] : 0.f;
        for (int u = 0; u < nt; ++u) s += part[u * M * N + r * N + n];
        y[r * N + n] = s;
      }
  }
}

// W given as the transpose of a row-major (N, K) tensor (the unembedding, wte.t()): each
// output is a dot product with one contiguous row, so each thread takes a band of outputs,
// again a contiguous slice of memory, and no sums cross threads. Four outputs at a time, so
// each load of x feeds four multiply-adds; the four rows stay in cache across the M rows of x.
static void gemv_nk(const float* x, const float* wt, const float* b, float* y,
                    int64_t M, int64_t K, int64_t N, int threads) {
  #pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t band = ((N + nt - 1) / nt + 3) / 4 * 4;
    const int64_t n0 = std::min(N, t * band), n1 = std::min(N, n0 + band);
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
      const float *w0 = wt + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
      for (int64_t r = 0; r < M; ++r) {
        const float* xr = x + r * K;
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
        #pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t k = 0; k < K; ++k) {
          s0 += xr[k] * w0[k]; s1 += xr[k] * w1[k]; s2 += xr[k] * w2[k]; s3 += xr[k] * w3[k];
        }
        float* yr = y + r * N + n;
        yr[0] = s0 + (b ? b[n] : 0.f);
        yr[1] = s1 + (b ? b[n + 1] : 0.f);
        yr[2] = s2 + (b ? b[n + 2] : 0.f);
        yr[3] = s3 + (b ? b[n + 3] : 0.f);
      }
    }
    for (; n < n1; ++n) {  // the last outputs of a band whose length is not a multiple of four
      const float* w0 = wt + n * K;
      for (int64_t r = 0; r < M; ++r) {
        const float* xr = x + r * K;
        float s0 = 0.f;
        #pragma omp simd reduction(+ : s0)
        for (int64_t k = 0; k < K; ++k) s0 += xr[k] * w0[k];
        y[r * N + n] = s0 + (b ? b[n] : 0.f);
      }
    }
  }
}

// y = x @ w + b, then GELU (gelu: 0 none, 1 the tanh approximation, 2 exact), as a new
// (..., N) tensor; an undefined tensor (None in Python) where this kernel does not apply, so
// the caller falls back. The checks live here, not in Python, because at ~50 calls a token
// their cost in Python (~12 us a call, against ~3 us here) would show.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, int64_t gelu) {
  const auto ok = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat;
  };
  if (!ok(x) || !ok(w) || x.dim() < 1 || w.dim() != 2 || gelu < 0 || gelu > 2) return {};
  const int64_t K = w.size(0), N = w.size(1);
  if (K == 0 || N == 0 || x.size(-1) != K || x.numel() == 0 || x.numel() > kMaxRows * K) return {};
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias && !(ok(*bias) && bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous())) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (has_bias && bias->requires_grad())))
    return {};  // this kernel records no gradient
  const bool transposed = !(w.stride(0) == N && w.stride(1) == 1);
  if (transposed && !(w.stride(0) == 1 && w.stride(1) == K)) return {};  // neither layout

  const at::Tensor xc = x.contiguous();  // (..., K) contiguous is (M, K) row-major
  const int64_t M = x.numel() / K;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options());
  const int threads = std::max(1, at::get_num_threads());
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  if (transposed) {
    gemv_nk(xc.data_ptr<float>(), w.data_ptr<float>(), bp, y.data_ptr<float>(), M, K, N, threads);
  } else {
    at::Tensor part = at::empty({threads, M, N}, x.options());
    gemv_kn(xc.data_ptr<float>(), w.data_ptr<float>(), bp, y.data_ptr<float>(), part.data_ptr<float>(),
            M, K, N, threads);
  }
  // GELU as torch computes it, vectorised: a scalar tanh per output here cost 25 us a call
  if (gelu) at::gelu_(y, gelu == 1 ? "tanh" : "none");
  return y;
}
"""

# -march=native: AVX2 and FMA where the machine has them (the loops above are written for the
# compiler to vectorise); no -ffast-math, whose shared-library startup code would flush
# denormals to zero for the whole process. libgomp is torch's own (same soname), so the
# kernel shares torch's OpenMP threads rather than starting a second pool.
_CFLAGS = ("-O3", "-march=native", "-fopenmp")
_LDFLAGS = ("-fopenmp",)
_GELU = {None: 0, "tanh": 1, "none": 2}

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_module = None
_failed = False


def _cpu_flags() -> str:
    """The CPU's feature flags: part of the cache key, since -march=native builds for them."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _clear_stale_lock(name: str) -> None:
    """torch serialises builds with a `lock` file that a process killed mid-build leaves behind,
    and every later process would then wait on it forever. A build takes ~30 s, so a lock
    older than 10 minutes is stale."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        lock = os.path.join(_get_build_directory(name, verbose=False), "lock")
        if time.time() - os.path.getmtime(lock) > 600:
            os.remove(lock)
    except Exception:  # no lock (the usual case), or torch's private helper moved
        pass


def _note_first_build(name: str) -> None:
    """Say so before a build, which pauses the first generation in an environment for ~30 s."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        built = os.path.exists(os.path.join(_get_build_directory(name, verbose=False), f"{name}.so"))
    except Exception:
        built = False
    if not built:
        _log.warning("gpt2: compiling the fast CPU decoding kernel, once (about 30 s); later runs reuse it")


def _extension():
    """The compiled module, building it on first use; None (remembered) if it can't be built."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is None and not _failed and os.environ.get("GPT2_GEMV", "1") == "0":
            _failed = True  # turned off
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load_inline

                key = hashlib.sha256("\0".join([_SOURCE, *_CFLAGS, *_LDFLAGS, _cpu_flags()]).encode()).hexdigest()[:12]
                name = f"gpt2_gemv_{key}"  # a new name for new source or flags: no stale reuse
                _clear_stale_lock(name)
                _note_first_build(name)
                _module = load_inline(
                    name=name,
                    cpp_sources=_SOURCE,
                    functions=["gemv"],
                    extra_cflags=list(_CFLAGS),  # copies: torch appends to the lists it is given
                    extra_ldflags=list(_LDFLAGS),
                    verbose=False,
                )
            except Exception as e:  # no compiler, no ninja, a failed build: fall back, quietly
                _failed = True
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                _log.warning("gpt2: fast CPU gemv unavailable, using oneDNN (%s)", first[:200])
    return _module


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: str | None) -> torch.Tensor | None:
    """x @ weight + bias, then GELU if `gelu` names its form ("tanh" or "none", as F.gelu's
    `approximate`), for float32 CPU x (..., in) of at most 16 rows in all and weight (in, out),
    either contiguous or the transpose of a contiguous (out, in). None where the kernel can't
    serve (other dtypes or layouts, more rows, a gradient wanted, no compiler)."""
    code = _GELU.get(gelu, -1)
    module = _module if _module is not None else _extension()
    if module is None or code < 0:
        return None
    return module.gemv(x, weight, bias, code)

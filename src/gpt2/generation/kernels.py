"""Kernels for decoding on the CPU: y = x @ weight + bias (then GELU) for <= 16 rows (`gemv`),
and attention of one new position per row over the KV cache (`attend`); and the model's
linear layer (`linear`), which dispatches to them, to oneDNN or to addmm, with the narrow
weights it reads (`widen`, `quantize_int8`, `stored_matrix`).

Batch-1 decoding reads every weight once per token, so its speed is set by how fast the
weights stream from memory, not by arithmetic. The matrix-vector kernel has each thread read
one contiguous slice of the weight front to back, the access pattern that memory serves
fastest, and reads bfloat16, float16 and int8 weights as they are stored. torch's attention,
built for long queries, costs more than this one for a single query per row.

It is a small C++ extension, compiled once (about 50 s on 2 cores; `make demo` and `make test`
compile it at set-up with `python -m gpt2.generation.kernels`) by torch.utils.cpp_extension.load_inline,
and kept in a directory of its own under torch's extensions root ($TORCH_EXTENSIONS_DIR, else
~/.cache/torch_extensions). The directory is named by a hash of everything that makes one
build unfit for another process (the source, the flags, the CPU, the Python, the torch, the
compiler), so environments that agree share one kernel and those that differ never rebuild
each other's. Where it cannot be built (no compiler, no ninja) `gemv` returns None and the
caller falls back to its own path; set GPT2_GEMV=0 to turn it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch
from torch.nn import functional as F

_SOURCE = r"""
#include <torch/extension.h>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static constexpr int64_t kMaxRows = 16;  // decoding and short prompts; past this a matrix product wins

// Weights may be narrower than the float32 they are widened to: bfloat16 (the high half of a
// float32's bits), float16, or int8 (times a float32 scale per output, applied once to each
// output's sum). Fewer bytes a weight, fewer to stream from memory. bfloat16 and int8 widen in
// registers as they are read (measured faster here than widening into a buffer first);
// float16 widens a block at a time into a float32 buffer with the CPU's own conversion (F16C),
// which the compiler does not find for a scalar loop.
struct BF16 { uint16_t bits; };
static inline float widen(float w) { return w; }
static inline float widen(BF16 w) {
  const uint32_t u = (uint32_t)w.bits << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline float widen(at::Half w) { return (float)w; }
static inline float widen(int8_t w) { return (float)w; }

template <typename W>
static constexpr bool kBuffered = std::is_same<W, at::Half>::value;

static inline void widen_run(float* dst, const at::Half* src, int64_t n) {
  int64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = (float)src[i];
}

// o[n] += sum_j x[j] * w[j * ld + n] over n < cols and j < rows (R, or fewer at a band's end)
template <int R, typename E>
static inline void axpy_rows(const float* x, const E* w, int64_t ld, float* o, int64_t cols, int rows) {
  if (rows == R) {
    #pragma omp simd
    for (int64_t n = 0; n < cols; ++n) {
      float s = o[n];
      for (int j = 0; j < R; ++j) s += x[j] * widen(w[j * ld + n]);  // unrolled: R is constant
      o[n] = s;
    }
  } else {
    for (int j = 0; j < rows; ++j) {
      #pragma omp simd
      for (int64_t n = 0; n < cols; ++n) o[n] += x[j] * widen(w[j * ld + n]);
    }
  }
}

// W stored (K, N) row-major (the block weights). Each thread takes a band of W's rows, a
// contiguous slice of memory, and sums its part of every output into a private buffer; after
// a barrier the threads add the buffers up column by column. (Splitting the columns instead
// would make every thread hop across every row: ~10% slower here.) R rows of W at a time, so
// each partial sum is loaded and stored once per R fused multiply-adds; 8 measured best.
template <typename W>
static void gemv_kn(const float* x, const W* w, const float* b, const float* scale, float* y, float* part,
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
    std::vector<float> buf(kBuffered<W> ? R * chunk : 0);
    for (int64_t k = k0; k < k1; k += R) {
      const int rows = (int)std::min<int64_t>(R, k1 - k);  // R but at the end of a band
      const W* wk = w + k * N;
      for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t cols = std::min(N, n0 + chunk) - n0;
        if constexpr (kBuffered<W>)
          for (int j = 0; j < rows; ++j) widen_run(buf.data() + j * chunk, wk + j * N + n0, cols);
        for (int64_t r = 0; r < M; ++r) {
          if constexpr (kBuffered<W>)
            axpy_rows<R>(x + r * K + k, buf.data(), chunk, acc + r * N + n0, cols, rows);
          else
            axpy_rows<R>(x + r * K + k, wk + n0, N, acc + r * N + n0, cols, rows);
        }
      }
    }
    #pragma omp barrier
    const int64_t cols = (N + nt - 1) / nt;
    const int64_t c0 = std::min(N, t * cols), c1 = std::min(N, c0 + cols);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t n = c0; n < c1; ++n) {
        float s = 0.f;
        for (int u = 0; u < nt; ++u) s += part[u * M * N + r * N + n];
        y[r * N + n] = (scale ? s * scale[n] : s) + (b ? b[n] : 0.f);
      }
  }
}

// Dot products of MR rows of x with NR rows of W (each K long, contiguous): s[r * NR + i].
// With AVX2 and FMA the weights widen eight at a time in registers (int8: sign-extend and
// convert; bfloat16: shift into a float32's high half; float16: F16C) and MR * NR = 8 sums
// run side by side, enough independent multiply-adds to hide their latency; each x vector
// loaded feeds NR of them and each weight vector MR. Elsewhere, a plain loop.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define GPT2_AVX2 1
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const BF16* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
static inline __m256 load8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
static inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

template <int MR, int NR, typename W>
static inline void dot_tile(const float* x, const W* w, int64_t K, float* s) {
  int64_t k = 0;
#ifdef GPT2_AVX2
  __m256 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < NR; ++i) acc[r][i] = _mm256_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w + 2 * NR * K);  // the rows two tiles on
  for (; k + 8 <= K; k += 8) {
    // Each row alone is a short stream (768 int8 weights are 12 cache lines), too short for
    // the hardware prefetcher to learn: fetch a later tile's lines as this one's are read
    // (two tiles ahead measured 5-20% faster than one for int8, the same for the others).
    for (int j = 0; j < NR * (int)sizeof(W); j += 8) _mm_prefetch(ahead + k * NR * sizeof(W) + j * 8, _MM_HINT_T1);
    for (int i = 0; i < NR; ++i) {
      const __m256 wv = load8(w + i * K + k);
      for (int r = 0; r < MR; ++r) acc[r][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * K + k), wv, acc[r][i]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int i = 0; i < NR; ++i) s[r * NR + i] = hsum(acc[r][i]);
#else
  for (int j = 0; j < MR * NR; ++j) s[j] = 0.f;
#endif
  for (; k < K; ++k)  // what is left after the vectors: all of it without AVX2
    for (int r = 0; r < MR; ++r)
      for (int i = 0; i < NR; ++i) s[r * NR + i] += x[r * K + k] * widen(w[i * K + k]);
}

// y[r, n + i] for r < M and i < NR: the rows of x MR at a time, MR * NR = 8 sums each
template <int NR, typename W>
static inline void dot_rows(const float* x, const W* w, const float* b, const float* scale, float* y,
                            int64_t M, int64_t K, int64_t N, int64_t n) {
  constexpr int MR = 8 / NR;
  float s[8];
  for (int64_t r = 0; r < M; r += MR) {
    const int rows = (int)std::min<int64_t>(MR, M - r);
    if (rows == MR)
      dot_tile<MR, NR>(x + r * K, w, K, s);
    else  // the last rows of x, fewer than MR: one at a time
      for (int j = 0; j < rows; ++j) dot_tile<1, NR>(x + (r + j) * K, w, K, s + j * NR);
    for (int j = 0; j < rows; ++j)
      for (int i = 0; i < NR; ++i)
        y[(r + j) * N + n + i] = (scale ? s[j * NR + i] * scale[n + i] : s[j * NR + i]) + (b ? b[n + i] : 0.f);
  }
}

// W given as the transpose of a row-major (N, K) tensor (nn.Linear's layout; wte.t()): each
// output is a dot product with one contiguous row, so each thread takes a band of outputs,
// a contiguous slice of memory, and no sums cross threads. Eight outputs at a time: eight
// rows of W (at most 24 KB) stay in L1 across the rows of x.
template <typename W>
static void gemv_nk(const float* x, const W* wt, const float* b, const float* scale, float* y,
                    int64_t M, int64_t K, int64_t N, int threads) {
  #pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t band = ((N + nt - 1) / nt + 7) / 8 * 8;
    const int64_t n0 = std::min(N, t * band), n1 = std::min(N, n0 + band);
    int64_t n = n0;
    for (; n + 8 <= n1; n += 8) {
      const W* w = wt + n * K;
      if (M == 1) dot_rows<8>(x, w, b, scale, y, M, K, N, n);
      else if (M < 4) dot_rows<4>(x, w, b, scale, y, M, K, N, n), dot_rows<4>(x, w + 4 * K, b, scale, y, M, K, N, n + 4);
      else for (int i = 0; i < 8; i += 2) dot_rows<2>(x, w + i * K, b, scale, y, M, K, N, n + i);
    }
    for (; n < n1; ++n) dot_rows<1>(x, wt + n * K, b, scale, y, M, K, N, n);  // a band's last outputs, fewer than 8
  }
}

template <typename W>
static void run(const at::Tensor& x, const at::Tensor& w, const float* b, const float* scale, at::Tensor& y,
                int64_t M, int64_t K, int64_t N, bool transposed) {
  const int threads = std::max(1, at::get_num_threads());
  const W* wp = reinterpret_cast<const W*>(w.data_ptr());
  if (transposed) {
    gemv_nk<W>(x.data_ptr<float>(), wp, b, scale, y.data_ptr<float>(), M, K, N, threads);
  } else {
    at::Tensor part = at::empty({threads, M, N}, x.options());
    gemv_kn<W>(x.data_ptr<float>(), wp, b, scale, y.data_ptr<float>(), part.data_ptr<float>(), M, K, N, threads);
  }
}

// y = (x @ w) * scale + b, then GELU (gelu: 0 none, 1 the tanh approximation, 2 exact), as a
// new float32 (..., N) tensor, for float32 x and w of float32, bfloat16, float16 or int8 (int8
// only with a float32 scale per output; the others without); an undefined tensor (None in
// Python) where this kernel does not apply, so the caller falls back. The checks live here,
// not in Python, because at ~50 calls a token their cost in Python (~12 us a call, against
// ~3 us here) would show.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, int64_t gelu,
                const c10::optional<at::Tensor>& scale) {
  const auto cpu = [](const at::Tensor& t) { return t.device().is_cpu() && t.layout() == at::kStrided; };
  const auto ok = [&](const at::Tensor& t) { return cpu(t) && t.scalar_type() == at::kFloat; };
  const auto type = w.scalar_type();
  const bool narrow = type == at::kBFloat16 || type == at::kHalf || type == at::kChar;
  if (!ok(x) || !cpu(w) || !(type == at::kFloat || narrow) || x.dim() < 1 || w.dim() != 2 || gelu < 0 || gelu > 2)
    return {};
  const int64_t K = w.size(0), N = w.size(1);
  if (K == 0 || N == 0 || x.size(-1) != K || x.numel() == 0 || x.numel() > kMaxRows * K) return {};
  const bool has_bias = bias.has_value() && bias->defined(), has_scale = scale.has_value() && scale->defined();
  const auto vector = [&](const at::Tensor& t) { return ok(t) && t.dim() == 1 && t.size(0) == N && t.is_contiguous(); };
  if (has_bias && !vector(*bias)) return {};
  if (has_scale != (type == at::kChar) || (has_scale && !vector(*scale))) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (has_bias && bias->requires_grad())))
    return {};  // this kernel records no gradient
  const bool transposed = !(w.stride(0) == N && w.stride(1) == 1);
  if (transposed && !(w.stride(0) == 1 && w.stride(1) == K)) return {};  // neither layout

  const at::Tensor xc = x.contiguous();  // (..., K) contiguous is (M, K) row-major
  const int64_t M = x.numel() / K;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options());
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  const float* sp = has_scale ? scale->data_ptr<float>() : nullptr;
  switch (type) {
    case at::kBFloat16: run<BF16>(xc, w, bp, sp, y, M, K, N, transposed); break;
    case at::kHalf: run<at::Half>(xc, w, bp, sp, y, M, K, N, transposed); break;
    case at::kChar: run<int8_t>(xc, w, bp, sp, y, M, K, N, transposed); break;
    default: run<float>(xc, w, bp, sp, y, M, K, N, transposed);
  }
  // GELU as torch computes it, vectorised: a scalar tanh per output here cost 25 us a call
  if (gelu) at::gelu_(y, gelu == 1 ? "tanh" : "none");
  return y;
}

// Attention of one new position per row over its slot's keys, for decoding: q (B, H, 1, D),
// k and v (B, H, S, D) views of the KV cache (each key's D values contiguous, keys D apart),
// float32; row b sees its first seen[b] keys (all S without `seen`, an int64 (B,) tensor:
// rows of different lengths in one batch). Returns softmax(q k^T / sqrt(D)) v as a new
// (B, H, 1, D) tensor, or an undefined tensor where this does not apply. torch's fused
// attention is built for long queries: for one, in the decode loop, it cost ~0.5 ms a token
// more than this over 12 layers, and its masked form ~3.5x this for rows of mixed lengths.
// Scores eight keys at a time (the dot products above), softmax by torch (vectorised exp),
// then each (row, head) sums its values.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& seen) {
  const auto ok = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat && t.dim() == 4 && t.stride(3) == 1;
  };
  if (!ok(q) || !ok(k) || !ok(v) || q.size(2) != 1 || k.sizes() != v.sizes()) return {};
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), S = k.size(2);
  if (k.size(0) != B || k.size(1) != H || k.size(3) != D || S == 0 || D == 0 || k.stride(2) != D || v.stride(2) != D) return {};
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) return {};
  const bool has_seen = seen.has_value() && seen->defined();
  if (has_seen && !(seen->device().is_cpu() && seen->scalar_type() == at::kLong && seen->dim() == 1 && seen->size(0) == B &&
                    seen->is_contiguous()))
    return {};
  const int64_t* np = has_seen ? seen->data_ptr<int64_t>() : nullptr;
  for (int64_t b = 0; np && b < B; ++b)
    if (np[b] < 1 || np[b] > S) return {};
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float scale = 1.f / std::sqrt((float)D);
  const int threads = (int)std::min<int64_t>(std::max(1, at::get_num_threads()), B * H);
  at::Tensor scores = at::empty({B * H, S}, q.options());
  float* sp = scores.data_ptr<float>();
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* qi = qp + b * q.stride(0) + h * q.stride(1);
    const float* ki = kp + b * k.stride(0) + h * k.stride(1);
    float* si = sp + bh * S;
    const int64_t n = np ? np[b] : S;  // keys this row sees; the rest weigh nothing
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) dot_tile<1, 8>(qi, ki + j * D, D, si + j);
    for (; j < n; ++j) dot_tile<1, 1>(qi, ki + j * D, D, si + j);
    for (j = 0; j < n; ++j) si[j] *= scale;
    std::fill(si + n, si + S, -INFINITY);
  }
  const at::Tensor p = at::_softmax(scores, 1, false);  // (B * H, S)
  const float* pp = p.data_ptr<float>();
  at::Tensor out = at::empty({B, H, 1, D}, q.options());
  float* op = out.data_ptr<float>();
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const float* vi = vp + (bh / H) * v.stride(0) + (bh % H) * v.stride(1);
    const float* pi = pp + bh * S;
    float* o = op + bh * D;
    std::fill(o, o + D, 0.f);
    for (int64_t j = 0, n = np ? np[bh / H] : S; j < n; ++j) {
      const float w = pi[j], *vj = vi + j * D;
      #pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] += w * vj[d];
    }
  }
  return out;
}
"""

# -march=native: AVX2 and FMA where the machine has them (the loops above are written for the
# compiler to vectorise); no -ffast-math, whose shared-library startup code would flush
# denormals to zero for the whole process. libgomp is torch's own (same soname), so the
# kernel shares torch's OpenMP threads rather than starting a second pool.
_CFLAGS = ("-O3", "-march=native", "-fopenmp")
_LDFLAGS = ("-fopenmp",)
_GELU = {None: 0, "tanh": 1, "none": 2}

BUILD_SECONDS = 50  # a build on 2 cores took 48 s here (README): said before each build
# A build holding the lock for longer than this is stuck: compile without waiting for it.
_BUILD_LIMIT = 600

_lock = threading.Lock()
_module = None
_failed = False


def _note(message: str) -> None:
    print(f"gpt2: {message}", file=sys.stderr, flush=True)


def _cpu_flags() -> str:
    """The CPU's feature flags: part of the cache key, since -march=native builds for them."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def _compiler() -> str:
    """The C++ compiler torch will call ($CXX, else c++): its path and what it says of its version."""
    from torch.utils.cpp_extension import get_cxx_compiler

    cxx = get_cxx_compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = "none"  # the build will fail and say why
    path = shutil.which(cxx)
    return f"{os.path.realpath(path) if path else cxx}\n{version.strip()}"


def cache_key() -> str:
    """A hash of everything that makes a build unfit for another process to load."""
    parts = [
        _SOURCE,
        *_CFLAGS,
        *_LDFLAGS,
        _cpu_flags(),  # what is compiled, and for which CPU
        sys.version,
        sys.implementation.cache_tag,
        sysconfig.get_config_var("EXT_SUFFIX") or "",
        platform.machine(),
        torch.__version__,
        torch.version.git_version or "",
        str(torch.compiled_with_cxx11_abi()),
        _compiler(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """The directory of this environment's kernel: gpt2_gemv_<cache key> under torch's extensions root."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"gpt2_gemv_{cache_key()}"


def _library(directory: Path) -> Path:
    from torch.utils.cpp_extension import LIB_EXT  # the suffix load_inline gives the library

    return directory / f"{directory.name}{LIB_EXT}"


def _import(library: Path) -> ModuleType:
    """Load a built kernel: a Python extension module named as its file."""
    spec = importlib.util.spec_from_file_location(library.stem, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_or_build(directory: Path) -> ModuleType:
    library = _library(directory)
    if library.exists():  # built before, by any process of an environment like this one
        return _import(library)
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory / "lock"):
        if library.exists():  # built by the process we waited for
            return _import(library)
        return _build(directory, library)


def _build(directory: Path, library: Path) -> ModuleType:
    """Compile in a directory of this build's own, then rename the library into place: a build
    killed midway leaves no library, and two builds never write the same file."""
    from torch.utils.cpp_extension import load_inline

    _note(f"compiling the decode kernel, once, about {BUILD_SECONDS} s (kept in {directory})")
    for old in directory.glob("build-*"):  # left by builds that were killed
        if time.time() - old.stat().st_mtime > _BUILD_LIMIT:
            shutil.rmtree(old, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=directory))
    try:
        module = load_inline(
            name=directory.name,
            cpp_sources=_SOURCE,
            functions=["gemv", "attend"],
            extra_cflags=list(_CFLAGS),  # copies: torch appends to the lists it is given
            extra_ldflags=list(_LDFLAGS),
            build_directory=str(work),
            verbose=False,
        )
        os.replace(work / library.name, library)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return module


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Held while one process builds, so that processes starting together build once.

    It is an flock, which the system releases when its holder exits, however it ends (Ctrl-C,
    SIGTERM, SIGHUP, SIGKILL): a killed build leaves a file behind but no lock to wait on.
    The holder writes its pid and start time into the file; a holder still alive after
    _BUILD_LIMIT is stuck, and this process compiles without it (builds never collide).
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): build without
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, started = _lock_holder(fd)
                if time.time() - started > _BUILD_LIMIT:
                    _note(
                        f"process {pid} has held the decode kernel's build lock for over {_BUILD_LIMIT // 60} minutes; "
                        f"compiling here without it"
                    )
                    break
                if not said:
                    _note(f"waiting for process {pid}, which is compiling the decode kernel")
                    said = True
                time.sleep(0.2)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {time.time():.0f}\n".encode(), 0)
            break
        yield
    finally:
        os.close(fd)  # releases the lock, if held


def _lock_holder(fd: int) -> tuple[str, float]:
    """The pid and start time the lock's holder wrote ("?" and now while it has not yet written)."""
    words = os.pread(fd, 100, 0).split()
    try:
        return words[0].decode(), float(words[1])
    except (IndexError, ValueError, UnicodeDecodeError):
        return "?", time.time()


def _extension() -> ModuleType | None:
    """The compiled module, loading or building it on first use; None (remembered) if it can't be had."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is None and not _failed and os.environ.get("GPT2_GEMV", "1") == "0":
            _failed = True  # turned off
        if _module is None and not _failed:
            try:
                _module = _load_or_build(cache_dir())
            except Exception as e:  # no compiler, no ninja, a failed build: fall back
                _failed = True
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                _note(f"the decode kernel is unavailable, decoding uses oneDNN instead ({first[:200]})")
    return _module


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gelu: str | None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """(x @ weight) * scale + bias, then GELU if `gelu` names its form ("tanh" or "none", as
    F.gelu's `approximate`), in float32, for float32 CPU x (..., in) of at most 16 rows in all
    and weight (in, out), either contiguous or the transpose of a contiguous (out, in).
    weight is float32, bfloat16 or float16 (no scale), widened to float32 as it is read, or
    int8 with a float32 scale (out,) per output. None where the kernel can't serve (other
    dtypes or layouts, more rows, a gradient wanted, no compiler)."""
    code = _GELU.get(gelu, -1)
    module = _module if _module is not None else _extension()
    if module is None or code < 0:
        return None
    return module.gemv(x, weight, bias, code, scale)


def tracing() -> bool:
    """Whether a tracer is recording the model (torch.onnx.export, torch.export, torch.jit.trace,
    torch.compile): our kernels are opaque to it, and a graph recorded through them would hold
    constants where the computation should be, so the model then takes plain torch ops. (ONNX's
    exporters trace through one of these: TorchScript's through the jit tracer, dynamo's through
    torch.export. Each check is a flag read, 0.1 us: a decode step makes 60.)"""
    return torch.compiler.is_exporting() or torch.compiler.is_compiling() or torch.jit.is_tracing()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor | None:
    """softmax(q k^T / sqrt(d)) v for one new position per row, decoding on the CPU: q (B, H, 1, d),
    k and v (B, H, S, d) float32, each key's d values contiguous (views of the KV cache); row b
    sees its first seen[b] keys (int64 (B,), 1 to S; all S without it). None where the kernel
    can't serve (other dtypes or layouts, a gradient wanted, no compiler)."""
    module = _module if _module is not None else _extension()
    return None if module is None else module.attend(q, k, v, seen)


# ------------------------------------------------------------------ the CPU linear dispatch

# Decoding on the CPU reads every weight once per token, so its speed is the rate at which the
# weights stream from memory. At one to a few rows, the matrix-vector product behind `x @ w` runs
# on one thread; the kernel above streams at the machine's bandwidth. oneDNN's linear (in every
# x86 CPU build of torch) is its fallback where it cannot be built, and the path for many rows (a
# prompt, evaluation's windows), where it runs about 20% faster than addmm on this machine
# (benchmarks/RESULTS.md). Neither computes gradients, so only inference takes these paths;
# training runs addmm.
_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_FEW_ROWS = 16  # up to this many rows, the decode kernel


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    gelu: str | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight + bias, with weight (in, out), then GELU if `gelu` names its form
    ("tanh" or "none", as F.gelu's `approximate`). (..., in) -> (..., out).

    A weight narrower than x (weight-only bfloat16, float16, or int8 times `scale`, one per
    output) is read as is by the decode kernel at few rows; for many it is widened first.
    """
    cpu_inference = (
        x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled() and not tracing()
    )
    if cpu_inference and x.numel() <= _FEW_ROWS * x.size(-1):
        y = gemv(x, weight, bias, gelu, scale)  # None where the kernel cannot serve
        if y is not None:
            return y
    if weight.dtype != x.dtype:
        weight = widen(weight, scale, x.dtype)
    if cpu_inference and _onednn_linear is not None:
        return _onednn(x, weight, bias, gelu)
    if bias is None:
        y = x @ weight
    else:  # the bias added inside the matrix product, not in a second pass over the output
        y = torch.addmm(bias, x.reshape(-1, x.size(-1)), weight).view(*x.shape[:-1], weight.size(-1))
    return y if gelu is None else F.gelu(y, approximate=gelu)


def onednn_rows(rows: int) -> int:
    """The rows oneDNN is given for `rows`: rounded up to one of eight sizes in each doubling
    (at most 1/8 more rows; 40 sizes from 17 to 512). oneDNN builds a kernel for each shape it
    is given and keeps up to 1,024 of them, so a server meeting prompts of every length grew by
    170 MB before that bound (benchmarks/load.py); a few sizes are built once, early."""
    step = 1 << max(rows.bit_length() - 4, 0)
    return -(-rows // step) * step


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gelu: str | None) -> torch.Tensor:
    """oneDNN's linear over x's rows padded with zeros to `onednn_rows` (their products dropped)."""
    rows, k = x.numel() // x.size(-1), x.size(-1)
    flat = x.reshape(rows, k)
    padded = onednn_rows(rows)
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, k)])
    # takes weight as (out, in): a view, no copy; applies the GELU in the same pass
    y = _onednn_linear(flat, weight.t(), bias, "none" if gelu is None else "gelu", [], gelu or "")
    return y[:rows].view(*x.shape[:-1], y.size(-1))


def widen(weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """A narrow weight in `dtype`: int8 times its scale per output (the last dimension)."""
    return weight.to(dtype) if scale is None else weight.to(dtype) * scale.to(dtype)


def quantize_int8(weight: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per output channel, the slices along `dim` (0 for
    a Dense's (in, out) weight, 1 for wte's (V, C) rows): weight ~ q * scale, |q| <= 127."""
    scale = weight.float().abs().amax(dim) / 127  # (out,)
    shape = (1, -1) if dim == 0 else (-1, 1)
    q = torch.round(weight.float() / scale.clamp(min=torch.finfo(torch.float32).tiny).view(shape)).clamp(-127, 127)
    return q.to(torch.int8), scale


def stored_matrix(
    weight: torch.Tensor, storage: torch.dtype, device: torch.device, dense: bool, weight_only: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A checkpoint's matrix as `linear` reads it, and its int8 scale (None unless `storage` is
    int8): a Dense layer's weight (in, out) (`dense`), or wte (V, C), in `storage` on `device`.
    A weight-only (narrow CPU) Dense weight is stored (out, in) and seen (in, out): the decode
    kernel reads narrow weights fastest as one contiguous row per output, as wte's rows already
    are for the unembedding. Copies only when the device, dtype or layout must change."""
    scale = None
    if storage == torch.int8:
        weight, scale = quantize_int8(weight.to(device), dim=0 if dense else 1)
    weight = weight.to(device=device, dtype=storage)
    return (weight.t().contiguous().t() if dense and weight_only else weight.contiguous()), scale


def main() -> int:
    """`python -m gpt2.generation.kernels`: have the kernel ready now, as `make demo` and `make test` do at set-up."""
    if os.environ.get("GPT2_GEMV", "1") == "0":
        print("decode kernel: turned off (GPT2_GEMV=0)")
        return 0
    directory = cache_dir()
    built = _library(directory).exists()
    started = time.monotonic()
    if _extension() is None:
        print("decode kernel: not available here; decoding on the CPU uses oneDNN instead (slower, as exact)")
    elif built:
        print(f"decode kernel: ready ({directory})")
    else:
        print(f"decode kernel: compiled in {time.monotonic() - started:.0f} s ({directory})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

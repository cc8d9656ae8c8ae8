"""The CPU gemv kernel (gpt2._gemv) against float64, and its refusals.

Its first use compiles a C++ extension (about 30 s here, then cached); where that cannot be
built, gemv returns None and the tests that need its answers are skipped.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch
import torch.nn.functional as F

from gpt2 import _gemv
from gpt2._gemv import gemv

C, V = 768, 50257
BLOCK_SHAPES = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # c_attn, attn c_proj, c_fc, mlp c_proj


@pytest.fixture(scope="module")
def kernel():
    if _gemv._extension() is None:
        pytest.skip("the gemv extension could not be built here")


def reference(x, w, b, gelu):
    y = x.double() @ w.double()
    y = y if b is None else y + b.double()
    return y if gelu is None else F.gelu(y, approximate=gelu)


def rel_err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


def weight(k, n, transposed, g):
    """(k, n): contiguous, or the transpose of a contiguous (n, k) as wte.t() is."""
    w = torch.randn(n, k, generator=g).t() if transposed else torch.randn(k, n, generator=g)
    assert w.is_contiguous() != transposed or k == 1 or n == 1
    return w * 0.02


@pytest.mark.parametrize("gelu", [None, "tanh", "none"])
@pytest.mark.parametrize("transposed", [False, True], ids=["in_out", "out_in_t"])
@pytest.mark.parametrize("k,n", BLOCK_SHAPES)
def test_block_shapes_match_float64(kernel, k, n, transposed, gelu):
    g = torch.Generator().manual_seed(k * n + transposed)
    w, b = weight(k, n, transposed, g), torch.randn(n, generator=g) * 0.02
    for rows in range(1, 17):
        x = torch.randn(rows, k, generator=g)
        y = gemv(x, w, b, gelu)
        assert y is not None and y.shape == (rows, n) and y.dtype == torch.float32
        assert rel_err(y, reference(x, w, b, gelu)) < 1e-5, rows


@pytest.mark.parametrize("transposed", [True, False], ids=["wte_t", "in_out"])
def test_unembedding_matches_float64(kernel, transposed):
    g = torch.Generator().manual_seed(1)
    w = weight(C, V, transposed, g)
    x = torch.randn(16, C, generator=g)
    for b in (None, torch.randn(V, generator=g)):
        ref = reference(x, w, b, None)  # rows are independent: the first `rows` rows of it
        for rows in range(1, 17):
            y = gemv(x[:rows], w, b, None)
            assert y is not None and y.shape == (rows, V)
            assert rel_err(y, ref[:rows]) < 1e-5, rows


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("k,n", [(1, 1), (3, 5), (13, 7), (17, 130), (1030, 9)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_odd_sizes_and_thread_counts(kernel, k, n, transposed, threads):
    """Sizes that leave remainders after the four-at-a-time loops and the threads' bands."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(k + n)
        w, b = weight(k, n, transposed, g), torch.randn(n, generator=g)
        for rows in (1, 2, 5, 16):
            x = torch.randn(rows, k, generator=g)
            for gelu in (None, "tanh"):
                assert rel_err(gemv(x, w, b, gelu), reference(x, w, b, gelu)) < 1e-5
    finally:
        torch.set_num_threads(before)


def test_leading_dims_and_views(kernel):
    g = torch.Generator().manual_seed(2)
    w, b = weight(C, 3 * C, False, g), torch.randn(3 * C, generator=g)
    for shape in [(C,), (1, 1, C), (2, 8, C), (4, 2, 2, C)]:
        x = torch.randn(shape, generator=g)
        y = gemv(x, w, b, None)
        assert y.shape == (*shape[:-1], 3 * C)
        assert rel_err(y, reference(x, w, b, None)) < 1e-5
    x = torch.randn(C, 4, generator=g).t()  # a non-contiguous x: copied, still right
    assert rel_err(gemv(x, w, b, "tanh"), reference(x, w, b, "tanh")) < 1e-5
    big = torch.randn(2 * C, 3 * C, generator=g)
    w_view = big[C:]  # a contiguous view at an offset into its storage
    assert rel_err(gemv(x, w_view, None, None), reference(x, w_view, None, None)) < 1e-5


def test_unsupported_inputs_return_none():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(1, C, generator=g), torch.randn(C, C, generator=g), torch.randn(C, generator=g)
    assert gemv(x.half(), w.half(), b.half(), None) is None
    assert gemv(x.double(), w.double(), b.double(), None) is None
    assert gemv(x.bfloat16(), w, b, None) is None
    assert gemv(torch.randn(17, C, generator=g), w, b, None) is None  # more than 16 rows
    assert gemv(torch.randn(3, 6, C, generator=g), w, b, None) is None  # 18 rows in all
    assert gemv(torch.randn(0, C), w, b, None) is None
    wide = torch.randn(C, 2 * C, generator=g)
    assert gemv(x, wide[:, ::2], b, None) is None  # strided: neither layout
    assert gemv(x, torch.randn(C, C, 2, generator=g)[..., 0], b, None) is None  # rows of stride 2C, columns 2
    assert gemv(x, w, torch.randn(2 * C, generator=g)[::2], None) is None  # non-contiguous bias
    assert gemv(x, w, b.double(), None) is None
    assert gemv(x, w, torch.randn(C + 1), None) is None
    assert gemv(torch.randn(1, C + 1), w, b, None) is None  # in-features disagree
    assert gemv(x, w, b, "relu") is None
    with torch.enable_grad():
        assert gemv(x, w.clone().requires_grad_(), b, None) is None  # would lose the gradient


def test_build_failure_returns_none_and_warns_once(monkeypatch, caplog):
    import torch.utils.cpp_extension as cpp_extension

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.setattr(cpp_extension, "load_inline", broken)
    monkeypatch.setattr(_gemv, "_module", None)
    monkeypatch.setattr(_gemv, "_failed", False)
    x, w = torch.randn(1, 8), torch.randn(8, 8)
    with caplog.at_level(logging.WARNING, logger="gpt2._gemv"):
        assert gemv(x, w, None, None) is None
        assert gemv(x, w, None, "tanh") is None
    assert len(calls) == 1  # the failure is remembered
    records = [r for r in caplog.records if r.name == "gpt2._gemv"]
    assert len(records) == 1 and "\n" not in records[0].getMessage()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(_gemv, "_module", None)
    monkeypatch.setattr(_gemv, "_failed", False)
    monkeypatch.setenv("GPT2_GEMV", "0")
    assert gemv(torch.randn(1, 8), torch.randn(8, 8), None, None) is None


def test_stale_build_lock_is_cleared(tmp_path, monkeypatch):
    """A build killed midway leaves torch's lock file; later processes must not wait forever."""
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = os.path.join(_get_build_directory("gpt2_gemv_test", verbose=False), "lock")
    open(lock, "w").close()
    _gemv._clear_stale_lock("gpt2_gemv_test")
    assert os.path.exists(lock)  # fresh: another process may be building
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    _gemv._clear_stale_lock("gpt2_gemv_test")
    assert not os.path.exists(lock)

"""The CPU gemv kernel (gpt2.generation.kernels) against float64, and its refusals; the model's linear
layer that dispatches to it (or to oneDNN, or to addmm) and its int8 quantisation.

Its first use compiles a C++ extension (about 50 s here, then cached; `make test` builds it
at set-up); where that cannot be built, gemv returns None and the tests that need its answers
are skipped. The tests of building, caching and locking use a fake compiler.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import make_hf_model

from gpt2.generation import kernels
from gpt2.generation.kernels import gemv, linear, quantize_int8
from gpt2.model.model import GPT2

C, V = 768, 50257
BLOCK_SHAPES = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)]  # c_attn, attn c_proj, c_fc, mlp c_proj


@pytest.fixture(scope="module")
def kernel():
    if kernels._extension() is None:
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


def narrow(w: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """w in a narrow dtype, in the same layout, and its scale per output (int8: symmetric, per column)."""
    rows_out = not w.is_contiguous()  # the transpose of a contiguous (n, k)
    if dtype != torch.int8:
        return (w.t().contiguous().to(dtype).t() if rows_out else w.to(dtype)), None
    scale = w.abs().amax(0).clamp(min=1e-12) / 127  # (n,)
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return (q.t().contiguous().t() if rows_out else q.contiguous()), scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8], ids=["bf16", "f16", "int8"])
@pytest.mark.parametrize("transposed", [False, True], ids=["in_out", "out_in_t"])
@pytest.mark.parametrize("k,n", [(C, 4 * C), (4 * C, C), (13, 7), (1030, 9)])
def test_narrow_weights_widen_to_float32_exactly(kernel, k, n, transposed, dtype):
    """bfloat16, float16 and int8 weights (with a scale per output) give x @ w as float64 gives
    it for the same narrow values: the narrowing is the caller's, the product exact to float32."""
    g = torch.Generator().manual_seed(k + n + transposed)
    w, scale = narrow(weight(k, n, transposed, g), dtype)
    assert w.is_contiguous() != transposed or n == 1
    widened = w.double() * (1 if scale is None else scale.double())
    b = torch.randn(n, generator=g)
    for rows in (1, 2, 3, 5, 8, 16):
        x = torch.randn(rows, k, generator=g)
        for gelu in (None, "tanh"):
            y = gemv(x, w, b, gelu, scale)
            assert y is not None and y.dtype == torch.float32 and y.shape == (rows, n)
            assert rel_err(y, reference(x, widened, b, gelu)) < 1e-5


def test_int8_needs_its_scale_and_only_int8_takes_one():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(1, C, generator=g), torch.randn(C, C, generator=g)
    q, scale = narrow(w, torch.int8)
    assert gemv(x, q, None, None) is None  # no scale: the values alone mean nothing
    assert gemv(x, q, None, None, scale.double()) is None
    assert gemv(x, q, None, None, scale[:-1]) is None
    assert gemv(x, w, None, None, scale) is None  # a float32 weight takes no scale
    assert gemv(x, w.bfloat16(), None, None, scale) is None


def test_unsupported_inputs_return_none():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(1, C, generator=g), torch.randn(C, C, generator=g), torch.randn(C, generator=g)
    assert gemv(x.half(), w.half(), b.half(), None) is None  # x is float32, whatever the weight
    assert gemv(x.double(), w.double(), b.double(), None) is None
    assert gemv(x, w.double(), b, None) is None
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


# ------------------------------------------------------------------ linear: the dispatch the model runs


@pytest.mark.parametrize("path", ["kernel", "onednn", "addmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8], ids=["f32", "bf16", "int8"])
def test_linear_gives_the_product_of_the_widened_weight_on_every_path(path, dtype, monkeypatch):
    """The kernel at few rows, oneDNN for many (and where the kernel cannot serve), addmm where
    neither is: each gives x @ w + b (then GELU) as float64 gives it for the widened weight."""
    if path != "kernel":
        monkeypatch.setattr(kernels, "gemv", lambda *args: None)
    if path == "addmm":
        monkeypatch.setattr(kernels, "_onednn_linear", None)
    g = torch.Generator().manual_seed(1)
    w, scale = narrow(weight(64, 48, False, g), dtype) if dtype != torch.float32 else (weight(64, 48, False, g), None)
    widened = w.double() * (1 if scale is None else scale.double())
    b = torch.randn(48, generator=g)
    with torch.no_grad():
        for rows in (1, 16, 40):
            x = torch.randn(rows, 64, generator=g)
            for gelu in (None, "tanh", "none"):
                assert rel_err(linear(x, w, b, gelu, scale), reference(x, widened, b, gelu)) < 1e-5


def test_onednn_gets_rows_in_a_few_sizes_at_most_an_eighth_more():
    """oneDNN keeps a kernel for each shape it is given: rows are padded to eight sizes in each
    doubling, never fewer than given and never more than 1/8 more."""
    for rows in range(1, 8193):
        assert rows <= kernels.onednn_rows(rows) <= rows * 9 / 8
    assert (
        len({kernels.onednn_rows(rows) for rows in range(17, 513)}) == 40
    )  # a server's prompts, within 512 tokens a step


def test_quantize_int8_keeps_one_scale_per_output():
    """A Dense weight (in, out) is scaled per column, wte (V, C) per row: as the test's own quantiser."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(40, 24, generator=g)
    q, scale = quantize_int8(w, dim=0)
    expected_q, expected_scale = narrow(w, torch.int8)
    assert q.dtype == torch.int8 and torch.equal(q, expected_q) and torch.allclose(scale, expected_scale)
    q_rows, row_scale = quantize_int8(w.t(), dim=1)
    assert torch.equal(q_rows, q.t()) and torch.allclose(row_scale, scale)
    assert (w - q.float() * scale).abs().max() <= scale.max() / 2 + 1e-7  # off by at most half a step


@pytest.mark.parametrize("path", ["onednn", "matmul"])
def test_decoding_without_the_compiled_kernel_equals_transformers(tmp_path, monkeypatch, path):
    # where the kernel cannot be built, decoding falls back to oneDNN, or to plain matmuls
    monkeypatch.setattr(kernels, "gemv", lambda *args: None)
    if path == "matmul":
        monkeypatch.setattr(kernels, "_onednn_linear", None)
    hf = make_hf_model(vocab_size=101, n_positions=96, n_embd=48, n_layer=3, n_head=3)
    hf.save_pretrained(tmp_path)
    ours = GPT2.from_pretrained(tmp_path, device="cpu")
    idx = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(5))
    expected = hf.generate(
        idx,
        max_new_tokens=40,
        do_sample=False,
        attention_mask=torch.ones_like(idx),
        pad_token_id=hf.config.eos_token_id,
    )
    assert torch.equal(ours.generate(idx, 40, temperature=0), expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_narrow_weights_without_the_decode_kernel_widen_and_decode_alike(dtype, tmp_path, monkeypatch):
    """Where the kernel cannot be built (it then says so once), narrow weights still decode:
    widened for each product, slower, the same tokens."""
    make_hf_model(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3).save_pretrained(tmp_path)
    model = GPT2.from_pretrained(tmp_path, device="cpu", dtype=dtype)
    idx = torch.randint(0, 101, (2, 5))
    with_kernel = model.generate(idx, 12, temperature=0)
    monkeypatch.setattr(kernels, "gemv", lambda *args: None)
    assert torch.equal(model.generate(idx, 12, temperature=0), with_kernel)


# ------------------------------------------------------------------ attention


def attention_float64(q, k, v):
    scores = (q.double() @ k.double().transpose(-1, -2)) / q.size(-1) ** 0.5  # (B, H, 1, S)
    return torch.softmax(scores, dim=-1) @ v.double()


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("S", [1, 7, 8, 9, 80, 1000])
def test_attend_matches_float64_over_a_kv_cache(kernel, B, S):
    """One query per row over the first S positions of a preallocated cache (views, as decoding
    passes them), q a view into c_attn's output: scores eight keys at a time, then the rest."""
    g = torch.Generator().manual_seed(B * S)
    H, D = 12, 64
    keys, values = torch.randn(4, H, 1024, D, generator=g), torch.randn(4, H, 1024, D, generator=g)
    qkv = torch.randn(B, 1, 3 * H * D, generator=g) * 2
    q = qkv[..., : H * D].view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D), not contiguous
    k, v = keys[:B, :, :S], values[:B, :, :S]
    y = kernels.attend(q, k, v)
    assert y is not None and y.shape == (B, H, 1, D) and y.dtype == torch.float32
    assert rel_err(y, attention_float64(q, k, v)) < 1e-5


def test_attend_rows_of_different_lengths_see_their_own_keys(kernel):
    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(4, 3, 64, 16, generator=g), torch.randn(4, 3, 64, 16, generator=g)
    q = torch.randn(4, 3, 1, 16, generator=g)
    seen = torch.tensor([1, 9, 30, 17])
    y = kernels.attend(q, keys[:, :, :30], values[:, :, :30], seen)
    assert y is not None
    for b, n in enumerate(seen.tolist()):  # each row alone, over its own first n keys
        assert (
            rel_err(y[b], attention_float64(q[b : b + 1], keys[b : b + 1, :, :n], values[b : b + 1, :, :n])[0]) < 1e-5
        )
    for bad in (
        torch.tensor([1, 9, 31, 17]),
        torch.tensor([0, 9, 30, 17]),
        torch.tensor([1, 9, 30]),
        seen.int(),
        seen.double(),
    ):
        assert kernels.attend(q, keys[:, :, :30], values[:, :, :30], bad) is None  # out of 1..S, or not (B,) int64


def test_attend_refuses_what_it_does_not_serve(kernel):
    g = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(1, 2, 1, 8, generator=g),
        torch.randn(1, 2, 5, 8, generator=g),
        torch.randn(1, 2, 5, 8, generator=g),
    )
    assert rel_err(kernels.attend(q, k, v), attention_float64(q, k, v)) < 1e-5
    assert kernels.attend(torch.randn(1, 2, 3, 8), k, v) is None  # more than one query: torch's attention
    assert kernels.attend(q.double(), k.double(), v.double()) is None
    assert kernels.attend(q, k, v[:, :, :4]) is None  # keys and values disagree
    assert kernels.attend(q, torch.randn(1, 2, 8, 5).transpose(2, 3), v) is None  # a key's values not contiguous
    assert kernels.attend(q, torch.randn(1, 2, 5, 16)[..., :8], v) is None  # keys not D apart
    assert kernels.attend(q[..., :0], k[..., :0], v[..., :0]) is None
    with torch.enable_grad():
        assert kernels.attend(q.clone().requires_grad_(), k, v) is None  # would lose the gradient


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No kernel loaded yet, an empty extensions root, and a fake load_inline that "compiles" at once:
    it writes the library file torch would and returns a stand-in module. Returns its calls."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(kernels, "_failed", False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.delenv("GPT2_GEMV", raising=False)
    calls = []

    def fake_load_inline(name, build_directory, **kwargs):
        calls.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"a library")
        return types.SimpleNamespace(name=name, built=True)

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    monkeypatch.setattr(kernels, "_import", lambda library: types.SimpleNamespace(name=library.stem, built=False))
    return calls


def test_a_build_says_so_first_and_later_processes_load_it(fresh, capsys):
    module = kernels._extension()
    directory = kernels.cache_dir()
    assert module.built and fresh == [directory.name]
    assert (directory / f"{directory.name}.so").read_bytes() == b"a library"
    assert not list(directory.glob("build-*"))  # the build's own directory is gone
    err = capsys.readouterr().err
    assert err.startswith("gpt2: compiling the decode kernel, once, about ") and str(directory) in err
    kernels._module = None  # a later process: loads what is there, builds nothing, says nothing
    assert not kernels._extension().built and len(fresh) == 1
    assert capsys.readouterr().err == ""


def test_a_build_is_announced_whatever_the_cache_holds(fresh, capsys):
    """Kernels of other builds in the cache do not hide that this one compiles."""
    kernels._extension()
    capsys.readouterr()
    kernels._module = None
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "_SOURCE", kernels._SOURCE + "// a new version of the source\n")
        kernels._extension()
    assert len(fresh) == 2 and fresh[0] != fresh[1]
    assert "compiling the decode kernel, once" in capsys.readouterr().err


@pytest.mark.parametrize("change", ["source", "flags", "python", "torch", "compiler"])
def test_each_environment_has_a_kernel_of_its_own(fresh, monkeypatch, change):
    before = kernels.cache_dir()
    if change == "source":
        monkeypatch.setattr(kernels, "_SOURCE", kernels._SOURCE + " ")
    elif change == "flags":
        monkeypatch.setattr(kernels, "_CFLAGS", (*kernels._CFLAGS, "-g"))
    elif change == "python":
        monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    elif change == "torch":
        monkeypatch.setattr(torch, "__version__", "2.0.0+another")
    else:
        monkeypatch.setattr(kernels, "_compiler", lambda: "/usr/bin/g++-99\ng++ 99.1")
    after = kernels.cache_dir()
    assert after != before and after.parent == before.parent


def test_a_kernel_from_another_environment_is_not_loaded(fresh, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "2.0.0+another")
        other = kernels.cache_dir()
    other.mkdir(parents=True)
    (other / f"{other.name}.so").write_bytes(b"built against another torch")
    module = kernels._extension()
    assert module.built and module.name == kernels.cache_dir().name != other.name


def hold_lock(directory: Path, started: float, release_on: Path | None = None) -> subprocess.Popen:
    """Another process that takes the build lock, writes its pid and `started` into it, then
    sleeps (or, once the file `release_on` exists, writes the library and exits: 120 s at most);
    returns once it holds the lock."""
    code = f"""
import fcntl, os, signal, sys, time
from pathlib import Path
for killer in (signal.SIGTERM, signal.SIGHUP):  # as a build has them, even under nohup (which ignores SIGHUP)
    signal.signal(killer, signal.SIG_DFL)
directory = Path({str(directory)!r})
fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{{os.getpid()}} {started}".encode())
print("holding", flush=True)
release_on, deadline = {None if release_on is None else str(release_on)!r}, time.monotonic() + 120
if release_on is None:
    time.sleep(600)
while not os.path.exists(release_on) and time.monotonic() < deadline:
    time.sleep(0.01)
(directory / (directory.name + ".so")).write_bytes(b"built by the other process")
"""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout.readline() == b"holding\n"
    return process


def test_a_lock_left_by_a_killed_build_does_not_block(fresh, capsys):
    directory = kernels.cache_dir()
    directory.mkdir(parents=True)
    for signal_number in (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP):
        holder = hold_lock(directory, started=time.time())
        os.killpg(holder.pid, signal_number)
        holder.wait(timeout=30)
        assert f"{holder.pid} " in (directory / "lock").read_text()  # the file stays, with a dead pid in it
    start = time.monotonic()
    module = kernels._extension()
    assert module.built and time.monotonic() - start < 60  # built at once, never waited on (a wait lasts minutes)
    assert "waiting" not in capsys.readouterr().err


def test_a_build_stuck_for_longer_than_a_build_takes_is_not_waited_on(fresh, capsys):
    directory = kernels.cache_dir()
    directory.mkdir(parents=True)
    holder = hold_lock(directory, started=time.time() - 2 * kernels._BUILD_LIMIT)  # alive, but for 20 minutes
    try:
        start = time.monotonic()
        assert kernels._extension().built and time.monotonic() - start < 60  # not the holder's 10 minutes
        assert f"process {holder.pid} has held the decode kernel's build lock for over" in capsys.readouterr().err
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)


def test_a_build_under_way_is_waited_for_and_then_loaded(fresh, capsys, monkeypatch):
    directory = kernels.cache_dir()
    directory.mkdir(parents=True)
    holder = hold_lock(directory, started=time.time(), release_on=directory / "go")
    note = kernels._note

    def noted(message: str) -> None:  # the other build ends once this process waits for it, not after a guessed time
        note(message)
        if message.startswith("waiting for process"):
            (directory / "go").touch()

    monkeypatch.setattr(kernels, "_note", noted)
    module = kernels._extension()
    holder.wait(timeout=120)
    assert not module.built and fresh == []  # loaded what the other process built
    assert f"waiting for process {holder.pid}, which is compiling the decode kernel" in capsys.readouterr().err


COMPILERS = ("cc1plus", "clang", "clang++")  # the compiler proper, under g++ or clang


def compiling(session: int) -> bool:
    """Whether the C++ compiler runs in the process session `session`."""
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and os.getsid(int(entry.name)) == session
                and (entry / "comm").read_text().strip() in COMPILERS
            ):
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def test_a_real_build_killed_midway_leaves_no_lock_and_no_library(tmp_path):
    """`python -m gpt2.generation.kernels` (make's set-up step) stopped by SIGTERM while it compiles."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    env.pop("GPT2_GEMV", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpt2.generation.kernels"], stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    line = process.stderr.readline().decode()
    deadline = time.monotonic() + 120
    while not compiling(process.pid):  # the compiler is running (its process, in the command's session)
        assert time.monotonic() < deadline and process.poll() is None, "the compiler never started"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    assert line.startswith("gpt2: compiling the decode kernel, once, about ")
    (directory,) = tmp_path.iterdir()
    assert not (directory / f"{directory.name}.so").exists()
    fcntl = pytest.importorskip("fcntl")
    fd = os.open(directory / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: raises BlockingIOError if anyone held it
    finally:
        os.close(fd)


def test_build_failure_returns_none_and_says_so_once(fresh, monkeypatch, capsys):
    import torch.utils.cpp_extension as cpp_extension

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.setattr(cpp_extension, "load_inline", broken)
    x, w = torch.randn(1, 8), torch.randn(8, 8)
    assert gemv(x, w, None, None) is None
    assert gemv(x, w, None, "tanh") is None
    assert len(calls) == 1  # the failure is remembered
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("gpt2: compiling the decode kernel")
    assert lines[1] == (
        "gpt2: the decode kernel is unavailable, decoding uses oneDNN instead "
        "(Ninja is required to load C++ extensions)"
    )


def test_disabled_by_environment(fresh, monkeypatch):
    monkeypatch.setenv("GPT2_GEMV", "0")
    assert gemv(torch.randn(1, 8), torch.randn(8, 8), None, None) is None
    assert fresh == []


def test_setup_step_says_what_it_did(fresh, capsys):
    kernels.main()
    assert capsys.readouterr().out.startswith("decode kernel: compiled in ")
    kernels._module = None
    kernels.main()
    assert capsys.readouterr().out == f"decode kernel: ready ({kernels.cache_dir()})\n"

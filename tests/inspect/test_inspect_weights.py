"""Weight space (gpt2.inspect.weights) against TransformerLens on the same weights: its
HookedTransformer's W_Q ... b_U, QK and OV, its FactoredMatrix, its all_composition_scores, and its
weight processing (load_and_process_state_dict): the processed model's logits and activations, and
its per-head direct logit attribution."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from helpers import make_hf_model, nanogpt_model, ours_from_hf, transformer_lens_from_hf
from torch.overrides import TorchFunctionMode

from gpt2 import GPT2Config, GPT2Error
from gpt2.errors import InputTypeError, InvalidArgumentError
from gpt2.inspect.circuits import logit_attribution
from gpt2.inspect.tracing import trace
from gpt2.inspect.weights import (
    FactoredMatrix,
    ProcessedGPT2,
    Weights,
    composition_scores,
    full_ov_circuit,
    full_qk_circuit,
    process_weights,
)
from gpt2.model.model import GPT2

CONFIG = dict(vocab_size=97, n_positions=32, n_embd=48, n_layer=3, n_head=4)
OPTIONS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
NAMES = "W_E W_pos W_Q W_K W_V W_O b_Q b_K b_V b_O W_in b_in W_out b_out W_U b_U".split()
IDS = torch.randint(0, CONFIG["vocab_size"], (12,), generator=torch.Generator().manual_seed(0)).tolist()


def make_models(directory, seed: int, ln_f_bias: bool = True):
    """(transformers' model, gpt2's) on the same random weights, every bias nonzero: transformers
    starts the linear layers' biases at 0, and b_V is what fold_value_biases moves. Without
    `ln_f_bias`, ln_f's bias is 0 (so folding it leaves the unembedding without a bias)."""
    hf = make_hf_model(seed, **CONFIG)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias") and ".ln_" not in name:
                p.add_(torch.randn_like(p) * 0.1)
        if not ln_f_bias:
            hf.transformer.ln_f.bias.zero_()
    return hf, ours_from_hf(hf, directory)


def lens(hf, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformer_lens_from_hf(hf, **options)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("weights"), seed=1)


@pytest.fixture(scope="module")
def biasless(tmp_path_factory):
    """A model without biases, with sinusoidal positions, and transformers' model loaded from its
    save_pretrained (zero biases, the fixed table as wpe), on which TransformerLens is built."""
    from transformers import GPT2LMHeadModel

    model = nanogpt_model(seed=2)
    directory = tmp_path_factory.mktemp("biasless")
    model.save_pretrained(directory)
    return GPT2LMHeadModel.from_pretrained(directory).eval(), model


# ------------------------------------------------------------------ the weights


@pytest.mark.parametrize("which", ["models", "biasless"])
def test_the_weights_are_transformer_lens_weights_name_for_name(which, request):
    hf, ours = request.getfixturevalue(which)
    tl, w = lens(hf), Weights(ours)
    for name in NAMES:
        torch.testing.assert_close(getattr(w, name), getattr(tl, name).detach(), rtol=0, atol=0, msg=name)
    if which == "biasless":  # zeros where the model has no bias, as TransformerLens fills them in
        assert all(not getattr(w, name).any() for name in NAMES if name.startswith("b_"))


def test_each_access_is_a_fresh_tensor_writing_to_which_changes_nothing(models):
    _, ours = models
    w = Weights(ours)
    before = {name: p.clone() for name, p in ours.state_dict().items()}
    for name in NAMES:
        first = getattr(w, name)
        assert not first.requires_grad
        first.add_(1.0)
        assert not torch.equal(first, getattr(w, name)), name
    assert all(torch.equal(before[name], p) for name, p in ours.state_dict().items())


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_narrow_weights_are_read_widened_as_the_model_computes_with_them(tmp_path, models, dtype):
    hf, _ = models
    hf.save_pretrained(tmp_path)
    narrow = GPT2.from_pretrained(tmp_path, device="cpu", dtype=dtype)
    assert narrow.transformer.h[0].attn.c_attn.weight.dtype != torch.float32  # stored narrow
    w, C = Weights(narrow), CONFIG["n_embd"]
    eye = torch.eye(C)
    with torch.no_grad():  # the model's own layers applied to the basis: their matrices, as its kernels widen them
        attn, mlp = narrow.transformer.h[1].attn, narrow.transformer.h[1].mlp
        c_attn = attn.c_attn(eye) - attn.c_attn.bias  # (C, 3C)
        c_fc = mlp.c_fc(eye) - mlp.c_fc.bias
        unembedding = narrow.unembed(eye)  # (C, V)
        embedding = narrow.embed(torch.arange(CONFIG["vocab_size"])[None])[0]
    W_Q = w.W_Q[1]  # (H, C, d)
    torch.testing.assert_close(W_Q.transpose(0, 1).reshape(C, C), c_attn[:, :C], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.W_in[1], c_fc, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.W_U, unembedding, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.W_E, embedding, rtol=0, atol=0)
    assert w.W_Q.dtype == torch.float32
    processed = process_weights(narrow, center_unembed=False)  # the logits unchanged, in float32 now
    ids = torch.tensor([IDS])
    with torch.no_grad():
        torch.testing.assert_close(processed(ids), narrow(ids), rtol=1e-4, atol=1e-4)
    assert processed.dtype == torch.float32


# ------------------------------------------------------------------ FactoredMatrix


def tl_factored(A, B):
    from transformer_lens import FactoredMatrix as TLFactoredMatrix

    return TLFactoredMatrix(A, B)


def assert_same_eigenvalues(ours: torch.Tensor, theirs: torch.Tensor, atol: float) -> None:
    """The same multiset of complex numbers, in any order: each of ours near one of theirs and back."""
    distance = (ours.reshape(-1, ours.size(-1))[:, :, None] - theirs.reshape(-1, theirs.size(-1))[:, None, :]).abs()
    assert distance.amin(-1).max() < atol and distance.amin(-2).max() < atol, (ours, theirs)


def assert_same_vectors(ours: torch.Tensor, theirs: torch.Tensor, atol: float = 1e-5) -> None:
    """Singular vectors (columns) equal up to each one's sign."""
    sign = torch.sign((ours * theirs).sum(-2, keepdim=True))
    torch.testing.assert_close(ours * sign, theirs, rtol=0, atol=atol)


def test_a_factored_matrix_is_transformer_lens_s_and_the_dense_product():
    generator = torch.Generator().manual_seed(0)
    A, B = torch.randn(2, 3, 20, 5, generator=generator), torch.randn(3, 5, 20, generator=generator)  # B broadcasts
    M, theirs = FactoredMatrix(A, B), tl_factored(A, B)
    dense = A @ B  # (2, 3, 20, 20)
    assert M.shape == theirs.shape == dense.shape and M.ndim == 4
    torch.testing.assert_close(M.AB, dense)
    U, S, Vh = M.svd()
    assert U.shape == (2, 3, 20, 5) and S.shape == (2, 3, 5) and Vh.shape == (2, 3, 5, 20)
    torch.testing.assert_close(S, theirs.S, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, torch.linalg.svdvals(dense)[..., :5], rtol=1e-5, atol=1e-5)
    assert_same_vectors(U, theirs.U)
    assert_same_vectors(Vh.mT, theirs.svd()[2])  # TransformerLens's svd gives V, ours Vh = V^T
    torch.testing.assert_close(U @ torch.diag_embed(S) @ Vh, dense, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(M.norm(), theirs.norm(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(M.norm(), torch.linalg.matrix_norm(dense), rtol=1e-5, atol=1e-5)
    assert_same_eigenvalues(M.eigenvalues, theirs.eigenvalues, atol=1e-4)
    dense_eigenvalues = torch.linalg.eigvals(dense)  # 20 of them: the 5 of B A and 15 zeros
    top = dense_eigenvalues.gather(-1, dense_eigenvalues.abs().argsort(-1, descending=True)[..., :5])
    assert_same_eigenvalues(M.eigenvalues[0, 0], top[0, 0], atol=1e-4)
    torch.testing.assert_close(M.T.AB, dense.mT)
    torch.testing.assert_close(M[1, 2].AB, dense[1, 2])
    torch.testing.assert_close(M[:, 1].AB, dense[:, 1])


def test_multiplying_a_factored_matrix_keeps_it_factored():
    generator = torch.Generator().manual_seed(1)
    A, B = torch.randn(30, 4, generator=generator), torch.randn(4, 30, generator=generator)
    X, v = torch.randn(30, 7, generator=generator), torch.randn(30, generator=generator)
    M, dense = FactoredMatrix(A, B), A @ B
    right, left = M @ X, X.T @ M
    assert isinstance(right, FactoredMatrix) and right.A.size(-1) == 4 and right.shape == (30, 7)
    assert isinstance(left, FactoredMatrix) and left.A.size(-1) == 4 and left.shape == (7, 30)
    torch.testing.assert_close(right.AB, dense @ X, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(left.AB, X.T @ dense, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(M @ v, dense @ v, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v @ M, v @ dense, rtol=1e-4, atol=1e-4)
    N = FactoredMatrix(torch.randn(30, 2, generator=generator), torch.randn(2, 30, generator=generator))
    product = M @ N
    assert isinstance(product, FactoredMatrix) and product.A.size(-1) == 2  # the smaller inner size
    torch.testing.assert_close(product.AB, dense @ N.AB, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "call, error, param",
    [
        (lambda: FactoredMatrix(torch.zeros(3), torch.zeros(3, 3)), InputTypeError, "A"),
        (lambda: FactoredMatrix(torch.zeros(3, 3), [[1.0]]), InputTypeError, "B"),
        (lambda: FactoredMatrix(torch.zeros(3, 2), torch.zeros(3, 3)), InvalidArgumentError, "B"),
        (lambda: FactoredMatrix(torch.zeros(2, 3, 2), torch.zeros(3, 2, 3)), InvalidArgumentError, "B"),
        (lambda: FactoredMatrix(torch.zeros(2, 3, 2), torch.zeros(2, 3))[0, 1], InvalidArgumentError, "index"),
        (lambda: FactoredMatrix(torch.zeros(4, 2), torch.zeros(2, 3)).eigenvalues, InvalidArgumentError, None),
    ],
)
def test_a_factored_matrix_refuses_what_it_cannot_be(call, error, param):
    with pytest.raises(error) as caught:
        call()
    assert caught.value.param == param


# ------------------------------------------------------------------ circuits


def test_qk_and_ov_are_transformer_lens_s_per_head(models):
    hf, ours = models
    tl, w = lens(hf), Weights(ours)
    for ours_circuit, theirs in ((w.QK, tl.QK), (w.OV, tl.OV)):
        assert ours_circuit.shape == theirs.shape == (3, 4, 48, 48)
        torch.testing.assert_close(ours_circuit.AB, theirs.AB.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours_circuit.S, theirs.S.detach(), rtol=1e-5, atol=1e-6)
        assert_same_eigenvalues(ours_circuit.eigenvalues, theirs.eigenvalues.detach(), atol=1e-5)


def test_the_full_circuits_are_the_dense_products_on_a_small_vocabulary(models):
    hf, ours = models
    tl = lens(hf)
    W_E, W_U = tl.W_E.detach(), tl.W_U.detach()
    for layer, head in ((0, 1), (2, 3)):
        W_Q, W_K, W_V, W_O = (getattr(tl, n)[layer, head].detach() for n in ("W_Q", "W_K", "W_V", "W_O"))
        qk, ov = W_E @ W_Q @ W_K.T @ W_E.T, W_E @ W_V @ W_O @ W_U  # (V, V), written out
        for circuit, dense in ((full_qk_circuit(ours, layer, head), qk), (full_ov_circuit(ours, layer, head), ov)):
            assert circuit.shape == (97, 97)
            torch.testing.assert_close(circuit.AB, dense, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(circuit.S, torch.linalg.svdvals(dense)[:12], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(circuit.norm(), torch.linalg.matrix_norm(dense), rtol=1e-5, atol=1e-6)
            eigenvalues = torch.linalg.eigvals(dense.double())
            top = eigenvalues[eigenvalues.abs().argsort(descending=True)[:12]]
            assert_same_eigenvalues(circuit.eigenvalues.to(top.dtype), top, atol=1e-4)
    every_head = full_qk_circuit(ours, 2)  # (H, V, V)
    assert every_head.shape == (4, 97, 97)
    torch.testing.assert_close(every_head[3].AB, full_qk_circuit(ours, 2, 3).AB)


class LargestTensor(TorchFunctionMode):
    """Records the most elements any torch function returned while it is on."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_full_circuits_of_gpt2_s_vocabulary_never_form_a_vocabulary_squared_matrix():
    torch.manual_seed(0)
    V = 50257
    model = GPT2(GPT2Config(n_vocab=V, n_ctx=8, n_embd=16, n_head=2, n_layer=1)).eval()
    with LargestTensor() as watch:
        qk, ov = full_qk_circuit(model, 0), full_ov_circuit(model, 0, 1)
        qk_eigenvalues, qk_S, ov_S, ov_eigenvalues, ov_norm = qk.eigenvalues, qk.S, ov.S, ov.eigenvalues, ov.norm()
    assert qk.shape == (2, V, V) and ov.shape == (V, V)
    assert 0 < watch.largest <= V * 16, watch.largest  # W_E's size at most: never V x V (2.5e9)
    theirs_qk, theirs_ov = tl_factored(qk.A, qk.B), tl_factored(ov.A, ov.B)  # TransformerLens on the same factors
    torch.testing.assert_close(qk_S, theirs_qk.S, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ov_S, theirs_ov.S, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ov_norm, theirs_ov.norm(), rtol=1e-4, atol=1e-6)
    assert_same_eigenvalues(qk_eigenvalues, theirs_qk.eigenvalues, atol=1e-5)
    assert_same_eigenvalues(ov_eigenvalues, theirs_ov.eigenvalues, atol=1e-5)


@pytest.mark.parametrize("processing", [{}, dict.fromkeys(OPTIONS, True)])
def test_composition_scores_are_transformer_lens_s(models, processing):
    hf, ours = models
    tl = lens(hf, **processing)
    model = process_weights(ours, **processing) if processing else ours
    for mode in "QKV":
        scores, theirs = composition_scores(model, mode), tl.all_composition_scores(mode).detach()
        assert scores.shape == (3, 4, 3, 4)
        torch.testing.assert_close(scores, theirs, rtol=1e-5, atol=1e-5)
        earlier = torch.arange(3)[:, None, None, None] < torch.arange(3)[None, None, :, None]
        assert not scores.masked_select(~earlier.expand_as(scores)).any()  # 0 unless l1 < l2
        assert (scores.masked_select(earlier.expand_as(scores)) > 0).all()


# ------------------------------------------------------------------ weight processing


def tl_activation(cache, tl, name: str) -> torch.Tensor:
    """TransformerLens's activation under gpt2's name, in gpt2's layout (the batch dropped, heads
    first; a LayerNorm's output after its weight and bias, where TransformerLens hooks it before)."""
    if name == "ln_f" or ".ln_" in name:  # ln_f, h.L.ln_1, h.L.ln_2
        hook, ln = ("ln_final", tl.ln_final) if name == "ln_f" else (None, None)
        if hook is None:
            layer, which = int(name.split(".")[1]), name.split(".")[2].replace("_", "")  # ln1, ln2
            hook, ln = f"blocks.{layer}.{which}", getattr(tl.blocks[layer], which)
        x = cache[f"{hook}.hook_normalized"][0]
        return x * ln.w + ln.b if hasattr(ln, "w") else x  # folded: its LayerNormPre has neither
    layer = name.split(".")[1]
    if name.endswith("attn.z"):
        return cache[f"blocks.{layer}.attn.hook_z"][0].transpose(0, 1)  # (T, H, d) -> (H, T, d)
    if name.endswith("attn.pattern"):
        return cache[f"blocks.{layer}.attn.hook_pattern"][0]
    return cache[f"blocks.{layer}.hook_resid_post"][0]  # h.L


STEPS = ["h.0.attn.z", "h.0.attn.pattern", "h.1.ln_1", "h.1.ln_2", "h.2.attn.z", "h.2", "ln_f"]


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=4)))
def test_each_processing_is_transformer_lens_s_logits_and_activations(models, flags):
    hf, ours = models
    options = dict(zip(OPTIONS, flags))
    before = {name: p.clone() for name, p in ours.state_dict().items()}
    processed = process_weights(ours, **options)
    assert isinstance(processed, ProcessedGPT2) and processed.processing == options
    assert all(torch.equal(before[name], p) for name, p in ours.state_dict().items())  # the input untouched
    tl = lens(hf, **options)
    with torch.no_grad():
        logits, cache = tl.run_with_cache(torch.tensor([IDS]))
    t = trace(processed, IDS, names=STEPS)
    torch.testing.assert_close(t.logits, logits[0], rtol=0, atol=1e-5)
    for name in STEPS:
        torch.testing.assert_close(t.activations[name], tl_activation(cache, tl, name), rtol=0, atol=1e-5, msg=name)
    for name in NAMES:  # and its weights are TransformerLens's processed ones
        torch.testing.assert_close(getattr(Weights(processed), name), getattr(tl, name).detach(), atol=1e-6, rtol=0)
    with torch.no_grad():  # the probabilities are the model's own
        torch.testing.assert_close(
            processed(torch.tensor([IDS])).log_softmax(-1), ours(torch.tensor([IDS])).log_softmax(-1), atol=1e-5, rtol=0
        )


def test_a_model_without_biases_is_processed_as_transformer_lens_processes_it(biasless):
    hf, model = biasless
    processed, tl = process_weights(model), lens(hf, **dict.fromkeys(OPTIONS, True))
    ids = IDS[:10]
    with torch.no_grad():
        logits, cache = tl.run_with_cache(torch.tensor([ids]))
    t = trace(processed, ids, names=["h.1.attn.z", "h.1"])
    torch.testing.assert_close(t.logits, logits[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(t.activations["h.1"], cache["blocks.1.hook_resid_post"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(Weights(processed).W_pos, tl.W_pos.detach(), rtol=0, atol=1e-6)  # the table, centred
    assert processed.transformer.h[0].attn.c_attn.bias is None  # still without biases: they stay 0


def tl_head_attribution(hf, fold_value_biases: bool, answer: int, other: int) -> torch.Tensor:
    """TransformerLens's per-head direct logit attribution at the last position under its default
    processing (fold_value_biases as given): each head's result through ln_f's scale, dotted with
    W_U[:, answer] - W_U[:, other]. (L, H)."""
    tl = lens(
        hf,
        fold_ln=True,
        center_writing_weights=True,
        center_unembed=True,
        fold_value_biases=fold_value_biases,
        use_attn_result=True,
    )
    with torch.no_grad():
        _, cache = tl.run_with_cache(torch.tensor([IDS]))
        stack = cache.stack_head_results(layer=-1, pos_slice=-1)  # (L H, 1, C)
        stack = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)
        return (stack[:, 0] @ (tl.W_U[:, answer] - tl.W_U[:, other])).view(CONFIG["n_layer"], CONFIG["n_head"])


@pytest.fixture(scope="module")
def no_ln_f_bias(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("no_ln_f_bias"), seed=4, ln_f_bias=False)


def test_direct_logit_attribution_is_transformer_lens_s_default_after_processing(no_ln_f_bias):
    """gpt2's DLA of the checkpoint's own weights is TransformerLens's with fold_value_biases=False;
    of process_weights's model, TransformerLens's default (all four): the two differ on the same
    weights, as each head's value bias moves into b_O. (ln_f's bias is 0 here: see the next test.)"""
    hf, ours = no_ln_f_bias
    answer, other = 5, 7
    default, unfolded = (tl_head_attribution(hf, fold, answer, other) for fold in (True, False))
    processed = logit_attribution(process_weights(ours), IDS, answer, other).heads.float()
    unprocessed = logit_attribution(ours, IDS, answer, other).heads.float()
    torch.testing.assert_close(processed, default, rtol=0, atol=1e-5)
    torch.testing.assert_close(unprocessed, unfolded, rtol=0, atol=1e-5)
    assert (default - unfolded).abs().max() > 1e-3  # the two conventions differ: each check above can fail


def test_direct_logit_attribution_after_processing_with_an_unembedding_bias(models):
    hf, ours = models
    answer, other = 5, 7
    parts = logit_attribution(process_weights(ours), IDS, answer, other)
    torch.testing.assert_close(parts.heads.float(), tl_head_attribution(hf, True, answer, other), rtol=0, atol=1e-5)
    logits = trace(ours, IDS).logits[-1]  # the pieces still sum to the real logit difference
    assert abs(parts.total - float(logits[answer] - logits[other])) < 1e-4


def test_a_processed_model_is_not_saved_nor_loaded_as_a_checkpoint(models, tmp_path):
    _, ours = models
    processed = process_weights(ours)
    with pytest.raises(InvalidArgumentError, match="not saved"):
        processed.save_pretrained(tmp_path / "processed")
    assert not (tmp_path / "processed").exists()
    with pytest.raises(InvalidArgumentError, match="process_weights"):
        ProcessedGPT2.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "call, error, param",
    [
        (lambda m: process_weights("gpt2"), InputTypeError, "model"),
        (lambda m: process_weights(m, fold_ln="yes"), InvalidArgumentError, "fold_ln"),
        (lambda m: process_weights(m, fold_value_biases=1), InvalidArgumentError, "fold_value_biases"),
        (lambda m: Weights(None), InputTypeError, "model"),
        (lambda m: composition_scores(m, "O"), InvalidArgumentError, "mode"),
        (lambda m: full_qk_circuit(m, 3), InvalidArgumentError, "layer"),
        (lambda m: Weights(m).attention(-1), InvalidArgumentError, "layer"),
        (lambda m: full_ov_circuit(m, 0, -1), InvalidArgumentError, "head"),
        (lambda m: full_ov_circuit(m, 0, True), InvalidArgumentError, "head"),
    ],
)
def test_bad_input_is_one_clear_error_naming_its_param(models, call, error, param):
    with pytest.raises(error) as caught:
        call(models[1])
    assert isinstance(caught.value, GPT2Error) and caught.value.param == param

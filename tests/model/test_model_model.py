"""The torch model against transformers' GPT2LMHeadModel and the NumPy reference engine."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import hf_and_ours, logits_of, make_hf_model, ours_from_hf, positions_written_out

from gpt2 import ContextLengthError, InputTypeError, InvalidArgumentError, TokenIdError
from gpt2.checkpoints.config import GPT2Config
from gpt2.devices import resolve_dtype
from gpt2.model.model import GPT2, softmax
from gpt2.reference import ReferenceModel

TOLERANCE = 1e-4  # max absolute difference of fp32 logits

# Small random configs: odd head counts, head sizes that are not powers of two, deep and shallow.
CONFIGS = [
    dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=3, n_head=3),
    dict(vocab_size=257, n_positions=17, n_embd=35, n_layer=2, n_head=5),
    dict(vocab_size=64, n_positions=40, n_embd=56, n_layer=5, n_head=7),
    dict(vocab_size=300, n_positions=8, n_embd=16, n_layer=1, n_head=1),
]


def max_diff(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


# --------------------------------------------------------------------- size


def test_124m_parameter_count():
    assert GPT2(GPT2Config.from_name("gpt2")).num_parameters() == 124_439_808


@pytest.mark.parametrize("name", ["gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_parameter_counts_equal_transformers(name):
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    config = GPT2Config.from_name(name)
    with torch.device("meta"):  # shapes only: no memory for 1.5B parameters
        ours = GPT2(config).num_parameters()
        theirs = GPT2LMHeadModel(
            HFConfig(n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head)
        ).num_parameters()
    assert ours == theirs


# --------------------------------------------------------------------- parity


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"L{c['n_layer']}H{c['n_head']}C{c['n_embd']}")
def test_logits_equal_transformers_and_numpy(config, tmp_path):
    hf = make_hf_model(**config)
    ours = ours_from_hf(hf, tmp_path)
    idx = torch.randint(0, config["vocab_size"], (3, config["n_positions"]), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        got = ours(idx)
    assert got.shape == (3, config["n_positions"], config["vocab_size"])
    assert max_diff(got, expected) < TOLERANCE
    reference = ReferenceModel.load(tmp_path)
    for b in range(3):
        assert max_diff(reference(idx[b].numpy()), expected[b]) < TOLERANCE


def test_124m_shape_equals_transformers_and_numpy(tmp_path):
    hf = make_hf_model(n_positions=1024)
    ours = ours_from_hf(hf, tmp_path)
    idx = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(idx).logits
        assert max_diff(ours(idx), expected) < TOLERANCE
    assert max_diff(ReferenceModel.load(tmp_path)(idx[1].numpy()), expected[1]) < TOLERANCE


def test_math_attention_equals_sdpa(tmp_path):
    ours = ours_from_hf(make_hf_model(**CONFIGS[0]), tmp_path)
    idx = torch.randint(0, 101, (2, 24))
    with torch.no_grad():
        sdpa = ours(idx)
        math = ours.set_attention("math")(idx)
    assert max_diff(sdpa, math) < 1e-5
    with pytest.raises(InvalidArgumentError, match="'sdpa' or 'math'"):
        ours.set_attention("flash")


def test_shorter_sequences_equal_prefix_of_longer(tmp_path):
    ours = ours_from_hf(make_hf_model(**CONFIGS[0]), tmp_path)
    idx = torch.randint(0, 101, (1, 24))
    with torch.no_grad():
        assert max_diff(ours(idx[:, :10]), ours(idx)[:, :10]) < 1e-5  # causality: the future is not seen


def test_loss_equals_transformers_shifted_loss(tmp_path):
    hf = make_hf_model(**CONFIGS[0])
    ours = ours_from_hf(hf, tmp_path)
    idx = torch.randint(0, 101, (2, 24))
    with torch.no_grad():
        expected = hf(idx, labels=idx).loss
        _, loss = ours(idx[:, :-1], idx[:, 1:])
    assert abs(float(loss) - float(expected)) < 1e-5


def test_loss_ignores_ignore_index(tmp_path):
    ours = ours_from_hf(make_hf_model(**CONFIGS[0]), tmp_path)
    idx = torch.randint(0, 101, (2, 10))
    targets = torch.randint(0, 101, (2, 10))
    targets[0, :4] = -100
    with torch.no_grad():
        logits, loss = ours(idx, targets)
    keep = targets != -100
    expected = F.cross_entropy(logits[keep], targets[keep])
    assert abs(float(loss) - float(expected)) < 1e-6
    with torch.no_grad():
        _, loss_1 = ours(idx, torch.where(keep, targets, -1), ignore_index=-1)
    assert abs(float(loss_1) - float(expected)) < 1e-6


def test_a_batch_whose_targets_are_all_ignored_has_loss_zero_and_no_gradient(tmp_path):
    """A batch of conversations with no reply in it adds nothing to a step: 0, where F.cross_entropy's mean is NaN."""
    ours = ours_from_hf(make_hf_model(**CONFIGS[0]), tmp_path)
    idx = torch.randint(0, 101, (2, 10))
    targets = torch.full((2, 10), -100)
    assert F.cross_entropy(ours(idx).flatten(0, 1), targets.flatten()).isnan()  # why it needs saying
    _, loss = ours(idx, targets)
    loss.backward()
    assert float(loss.detach()) == 0.0 and all(float(p.grad.abs().max()) == 0.0 for p in ours.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_equals_float64_on_extreme_logits(dtype):
    """Probabilities in float32 whatever the logits' dtype, as SciPy's float64 softmax gives them,
    where a naive exp would overflow (1e4) or underflow to a row of zeros (-1e4)."""
    from scipy.special import softmax as softmax_float64

    logits = torch.tensor(
        [
            [1e4, 1e4, -1e4, 0.0],
            [-1e4, -1e4 + 1, -1e4 + 2, -1e4 + 3],
            [0.0, 1.0, 2.0, 3.0],
            [60000.0, -60000.0, 0.0, 5.0],
        ]
    ).to(dtype)
    p = softmax(logits)
    assert p.dtype == torch.float32 and torch.isfinite(p).all()
    expected = softmax_float64(logits.double().numpy(), axis=-1)
    assert np.abs(p.double().numpy() - expected).max() < 1e-6


# ------------------------------------------------ options transformers lacks


@pytest.mark.parametrize(
    "options",
    [dict(positions="sinusoidal"), dict(activation="gelu"), dict(bias=False)],
    ids=["sinusoidal", "gelu", "nobias"],
)
def test_other_options_equal_transformers_made_so_and_the_numpy_engine(options, tmp_path):
    """Options transformers' GPT-2 lacks, each put into transformers' model (loaded from ours) by
    the test itself: fixed sinusoidal positions (its wpe set to the formula written out), the
    exact GELU (transformers' "gelu", torch's erf GELU, in each block), no biases (each bias,
    the LayerNorms' too, zeroed). Ours, saved and loaded, and the NumPy engine's logits equal that model's."""
    from transformers import GPT2LMHeadModel
    from transformers.activations import ACT2FN

    torch.manual_seed(0)
    config = GPT2Config(n_vocab=90, n_ctx=20, n_embd=24, n_head=3, n_layer=2, **options)
    model = GPT2(config).eval()
    with torch.no_grad():  # off their initial values (LayerNorms at 1, biases at 0), wide enough that GELUs differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(tmp_path)
    loaded = GPT2.from_pretrained(tmp_path, device="cpu")
    assert loaded.config == config
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        if "positions" in options:
            theirs.transformer.wpe.weight.copy_(torch.from_numpy(positions_written_out(20, 24)))
        if "activation" in options:
            for block in theirs.transformer.h:
                block.mlp.act = ACT2FN["gelu"]
        if "bias" in options:
            for name, p in theirs.named_parameters():
                if name.endswith(".bias"):  # the Linears' and the LayerNorms', as nanoGPT's bias=False
                    p.zero_()
    idx = torch.randint(0, 90, (1, 20))
    expected = logits_of(theirs, idx)
    with torch.no_grad():
        logits = model(idx)
        assert max_diff(loaded(idx), logits) == 0.0
    assert max_diff(logits, expected) < TOLERANCE
    assert max_diff(ReferenceModel.load(tmp_path)(idx[0].numpy()), expected[0]) < TOLERANCE
    if not config.bias:
        assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_dropout_only_in_training():
    model = GPT2(GPT2Config(n_vocab=50, n_ctx=16, n_embd=16, n_head=2, n_layer=2, dropout=0.5))
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        model.train()
        assert max_diff(model(idx), model(idx)) > 1e-3
        model.eval()
        assert max_diff(model(idx), model(idx)) == 0.0


# --------------------------------------------------------------------- precision


@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", 0.1), ("float16", 0.02)])
def test_low_precision_stays_near_float32_on_cpu(dtype, tolerance, tmp_path):
    hf = make_hf_model(**CONFIGS[0])
    hf.save_pretrained(tmp_path)
    fp32 = GPT2.from_pretrained(tmp_path, device="cpu")
    low = GPT2.from_pretrained(tmp_path, device="cpu", dtype=dtype)
    assert low.dtype == resolve_dtype(dtype) and low.compute_dtype == torch.float32  # weight-only on the CPU
    idx = torch.randint(0, 101, (2, 24))
    with torch.no_grad():
        reference = fp32(idx)
        got = low(idx).float()
    # relative to the spread of the logits, which is what sampling sees
    assert max_diff(got, reference) / float(reference.std()) < tolerance


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8"])
def test_narrow_weights_on_the_cpu_compute_what_their_widened_values_give(dtype, tmp_path):
    """Weight-only: the matrices narrow (int8 with a scale per output channel: per column of a
    layer's (in, out) weight, per row of wte), the rest float32. Prefill, decoding through the
    kernel, and the tied embedding all equal a float32 model holding the widened values."""
    from gpt2.generation.kernels import widen
    from gpt2.model.model import Dense

    make_hf_model(vocab_size=50257, n_positions=64, n_embd=48, n_layer=2, n_head=3).save_pretrained(tmp_path)
    narrow = GPT2.from_pretrained(tmp_path, device="cpu", dtype=dtype)
    assert narrow.dtype == getattr(torch, dtype) and narrow.compute_dtype == torch.float32
    assert narrow.transformer.h[0].ln_1.weight.dtype == narrow.transformer.wpe.weight.dtype == torch.float32
    widened = GPT2.from_pretrained(tmp_path, device="cpu")
    with torch.no_grad():
        for module, wide in zip(narrow.modules(), widened.modules()):
            if isinstance(module, Dense) or module is narrow.transformer.wte:
                scale = module.scale
                assert (scale is None) == (dtype != "int8")
                if scale is not None:
                    assert scale.shape == (
                        module.weight.shape[1] if isinstance(module, Dense) else module.weight.shape[0],
                    )
                    assert module.weight.abs().max() == 127
                if isinstance(
                    module, Dense
                ):  # stored (out, in), seen (in, out): a contiguous row per output for the kernel
                    assert module.weight.t().is_contiguous()
                w = module.weight if isinstance(module, Dense) else module.weight.t()
                wide.weight.copy_(
                    widen(w, scale, torch.float32) if isinstance(module, Dense) else widen(w, scale, torch.float32).t()
                )
        idx = torch.randint(0, 50257, (2, 20))
        assert max_diff(narrow(idx), widened(idx)) < 1e-4
        assert torch.equal(narrow.generate(idx, 15, temperature=0), widened.generate(idx, 15, temperature=0))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bfloat16_stays_near_float32(tmp_path):
    hf = make_hf_model(n_positions=256)  # the 124M shape
    hf.save_pretrained(tmp_path)
    fp32 = GPT2.from_pretrained(tmp_path, device="cuda")
    bf16 = GPT2.from_pretrained(tmp_path, device="auto", dtype="bfloat16")
    assert bf16.device.type == "cuda"
    idx = torch.randint(0, 50257, (4, 256), device="cuda")
    with torch.no_grad():
        reference = fp32(idx)
        assert max_diff(reference.cpu(), hf(idx.cpu()).logits) < 1e-3  # TF32 may be on
        got = bf16(idx).float()
    assert max_diff(got, reference) / float(reference.std()) < 0.1
    assert (got.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


# --------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def tiny() -> GPT2:
    return GPT2(GPT2Config(n_vocab=50, n_ctx=8, n_embd=16, n_head=2, n_layer=1)).eval()


def test_sequence_longer_than_context(tiny):
    with pytest.raises(ContextLengthError, match="sequence of 9 tokens is longer than the model's context of n_ctx=8"):
        tiny(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("bad", [-1, 50, 10**6])
def test_token_ids_out_of_range(tiny, bad):
    idx = torch.zeros(2, 4, dtype=torch.long)
    idx[1, 2] = bad
    with pytest.raises(TokenIdError, match=f"token id {bad} is out of range: this model's ids are 0..49"):
        tiny(idx)


def test_empty_batch_and_wrong_shapes(tiny):
    with pytest.raises(InvalidArgumentError, match="idx is empty"):
        tiny(torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="idx is empty"):
        tiny(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="shape \\(B, T\\), got \\[4\\]; for one sequence use idx\\[None\\]"):
        tiny(torch.zeros(4, dtype=torch.long))
    with pytest.raises(InputTypeError, match="integer tensor"):
        tiny(torch.zeros(1, 4))
    with pytest.raises(InputTypeError, match="got list"):
        tiny([[1, 2, 3]])
    with pytest.raises(
        InvalidArgumentError, match="targets must be a tensor shaped like idx \\[1, 4\\], got \\[1, 3\\]"
    ):
        tiny(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize(
    "config, message",
    [
        ("gpt2", "GPT2() takes a GPT2Config, got str; to load weights, use GPT2.from_pretrained('gpt2')"),
        (None, "GPT2() takes a GPT2Config, got NoneType"),
        ({"n_layer": 2}, "GPT2() takes a GPT2Config, got dict"),
    ],
)
def test_model_from_something_else_than_a_config(config, message):
    with pytest.raises(InputTypeError, match=re.escape(message)):
        GPT2(config)


@pytest.fixture(scope="module")
def traceable(tmp_path_factory):
    return hf_and_ours(
        tmp_path_factory.mktemp("traced"), seed=1, vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2
    )


@pytest.mark.parametrize("tracer", ["torch.jit.trace", "torch.export", "torch.onnx.export (TorchScript)"])
def test_a_tracer_records_the_plain_pass_not_the_inference_kernels(tracer, traceable, tmp_path):
    """Under no_grad on the CPU the model runs kernels a tracer cannot see into; traced, it takes
    plain torch ops, so the recorded graph computes the model's logits on other shapes too (before,
    torch.onnx.export wrote a graph of one constant node, silently). torch.onnx.export's default,
    dynamo, exporter records through torch.export."""
    hf, model = traceable
    example, other = torch.randint(0, 96, (2, 5)), torch.randint(0, 96, (3, 11))
    with torch.no_grad():
        expected = hf(other).logits
        if tracer == "torch.jit.trace":
            got = torch.jit.trace(model, (example,), check_trace=False)(other)
        elif tracer == "torch.export":
            dims = {"idx": {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", max=32)}}
            got = torch.export.export(model, (example,), dynamic_shapes=dims).module()(other)
        else:
            import onnxruntime

            torch.onnx.export(
                model,
                (example,),
                str(tmp_path / "m.onnx"),
                input_names=["idx"],
                dynamic_axes={"idx": {0: "b", 1: "t"}},
                dynamo=False,
            )
            got = torch.from_numpy(
                onnxruntime.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"idx": other.numpy()})[0]
            )
    assert (got - expected).abs().max() < 1e-4

"""GGUF (gpt2.checkpoints.gguf, and its door gpt2.export.gguf): the file read with the gguf package's
own reader and held to what llama.cpp's gpt2 loader asks (src/models/gpt2.cpp's tensors and their
dimensions, llama-model.cpp's and llama-vocab.cpp's keys, written out below, named from gguf's
constants) and to what its converter writes from a transformers checkpoint (convert_hf_to_gguf.py's
GPT2Model: gguf's TensorNameMap, Conv1D weights transposed); read back, transformers' logits, and
tiktoken's tokens; every bad input one clear error, and nothing half-written."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import (
    MODEL_ARCH,
    MODEL_TENSOR,
    MODEL_TENSORS,
    TENSOR_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    Keys,
)
from helpers import REPO, VOCAB, corpus, logits_of, make_hf_model

from gpt2 import (
    CheckpointError,
    CheckpointNotFoundError,
    GPT2Error,
    InvalidArgumentError,
    MissingPackageError,
    Tokenizer,
    UnwritablePathError,
)
from gpt2.checkpoints.config import GPT2Config
from gpt2.checkpoints.gguf import open_gguf, write_gguf
from gpt2.checkpoints.weights import expected_shapes, locate, read_config
from gpt2.export.gguf import export_gguf
from gpt2.inspect.circuits import repeated_tokens
from gpt2.model.model import GPT2
from gpt2.tokenizer import CharTokenizer, same_vocabulary

ARCH = "gpt2"
CONFIG = dict(vocab_size=304, n_positions=32, n_embd=64, n_layer=2, n_head=2)  # 4 ids past the tokenizer's 300
TEMPLATE = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
IDX = torch.randint(0, CONFIG["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(0))
INDUCTION_2L = REPO / "tests" / "fixtures" / "induction_2l"  # trained here: tests/fixtures/make_induction_2l.py


def llama_cpp_tensors(n_layer: int, n_embd: int, n_vocab: int, n_ctx: int) -> dict[str, list[int]]:
    """The tensors llama.cpp's gpt2 loader creates (load_arch_tensors in src/models/gpt2.cpp), each with
    the dimensions it asks of create_tensor ({ne0, ne1}), named from gguf's constants: every tensor of
    MODEL_TENSORS[GPT2] but OUTPUT, which the loader takes from token_embd where a file has none."""
    C, ff = n_embd, 4 * n_embd
    dims = {
        MODEL_TENSOR.TOKEN_EMBD: {"weight": [C, n_vocab]},
        MODEL_TENSOR.POS_EMBD: {"weight": [C, n_ctx]},
        MODEL_TENSOR.OUTPUT_NORM: {"weight": [C], "bias": [C]},
        MODEL_TENSOR.ATTN_NORM: {"weight": [C], "bias": [C]},
        MODEL_TENSOR.ATTN_QKV: {"weight": [C, 3 * C], "bias": [3 * C]},
        MODEL_TENSOR.ATTN_OUT: {"weight": [C, C], "bias": [C]},
        MODEL_TENSOR.FFN_NORM: {"weight": [C], "bias": [C]},
        MODEL_TENSOR.FFN_DOWN: {"weight": [ff, C], "bias": [C]},
        MODEL_TENSOR.FFN_UP: {"weight": [C, ff], "bias": [ff]},
    }
    assert set(MODEL_TENSORS[MODEL_ARCH.GPT2]) == set(dims) | {MODEL_TENSOR.OUTPUT}
    tensors = {}
    for tensor, parts in dims.items():
        name = TENSOR_NAMES[tensor]
        for block in range(n_layer) if "{bid}" in name else [None]:
            tensors.update({f"{name.format(bid=block)}.{part}": shape for part, shape in parts.items()})
    return tensors


def arch_key(template: str) -> str:
    return template.format(arch=ARCH)


# The keys llama.cpp's loader requires of a gpt2 file (llama_model::load_hparams, its gpt2 case, and the
# vocabulary's load): feed_forward_length sizes the ffn tensors, so it is required in effect too.
REQUIRED_KEYS = {
    Keys.General.ARCHITECTURE,
    *map(
        arch_key,
        [
            Keys.LLM.CONTEXT_LENGTH,
            Keys.LLM.EMBEDDING_LENGTH,
            Keys.LLM.BLOCK_COUNT,
            Keys.LLM.FEED_FORWARD_LENGTH,
            Keys.Attention.HEAD_COUNT,
            Keys.Attention.LAYERNORM_EPS,
        ],
    ),
    Keys.Tokenizer.MODEL,
}
BPE_KEYS = {Keys.Tokenizer.LIST, Keys.Tokenizer.MERGES}  # required of tokenizer.ggml.model "gpt2"
# The others it reads where they are, which the files hold.
OPTIONAL_KEYS = {
    Keys.General.NAME,
    Keys.General.FILE_TYPE,
    Keys.General.QUANTIZATION_VERSION,
    arch_key(Keys.LLM.VOCAB_SIZE),
}
BPE_OPTIONAL_KEYS = {
    Keys.Tokenizer.PRE,
    Keys.Tokenizer.TOKEN_TYPE,
    Keys.Tokenizer.BOS_ID,
    Keys.Tokenizer.EOS_ID,
    Keys.Tokenizer.UNK_ID,
    Keys.Tokenizer.ADD_BOS,
    Keys.Tokenizer.CHAT_TEMPLATE,
}


def metadata(reader: GGUFReader) -> dict:
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


@pytest.fixture(scope="module")
def hf():
    return make_hf_model(seed=1, **CONFIG)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(corpus()[1][:20_000], vocab_size=300).with_chat_template(TEMPLATE)


@pytest.fixture(scope="module")
def model(hf, tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return GPT2.from_pretrained(directory, device="cpu")


@pytest.fixture(scope="module")
def files(model, tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("gguf")
    return {dtype: export_gguf(model, directory / f"model-{dtype}.gguf", dtype) for dtype in ("f32", "f16", "q8_0")}


# ------------------------------------------------------------------ what llama.cpp reads


def test_the_file_holds_exactly_the_tensors_and_keys_llama_cpps_gpt2_loader_reads(files, hf, tokenizer):
    reader = GGUFReader(files["f32"])
    assert {t.name: [int(n) for n in t.shape] for t in reader.tensors} == llama_cpp_tensors(2, 64, 304, 32)
    values = metadata(reader)
    assert REQUIRED_KEYS | BPE_KEYS <= set(values) <= REQUIRED_KEYS | BPE_KEYS | OPTIONAL_KEYS | BPE_OPTIONAL_KEYS
    assert values[Keys.General.ARCHITECTURE] == gguf.MODEL_ARCH_NAMES[MODEL_ARCH.GPT2] == ARCH
    hparams = {
        Keys.LLM.CONTEXT_LENGTH: 32,
        Keys.LLM.EMBEDDING_LENGTH: 64,
        Keys.LLM.BLOCK_COUNT: 2,
        Keys.LLM.FEED_FORWARD_LENGTH: 256,
        Keys.Attention.HEAD_COUNT: 2,
        Keys.LLM.VOCAB_SIZE: 304,
    }
    assert {arch_key(key): values[arch_key(key)] for key in hparams} == {
        arch_key(key): value for key, value in hparams.items()
    }
    assert values[arch_key(Keys.Attention.LAYERNORM_EPS)] == pytest.approx(1e-5)
    assert values[Keys.General.FILE_TYPE] == gguf.LlamaFileType.ALL_F32
    assert (values[Keys.Tokenizer.MODEL], values[Keys.Tokenizer.PRE]) == ("gpt2", "gpt-2")
    eot = tokenizer.eot_token
    assert [values[key] for key in (Keys.Tokenizer.BOS_ID, Keys.Tokenizer.EOS_ID, Keys.Tokenizer.UNK_ID)] == [eot] * 3
    assert values[Keys.Tokenizer.ADD_BOS] is False and values[Keys.Tokenizer.CHAT_TEMPLATE] == TEMPLATE
    # the tokens as GPT-2's files write them, padded to the model's ids as the converter pads them
    tokens, types = values[Keys.Tokenizer.LIST], values[Keys.Tokenizer.TOKEN_TYPE]
    assert len(tokens) == len(types) == 304 and tokens[300:] == [f"[PAD{i}]" for i in range(300, 304)]
    assert types[eot] == gguf.TokenType.CONTROL and set(types[300:]) == {gguf.TokenType.UNUSED}
    assert types.count(gguf.TokenType.NORMAL) == 299
    assert len(values[Keys.Tokenizer.MERGES]) == len(tokenizer.merges) and all(
        m.count(" ") == 1 for m in values[Keys.Tokenizer.MERGES]
    )


def test_the_tensors_are_what_llama_cpps_converter_writes_from_transformers_checkpoint(files, hf):
    """convert_hf_to_gguf.py: each tensor renamed by gguf's TensorNameMap, the Conv1D weights transposed;
    f16 and q8_0 narrow the 2-D weights but position_embd, norms and biases stay f32."""
    names = gguf.get_tensor_name_map(MODEL_ARCH.GPT2, CONFIG["n_layer"])
    readers = {dtype: {t.name: t for t in GGUFReader(path).tensors} for dtype, path in files.items()}
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):  # the tied head; masks
            continue
        data = tensor.numpy()
        if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            data = data.T
        stored = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert np.array_equal(readers["f32"][stored].data, data), name
        narrow = data.ndim == 2 and stored != TENSOR_NAMES[MODEL_TENSOR.POS_EMBD] + ".weight"
        for dtype, ggml in (("f16", GGMLQuantizationType.F16), ("q8_0", GGMLQuantizationType.Q8_0)):
            assert readers[dtype][stored].tensor_type == (ggml if narrow else GGMLQuantizationType.F32), (dtype, name)
    assert readers["q8_0"]["token_embd.weight"].data.dtype == np.uint8  # blocks of 32: a float16 scale, 32 int8


def test_q8_0_writes_rows_that_are_not_whole_blocks_in_f16_as_the_converter_falls_back(tmp_path, tokenizer):
    config = GPT2Config(n_vocab=300, n_ctx=16, n_embd=48, n_head=3, n_layer=1)  # rows of 48: not whole blocks of 32
    generator = np.random.default_rng(0)
    tensors = {
        name: generator.standard_normal(shape).astype(np.float32) for name, shape in expected_shapes(config).items()
    }
    stored = {
        t.name: t.tensor_type
        for t in GGUFReader(write_gguf(config, tensors, tokenizer, tmp_path / "m.gguf", "q8_0")).tensors
    }
    assert stored["blk.0.ffn_down.weight"] == GGMLQuantizationType.Q8_0  # rows of 4 * 48 = 192 = 6 blocks
    assert (
        stored["blk.0.ffn_up.weight"]
        == stored["blk.0.attn_qkv.weight"]
        == stored["token_embd.weight"]
        == GGMLQuantizationType.F16
    )


# ------------------------------------------------------------------ read back


@pytest.mark.parametrize("dtype, tolerance", [("f32", 1e-5), ("f16", 1e-2)])
def test_a_model_read_back_gives_transformers_logits(files, hf, dtype, tolerance):
    back = GPT2.from_pretrained(files[dtype], device="cpu")
    assert locate(files[dtype]).format == "gguf"
    assert (logits_of(back, IDX) - logits_of(hf, IDX)).abs().max() < tolerance


def test_the_config_and_the_tokenizer_read_back_are_the_models(files, model, tokenizer):
    assert read_config(files["q8_0"]) == model.config
    back = GPT2.from_pretrained(files["q8_0"], device="cpu").tokenizer
    assert same_vocabulary(back, tokenizer) and back.n_vocab == 300 and back.chat_template == TEMPLATE


def test_q8_0_keeps_the_top_1_of_a_model_trained_here(tmp_path):
    """induction_2l, trained here (no vocabulary of its own: the file's is "none", as llama.cpp runs token
    ids), quantized to q8_0 and read back, against transformers on the original file."""
    from transformers import GPT2LMHeadModel

    path = export_gguf(GPT2.from_pretrained(INDUCTION_2L, device="cpu"), tmp_path / "induction.gguf", "q8_0")
    values = metadata(GGUFReader(path))
    assert values[Keys.Tokenizer.MODEL] == "none" and values[arch_key(Keys.LLM.VOCAB_SIZE)] == 64
    assert REQUIRED_KEYS | {arch_key(Keys.LLM.VOCAB_SIZE)} <= set(values) <= REQUIRED_KEYS | OPTIONAL_KEYS
    ids = torch.tensor([repeated_tokens(32, 64, seed=seed) for seed in range(8)])  # 512 positions
    back = GPT2.from_pretrained(path, device="cpu")
    assert back.tokenizer is None
    agree = (
        (logits_of(back, ids).argmax(-1) == logits_of(GPT2LMHeadModel.from_pretrained(INDUCTION_2L), ids).argmax(-1))
        .float()
        .mean()
    )
    assert agree >= 0.99


def test_gpt2s_vocabulary_is_written_as_its_files_hold_it_and_read_back_as_gpt2s_tokenizer(tmp_path, tiktoken_gpt2):
    config = GPT2Config(n_vocab=50257, n_ctx=8, n_embd=32, n_head=2, n_layer=1)
    tensors = {name: np.zeros(shape, dtype=np.float32) for name, shape in expected_shapes(config).items()}
    file = open_gguf(write_gguf(config, tensors, None, tmp_path / "gpt2.gguf"))  # None: GPT-2's, for GPT-2's vocabulary
    encoder = json.loads((VOCAB / "encoder.json").read_text(encoding="utf-8"))
    merges = [line for line in (VOCAB / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:] if line]
    assert file.metadata[Keys.Tokenizer.LIST] == sorted(encoder, key=encoder.get)
    assert file.metadata[Keys.Tokenizer.MERGES] == merges
    assert file.metadata[Keys.Tokenizer.TOKEN_TYPE] == [gguf.TokenType.NORMAL] * 50256 + [gguf.TokenType.CONTROL]
    assert file.metadata[Keys.Tokenizer.EOS_ID] == 50256
    tokenizer = file.tokenizer()
    assert tokenizer is Tokenizer.gpt2()
    text = "Hello world, it's 2026!\n\n  Ünïcödé 日本語 🤗<|endoftext|>tail"
    assert tokenizer.encode(text, allowed_special="all") == tiktoken_gpt2.encode(text, allowed_special="all")


def test_a_model_without_biases_and_with_sinusoidal_positions_reads_back_computing_the_same(tmp_path, tokenizer):
    """llama.cpp's gpt2 needs both: the file holds zero biases and the fixed table, as save_pretrained
    writes them for transformers, which computes the reference from that directory."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    ours = GPT2(
        GPT2Config(n_vocab=300, n_ctx=16, n_embd=32, n_head=2, n_layer=2, bias=False, positions="sinusoidal")
    ).eval()
    ours.tokenizer = tokenizer
    ours.save_pretrained(tmp_path / "hf")
    back = GPT2.from_pretrained(export_gguf(ours, tmp_path / "m.gguf"), device="cpu")
    assert back.config.bias and back.config.positions == "learned"  # the same function, in the file's terms
    ids = IDX[:, :16] % 300
    assert (logits_of(back, ids) - logits_of(GPT2LMHeadModel.from_pretrained(tmp_path / "hf"), ids)).abs().max() < 1e-5


# ------------------------------------------------------------------ what cannot be written


def test_what_llama_cpps_gpt2_cannot_hold_is_refused_with_the_reason(tmp_path, tokenizer, model):
    small = dict(n_ctx=16, n_embd=32, n_head=2, n_layer=1)
    huge = {
        name: np.full(shape, 1e5, np.float32)
        for name, shape in expected_shapes(GPT2Config(n_vocab=300, **small)).items()
    }
    cases = [
        (
            lambda: write_gguf(GPT2Config(n_vocab=2, **small), {}, CharTokenizer(["a", "b"]), tmp_path / "x.gguf"),
            "tokenizer",
            "this model's is a character vocabulary of 2 characters",
        ),
        (
            lambda: write_gguf(GPT2Config(n_vocab=300, activation="gelu", **small), {}, tokenizer, tmp_path / "x.gguf"),
            "config",
            "computes GELU's tanh approximation (gelu_tanh), and this model uses the exact GELU ('gelu')",
        ),
        (
            lambda: export_gguf(GPT2.from_pretrained("shakespeare_char", device="cpu"), tmp_path / "x.gguf"),
            None,
            "llama.cpp's gpt2",
        ),
        (
            lambda: write_gguf(GPT2Config(n_vocab=299, **small), {}, tokenizer, tmp_path / "x.gguf"),
            "tokenizer",
            "the tokenizer has 300 ids, more than the model's vocabulary of 299",
        ),
        (lambda: export_gguf(model, tmp_path / "x.gguf", "q4_0"), "dtype", "dtype must be one of f32, f16, q8_0"),
        (
            lambda: write_gguf(GPT2Config(n_vocab=300, **small), {}, tokenizer, tmp_path / "x.gguf", "bf16"),
            "dtype",
            "got 'bf16'",
        ),
        (
            lambda: write_gguf(GPT2Config(n_vocab=300, **small), {}, tokenizer, tmp_path / "x.gguf"),
            "tensors",
            "the tensors lack transformer.wte.weight",
        ),
        (
            lambda: write_gguf(GPT2Config(n_vocab=300, **small), huge, tokenizer, tmp_path / "x.gguf", "f16"),
            "dtype",
            "tensor transformer.wte.weight has values beyond float16's range (largest 1e+05, float16's 65504): "
            "write it with dtype f32",
        ),
    ]
    for call, param, message in cases:
        with pytest.raises(InvalidArgumentError) as caught:
            call()
        assert message in str(caught.value) and (param is None or caught.value.param == param)
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_leaves_nothing_at_the_path(model, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    with pytest.raises(UnwritablePathError, match="a-file is a file, not a directory"):
        export_gguf(model, tmp_path / "a-file" / "m.gguf")
    with pytest.raises(UnwritablePathError, match="a-dir is a directory"):
        export_gguf(model, tmp_path / "a-dir")
    (tmp_path / "m.gguf").write_bytes(b"the file before")

    def fails_midway(writer, **_):  # some bytes out, then the disk is full
        writer.fout[0].write(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(GGUFWriter, "write_tensors_to_file", fails_midway)
    with pytest.raises(OSError, match="No space left"):
        export_gguf(model, tmp_path / "m.gguf", "q8_0")
    assert (tmp_path / "m.gguf").read_bytes() == b"the file before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "a-file", "m.gguf"]  # no temporary file left


# ------------------------------------------------------------------ what cannot be read


def rewritten(
    source: Path, target: Path, architecture: str = ARCH, drop: str | None = None, tensors: dict | None = None
) -> Path:
    """A copy of a GGUF file written by gguf's own writer with a change: another architecture (its keys
    renamed), a tensor left out, tensors replaced or added."""
    reader = GGUFReader(source)
    writer = GGUFWriter(target, architecture)
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != Keys.General.ARCHITECTURE:
            sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(
                key.replace(f"{ARCH}.", f"{architecture}.", 1), field.contents(), field.types[0], sub_type
            )
    arrays = {t.name: (t.data, t.tensor_type) for t in reader.tensors if t.name != drop}
    arrays.update({name: (array, GGMLQuantizationType.F32) for name, array in (tensors or {}).items()})
    for name, (array, ggml) in arrays.items():
        writer.add_tensor(name, array, raw_dtype=ggml)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_bad_files_are_one_clear_error_naming_the_file(files, tmp_path):
    source = files["f32"]
    token_embd = GGUFReader(source).tensors[0].data
    (tmp_path / "notes.gguf").write_text("not a model")
    (tmp_path / "cut.gguf").write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    (tmp_path / "cut-header.gguf").write_bytes(source.read_bytes()[:300])
    cases = {
        tmp_path / "notes.gguf": "is not a GGUF file: it does not begin with GGUF's magic bytes b'GGUF'",
        tmp_path / "cut.gguf": "is truncated or corrupt",
        tmp_path / "cut-header.gguf": "is truncated or corrupt",
        rewritten(
            source, tmp_path / "llama.gguf", "llama"
        ): "is a GGUF file of llama.cpp's 'llama' architecture, not 'gpt2'",
        rewritten(source, tmp_path / "missing.gguf", drop="blk.1.ffn_up.weight"): "lacks tensor(s) blk.1.ffn_up.weight",
        rewritten(source, tmp_path / "shape.gguf", tensors={"position_embd.weight": np.zeros((33, 64), np.float32)}): (
            "tensor 'position_embd.weight' has shape [64, 33], "
            "but the metadata (n_layer=2, n_embd=64, n_vocab=304, n_ctx=32) needs [64, 32]"
        ),
        rewritten(
            source, tmp_path / "extra.gguf", tensors={"blk.0.attn_q.weight": np.zeros((64, 64), np.float32)}
        ): "unexpected tensor 'blk.0.attn_q.weight'",
        rewritten(
            source, tmp_path / "head.gguf", tensors={"output.weight": token_embd + 1.0}
        ): "its head (output.weight) is not its token embeddings",
        tmp_path / "absent.gguf": "does not exist",
    }
    for path, message in cases.items():
        with pytest.raises(GPT2Error) as caught:
            GPT2.from_pretrained(path, device="cpu")
        assert (
            isinstance(caught.value, CheckpointError)
            and str(path) in str(caught.value)
            and message in str(caught.value)
        ), caught.value
    assert isinstance(caught.value, CheckpointNotFoundError)
    tied = rewritten(
        source, tmp_path / "tied.gguf", tensors={"output.weight": np.array(token_embd)}
    )  # the converter's choice, spelled out
    assert (
        logits_of(GPT2.from_pretrained(tied, device="cpu"), IDX)
        - logits_of(GPT2.from_pretrained(source, device="cpu"), IDX)
    ).abs().max() == 0


def test_without_the_gguf_package_reading_and_writing_say_what_to_install(files, model, tmp_path, monkeypatch):
    shutil.copy(files["f32"], tmp_path / "copy.gguf")  # a file not opened yet
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    for call in (
        lambda: export_gguf(model, tmp_path / "new.gguf"),
        lambda: GPT2.from_pretrained(tmp_path / "copy.gguf"),
    ):
        with pytest.raises(
            MissingPackageError, match=re.escape("GGUF files need the gguf package: pip install 'gpt2[export]'")
        ):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf"]

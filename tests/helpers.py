"""Helpers the tests (and the benchmarks) share: paths, corpora, and independent references.

The corpus is tinyshakespeare as gpt2 ships it (`gpt2.examples`), so that every clone, with
`../shared` beside it or not, tests on the same text.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sysconfig
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai

from gpt2.examples import corpus_text

REPO = Path(__file__).resolve().parents[1]
VOCAB = REPO / "src" / "gpt2" / "tokenizer" / "vocab"


def stdlib_sources(limit: int | None = None) -> list[Path]:
    """Python files of the standard library, in a fixed order."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return files[:limit] if limit else files


@functools.cache
def corpus() -> tuple[str, str]:
    """(name, text): tinyshakespeare, 1.1 MB, as gpt2 ships it."""
    return "tinyshakespeare (shipped in gpt2)", corpus_text("shakespeare")


def corpus_hellaswag(n: int = 24) -> list[dict]:
    """n examples in HellaSwag's format from the corpus's lines (of 6 words or more): a line's first
    half, and the second halves of it and the next three lines, its own at index i % 4: a model
    trained on the corpus for a few iterations scores neither 0 nor 1, and not the same at each
    evaluation."""
    lines = [line.split() for line in corpus()[1].splitlines() if len(line.split()) >= 6]
    examples = []
    for i in range(n):
        halves = [(words[: len(words) // 2], words[len(words) // 2 :]) for words in lines[i : i + 4]]
        endings = [" ".join(second) for _, second in halves]
        endings[0], endings[i % 4] = endings[i % 4], endings[0]
        examples.append({"ctx": " ".join(halves[0][0]), "endings": endings, "label": i % 4})
    return examples


def write_hellaswag(path: Path, examples: list[dict]) -> Path:
    """A hellaswag_val.jsonl of these examples; its path."""
    path.write_text("".join(json.dumps(e) + "\n" for e in examples), encoding="utf-8")
    return path


def write_chat_data(
    directory: Path, ids: dict[str, np.ndarray], masks: dict[str, np.ndarray], template: str, like: Path | None = None
) -> Path:
    """Prepared conversations as issue 26's contract lays them out, written by hand (not by the
    code under test): train.bin and val.bin of `ids` by split, train.mask.bin and val.mask.bin of
    `masks` (a byte per id, 1 on the replies), meta.json with "chat", and the tokenizer's files:
    GPT-2's, as gpt2 prepare copies them, or those of the prepared directory `like`."""
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        np.asarray(ids[split], dtype="<u2").tofile(directory / f"{split}.bin")
        np.asarray(masks[split], dtype=np.uint8).tofile(directory / f"{split}.mask.bin")
    source = VOCAB if like is None else like
    for name in ("encoder.json", "vocab.bpe", "chars.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)
    known = {"tokenizer": "gpt2", "vocab_size": 50257} if like is None else json.loads((like / "meta.json").read_text())
    marked = {split: int(np.count_nonzero(masks[split])) for split in ("train", "val")}
    meta = {
        "format": "gpt2-prepared",
        "version": 1,
        "tokenizer": known["tokenizer"],
        "vocab_size": known["vocab_size"],
        "dtype": "uint16",
        "train_tokens": len(ids["train"]),
        "val_tokens": len(ids["val"]),
        "chat": {"template": template, "conversations": {"train": 1, "val": 1}, "mask_tokens": marked},
    }
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return directory


def replies_are_even_ids(data: Path, out: Path, template: str) -> Path:
    """The ids of a prepared directory as conversations whose replies are its even ids: a mask
    a test reads off the targets themselves (y % 2 == 0), with no window's offset to find."""
    ids = {split: np.fromfile(data / f"{split}.bin", dtype="<u2") for split in ("train", "val")}
    return write_chat_data(out, ids, {split: v % 2 == 0 for split, v in ids.items()}, template, like=data)


def write_conversations(path: Path, conversations: list[list[dict]]) -> Path:
    """A JSON Lines file of conversations in OpenAI's fine-tuning format, {"messages": [...]} a line; its path."""
    path.write_text(
        "".join(json.dumps({"messages": messages}, ensure_ascii=False) + "\n" for messages in conversations),
        encoding="utf-8",
    )
    return path


def tiktoken_from_files(encoder_json: Path, vocab_bpe: Path, eot: int = 50256):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json))
    return tiktoken.Encoding(
        name="gpt2-reference",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": eot},
        explicit_n_vocab=len(ranks) + 1,
    )


SMALL = dict(vocab_size=101, n_positions=24, n_embd=48, n_layer=2, n_head=3)  # a small GPT-2, in transformers' keys


def logits_of(model, idx):
    """The logits (B, T, V) of our model or of transformers' (whose output holds them)."""
    import torch

    with torch.no_grad():
        out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def make_hf_model(seed: int = 0, **config):
    """A randomly initialised `transformers.GPT2LMHeadModel` (the independent reference), in eval mode.

    Config keys are Hugging Face's (vocab_size, n_positions, n_embd, n_layer, n_head, ...).
    """
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    vocab = config.get("vocab_size", 50257)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(HFConfig(bos_token_id=vocab - 1, eos_token_id=vocab - 1, **config)).eval()
    with torch.no_grad():  # LayerNorms start at 1/0: perturb them so a mix-up of g and b shows
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def ours_from_hf(hf, directory: Path):
    """transformers' model `hf` saved in `directory`, and gpt2's model loaded from there, on the CPU."""
    from gpt2.model.model import GPT2

    hf.save_pretrained(directory)
    return GPT2.from_pretrained(directory, device="cpu")


def hf_and_ours(directory: Path, seed: int = 0, **config):
    """(transformers' model, gpt2's on the same weights): `make_hf_model(seed, **config)`, saved in
    `directory` and loaded from there by gpt2 (`ours_from_hf`)."""
    hf = make_hf_model(seed, **config)
    return hf, ours_from_hf(hf, directory)


def positions_written_out(n_ctx: int, n_embd: int) -> np.ndarray:
    """The positions of "Attention Is All You Need" (3.5), one value at a time, in float64: PE(t, 2i)
    = sin(t / 10000^(2i / C)), PE(t, 2i + 1) = cos(t / 10000^(2i / C)); an odd C ends on a sine."""
    import math

    return np.array(
        [
            [(math.sin if c % 2 == 0 else math.cos)(t / 10000 ** ((c - c % 2) / n_embd)) for c in range(n_embd)]
            for t in range(n_ctx)
        ]
    )


def head_score_written_out(A, ids: list[int], kind: str) -> float:
    """Issue 38's definitions of the head scores, one query at a time, on one head's attention
    pattern A (T, T): previous_token, duplicate_token or induction."""
    T, values = len(ids), []
    for q in range(T):
        earlier = [p for p in range(q) if ids[p] == ids[q]]
        if kind == "previous_token" and q >= 1:
            values.append(float(A[q, q - 1]))
        elif kind == "duplicate_token" and earlier:
            values.append(sum(float(A[q, p]) for p in earlier))
        elif kind == "induction" and earlier:
            values.append(sum(float(A[q, p + 1]) for p in earlier if p < q - 1))
    return sum(values) / len(values)


def nanogpt_model(seed: int = 0):
    """A model without biases, with sinusoidal positions: what transformers' GPT-2 has neither of."""
    import torch

    from gpt2.checkpoints.config import GPT2Config
    from gpt2.model.model import GPT2

    torch.manual_seed(seed)
    model = GPT2(
        GPT2Config(n_vocab=101, n_ctx=24, n_embd=48, n_head=3, n_layer=2, bias=False, positions="sinusoidal")
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def make_ending_model(directory: Path, n_ctx: int = 64):
    """A tiny transformers model whose texts end: "."'s embedding and <|endoftext|>'s share a
    direction u, <|endoftext|>'s the larger part, so that after a "." (whose residual stream holds
    u) <|endoftext|> is the greedy next token (the tied unembedding reads u back), as a trained
    model ends a sentence that ends its text. Saved in `directory` with GPT-2's tokenizer files
    (for lm-eval's hf model); transformers' model."""
    import torch

    from gpt2 import Tokenizer

    enc = Tokenizer.gpt2()
    hf = make_hf_model(seed=3, vocab_size=50257, n_positions=n_ctx, n_embd=32, n_layer=2, n_head=2)
    with torch.no_grad():
        u = torch.nn.functional.normalize(torch.randn(32, generator=torch.Generator().manual_seed(0)), dim=0)
        hf.transformer.wte.weight[enc.token_id(".")] += 2 * u
        hf.transformer.wte.weight[enc.eot_token] = 3 * u
    hf.save_pretrained(directory)
    enc.save_pretrained(directory)
    return hf


def perturbed(model, scale: float = 0.5, seed: int = 0):
    """A copy of a transformers model with noise added to its blocks' weights (`scale` times each
    tensor's spread; the embeddings kept): a draft model that often agrees with the model, not
    always, as a smaller model trained on the same text does."""
    import copy

    import torch

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if ".h." in name:
                p.add_(torch.randn(p.shape, generator=generator) * scale * p.std())
    return draft


def heed_ctrl_c() -> None:
    """For subprocess.Popen(preexec_fn=...): take SIGINT's default back in the child. A shell
    without job control starts background commands (a CI job run with &) with SIGINT ignored,
    and children inherit that."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Watched:
    """A command run in the background, its stderr read as it comes (a progress bar writes no new
    lines, so a reader waiting for lines would wait for ever): `wait_for` a pattern there, then
    `stop` it with a signal and time its exit."""

    def __init__(self, command: list[str], env: dict[str, str], stdout) -> None:
        self.process = subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE, preexec_fn=heed_ctrl_c)
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while chunk := os.read(self.process.stderr.fileno(), 1 << 16):
            self.chunks.append(chunk)

    @property
    def err(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        """Until the regular expression `pattern` matches stderr (the test fails if the process ends first)."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.err):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"never saw {pattern!r} on stderr: {self.err[-3000:]}")
            time.sleep(0.02)

    def stop(self, signum: int, timeout: float = 60, send=None) -> float:
        """Send `signum` (to the process, or by `send(signum)`); the seconds until the process ends
        (killed, and the test failing, after `timeout`)."""
        sent = time.monotonic()
        (send or self.process.send_signal)(signum)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running {timeout} s after signal {signum}: {self.err[-3000:]}") from None
        finally:
            self.reader.join()
        return time.monotonic() - sent


class Running:
    """A server on a free local port, in a thread of this process."""

    def __init__(self, load, model_id="tiny", limits=None, wait=True, **options):
        import uvicorn

        from gpt2.serve import Limits, create_app, listen

        self.app = create_app(load, model_id, limits or Limits(), **options)
        sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.runner = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.runner.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120  # a bound for a hang
        while not self.runner.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        if wait:
            self.wait_ready()

    def wait_ready(self):
        deadline = time.monotonic() + 120  # a bound for a hang: a busy machine loads slowly
        while httpx.get(self.url + "/health", timeout=60).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def client(self, **options):
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key=options.pop("api_key", "none"), max_retries=0, **options
        )

    def stop(self):
        self.runner.should_exit = True
        self.thread.join(timeout=30)


def serving(model, tokenizer, model_id: str = "tiny", **options):
    """A server fixture's body (`yield from serving(...)`): a `Running` server of `model` and
    `tokenizer`, yielded, then stopped."""
    running = Running(lambda: (model, tokenizer), model_id, **options)
    yield running
    running.stop()


QUESTIONS = {  # a question about digits, and its answer
    "first": (lambda d: f"What is the first digit of {' '.join(d)}?", lambda d: d[0]),
    "middle": (lambda d: f"What is the middle digit of {' '.join(d)}?", lambda d: d[1]),
    "last": (lambda d: f"What is the last digit of {' '.join(d)}?", lambda d: d[-1]),
    "larger": (lambda d: f"Which is larger, {d[0]} or {d[1]}?", lambda d: max(d[0], d[1])),
}


def digit_questions(n: int, seed: int, held_out: bool) -> list[tuple[str, str]]:
    """n (question, answer) pairs about three random digits ("What is the last digit of 4 0 7?",
    "7"). The held-out questions are about digits that sum to a multiple of 5, which no other
    question uses: a model that answers them learned the task, not the questions."""
    rng, pairs = random.Random(seed), []
    while len(pairs) < n:
        digits = [str(rng.randrange(10)) for _ in range(3)]
        kind = rng.choice(sorted(QUESTIONS))
        if (sum(map(int, digits)) % 5 == 0) != held_out or (kind == "larger" and digits[0] == digits[1]):
            continue
        question, answer = QUESTIONS[kind]
        pairs.append((question(digits), answer(digits)))
    return pairs


def conversation(question: str, answer: str | None = None) -> list[dict]:
    """The messages of one question (and its answer)."""
    messages = [{"role": "user", "content": question}]
    return messages + ([{"role": "assistant", "content": answer}] if answer is not None else [])


def transformers_sampled(hf, ids: list[int], max_new_tokens: int, seed: int, **sampling) -> list[int]:
    """transformers' sampled continuation of `ids` (its generate(do_sample=True), top_k off unless
    given), its draws from torch's global generator seeded as gpt2 documents a seed s: below 2**32
    torch.manual_seed(s); from 2**32 up, the Mersenne Twister state NumPy's legacy MT19937 sets
    from s's two 32-bit halves (init_by_array). The reference for the seed rule (row i from seed + i)."""
    import torch

    sampling.setdefault("top_k", 0)
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # the global generator as it was, after
        if seed < 2**32:
            torch.manual_seed(seed)
        else:  # torch's CPU state: seed (u64), left (i32), seeded (i32), next (u64), 624 words as u64
            key = np.random.RandomState(np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)).get_state()[1]
            state = bytearray(torch.get_rng_state().numpy().tobytes())
            state[:24] = struct.pack("<QiiQ", seed, 1, 1, 0)  # left 1: the first draw twists, as after seeding
            state[24 : 24 + 624 * 8] = key.astype("<u8").tobytes()
            torch.set_rng_state(torch.frombuffer(state, dtype=torch.uint8))
        return transformers_continuation(hf, ids, max_new_tokens, do_sample=True, **sampling)


def transformers_greedy(hf, ids: list[int], max_new_tokens: int, **options) -> list[int]:
    """transformers' greedy continuation of `ids` (its generate(do_sample=False), ending at its eos
    token); `options` more of generate's (a logits_processor, a repetition_penalty)."""
    return transformers_continuation(hf, ids, max_new_tokens, do_sample=False, **options)


def transformers_continuation(hf, ids: list[int], max_new_tokens: int, **options) -> list[int]:
    """The new tokens of transformers' generate after `ids`, which ends at the model's eos token."""
    import torch

    idx = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(
            idx,
            max_new_tokens=max_new_tokens,
            attention_mask=torch.ones_like(idx),
            eos_token_id=hf.config.eos_token_id,
            pad_token_id=hf.config.eos_token_id,
            **options,
        )
    return out[0, len(ids) :].tolist()


class PenaltiesWrittenOut:
    """A logits processor for transformers' generate (logits_processor=[...]): OpenAI's logit_bias,
    frequency_penalty and presence_penalty, and transformers' repetition rule, written out on
    transformers' input_ids, in that order: the repetition rule over the prompt and the new tokens,
    the other penalties counting the tokens after the prompt (as vLLM counts them)."""

    def __init__(
        self, prompt_length: int, bias: dict[int, float], frequency: float, presence: float, repetition: float
    ):
        self.n, self.bias, self.frequency, self.presence = prompt_length, bias, frequency, presence
        self.repetition = repetition

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for token, bias in self.bias.items():
            scores[0, token] += bias
        for token in set(input_ids[0].tolist()):
            value = scores[0, token]
            scores[0, token] = value * self.repetition if value < 0 else value / self.repetition
        for token in set(input_ids[0, self.n :].tolist()):
            count = (input_ids[0, self.n :] == token).sum()
            scores[0, token] -= count * self.frequency + self.presence
        return scores


class ConstraintWrittenOut:
    """A logits processor for transformers' generate: llguidance's matcher of `grammar` over
    `lltokenizer` (llguidance's view of a vocabulary, e.g. of tiktoken's encoding), fed the tokens
    after the prompt, leaves the tokens it allows next and -inf elsewhere. At the end of the text
    it allows only the eos token, at which transformers' generate stops."""

    def __init__(self, lltokenizer, grammar: str, prompt_length: int):
        from llguidance import LLMatcher

        self.matcher, self.n, self.fed = LLMatcher(lltokenizer, grammar, log_level=0), prompt_length, 0
        assert not self.matcher.is_error(), self.matcher.get_error()

    def __call__(self, input_ids, scores):
        import torch

        for token in input_ids[0, self.n + self.fed :].tolist():
            assert self.matcher.consume_token(token), self.matcher.get_error()
            self.fed += 1
        allowed = torch.from_numpy(np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8) > 0)
        scores = scores.clone()
        scores[0, : len(allowed)] = scores[0, : len(allowed)].masked_fill(~allowed, -float("inf"))
        scores[0, len(allowed) :] = -float("inf")
        return scores


def filtered(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None) -> np.ndarray:
    """Sampling's distributions (..., V), as `Sampling` defines them: the softmax after temperature,
    then the k most likely tokens kept (lower ids first among equals), then the fewest most likely
    whose probability reaches top_p, each time renormalised. A logit of -inf (a token a constraint
    refuses) gets probability 0."""
    probs = np.exp(logits / temperature - (logits / temperature).max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, -1)
    drop = np.zeros(ranked.shape, dtype=bool)
    drop[..., top_k or logits.shape[-1] :] = True
    ranked = np.where(drop, 0, ranked)
    ranked /= ranked.sum(-1, keepdims=True)
    if top_p is not None:
        drop |= np.cumsum(ranked, -1) - ranked >= top_p
    keep = np.zeros(drop.shape, dtype=bool)
    np.put_along_axis(keep, order, ~drop, -1)
    probs = np.where(keep, probs, 0)
    return probs / probs.sum(-1, keepdims=True)


def exact_distribution(hf, prompt: list[int], m: int, sampling, allowed: np.ndarray | None = None) -> np.ndarray:
    """The probability of each of the V**m continuations of `prompt` by m tokens, from transformers'
    logits: the product of each token's probability given those before it, under `sampling`'s
    temperature, top_k and top_p; `allowed` (m, V), the tokens a constraint allows at each place."""
    import itertools

    import torch

    V = hf.config.vocab_size
    sequences = np.array(list(itertools.product(range(V), repeat=m)))  # (V**m, m), the first token slowest
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + list(s) for s in sequences])).logits.double().numpy()  # (V**m, T, V)
    n = len(prompt)
    logits = logits[:, n - 1 : n - 1 + m]  # (V**m, m, V)
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    probs = filtered(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # (V**m, m, V)
    return np.take_along_axis(probs, sequences[:, :, None], -1)[:, :, 0].prod(-1)


def chi_square_p(tokens: np.ndarray, probs: np.ndarray) -> float:
    """The chi-square test's p-value of continuations (N, m) drawn from `probs` (V**m,), the
    continuations of expected count below 5 pooled into one cell. A continuation of probability 0 fails it."""
    from scipy.stats import chisquare

    V = round(len(probs) ** (1 / tokens.shape[1]))
    observed = np.bincount(tokens @ V ** np.arange(tokens.shape[1])[::-1], minlength=len(probs))
    expected = probs * len(tokens)
    if observed[expected == 0].any():
        return 0.0
    big, rare = expected >= 5, (expected > 0) & (expected < 5)
    return chisquare(
        np.append(observed[big], observed[rare].sum()), np.append(expected[big], expected[rare].sum())
    ).pvalue


def transformer_lens_from_hf(hf, **processing):
    """TransformerLens's HookedTransformer on the weights of transformers' GPT-2 `hf` (built
    offline from its config, as `HookedTransformer.from_pretrained` converts GPT-2's weights).
    `processing`: from_pretrained's weight processing (fold_ln, center_writing_weights,
    center_unembed, fold_value_biases), each False unless given; `use_attn_result` etc. are
    set on its config."""
    import warnings

    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf.config
    options = {k: processing.pop(k) for k in list(processing) if k.startswith("use_")}
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        d_head=c.n_embd // c.n_head,
        n_heads=c.n_head,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel",
        **options,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # HookedTransformer: deprecated in 3.x, gone in 4.0
        tl = HookedTransformer(cfg)
    processing = {
        "fold_ln": False,
        "center_writing_weights": False,
        "center_unembed": False,
        "fold_value_biases": False,
        **processing,
    }
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), **processing)
    return tl.eval()


# ------------------------------------------------------------------ circuit-tracer's transcoder sets, written out


def circuit_tracer_layer(
    seed: int, jumprelu: bool, skip: bool, d_model: int = 32, d_transcoder: int = 48, b_enc: float = 0.0
):
    """One layer_{i}.safetensors's tensors, random, as circuit-tracer writes them: W_enc and W_dec
    (d_transcoder, d_model); b_enc around `b_enc` (below 0: fewer features fire)."""
    import torch

    D_T = d_transcoder
    g = torch.Generator().manual_seed(seed)
    w = {
        "W_enc": torch.randn(D_T, d_model, generator=g) * 0.3,
        "W_dec": torch.randn(D_T, d_model, generator=g) * 0.3,
        "b_enc": torch.randn(D_T, generator=g) * 0.2 + b_enc,
        "b_dec": torch.randn(d_model, generator=g) * 0.1,
    }
    if jumprelu:  # some thresholds below 0: circuit-tracer's JumpReLU then keeps negative values
        w["activation_function.threshold"] = torch.rand(D_T, generator=g) * 0.7 - 0.2
    if skip:
        w["W_skip"] = torch.randn(d_model, d_model, generator=g) * 0.1
    return w


def write_circuit_tracer(directory, layers: dict[int, dict], listed: bool = False, **config) -> None:
    """A transcoder set in circuit-tracer's layout: config.yaml and layer_{i}.safetensors."""
    import yaml
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    for i, weights in layers.items():
        save_file(weights, str(directory / f"layer_{i}.safetensors"))
    config = {"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in"} | config
    config.setdefault("feature_output_hook", "mlp.hook_out")
    if listed:
        config["transcoders"] = [f"layer_{i}.safetensors" for i in sorted(layers)]
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


def circuit_tracer_forward(x, w) -> tuple:
    """circuit-tracer's encode and decode, written out: (features, output)."""
    import torch

    pre = x @ w["W_enc"].T + w["b_enc"]  # F.linear(x, W_enc, b_enc)
    threshold = w.get("activation_function.threshold")
    acts = torch.relu(pre) if threshold is None else pre * (pre > threshold)
    out = acts @ w["W_dec"] + w["b_dec"]
    if "W_skip" in w:
        out = out + x @ w["W_skip"].T  # compute_skip
    return acts, out


def transformers_steps(hf, ids: list[int]) -> dict:
    """Every step of `gpt2.inspect.walk` read from transformers' own modules by forward hooks
    (and its eager attention's weights), one sequence: {name: (T, X) or (H, T, T)}, "logits" last."""
    import torch

    seen: dict = {}
    hooks = []

    def keep(name):
        return lambda module, args, out: seen.__setitem__(name, (out[0] if isinstance(out, tuple) else out)[0])

    t = hf.transformer
    modules = {"wte": t.wte, "wpe": t.wpe, "ln_f": t.ln_f}
    for i, block in enumerate(t.h):
        modules |= {
            f"h.{i}.ln_1": block.ln_1,
            f"h.{i}.attn.c_attn": block.attn.c_attn,
            f"h.{i}.attn.c_proj": block.attn.c_proj,
            f"h.{i}.ln_2": block.ln_2,
            f"h.{i}.mlp.c_fc": block.mlp.c_fc,
            f"h.{i}.mlp.gelu": block.mlp.act,
            f"h.{i}.mlp.c_proj": block.mlp.c_proj,
            f"h.{i}": block,
        }
    hooks = [module.register_forward_hook(keep(name)) for name, module in modules.items()]
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    for i, pattern in enumerate(out.attentions):
        seen[f"h.{i}.attn.pattern"] = pattern[0]
    seen["logits"] = out.logits[0]
    return seen


def assert_walk_equals_transformers(answer: dict, hf, atol: float = 1e-4) -> None:
    """A walk's steps (gpt2.inspect.walk's JSON, from the library, the CLI or the server): the names in
    the pass's order, each shape, and each value at the last position within `atol` of transformers'."""
    import torch

    reference = transformers_steps(hf, answer["ids"])
    n_layer = hf.config.n_layer
    block = ["ln_1", "attn.c_attn", "attn.pattern", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.gelu", "mlp.c_proj"]
    names = ["wte", "wpe", *(n for i in range(n_layer) for n in [*(f"h.{i}.{s}" for s in block), f"h.{i}"])]
    assert [s["name"] for s in answer["steps"]] == [*names, "ln_f", "logits"]
    for step in answer["steps"]:
        expected = reference[step["name"]]
        assert step["shape"] == list(expected.shape), step["name"]
        last = expected[:, -1] if expected.dim() == 3 else expected[-1]
        torch.testing.assert_close(
            torch.tensor(step["values"], dtype=torch.float64),
            last.double(),
            atol=atol,
            rtol=0,
            msg=lambda m, name=step["name"]: f"{name}: {m}",
        )
        assert step["math"] and step["about"]
    logits = reference["logits"][-1]
    top = logits.topk(len(answer["next"]))
    assert [e["id"] for e in answer["next"]] == top.indices.tolist()
    torch.testing.assert_close(
        torch.tensor([e["logit"] for e in answer["next"]]), top.values.float(), atol=atol, rtol=0
    )


def gpt2_byte_letters() -> dict[int, str]:
    """GPT-2's byte-to-unicode map as its encoder.py defines it (printable bytes as themselves, the
    rest shifted past 255): the letters vocab.bpe writes bytes with."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    letters, extra = {}, 0
    for b in range(256):
        if b in printable:
            letters[b] = chr(b)
        else:
            letters[b] = chr(256 + extra)
            extra += 1
    return letters

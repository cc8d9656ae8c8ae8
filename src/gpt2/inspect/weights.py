"""Weight space: the model's matrices in TransformerLens's shapes, its heads' circuits kept
factored, the composition between heads, and TransformerLens's weight processing.

    w = Weights(model)
    w.W_Q                                   # (L, H, C, d): each head's query matrix, x @ W_Q[l, h]
    w.OV[1, 4].S                            # head 1.4's OV circuit W_V W_O: its singular values
    full_ov_circuit(model, 1, 4).S[:5]      # W_E W_V W_O W_U (V x V), never formed
    composition_scores(model, "K")          # (L, H, L, H): how much each later head's keys read each head
    processed = process_weights(model)      # TransformerLens's from_pretrained processing, a copy

B is the batch, T the positions, C = n_embd, V = n_vocab, L = n_layer, H = n_head, d = C / H.
The weights follow TransformerLens's names and shapes (x a row vector, as the seeds write it):

    W_E (V, C)   W_pos (n_ctx, C)
    W_Q, W_K, W_V (L, H, C, d)   b_Q, b_K, b_V (L, H, d)      q = x W_Q + b_Q, one head at a time
    W_O (L, H, d, C)             b_O (L, C)                    attn = sum_h z_h W_O[h] + b_O
    W_in (L, C, 4C)  b_in (L, 4C)   W_out (L, 4C, C)  b_out (L, C)
    W_U (C, V)   b_U (V,)                                      logits = ln_f(x) W_U + b_U

Head h's QK circuit is W_Q[h] W_K[h]^T (C x C, rank d): the score of query x_i on key x_j is
x_i W_QK x_j^T (biases aside); its OV circuit W_V[h] W_O[h] (C x C, rank d) is what it writes for
what it reads. Each is a `FactoredMatrix`: a product A B kept as its factors, whose eigenvalues,
singular values and norm come from d x d matrices, so that even W_E W_QK W_E^T, V x V, is never
formed.
"""

from __future__ import annotations

from functools import cached_property

import torch

from gpt2._checks import boolean, int_between
from gpt2.errors import InputTypeError, InvalidArgumentError
from gpt2.generation.kernels import widen
from gpt2.model.model import GPT2, Dense, SinusoidalPositions

MODES = ("Q", "K", "V")  # composition: which of a later head's inputs reads an earlier head's output


# ------------------------------------------------------------------ a product kept factored


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32 at least: QR, SVD and eig have no 16-bit kernels."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


class FactoredMatrix:
    """M = A @ B, kept as A (..., m, r) and B (..., r, n): TransformerLens's FactoredMatrix.

    M is m x n but has rank at most r; everything here costs about (m + n) r^2, never m n:

        A = Q_A R_A,  B^T = Q_B R_B       (reduced QR: Q orthonormal columns, R small)
        M = Q_A (R_A R_B^T) Q_B^T         the core R_A R_B^T is at most r x r
        core = U_c S Vh_c  =>  M = (Q_A U_c) S (Vh_c Q_B^T)      M's compact SVD
        ||M||_F = ||core||_F              eig(M) = eig(B A) and zeros   (ABv = kv => BA(Bv) = k(Bv))

    Leading dimensions (a layer's heads, (L, H)) broadcast between A and B. A and B are never
    changed here: every operation returns a new matrix.
    """

    def __init__(self, A: torch.Tensor, B: torch.Tensor):
        for name, t in (("A", A), ("B", B)):
            if not isinstance(t, torch.Tensor) or t.dim() < 2:
                got = f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise InputTypeError(
                    f"FactoredMatrix's {name} must be a tensor of 2 or more dimensions, got {got}", name
                )
        if A.size(-1) != B.size(-2):
            raise InvalidArgumentError(
                f"FactoredMatrix(A, B) needs A's columns to match B's rows, "
                f"got A {list(A.shape)} and B {list(B.shape)}",
                "B",
            )
        try:
            leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError:
            raise InvalidArgumentError(
                f"FactoredMatrix(A, B): the leading dimensions of A {list(A.shape)} and B {list(B.shape)} "
                "do not broadcast",
                "B",
            ) from None
        self.A = A.broadcast_to(leading + A.shape[-2:])  # (..., m, r)
        self.B = B.broadcast_to(leading + B.shape[-2:])  # (..., r, n)

    @property
    def shape(self) -> torch.Size:
        """(..., m, n): the shape of the product."""
        return self.A.shape[:-1] + self.B.shape[-1:]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={list(self.shape)}, inner={self.A.size(-1)})"

    @property
    def AB(self) -> torch.Tensor:
        """The product itself, (..., m, n): formed only here, when asked for."""
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        """B @ A, (..., r, r): the small matrix with M's nonzero eigenvalues (square M only)."""
        if self.shape[-2] != self.shape[-1]:
            raise InvalidArgumentError(f"B @ A and eigenvalues need a square matrix, this one is {list(self.shape)}")
        return self.B @ self.A

    @property
    def T(self) -> FactoredMatrix:
        """M^T = B^T A^T, still factored."""
        return FactoredMatrix(self.B.mT, self.A.mT)

    def __getitem__(self, index) -> FactoredMatrix:
        """Indexing the leading dimensions only (QK[layer, head]); the matrix's own two stay whole."""
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis or i is None for i in index) or len(index) > self.ndim - 2:
            raise InvalidArgumentError(
                f"a FactoredMatrix of shape {list(self.shape)} is indexed by its {self.ndim - 2} leading "
                f"dimension(s) only (ints and slices), got {index!r}",
                "index",
            )
        return FactoredMatrix(self.A[index], self.B[index])

    def __matmul__(self, other: torch.Tensor | FactoredMatrix) -> torch.Tensor | FactoredMatrix:
        """M @ X stays factored, A (B X); M @ v (a vector) is a vector; M @ N keeps the smaller inner size."""
        if isinstance(other, FactoredMatrix):
            if self.A.size(-1) <= other.A.size(-1):
                return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
            return FactoredMatrix(self.A @ (self.B @ other.A), other.B)
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.dim() == 1:
            return self.A @ (self.B @ other)  # (..., m)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: torch.Tensor) -> torch.Tensor | FactoredMatrix:
        """X @ M stays factored, (X A) B; v @ M (a vector) is a vector."""
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if other.dim() == 1:
            return (other @ self.A) @ self.B  # (..., n)
        return FactoredMatrix(other @ self.A, self.B)

    @cached_property
    def _qr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q_A (..., m, k), R_A (..., k, r), Q_B (..., n, j), R_B (..., j, r): A = Q_A R_A, B^T = Q_B R_B."""
        Q_A, R_A = torch.linalg.qr(_wide(self.A))
        Q_B, R_B = torch.linalg.qr(_wide(self.B).mT)
        return Q_A, R_A, Q_B, R_B

    @property
    def core(self) -> torch.Tensor:
        """R_A R_B^T (..., k, j), k, j <= r: M = Q_A core Q_B^T, with the same singular values as M."""
        _, R_A, _, R_B = self._qr
        return R_A @ R_B.mT

    @cached_property
    def _svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Q_A, _, Q_B, _ = self._qr
        U, S, Vh = torch.linalg.svd(self.core, full_matrices=False)
        return Q_A @ U, S, Vh @ Q_B.mT

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """M's compact SVD, U (..., m, k) S (..., k) Vh (..., k, n) with M = U diag(S) Vh, S descending,
        k = min(m, n, r): torch.linalg.svd's convention (TransformerLens's svd gives V = Vh^T)."""
        return self._svd

    @property
    def U(self) -> torch.Tensor:
        return self._svd[0]

    @property
    def S(self) -> torch.Tensor:
        return self._svd[1]

    @property
    def Vh(self) -> torch.Tensor:
        return self._svd[2]

    def norm(self) -> torch.Tensor:
        """The Frobenius norm, (...,): sqrt(sum of M's squared entries) = ||core||_F = sqrt(sum S^2)."""
        return torch.linalg.matrix_norm(self.core)

    @property
    def eigenvalues(self) -> torch.Tensor:
        """(..., r) complex: the eigenvalues of B A, which are M's nonzero ones (M's other m - r are 0)."""
        return torch.linalg.eigvals(_wide(self.BA))

    def collapse_l(self) -> torch.Tensor:
        """R_A B (..., k, n): M without its left orthonormal factor (M = Q_A (R_A B)), so that
        ||M X||_F = ||collapse_l() X||_F for any X."""
        return self._qr[1] @ _wide(self.B)

    def collapse_r(self) -> torch.Tensor:
        """A R_B^T (..., m, j): M without its right orthonormal factor, ||X M||_F = ||X collapse_r()||_F."""
        return _wide(self.A) @ self._qr[3].mT


# ------------------------------------------------------------------ the weights, TransformerLens's shapes


def check_model(model: object, param: str = "model") -> GPT2:
    if not isinstance(model, GPT2):
        raise InputTypeError(f"{param} must be a gpt2 GPT2 model, got {type(model).__name__}", param)
    return model


class Weights:
    """A GPT2's weights as TransformerLens's HookedTransformer names and shapes them (the module's
    docstring), read-only: each access builds a fresh tensor, detached from the model, in the model's
    compute dtype (a matrix stored narrow, bfloat16 or int8 times its scale, is widened), so writing
    to it never changes the model. A model without biases (config.bias False) reads zeros, as
    TransformerLens fills them in. The stacked properties copy every layer; a block's own are
    `attention(layer)` and `mlp(layer)`.
    """

    def __init__(self, model: GPT2):
        self.model = check_model(model)

    @property
    def dtype(self) -> torch.dtype:
        """The model's compute dtype: float32 where its matrices are stored narrow on the CPU."""
        return self.model.compute_dtype

    def _block(self, layer: int) -> torch.nn.Module:
        return self.model.transformer.h[int_between("layer", layer, 0, self.model.config.n_layer - 1, "a layer index")]

    def _matrix(self, dense: Dense) -> torch.Tensor:
        """A Dense layer's weight (in, out), widened: a new tensor."""
        return widen(dense.weight.detach(), dense.scale, self.dtype).clone()

    def _bias(self, dense: Dense) -> torch.Tensor:
        """A Dense layer's bias (out,), zeros where it has none."""
        if dense.bias is None:
            return torch.zeros(dense.weight.size(1), dtype=self.dtype, device=dense.weight.device)
        return dense.bias.detach().to(self.dtype).clone()

    def attention(self, layer: int) -> dict[str, torch.Tensor]:
        """Block `layer`'s W_Q, W_K, W_V (H, C, d), W_O (H, d, C), b_Q, b_K, b_V (H, d), b_O (C,)."""
        attn = self._block(layer).attn
        H, C = attn.n_head, attn.c_proj.weight.size(1)
        W = self._matrix(attn.c_attn).view(C, 3, H, C // H).permute(1, 2, 0, 3)  # (3, H, C, d)
        b = self._bias(attn.c_attn).view(3, H, C // H)  # (3, H, d)
        out = dict(W_Q=W[0], W_K=W[1], W_V=W[2], b_Q=b[0], b_K=b[1], b_V=b[2])
        out["W_O"] = self._matrix(attn.c_proj).view(H, C // H, C)  # c_proj's rows, head by head
        out["b_O"] = self._bias(attn.c_proj)
        return out

    def mlp(self, layer: int) -> dict[str, torch.Tensor]:
        """Block `layer`'s W_in (C, 4C), b_in (4C,), W_out (4C, C), b_out (C,)."""
        mlp = self._block(layer).mlp
        return dict(
            W_in=self._matrix(mlp.c_fc),
            b_in=self._bias(mlp.c_fc),
            W_out=self._matrix(mlp.c_proj),
            b_out=self._bias(mlp.c_proj),
        )

    def _stack(self, part: str, name: str) -> torch.Tensor:
        read = self.attention if part == "attn" else self.mlp
        return torch.stack([read(layer)[name] for layer in range(self.model.config.n_layer)])

    @property
    def W_E(self) -> torch.Tensor:
        """(V, C): wte, each token's row."""
        wte = self.model.transformer.wte
        scale = None if wte.scale is None else wte.scale[:, None]  # int8: one scale per row
        return widen(wte.weight.detach(), scale, self.dtype).clone()

    @property
    def W_pos(self) -> torch.Tensor:
        """(n_ctx, C): wpe, each position's row (the fixed table of a sinusoidal model)."""
        return self.model.transformer.wpe.weight.detach().to(self.dtype).clone()

    @property
    def W_U(self) -> torch.Tensor:
        """(C, V): the unembedding, wte^T (tied), or a processed model's own."""
        if isinstance(self.model, ProcessedGPT2):
            return self._matrix(self.model.lm_head)
        return self.W_E.T.contiguous()

    @property
    def b_U(self) -> torch.Tensor:
        """(V,): zeros (GPT-2 has no unembedding bias), or a processed model's own."""
        if isinstance(self.model, ProcessedGPT2):
            return self._bias(self.model.lm_head)
        return torch.zeros(self.model.config.n_vocab, dtype=self.dtype, device=self.model.device)

    W_Q = property(lambda self: self._stack("attn", "W_Q"), doc="(L, H, C, d): q = x W_Q[l, h] + b_Q[l, h]")
    W_K = property(lambda self: self._stack("attn", "W_K"), doc="(L, H, C, d)")
    W_V = property(lambda self: self._stack("attn", "W_V"), doc="(L, H, C, d)")
    W_O = property(lambda self: self._stack("attn", "W_O"), doc="(L, H, d, C): head h writes z_h W_O[l, h]")
    b_Q = property(lambda self: self._stack("attn", "b_Q"), doc="(L, H, d)")
    b_K = property(lambda self: self._stack("attn", "b_K"), doc="(L, H, d)")
    b_V = property(lambda self: self._stack("attn", "b_V"), doc="(L, H, d)")
    b_O = property(lambda self: self._stack("attn", "b_O"), doc="(L, C): c_proj's bias")
    W_in = property(lambda self: self._stack("mlp", "W_in"), doc="(L, C, 4C): c_fc")
    b_in = property(lambda self: self._stack("mlp", "b_in"), doc="(L, 4C)")
    W_out = property(lambda self: self._stack("mlp", "W_out"), doc="(L, 4C, C): the MLP's c_proj")
    b_out = property(lambda self: self._stack("mlp", "b_out"), doc="(L, C)")

    @property
    def QK(self) -> FactoredMatrix:
        """(L, H, C, C): each head's W_Q W_K^T, factored (TransformerLens's model.QK)."""
        return FactoredMatrix(self.W_Q, self.W_K.mT)

    @property
    def OV(self) -> FactoredMatrix:
        """(L, H, C, C): each head's W_V W_O, factored (TransformerLens's model.OV)."""
        return FactoredMatrix(self.W_V, self.W_O)


# ------------------------------------------------------------------ circuits through the vocabulary


def _layer_heads(model: GPT2, layer: int, head: int | None) -> tuple[Weights, dict[str, torch.Tensor]]:
    """The Weights of `model` and block `layer`'s attention weights, of one head (a leading axis
    of 1 dropped) or of all."""
    w = Weights(model)
    attn = w.attention(layer)
    if head is not None:
        int_between("head", head, 0, model.config.n_head - 1, "a head index")
        attn = {name: t if name == "b_O" else t[head] for name, t in attn.items()}  # b_O: the block's
    return w, attn


def full_qk_circuit(model: GPT2, layer: int, head: int | None = None) -> FactoredMatrix:
    """W_E W_Q W_K^T W_E^T, (V, V) (or (H, V, V) for all the layer's heads): entry [i, j] is how
    much a query of token i attends to a key of token j through the tokens' embeddings alone
    (positions, biases and LayerNorm's scale left out; on a `process_weights` model LayerNorm's
    weights are inside W_Q and W_K). Factored through d: V x V is never formed."""
    w, attn = _layer_heads(model, layer, head)
    W_E = w.W_E  # (V, C)
    return FactoredMatrix(W_E @ attn["W_Q"], attn["W_K"].mT @ W_E.T)  # (.., V, d) @ (.., d, V)


def full_ov_circuit(model: GPT2, layer: int, head: int | None = None) -> FactoredMatrix:
    """W_E W_V W_O W_U, (V, V) (or (H, V, V)): entry [i, j] is how much attending to token i
    raises the logit of token j, directly (same approximations as `full_qk_circuit`). Factored
    through d: V x V is never formed."""
    w, attn = _layer_heads(model, layer, head)
    return FactoredMatrix(w.W_E @ attn["W_V"], attn["W_O"] @ w.W_U)  # (.., V, d) @ (.., d, V)


@torch.no_grad()
def composition_scores(model: GPT2, mode: str) -> torch.Tensor:
    """(L, H, L, H): how much head (l2, h2) reads the output of an earlier head (l1, h1), by
    Elhage et al. (2021)'s composition score, as TransformerLens's all_composition_scores(mode):

        score = ||W_OV(l1,h1) W(l2,h2)||_F / (||W_OV(l1,h1)||_F ||W(l2,h2)||_F)

    where W is the later head's QK circuit W_Q W_K^T for "Q" (its queries read the output), its
    transpose W_K W_Q^T for "K" (its keys do), its OV circuit for "V" (its values do). 0 unless
    l1 < l2: a head reads only the heads of earlier blocks. The norms come from d x d factors.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r}", "mode")
    w = Weights(check_model(model))
    L, H = model.config.n_layer, model.config.n_head
    left, right = [], []  # each layer's heads: OV without its left orthonormal factor; W without its right
    for layer in range(L):
        a = w.attention(layer)
        ov = FactoredMatrix(a["W_V"], a["W_O"])  # (H, C, C)
        qk = FactoredMatrix(a["W_Q"], a["W_K"].mT)
        left.append(ov.collapse_l())  # (H, k, C)
        right.append({"Q": qk, "K": qk.T, "V": ov}[mode].collapse_r())  # (H, C, j)
    scores = torch.zeros(L, H, L, H, dtype=left[0].dtype, device=left[0].device)
    for l1 in range(L):
        for l2 in range(l1 + 1, L):
            product = torch.linalg.matrix_norm(left[l1][:, None] @ right[l2][None])  # (H, H)
            norms = torch.linalg.matrix_norm(left[l1])[:, None] * torch.linalg.matrix_norm(right[l2])[None]
            scores[l1, :, l2, :] = product / norms
    return scores


# ------------------------------------------------------------------ TransformerLens's weight processing


class ProcessedGPT2(GPT2):
    """A GPT2 whose weights `process_weights` changed: its unembedding is its own, logits =
    x @ W_U + b_U (`lm_head`, a Dense (C, V)), no longer wte^T, since folding ln_f and centering
    change W_U and W_E apart. `processing` names the options it was processed with. Everything
    that runs a GPT2 runs it (forward, trace, generate); saving it is refused: its weights are
    not GPT-2's layout any more (save the model it came from)."""

    def __init__(self, config, processing: dict[str, bool] | None = None):
        super().__init__(config)
        self.processing = dict(processing or {})
        self.lm_head = Dense(config.n_embd, config.n_vocab, bias=config.bias)
        if torch.get_default_device().type != "meta":
            self._init_weights(self.lm_head)

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states: (..., C) -> (..., V), x @ W_U + b_U."""
        return self.lm_head(x)

    def save_pretrained(self, directory, tensors=None, metadata=None) -> None:
        raise InvalidArgumentError(
            "a model from process_weights is not saved: its unembedding is no longer wte (folded "
            "LayerNorm, centred weights), which GPT-2's layout cannot hold; save the model it came "
            "from and process it again after loading"
        )

    @classmethod
    def from_pretrained(cls, name_or_path, **options) -> GPT2:
        raise InvalidArgumentError(
            "load with GPT2.from_pretrained, then process_weights(model): a processed model is made, not loaded"
        )


def _tl_state(model: GPT2) -> dict[str, torch.Tensor]:
    """Every weight of `model` by TransformerLens's name (the LayerNorms' as ln_1.w, ln_1.b (L, C),
    ln_f.w, ln_f.b (C,)), float32, as TransformerLens processes in float32."""
    w = Weights(model)
    state = {name: getattr(w, name) for name in ("W_E", "W_pos", "W_U", "b_U")}
    for part, names in (
        ("attn", ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")),
        ("mlp", ("W_in", "b_in", "W_out", "b_out")),
    ):
        for name in names:
            state[name] = w._stack(part, name)
    blocks = model.transformer.h
    for name, lns in (
        ("ln_1", [b.ln_1 for b in blocks]),
        ("ln_2", [b.ln_2 for b in blocks]),
        ("ln_f", [model.transformer.ln_f]),
    ):
        weight = torch.stack([ln.weight.detach() for ln in lns])  # (L, C), or (1, C) for ln_f
        bias = torch.stack([torch.zeros_like(ln.weight) if ln.bias is None else ln.bias.detach() for ln in lns])
        state[f"{name}.w"], state[f"{name}.b"] = (weight[0], bias[0]) if name == "ln_f" else (weight, bias)
    return {name: t.float() for name, t in state.items()}


def _fold_ln(w: dict[str, torch.Tensor]) -> None:
    """Each LayerNorm's weight g and bias b into the matrices that read it, then those centred:

        (n g + b) W + c = n (g[:, None] * W) + (b W + c)       n: the normalised input, mean 0
        so W' = g[:, None] * W - mean over C,  c' = c + b W,   and the LayerNorm keeps g = 1, b = 0

    (subtracting the mean over the input's C rows changes nothing: n sums to 0). For ln_1 into
    W_Q, W_K, W_V; ln_2 into W_in; ln_f into W_U, b_U."""
    for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):  # (L, H, C, d), (L, H, d)
        w[b] = w[b] + torch.einsum("lc,lhcd->lhd", w["ln_1.b"], w[W])
        w[W] = w[W] * w["ln_1.w"][:, None, :, None]
        w[W] = w[W] - w[W].mean(-2, keepdim=True)
    w["b_in"] = w["b_in"] + torch.einsum("lc,lcf->lf", w["ln_2.b"], w["W_in"])  # W_in (L, C, 4C)
    w["W_in"] = w["W_in"] * w["ln_2.w"][:, :, None]
    w["W_in"] = w["W_in"] - w["W_in"].mean(-2, keepdim=True)
    w["b_U"] = w["b_U"] + w["ln_f.b"] @ w["W_U"]  # W_U (C, V)
    w["W_U"] = w["W_U"] * w["ln_f.w"][:, None]
    w["W_U"] = w["W_U"] - w["W_U"].mean(0, keepdim=True)
    for name in ("ln_1", "ln_2", "ln_f"):
        w[f"{name}.w"], w[f"{name}.b"] = torch.ones_like(w[f"{name}.w"]), torch.zeros_like(w[f"{name}.b"])


def _center_writing_weights(w: dict[str, torch.Tensor]) -> None:
    """What writes to the residual stream made mean 0 over C: every reader of the stream is a
    LayerNorm, which subtracts the mean first, so the stream's mean never matters.
    W_E, W_pos, W_O, W_out less their mean over C; b_O, b_out less their mean."""
    for name in ("W_E", "W_pos", "W_O", "W_out", "b_O", "b_out"):
        w[name] = w[name] - w[name].mean(-1, keepdim=True)


def _center_unembed(w: dict[str, torch.Tensor]) -> None:
    """W_U and b_U less their mean over the vocabulary: every logit of a position moves by the
    same amount, which the softmax ignores (log-probabilities and the loss unchanged)."""
    w["W_U"] = w["W_U"] - w["W_U"].mean(-1, keepdim=True)
    w["b_U"] = w["b_U"] - w["b_U"].mean()


def _fold_value_biases(w: dict[str, torch.Tensor]) -> None:
    """Each head's value bias into the block's output bias: a pattern's row sums to 1, so b_V adds
    the same b_V W_O to every position's output, whatever the head attends to:

        b_O' = b_O + sum_h b_V[h] W_O[h],   b_V' = 0

    A head's output z_h W_O[h] then holds only what depends on what it attends to. (Where writing
    weights were centred, each row of W_O is mean 0, so b_O' stays mean 0, which TransformerLens ensures
    by centring it again.)"""
    w["b_O"] = w["b_O"] + torch.einsum("lhd,lhdc->lc", w["b_V"], w["W_O"])
    w["b_V"] = torch.zeros_like(w["b_V"])


def _gpt2_state(w: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """TransformerLens's weights back in gpt2's names and layout (ProcessedGPT2's state dict)."""
    L, C = config.n_layer, config.n_embd
    state = {"transformer.wte.weight": w["W_E"], "lm_head.weight": w["W_U"], "transformer.ln_f.weight": w["ln_f.w"]}
    if config.positions == "learned":
        state["transformer.wpe.weight"] = w["W_pos"]
    for l in range(L):
        p = f"transformer.h.{l}."
        qkv = torch.cat([w[W][l].transpose(0, 1).reshape(C, C) for W in ("W_Q", "W_K", "W_V")], dim=1)  # (C, 3C)
        state |= {
            p + "ln_1.weight": w["ln_1.w"][l],
            p + "attn.c_attn.weight": qkv,
            p + "attn.c_proj.weight": w["W_O"][l].reshape(C, C),  # (H, d, C) -> (H d, C)
            p + "ln_2.weight": w["ln_2.w"][l],
            p + "mlp.c_fc.weight": w["W_in"][l],
            p + "mlp.c_proj.weight": w["W_out"][l],
        }
        if config.bias:
            state |= {
                p + "ln_1.bias": w["ln_1.b"][l],
                p + "attn.c_attn.bias": torch.cat([w[b][l].flatten() for b in ("b_Q", "b_K", "b_V")]),
                p + "attn.c_proj.bias": w["b_O"][l],
                p + "ln_2.bias": w["ln_2.b"][l],
                p + "mlp.c_fc.bias": w["b_in"][l],
                p + "mlp.c_proj.bias": w["b_out"][l],
            }
    if config.bias:
        state |= {"transformer.ln_f.bias": w["ln_f.b"], "lm_head.bias": w["b_U"]}
    return state


@torch.no_grad()
def process_weights(
    model: GPT2,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
) -> ProcessedGPT2:
    """A copy of `model` with TransformerLens's weight processing (its load_and_process_state_dict,
    in its order); `model` itself is untouched. The defaults are TransformerLens's
    (HookedTransformer.from_pretrained processes all four); gpt2's models are the checkpoint's
    own weights, unprocessed. Each option on its own:

        fold_ln                 each LayerNorm's weight and bias into the matrices after it
        center_writing_weights  W_E, W_pos, W_O, b_O, W_out, b_out made mean 0 over C
        center_unembed          W_U and b_U made mean 0 over the vocabulary (logits shift, probabilities do not)
        fold_value_biases       b_V folded into b_O: a head's output holds only what depends on what it attends to

    None changes the probabilities; center_unembed moves every logit of a position by the same
    amount, and center_writing_weights and fold_ln change the residual stream and the LayerNorms'
    outputs (not what is read from them). TransformerLens refuses none of the 16 combinations for
    GPT-2 (only shortformer positions, post-LayerNorm blocks and soft-capped logits, which GPT-2 has
    not). The copy is in the model's compute dtype, a matrix stored narrow widened (processing runs
    in float32, as TransformerLens's), on the model's device; it is a `ProcessedGPT2`.
    """
    check_model(model)
    options = {
        "fold_ln": boolean("fold_ln", fold_ln),
        "center_writing_weights": boolean("center_writing_weights", center_writing_weights),
        "center_unembed": boolean("center_unembed", center_unembed),
        "fold_value_biases": boolean("fold_value_biases", fold_value_biases),
    }
    w = _tl_state(model)
    if fold_ln:
        _fold_ln(w)
    if center_writing_weights:
        _center_writing_weights(w)
    if center_unembed:
        _center_unembed(w)
    if fold_value_biases:
        _fold_value_biases(w)
    return _processed_copy(model, w, options)


def _processed_copy(model: GPT2, w: dict[str, torch.Tensor], options: dict[str, bool]) -> ProcessedGPT2:
    """A ProcessedGPT2 of `model`'s config holding the weights `w`, as `model` is set up (its
    tokenizer, attention, train or eval mode), built without initialising weights it replaces."""
    config, dtype = model.config, model.compute_dtype
    with torch.device("meta"):
        copy = ProcessedGPT2(config, options)
    state = {name: t.to(dtype) for name, t in _gpt2_state(w, config).items()}
    copy.load_state_dict(state, assign=True)
    if isinstance(copy.transformer.wpe, SinusoidalPositions):  # a buffer, not saved: centred or not, the copy's own
        copy.transformer.wpe.weight = w["W_pos"].to(dtype)
    for mine, theirs in zip(copy.transformer.h, model.transformer.h):
        mine.attn.use_sdpa = theirs.attn.use_sdpa
    copy.tokenizer = model.tokenizer
    copy.checkpoint_activations = model.checkpoint_activations
    return copy.train(model.training)

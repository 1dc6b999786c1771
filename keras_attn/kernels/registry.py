"""The kernels' declarations, their one table, and the one choice among them.

Each kernel module declares a `Kernel` (its function and what it supports:
the weights, dropout, a custom normalization, which scores, whether the
backend and device prefer it, its place in `"auto"`'s order) and registers it
in `KERNELS`; a new kernel is one new module (and its import in
`keras_attn/kernels/__init__.py`). `choose` reads the declarations: an
explicit `implementation` is checked against them, `"auto"` takes the first
kernel, by `auto_rank`, that supports the call and wants it.
"""

import dataclasses
import math
from collections.abc import Callable

from keras_attn.kernels.spec import AttentionSpec

# "auto" switches to the chunked kernel once the (..., Tq, Tv) scores would hold
# 2^28 values (1 GiB in float32; a dense training step keeps about three such
# tensors alive): e.g. 8 heads at B=1 from L=8192, at B=8 from L=2896.
# Below it the fused kernel is faster (measured 1.4-1.7x at L=4096-8192, B=1).
CHUNKED_MIN_SCORES = 2**28

# The kinds of score a kernel may support:
# "dot"        `q . k * scale` (every score that is a dot product of prepared inputs:
#              dot, scaled dot, bilinear);
# "blockwise"  a pairwise score with a written-out gradient, evaluated per key block
#              (Bahdanau's additive score);
# "any"        any `keras_attn.scores.Score` (evaluated whole, differentiated by the backend).
SCORE_KINDS = ("dot", "blockwise", "any")


def score_kind(score) -> str:
    """The kind of `score` (`None`: the dot product), from the score's own `kind`."""
    return "dot" if score is None else getattr(score, "kind", "any")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel and what it supports.

    Attributes:
        name: its `implementation` name.
        run: `run(query, key, value, spec) -> (output, weights or None)`.
        weights: returns the `(..., Tq, Tv)` weights.
        dropout: applies dropout to the weights.
        normalize: takes a custom normalization (`spec.normalize`).
        scores: the score kinds it evaluates (`SCORE_KINDS`).
        memory: its working memory, for the docs.
        auto_rank: its place in the order `"auto"` tries the kernels, lowest
            first (one rank per kernel).
        wanted: `wanted(spec, shape, large, flash_attention) -> bool`, whether
            `"auto"` takes it for a call it supports (`shape`: the scores'
            `(..., Tq, Tv)`, `None` where unknown; `large`: they hold
            `CHUNKED_MIN_SCORES` values or more).
    """

    name: str
    run: Callable
    weights: bool
    dropout: bool
    normalize: bool
    scores: tuple
    memory: str
    auto_rank: int
    wanted: Callable = lambda spec, shape, large, flash_attention: True

    def refusal(self, spec: AttentionSpec, kind: str | None = None) -> str | None:
        """Why this kernel cannot run `spec` (a sentence), or `None`."""
        kind = score_kind(spec.score) if kind is None else kind
        if spec.return_weights and not self.weights:
            return (
                f"implementation={self.name!r} never forms the attention weights: call with "
                "return_attention_scores=False (return_weights=False), or use implementation "
                "'auto' or 'dense' (flash_attention not True)."
            )
        if spec.dropout and not self.dropout:
            return (
                f"implementation={self.name!r} has no dropout: use a dropout rate of 0, "
                "training=False, or implementation 'auto' or 'dense' (flash_attention not "
                f"True). Received: dropout rate {spec.dropout_rate} with training={spec.training}"
            )
        if spec.normalize is not None and not self.normalize:
            return f"implementation={self.name!r} has only the softmax: use 'dense'."
        if kind not in self.scores:
            return (
                f"implementation={self.name!r} runs the scores {self.scores}; this score is "
                f"{kind!r}: use implementation 'auto' or one of "
                f"{[k.name for k in _ordered() if kind in k.scores]}."
            )
        return None

    def __call__(self, query, key, value, spec: AttentionSpec | None = None):
        spec = AttentionSpec() if spec is None else spec
        reason = self.refusal(spec)
        if reason is not None:
            raise ValueError(reason)
        return self.run(query, key, value, spec)


# The table of kernels, by name: each kernel module registers its own. Kept in the reverse
# of "auto"'s order, the reference kernel first (dense, fused, chunked, backend), as
# `implementations()` lists them.
KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Adds `kernel` to `KERNELS` (in place of a kernel of the same name) and returns it.

    Raises:
        ValueError: another kernel already holds its `auto_rank`.
    """
    for other in KERNELS.values():
        if other.name != kernel.name and other.auto_rank == kernel.auto_rank:
            raise ValueError(
                f"Kernel {kernel.name!r} takes auto_rank={kernel.auto_rank}, which kernel "
                f"{other.name!r} holds: each kernel has its own place in the order of 'auto'."
            )
    table = {**KERNELS, kernel.name: kernel}
    KERNELS.clear()
    KERNELS.update(sorted(table.items(), key=lambda item: -item[1].auto_rank))
    return kernel


def implementations() -> tuple:
    """The names `implementation` takes: `"auto"`, then every registered kernel's."""
    return ("auto", *KERNELS)


def _ordered():
    """The kernels in the order `"auto"` tries them: the backend's kernel where the backend
    prefers it, the chunked one for large scores, the fused one, then the dense one."""
    return sorted(KERNELS.values(), key=lambda kernel: kernel.auto_rank)


def check_implementation(
    implementation: str,
    flash_attention: bool | None = None,
    dropout_rate: float = 0.0,
    score=None,
    return_weights: bool = False,
) -> str:
    """The constructor's check: a known name that agrees with `flash_attention`, the
    dropout rate and the score; returns the implementation under `flash_attention`.

    Raises:
        ValueError: an unknown name; `flash_attention=True` with `"dense"`, `"fused"`
            or `"chunked"`, `False` with `"backend"`; a kernel without dropout with a
            dropout rate, or that does not run the score.
    """
    names = implementations()
    if implementation not in names:
        raise ValueError(
            f"`implementation` must be one of {names}. Received: implementation={implementation!r}"
        )
    if flash_attention and implementation not in ("auto", "backend"):
        raise ValueError(
            "flash_attention=True runs the backend's kernel: use implementation 'auto' or "
            f"'backend'. Received: implementation={implementation!r}"
        )
    if flash_attention is False and implementation == "backend":
        raise ValueError(
            "implementation='backend' is the backend's (flash) kernel: it cannot run with "
            "flash_attention=False. Received: flash_attention=False, implementation='backend'"
        )
    implementation = "backend" if flash_attention else implementation
    if implementation != "auto":
        spec = AttentionSpec(
            dropout_rate=dropout_rate, training=True, score=score, return_weights=return_weights
        )
        reason = KERNELS[implementation].refusal(spec)
        if reason is not None:
            raise ValueError(reason)
    return implementation


def choose(
    spec: AttentionSpec,
    scores_shape: tuple,
    implementation: str = "auto",
    flash_attention: bool | None = None,
) -> Kernel:
    """The one choice of a kernel for `spec` on scores of `scores_shape` `(..., Tq, Tv)`.

    An explicit `implementation` (or `flash_attention=True`: `"backend"`) is
    checked against its declaration. `"auto"` takes the first kernel, by
    `auto_rank`, that supports the call (the weights, dropout, the
    normalization and the score) and wants it (`Kernel.wanted`): the backend's
    kernel where the backend and device prefer it (not with
    `flash_attention=False`, nor for a position bias on large scores: it
    evaluates the bias whole), the chunked one from `CHUNKED_MIN_SCORES`
    scores (unknown `Tq` or `Tv`: never; unknown leading axes count as 1),
    the fused one, the dense one.

    Raises:
        ValueError: see `check_implementation`, and a kernel that cannot give
            what the call asks.
    """
    implementation = check_implementation(implementation, flash_attention)
    kind = score_kind(spec.score)
    if implementation != "auto":
        kernel = KERNELS[implementation]
        reason = kernel.refusal(spec, kind)
        if reason is not None:
            raise ValueError(reason)
        return kernel
    # Known dims are ints; None (or a JAX symbolic dim, in `model.export`) is unknown.
    known = [d if isinstance(d, int) else None for d in scores_shape]
    large = None not in known[-2:] and math.prod(d for d in known if d) >= CHUNKED_MIN_SCORES
    for kernel in _ordered():
        if kernel.refusal(spec, kind) is None and kernel.wanted(
            spec, tuple(known), large, flash_attention
        ):
            return kernel
    raise AssertionError("the dense kernel runs every call")  # pragma: no cover

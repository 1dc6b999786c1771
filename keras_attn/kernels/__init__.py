"""The attention kernels: one call spec, kernels that declare what they support, one choice.

    kernel(query, key, value, spec) -> (output, weights or None)

`spec` is an `AttentionSpec` (mask, is_causal, query_start, window, bias,
scale, score, dropout, return_weights, normalize), built once per call by
`keras_attn.ops.attention`. Each kernel's module declares it (`registry.Kernel`)
and registers it in the one table, `KERNELS` (imported below, so that every
kernel registers; a new kernel is a new module and its import here):

| kernel | weights | dropout | scores | memory | "auto" takes it (tried in `auto_rank` order) |
|---|---|---|---|---|---|
| `dense` | returned | yes | dot, blockwise, any | `O(Tq Tv)` | 4th: for what only it runs |
| `fused` | - | - | dot | `O(Tq Tv)`, fewer passes | 3rd: the default |
| `chunked` | - | - | dot, blockwise | `O(Tq)` per block | 2nd: from `CHUNKED_MIN_SCORES` |
| `backend` | - | - | dot | the backend's | 1st: JAX on a GPU, torch (CPU: Tq > 1) |

(`dense` alone returns the weights, applies dropout, takes a custom
normalization and any score; `backend` is `keras.ops.dot_product_attention`.)

`registry.choose` reads these declarations: it is the one choice of a kernel,
and `keras_attn.ops.attention` the one caller; layers call `ops.attention`,
not the kernels. Every kernel replaces masked scores before any max or exp
(`keras_attn.masks.fill_masked`), builds its causal and window masks with
`keras_attn.masks.position_mask`, adds the bias (`bias.AttentionBias`:
tensors, and position biases evaluated where the kernel needs them, per key
block for the chunked kernel) to the scores in float32, gives rows with no
visible key a zero output with zero gradients, and guards its weighted sum
against non-finite keys and values at masked positions (`finite`). A
kernel's custom gradient goes through `keras_attn.kernels._gradient.custom_gradient`,
every tensor it reads an argument (closed over, a tensor breaks `model.export` on JAX).
"""

# Importing a kernel's module registers its kernel: backend, chunked, dense and fused here.
from keras_attn.kernels import bias, finite, registry
from keras_attn.kernels.backend import backend_attention
from keras_attn.kernels.bias import AttentionBias
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.kernels.dense import dense_attention, masked_softmax, softmax
from keras_attn.kernels.fused import fused_attention
from keras_attn.kernels.registry import (
    CHUNKED_MIN_SCORES,
    KERNELS,
    Kernel,
    check_implementation,
    choose,
    implementations,
    score_kind,
)
from keras_attn.kernels.spec import AttentionSpec

# The names `implementation` takes, once every kernel above has registered:
# ("auto", "dense", "fused", "chunked", "backend").
IMPLEMENTATIONS = implementations()

__all__ = [
    "CHUNKED_MIN_SCORES",
    "IMPLEMENTATIONS",
    "KERNELS",
    "AttentionBias",
    "AttentionSpec",
    "Kernel",
    "backend_attention",
    "bias",
    "check_implementation",
    "choose",
    "chunked_attention",
    "dense_attention",
    "finite",
    "fused_attention",
    "masked_softmax",
    "registry",
    "score_kind",
    "softmax",
]

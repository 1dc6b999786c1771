"""The attention kernels, behind one signature.

    kernel(query, key, value, mask=None, is_causal=False, query_start=None,
           scale=None, dropout=None, window=None, bias=None) -> (output, weights or None)

| kernel | weights | dropout | memory | |
|---|---|---|---|---|
| `dense_attention` | returned | yes | `O(Tq Tv)` | the reference: masked softmax, weighted sum |
| `fused_attention` | - | - | `O(Tq Tv)`, fewer passes | a written-out gradient |
| `chunked_attention` | - | - | `O(Tq)` per key block | an online softmax over key blocks |
| `backend_attention` | - | - | the backend's | `keras.ops.dot_product_attention` (cuDNN, SDPA) |

Every kernel replaces masked scores before any max or exp
(`keras_attn.masks.fill_masked`), builds its causal mask with
`keras_attn.masks.position_mask` (causal, sliding `window`), adds a `bias`
(`keras_attn.kernels.bias`: tensors, and position biases evaluated where the
kernel needs them, per key block for the chunked kernel) to the scaled scores
in float32, gives rows with no visible key a zero output
with zero gradients, and guards its weighted sum against non-finite keys and
values at masked positions (`finite`). `keras_attn.ops.attention` is the one
place that chooses a kernel; layers call it, not the kernels. A kernel's custom
gradient goes through `keras_attn.kernels._gradient.custom_gradient`, every
tensor it reads an argument (closed over, a tensor breaks `model.export` on JAX).
"""

from keras_attn.kernels import bias, finite
from keras_attn.kernels.backend import backend_attention
from keras_attn.kernels.chunked import chunked_attention
from keras_attn.kernels.dense import dense_attention, masked_softmax, softmax
from keras_attn.kernels.fused import fused_attention

KERNELS = {
    "dense": dense_attention,
    "fused": fused_attention,
    "chunked": chunked_attention,
    "backend": backend_attention,
}

__all__ = [
    "KERNELS",
    "backend_attention",
    "bias",
    "chunked_attention",
    "dense_attention",
    "finite",
    "fused_attention",
    "masked_softmax",
    "softmax",
]

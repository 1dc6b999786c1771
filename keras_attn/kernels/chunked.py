"""Memory-efficient attention: an online softmax over blocks of keys.

`chunked_attention` computes `softmax(q k^T * scale) v` without ever holding
the `(Tq, Tv)` score matrix. The keys and values are read in blocks of `Bk`;
for each block the scores `s` of every query against it are computed, and a
running row maximum `m`, row sum `l` and weighted sum `acc` are updated
(Milakov & Gimelshein 2018; Dao et al. 2022):

    m' = max(m, max_j s_j)
    l' = l * exp(m - m') + sum_j exp(s_j - m')
    acc' = acc * exp(m - m') + sum_j exp(s_j - m') v_j
    output = acc / l     (m and 1 / l kept for the backward pass)

The gradient is custom: the backward pass visits the key blocks again,
recomputes `p = exp(s - m) / l` and forms `dV_j = p^T dO`,
`dS = p * (dO V_j^T - rowsum(dO * O))`, `dQ += dS K_j`, `dK_j = dS^T Q`. Only
`q, k, v`, the output, `m` and `1 / l` are saved, so memory is `O(B h Tq (d + Bk))`
instead of `O(B h Tq Tv)`.

Masking happens per block, with the mask functions of `keras_attn.masks`: a
boolean mask broadcastable to `(..., Tq, Tv)` is sliced along its key axis (a
key-padding mask `(..., 1, Tv)` stays `O(Tv)`; a full mask is only as large as
the caller made it), the causal mask is `causal_mask(..., key_start=)` of the
block's positions, and the masked scores of a block are replaced
(`fill_masked`) before its maximum and exp. The running maximum starts at
the lowest visible score: a row whose scores are all far below any threshold
(a bias of -3e25, or float32's lowest) gets its softmax. Which rows see a key
is read from the masks, block by block: a row with no visible key gives a
zero output and zero gradients, never NaN. A NaN or inf key or value
at a masked position changes nothing (`keras_attn.kernels.finite`).
"""

import dataclasses
import math
from typing import Any

import keras
from keras import ops

from keras_attn import masks
from keras_attn.kernels import bias as bias_lib
from keras_attn.kernels import finite
from keras_attn.kernels._gradient import custom_gradient
from keras_attn.kernels._shapes import check_qkv, default_scale, dims, swap_last
from keras_attn.kernels.registry import Kernel, register

# Start of the running maximum: the lowest visible score (`keras_attn.masks.LOWEST`,
# a bias is raised to it), 2^104 above the fill of masked scores, so exp(FILL - m)
# is exactly 0 from the first block, and the largest visible score of a row, however
# negative, gives p = 1. Which rows see a key is read from the masks, not from m or l.
_M_INIT = masks.LOWEST
# Default number of float32 elements in one (..., Tq, Bk) tile: 64 MiB.
TILE_ELEMENTS = 2**24


def _slice_axis(x, axis, start, size):
    """`x[..., start:start + size, ...]` along `axis` (negative), `start` may be a tensor."""
    shape = dims(x)
    axis = len(shape) + axis
    starts = [0] * len(shape)
    starts[axis] = start
    shape[axis] = size
    return ops.slice(x, starts, shape)


def _pad_axis(x, axis, amount, value=0):
    """Pads `amount` (an int or a scalar tensor) entries of `value` at the end of `axis`."""
    if isinstance(amount, int) and amount == 0:
        return x
    widths = [[0, 0] for _ in x.shape]
    widths[axis] = [0, amount]
    return ops.pad(x, widths, constant_values=value)


def block_size_for(query, value_length, tile_elements=TILE_ELEMENTS):
    """The default key block `Bk`: a power of two in [64, 1024] with a tile near `tile_elements`.

    A tile is the `(..., Tq, Bk)` score block; dimensions unknown at trace
    time (None, or symbolic in a JAX export) count as 1. `Bk` never exceeds the key
    length rounded up to a power of two.
    """
    rows = math.prod(d for d in query.shape[:-1] if isinstance(d, int))
    block = 2 ** max(6, min(10, int(math.log2(max(1, tile_elements // max(rows, 1))))))
    if value_length is not None:
        block = min(block, 2 ** math.ceil(math.log2(max(value_length, 1))))
    return block


def chunked_attention(query, key, value, spec, block_size=None):
    """Attention in key blocks with an online softmax.

    Equal to `keras_attn.kernels.dense_attention(...)[0]` (float32: to ~1e-6)
    but the `(Tq, Tv)` weights are never materialised, in the forward or the
    backward pass, eager or traced. There is no dropout and no weights output.

    `output_i = sum_j softmax_j(s(q_i, k_j) + bias_ij) v_j` over the visible
    keys, `s` the scaled dot product or a blockwise score (`spec.score` with
    `kind = "blockwise"`: its `pairwise` runs per block, its
    `pairwise_gradient` in the backward pass).

    Args:
        query, key, value, spec: as `keras_attn.kernels.dense_attention`. Per
            key block: the causal and window masks are built
            (`keras_attn.masks.position_mask`), `spec.mask` is sliced along its
            key axis (pass a key-padding mask as `(..., 1, Tv)` to keep memory
            `O(Tv)`), a bias tensor is sliced and a position bias evaluated at
            the block's positions only (no `(Tq, Tv)` bias is ever formed; its
            gradient is accumulated block by block).
        block_size: keys per block `Bk`; `None` picks one so that a float32
            `(..., Tq, Bk)` tile (times the score's width for a blockwise
            score) holds about `TILE_ELEMENTS` values.

    Returns:
        `(output, None)`: `(..., Tq, dv)` in the dtype of `value`; rows with
        no visible key are zero. Scores, softmax and accumulators run in
        float32 whatever the input dtype; `Q K^T`, `dQ`, `dK` and `dV` are
        matmuls in the input dtype (bf16 on AMX under `mixed_bfloat16`),
        `P V` and `dP` in float32 (so that the gradients under bf16 are as
        close to float32 as the dense kernel's).

    Example:

    >>> from keras_attn import kernels
    >>> q = keras.random.normal((1, 2, 300, 16))
    >>> spec = kernels.AttentionSpec(is_causal=True, return_weights=False)
    >>> out, _ = kernels.chunked_attention(q, q, q, spec, block_size=64)
    >>> ref, _ = kernels.dense_attention(q, q, q, spec)
    >>> print(out.shape, bool(keras.ops.max(keras.ops.abs(out - ref)) < 1e-5))
    (1, 2, 300, 16) True

    Reference:
        Milakov & Gimelshein, 2018, "Online normalizer calculation for
        softmax", https://arxiv.org/abs/1805.02867; Rabe & Staats, 2021,
        "Self-attention Does Not Need O(n^2) Memory",
        https://arxiv.org/abs/2112.05682; Dao et al., 2022, "FlashAttention",
        https://arxiv.org/abs/2205.14135
    """
    check_qkv(query, key, value, same_widths=spec.score is None)
    query_length, value_length = dims(query)[-2], dims(key)[-2]
    static_length = key.shape[-2] if isinstance(key.shape[-2], int) else None
    query_start = value_length - query_length if spec.query_start is None else spec.query_start
    no_rows = any(isinstance(d, int) and d == 0 for d in query.shape[:-1])
    if static_length == 0 or no_rows:  # no key (every row is zero) or no row: no block to trace
        return _zero_output(query, key, value), None
    # Non-finite keys and values zeroed and flagged: a NaN at a masked position
    # then reaches no block's sum (keras_attn.kernels.finite).
    value, key, flag = finite.zero_nonfinite(value, key)  # flag: (..., Tv, 1)
    if flag is None:  # nothing flagged (an eager call on finite inputs)
        flag = ops.zeros_like(value[..., :1])
    # A blockwise score's tile is (..., Tq, Bk, width): the width counts as more rows.
    width = 1 if spec.score is None else query.shape[-1] or 1
    block = int(block_size or block_size_for(query, static_length, TILE_ELEMENTS // width))
    if block <= 0:
        raise ValueError(f"`block_size` must be positive. Received: block_size={block_size}")
    num_blocks = -(-value_length // block)  # an int, or a scalar tensor for an unknown length
    pad = num_blocks * block - value_length
    key, value, flag = (_pad_axis(x, -2, pad) for x in (key, value, flag))
    mask = spec.mask
    if mask is not None and mask.shape[-1] != 1:
        mask = _pad_axis(mask, -1, pad, False)
    bias = spec.bias
    if bias is not None:  # tensors padded to whole blocks, like the keys
        bias = bias.with_inputs(
            [t if t.shape[-1] == 1 else _pad_axis(t, -1, pad) for t in bias.tensors]
            + [p for params in bias.parameters for p in params]
        )
    blocks = _Blocks(
        block=block,
        is_causal=spec.is_causal,
        window=spec.window,
        tail=not isinstance(pad, int) or pad > 0,  # padded keys past the end to hide
        num_heads=bias_lib.num_heads_of(query),
        bias=bias,
        score=spec.score,
        mask=mask,
        query_start=query_start,
        query_length=query_length,
        value_length=value_length,
        num_blocks=num_blocks,
    )
    q = query
    if spec.score is None:  # scaling Tq * dk values, not Tq * Tv
        q = ops.multiply(query, ops.cast(default_scale(query, spec.scale), query.dtype))
    return _attend(q, key, value, flag, blocks), None


def _zero_output(query, key, value):
    """Zeros `(..., Tq, dv)` computed from the inputs, so that their gradients are zeros (not
    missing): sums over an empty axis, `(q[..., :0] k[..., :0]^T) v`."""
    empty = ops.matmul(query[..., :0], swap_last(key[..., :0]))  # (..., Tq, Tv)
    return ops.matmul(ops.cast(empty, value.dtype), value)


# The fields of `_Blocks` that may be tensors: arguments of the custom gradient.
_CONSTANTS = ("mask", "query_start", "query_length", "value_length", "num_blocks")


@dataclasses.dataclass(frozen=True, eq=False)
class _Blocks:
    """What one key block sees: its mask (`visible(j)`), bias (`bias_of`) and scores.

    Its possibly-tensor fields (`_CONSTANTS`) enter the custom gradient as
    arguments, and `with_constants` rebinds them there
    (`keras_attn.kernels._gradient`); the bias and the score get theirs
    through `with_inputs`.
    """

    block: int
    is_causal: bool
    window: int | None
    tail: bool
    num_heads: int
    bias: Any
    score: Any
    mask: Any
    query_start: Any
    query_length: Any
    value_length: Any
    num_blocks: Any

    # The bias's query positions, computed once from the traced constants (`with_constants`).
    query_positions: Any = None

    @property
    def masked(self):
        """Whether a block has masked keys (`visible(j)` is not `None`)."""
        return self.mask is not None or self.is_causal or self.window is not None or self.tail

    @property
    def constants(self):
        return tuple(getattr(self, name) for name in _CONSTANTS)

    def with_constants(self, constants):
        traced = dataclasses.replace(self, **dict(zip(_CONSTANTS, constants, strict=True)))
        if self.bias is None:
            return traced
        positions = masks.query_positions(traced.query_length, None, traced.query_start)
        return dataclasses.replace(traced, query_positions=positions)

    def visible(self, j):
        """Boolean visibility of block `j`, broadcastable to `(..., Tq, Bk)`, or `None`."""
        first, block, mask = j * self.block, self.block, self.mask
        if mask is not None and mask.shape[-1] != 1:
            mask = _slice_axis(mask, -1, first, block)
        parts = [
            mask,
            masks.position_mask(
                self.query_length, block, self.is_causal, self.window, self.query_start, first
            ),
        ]
        if self.tail:
            parts.append(masks.positions_below(self.value_length, block, start=first))
        return masks.merge_masks(*parts)

    def bias_of(self, j, bias):
        """The float32 bias of block `j` from `bias` (an `AttentionBias` of traced inputs)."""
        if bias is None:
            return None
        first = j * self.block
        keys = masks.key_positions(self.block, first)
        return bias.block(
            self.query_positions, keys, first, self.block, self.num_heads, _slice_axis
        )

    def scores(self, j, q, k, bias, score_parameters, visible):
        """The float32 `(..., Tq, Bk)` scores of block `j`, biased, the masked ones replaced
        (`visible`: `visible(j)`)."""
        k_block = _slice_axis(k, -2, j * self.block, self.block)
        if self.score is None:
            scores = ops.matmul(q, swap_last(k_block))
        else:
            scores = self.score.pairwise(q, k_block, score_parameters)
        block_bias = self.bias_of(j, bias)
        if block_bias is not None:
            scores = ops.cast(scores, "float32") + block_bias
        return masks.fill_masked(scores, visible)

    def score_gradients(self, j, d_scores, q, k, score_parameters):
        """`(dQ, dK_j, d_parameters)` of block `j`'s scores, from their gradient `dS`."""
        k_block = _slice_axis(k, -2, j * self.block, self.block)
        if self.score is None:
            d_scores = ops.cast(d_scores, q.dtype)
            return ops.matmul(d_scores, k_block), ops.matmul(swap_last(d_scores), q), ()
        return self.score.pairwise_gradient(d_scores, q, k_block, score_parameters)


def _fori_loop(num_blocks, body, init):
    """`keras.ops.fori_loop(0, num_blocks, body, init)`, one block at a time.

    On TensorFlow, `keras.ops.fori_loop` is a `tf.while_loop` that may run 10
    iterations at once; the score tiles of several blocks would then be alive
    together (measured: 2.2 GiB instead of 1.0 GiB for fwd+bwd at L=8192), so
    there the loop runs with `parallel_iterations=1`.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.while_loop(
            lambda j, _: j < num_blocks,
            lambda j, carry: (j + 1, body(j, carry)),
            (ops.convert_to_tensor(0, "int32"), init),
            parallel_iterations=1,
        )[1]
    return ops.fori_loop(0, num_blocks, body, init)


def _attend(q, k, v, flag, blocks):
    bias_inputs = [] if blocks.bias is None else blocks.bias.inputs()
    score_inputs = [] if blocks.score is None else list(blocks.score.score_parameters())
    count = 3 + len(bias_inputs) + len(score_inputs)

    def attend(*args):
        traced = blocks.with_constants(args[count + 1 :])
        # The forward pass on stopped inputs: an eager GradientTape would
        # otherwise record every block's ops and keep their (Tq, Bk) tiles
        # alive (O(Tq Tv) memory; measured at L=8192: 4.5 GiB instead of 1.2).
        # The flag too: made from the watched value (`zeros_like`, when nothing
        # is flagged), it would have the tape keep every block's P of `P flag`.
        stopped = [ops.stop_gradient(x) for x in args[:count]]
        flag = ops.stop_gradient(args[count])
        q, k, v = stopped[:3]
        bias_end = 3 + len(bias_inputs)
        bias = None if blocks.bias is None else blocks.bias.with_inputs(stopped[3:bias_end])
        params = tuple(stopped[bias_end:])
        out, stats, seen = _forward(q, k, v, flag, traced, bias, params)  # out: float32

        def grad(d_out):
            return _backward(q, k, v, out, stats, d_out, traced, bias, params)

        # NaN on the rows that see a non-finite key or value (forward only).
        seen_out = ops.where(seen > 0, float("nan"), out)
        return ops.cast(seen_out, args[2].dtype), grad

    inputs = (q, k, v, *bias_inputs, *score_inputs)
    return custom_gradient(attend, inputs, (flag, *blocks.constants))


def _forward(q, k, v, flag, blocks, bias, params):
    block = blocks.block
    rows = dims(q)[:-1]  # (..., Tq)
    m = ops.full(rows + [1], _M_INIT, "float32")
    l = ops.zeros(rows + [1], "float32")  # noqa: E741 (the paper's name)
    acc = ops.zeros(rows + [v.shape[-1]], "float32")
    # `l` restricted to the flagged (non-finite) keys: > 0 when a row sees one.
    seen = ops.zeros(rows + [1], "float32")
    flag = ops.cast(flag, "float32")
    # P V in float32 (a no-op cast for float32 inputs): the backward pass's
    # rowsum(dO * O) then equals rowsum(P * dP) for bfloat16 inputs too, and
    # their gradients are as close to float32 as the dense path's.
    v32 = ops.cast(v, "float32")

    def step(j, carry):
        m, l, acc, seen, *any_key = carry  # noqa: E741
        visible = blocks.visible(j)
        s = blocks.scores(j, q, k, bias, params, visible)
        m_new = ops.maximum(m, ops.max(s, axis=-1, keepdims=True))
        p = ops.exp(s - m_new)
        alpha = ops.exp(m - m_new)
        pv = ops.matmul(p, _slice_axis(v32, -2, j * block, block))  # (..., Tq, dv)
        p_flag = ops.matmul(p, _slice_axis(flag, -2, j * block, block))  # (..., Tq, 1)
        if any_key:
            any_key = [ops.logical_or(any_key[0], ops.any(visible, axis=-1, keepdims=True))]
        return (
            m_new,
            l * alpha + ops.sum(p, axis=-1, keepdims=True),
            acc * alpha + pv,
            seen * alpha + p_flag,
            *any_key,
        )

    init = (m, l, acc, seen)
    if blocks.masked:  # whether each row sees a key, from the masks: (..., Tq, 1) bool
        init += (ops.zeros(rows + [1], "bool"),)
    m, l, acc, seen, *any_key = _fori_loop(blocks.num_blocks, step, init)  # noqa: E741
    # l >= 1 on a row that sees a key (its largest score's p is 1), unless every
    # visible score is -inf (a float16 overflow): that row gives zeros.
    safe_l = ops.where(l > 0, l, 1.0)
    # Kept in float32 for the backward pass: rowsum(dO * O) from an output
    # rounded to bfloat16 would not cancel against rowsum(P * dP).
    out = acc / safe_l
    # m and 1 / l, not lse = m + log(l): at m = -3e25 the float32 sum drops log(l).
    inverse_l = 1.0 / safe_l
    if any_key:  # a row that saw nothing: zeros, and m = 1 / l = 0 (every recomputed p is 0)
        any_key = any_key[0]
        out, m, inverse_l, seen = (ops.where(any_key, x, 0.0) for x in (out, m, inverse_l, seen))
    return out, (m, inverse_l), seen


def _backward(q, k, v, out, stats, d_out, blocks, bias, params):
    block = blocks.block
    m, inverse_l = stats  # (..., Tq, 1) each
    # rowsum(dO * O) equals rowsum(P * dP): an O(Tq dv) pass instead of O(Tq Tv).
    d_out32 = ops.cast(d_out, "float32")
    delta = ops.sum(d_out32 * out, axis=-1, keepdims=True)  # (..., Tq, 1)
    d_out = ops.cast(d_out, v.dtype)
    # dP - delta cancels, so dP is float32 too: rounded to bfloat16 it is off by
    # ~0.4 % of dP, not small against dP - delta (measured: 3x the dense
    # path's gradient error under mixed_bfloat16; with float32 P V and dP, equal).
    v32 = ops.cast(v, "float32")
    dq = ops.zeros(dims(q), "float32")
    dk = ops.zeros(dims(k), k.dtype)
    dv = ops.zeros(dims(v), v.dtype)
    zeros = [0] * (len(k.shape) - 2)
    d_bias = _BiasGradients(bias, blocks)
    d_params = tuple(ops.zeros(dims(p), "float32") for p in params)

    def step(j, carry):
        dq, dk, dv, d_bias_carry, d_params = carry
        seen = blocks.visible(j)
        p = ops.exp(blocks.scores(j, q, k, bias, params, seen) - m) * inverse_l  # 0 if masked
        dv_j = ops.matmul(swap_last(ops.cast(p, v.dtype)), d_out)
        dp = ops.matmul(d_out32, swap_last(_slice_axis(v32, -2, j * block, block)))
        ds = p * (dp - delta)
        if seen is not None:  # dP may be inf at a huge masked value: 0 * inf is NaN
            ds = ops.where(seen, ds, 0.0)
        d_bias_carry = d_bias.add(d_bias_carry, j, ds)
        dq_j, dk_j, d_params_j = blocks.score_gradients(j, ds, q, k, params)
        dq = dq + ops.cast(dq_j, "float32")
        d_params = tuple(
            d + ops.cast(g, "float32") for d, g in zip(d_params, d_params_j, strict=True)
        )
        start = zeros + [j * block, 0]
        dk = ops.slice_update(dk, start, ops.cast(dk_j, dk.dtype))
        dv = ops.slice_update(dv, start, ops.cast(dv_j, dv.dtype))
        return dq, dk, dv, d_bias_carry, d_params

    init = (dq, dk, dv, d_bias.init(), d_params)
    dq, dk, dv, d_biases, d_params = _fori_loop(blocks.num_blocks, step, init)
    d_params = (ops.cast(d, p.dtype) for d, p in zip(d_params, params, strict=True))
    return (ops.cast(dq, q.dtype), dk, dv, *d_biases, *d_params)


class _BiasGradients:
    """The bias inputs' gradients, accumulated over key blocks (a tuple carried by the loop)."""

    def __init__(self, bias, blocks):
        self.bias, self.blocks = bias, blocks

    def init(self):
        if self.bias is None:
            return ()
        return tuple(ops.zeros(dims(x), "float32") for x in self.bias.inputs())

    def add(self, carry, j, ds):
        if self.bias is None:
            return carry
        block, first = self.blocks.block, j * self.blocks.block
        carry = list(carry)
        for i, t in enumerate(self.bias.tensors):
            if t.shape[-1] == 1:
                carry[i] = carry[i] + bias_lib.sum_to_shape(ds, t.shape)
            else:
                shape = tuple(t.shape[:-1]) + (block,)
                start = [0] * (len(t.shape) - 1) + [first]
                carry[i] = ops.slice_update(carry[i], start, bias_lib.sum_to_shape(ds, shape))
        keys = masks.key_positions(block, first)
        grads = self.bias.block_gradients(ds, self.blocks.query_positions, keys)
        i = len(self.bias.tensors)
        for params_grads in grads:
            for g in params_grads:
                carry[i] = carry[i] + ops.cast(g, "float32")
                i += 1
        return tuple(carry)


CHUNKED = Kernel(
    name="chunked",
    run=chunked_attention,
    weights=False,
    dropout=False,
    normalize=False,
    scores=("dot", "blockwise"),
    memory="O(Tq) per key block",
    auto_rank=1,
    wanted=lambda spec, shape, large, flash_attention: large,
)
register(CHUNKED)

"""The backend's fused kernel: `keras.ops.dot_product_attention` (torch: SDPA), with our masks.

`backend_attention` hands the attention itself to the backend: on JAX with
a GPU, cuDNN's (flash) attention through `jax.nn.dot_product_attention`; on
torch, `torch.nn.functional.scaled_dot_product_attention` (SDPA: flash or
memory-efficient kernels on CUDA, a fused C++ kernel on the CPU); on
TensorFlow, Keras' own composition (no fused kernel: `"auto"` never picks
it there). Around the call it keeps what every kernel guarantees:

- the causal mask is ours, aligned to the end (`query_start`, default
  `Tv - Tq`): Keras' `is_causal` (top-left) is used only when it is the same
  mask (`Tq == Tv`, no `query_start`, no window), else the position masks go
  in as an explicit boolean mask; a sliding `window` likewise;
- masked keys get exactly zero weight; rows with no visible key (and padded
  rows) give a zero output, with zero (finite) gradients, whatever the
  backend computes for them;
- the keys and values that no query sees (padding) are zeroed, so nothing
  they hold (huge, inf, NaN) reaches a logit, the output or a gradient; a
  non-finite key or value elsewhere is zeroed too (`finite.zero_nonfinite`)
  and the rows whose mask lets them see it are set to NaN (without the
  weights, "sees" is the mask: a weight that underflows to 0 still counts);
- a bias (tensors and position biases, `keras_attn.kernels.bias`) is
  evaluated whole and passed as Keras' `bias=`; on torch (whose SDPA takes a
  mask or a bias) with the mask folded into it; its gradient is the backend's;
- the bias is added in float32, as on every kernel: float16 and bfloat16
  inputs with a bias are computed in float32 (Keras' op and SDPA take the
  bias in the inputs' dtype: in float16 `7e4` is inf, in bfloat16 `300.7` is
  300), and float16 on torch, where Keras adds the mask to the logits (a
  large negative) rather than replacing them, with a mask too, so a masked
  logit that overflowed float16 cannot win;
- next to a mask, a bias is raised to half the masked logits' fill (-1.2e38
  in float32): a visible logit stays above every masked one, also where the
  bias holds float32's lowest (an additive mask); what it changes is the
  order of biases below -1.2e38, which give a weight of 0 next to any other;
- a mask or bias of rank 1 (`(Tv,)`) is given the query axis `(1, Tv)`.

Keras' layout is `(B, T, N, H)`, ours `(..., T, d)`: the kernel transposes
`(B, N, T, H)` in and out (rank 3 gains a heads axis of 1, more leading axes
are merged). Where the projections give `(B, T, N, H)` and the kernel takes
`(B, N, T, H)` as `MultiHeadAttention` does, the two transposes cancel: XLA
folds them. On torch the kernel calls SDPA itself (`_torch_sdpa`), which
takes our layout as it is: Keras' op would transpose to SDPA's layout and
back, with a copy of each input, on every eager call.
"""

import functools

import keras
import numpy as np
from keras import ops
from keras.src.backend.common import global_state

from keras_attn import masks
from keras_attn._execution import transpose
from keras_attn.kernels import finite
from keras_attn.kernels._shapes import default_scale, dims, lengths, swap_last
from keras_attn.kernels.registry import Kernel, register

# Whether `"auto"` takes the backend kernel on torch with the CPU as its
# device, for more than one query (or an unknown number), or one query that
# SDPA gets without a mask: with one query and a mask (a cached decoding step)
# our fused kernel is faster there, SDPA with a mask measured 1.1-14x slower;
# with more, SDPA was as fast or faster in training (forward and backward
# 0.46-1.09x). Measured with benchmarks/backend_kernel.py (numbers in
# benchmarks/README.md). One query without a mask: SDPA as fast at 4,096 keys
# (forward and backward) and, eagerly at 1 key, one op in place of our kernel's ten.
TORCH_CPU = True


def device_kind():
    """The kind of Keras' default device: `"cpu"`, `"gpu"`, `"cuda"`, `"tpu"`, `"mps"`.

    On torch, where Keras puts new tensors: the device of a `keras.device`
    scope (Keras' own global, which is what its `get_device` reads; a
    functional model is built in a `"meta"` scope, which says nothing about
    where the model will run), else Keras' default device, read once.
    """
    if keras.backend.backend() == "torch":
        scope = global_state.get_global_attribute("torch_device", None)
        return _torch_device_kind() if scope is None else str(scope).split(":")[0]
    return _listed_device_kind()


@functools.cache
def _torch_device_kind():
    return ops.convert_to_tensor(0.0).device.type


@functools.cache
def _listed_device_kind():
    return keras.distribution.list_devices()[0].split(":")[0].lower()


def _backend_name():
    return keras.backend.backend()


def preferred(shape=None, masked=True):
    """Whether `implementation="auto"` takes the backend kernel on this backend and device.

    JAX on a GPU (cuDNN), torch on CUDA (SDPA) and, if `TORCH_CPU`, torch on
    the CPU for scores of `shape` `(..., Tq, Tv)` (`None` where unknown) with
    more than one query or an unknown number, or one query when not `masked`
    (SDPA gets neither a mask nor a bias: `sdpa_masked`); never
    TensorFlow (no fused kernel), nor JAX on the CPU (Keras' op is then XLA's
    composition). Reads `device_kind()`, which is read once.
    """
    backend = _backend_name()
    if backend == "jax":
        return device_kind() == "gpu"
    if backend == "torch":
        kind = device_kind()
        cpu = kind == "cpu" and TORCH_CPU and (_many_queries(shape) or not masked)
        return kind == "cuda" or cpu
    return False


def sdpa_masked(spec, shape=None):
    """Whether `backend_attention` hands the backend a mask or a bias for `spec` on `shape`.

    `False` only when Keras' own `is_causal` (or nothing) is the whole mask:
    no padding or explicit mask, no window, no bias, and either no causal
    mask or one that is Keras' top-left one (`Tq == Tv`, static).
    """
    if spec.mask is not None or spec.bias is not None or spec.window is not None:
        return True
    tq, tv = (None, None) if shape is None else tuple(shape)[-2:]
    return spec.is_causal and not _native_causal(True, tq, tv, spec.query_start, None)


def _many_queries(shape):
    """Whether scores of `shape` `(..., Tq, Tv)` have more than one query, or an unknown number."""
    return shape is None or shape[-2] is None or shape[-2] > 1


def _static(x):
    return x if isinstance(x, int) else None


def _native_causal(is_causal, query_length, value_length, query_start, window):
    """Whether Keras' top-left `is_causal` is our end-aligned causal mask (and all of it)."""
    tq, tv = _static(query_length), _static(value_length)
    start_zero = query_start is None or (isinstance(query_start, int) and query_start == 0)
    return is_causal and window is None and tq is not None and tq == tv and start_zero


def _to_keras(x, rank):
    """`(..., T, d)` of `rank` -> Keras' `(B, T, N, H)`."""
    if rank == 2:  # (T, d)
        return x[None, :, None, :]
    if rank == 3:  # (B, T, d): one head
        return ops.expand_dims(x, 2)
    if rank > 4:  # (b_1, ..., b_n, N, T, d): the batch axes merged
        shape = dims(x)
        x = ops.reshape(x, (-1, *shape[-3:]))
    return transpose(x, (0, 2, 1, 3))


def _from_keras(y, like):
    """Keras' `(B, T, N, H)` -> ours, `like`'s leading axes."""
    rank = len(like.shape)
    if rank == 2:
        return y[0, :, 0, :]
    if rank == 3:
        return y[:, :, 0, :]
    y = transpose(y, (0, 2, 1, 3))  # (B, N, T, H)
    if rank > 4:
        y = ops.reshape(y, (*dims(like)[:-2], *dims(y)[-2:]))
    return y


def _grid_to_keras(m, rank, like):
    """A mask or bias broadcastable to the scores (inputs of `rank`) -> `(B|1, N|1, Tq, Tv)`."""
    while len(m.shape) < rank:
        m = ops.expand_dims(m, 0)
    if rank == 2:
        return m[None, None]
    if rank == 3:
        return ops.expand_dims(m, 1)
    if rank > 4:  # broadcast over the batch axes, then merged as the inputs are
        lead = dims(like)[:-2]
        m = ops.broadcast_to(m, (*lead, *dims(m)[-2:]))
        m = ops.reshape(m, (-1, *dims(m)[-3:]))
    return m


def _nan_where_seen(out, mask, flag):
    """NaN on the rows of `out` whose `mask` (or every row, `None`) lets them see a flagged key."""
    if flag is None:  # nothing flagged
        return out

    def mark():
        flagged = swap_last(flag) > 0  # (..., 1, Tv)
        seen = flagged if mask is None else ops.logical_and(mask, flagged)
        rows = ops.any(seen, axis=-1, keepdims=True)  # (..., Tq|1, 1)
        return ops.where(rows, ops.cast(float("nan"), out.dtype), out)

    return ops.cond(ops.any(flag > 0), mark, lambda: out)


def _same_widths(query, key, value):
    """On JAX (whose op needs `dk == dv`): the narrower side padded with zero channels.

    Zero channels of the query and key add nothing to a logit; zero channels
    of the value give zero output channels, sliced off after the call.
    """
    dk, dv = query.shape[-1], value.shape[-1]
    if keras.backend.backend() != "jax" or dk == dv:
        return query, key, value

    def pad(x, width):
        return ops.pad(x, [(0, 0)] * (len(x.shape) - 1) + [(0, width - x.shape[-1])])

    if dk < dv:
        return pad(query, dv), pad(key, dv), value
    return query, key, pad(value, dk)


def _is_float16(x):
    return keras.backend.standardize_dtype(x.dtype) == "float16"


def _is_low_precision(x):
    return keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16")


def _with_query_axis(x):
    """A mask or bias broadcastable to the scores, with a query axis: `(Tv,)` -> `(1, Tv)`."""
    return x if x is None or len(x.shape) >= 2 else ops.reshape(x, (1, -1))


def _large_negative(dtype):
    """A fill for masked logits that stays finite when added to once more (Keras' choice)."""
    return -0.7 * float(np.finfo(keras.backend.standardize_dtype(dtype)).max)


def _torch_sdpa(query, key, value, bias, mask, scale, is_causal):
    """`torch.nn.functional.scaled_dot_product_attention` on our layout, as Keras' op calls it.

    SDPA takes `(..., T, d)` with any leading axes, ours; Keras' op wants
    `(B, T, N, H)` and transposes to SDPA's layout and back (on torch's CPU
    with a copy of each), which an eager call pays for in five transposes and
    three copies. The same call otherwise: a boolean `mask` becomes an additive
    one (0 or a large negative, Keras' choice, so a row that sees nothing has
    finite gradients), a `bias` (the mask already folded in) goes as
    `attn_mask`, and torch picks the SDPA kernel.
    """
    import torch

    query, key, value, bias, mask = (
        x if x is None or torch.is_tensor(x) else ops.convert_to_tensor(x)
        for x in (query, key, value, bias, mask)
    )
    if not query.dtype == key.dtype == value.dtype:  # SDPA wants one dtype: Keras' promotion
        dtype = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    if mask is not None:  # (`backend_attention` passes no `is_causal` next to it)
        bias = torch.zeros_like(mask, dtype=query.dtype)  # in the query's dtype: float64 too
        bias = bias.masked_fill(torch.logical_not(mask), _large_negative(query.dtype))
    elif bias is not None and bias.dtype != query.dtype:
        bias = bias.to(query.dtype)
    squeeze = len(query.shape) == 2  # (T, d): SDPA wants a batch axis
    if squeeze:
        query, key, value = query[None], key[None], value[None]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, is_causal=is_causal, scale=scale
    )
    return out[0] if squeeze else out


def backend_attention(query, key, value, spec):
    """`dense_attention(...)[0]` computed by `keras.ops.dot_product_attention` (torch: SDPA).

    Args:
        query, key, value, spec: as `keras_attn.kernels.dense_attention`.

    Returns:
        `(output, None)`: `(..., Tq, dv)` in the dtype of `value`; rows with
        no visible key are zero, with zero (finite) gradients. A NaN or inf
        key or value at a masked position changes nothing; at a visible one,
        the rows that see it are NaN.

    Example:

    >>> from keras_attn import kernels
    >>> q = keras.random.normal((2, 3, 5, 8))
    >>> spec = kernels.AttentionSpec(is_causal=True, return_weights=False)
    >>> out, _ = kernels.backend_attention(q, q, q, spec)
    >>> ref, _ = kernels.dense_attention(q, q, q, spec)
    >>> print(out.shape, bool(keras.ops.max(keras.ops.abs(out - ref)) < 1e-5))
    (2, 3, 5, 8) True
    """
    is_causal, query_start, window, bias = spec.is_causal, spec.query_start, spec.window, spec.bias
    query_length, value_length = lengths(query, key)
    if _static(value_length) == 0:  # no key: zeros, as every kernel gives them
        return ops.matmul(ops.zeros_like(query[..., :0]), value), None
    on_torch = keras.backend.backend() == "torch"
    # SDPA takes `is_causal` or an `attn_mask` (our bias or mask), not both: on torch, next to
    # a bias or a mask the causal mask is one of our position masks, merged into the mask.
    native = _native_causal(is_causal, query_length, value_length, query_start, window) and not (
        on_torch and (bias is not None or spec.mask is not None)
    )
    positions = masks.position_mask(
        query_length, value_length, is_causal and not native, window, query_start
    )
    mask = _with_query_axis(masks.merge_masks(spec.mask, positions))  # Keras' `mask`
    value, key, flag = finite.zero_nonfinite(value, key)
    # Every position mask, Keras' causal one included: which rows see a key. Built only
    # where read: to zero the rows that see nothing (Keras' causal mask alone: row i sees
    # key i, none to zero) or to mark the rows that see a flagged key.
    seen = None
    if mask is not None or (native and flag is not None):
        seen = mask if not native else masks.merge_masks(mask, masks.causal_mask(query_length))
    rows = seen if mask is not None and not spec.every_row_sees_a_key else None
    if mask is not None:  # the keys no query sees hold nothing a logit or a gradient could meet
        some_query = swap_last(ops.any(mask, axis=-2, keepdims=True))  # (..., Tv, 1)
        key, value = (ops.where(some_query, x, ops.zeros_like(x)) for x in (key, value))
    rank = len(query.shape)
    q, k, v = query, key, value
    if (bias is not None and _is_low_precision(query)) or (
        on_torch and mask is not None and _is_float16(query)
    ):
        # Keras and SDPA cast a bias to the inputs' dtype (a float32 bias of 7e4 is inf in
        # float16, 300.7 is 300 in bfloat16), and the torch op adds the mask to the logits (a
        # large negative, -45852 in float16: a masked logit that overflowed float16 would
        # still win). In float32, neither.
        q, k, v = (ops.cast(x, "float32") for x in (q, k, v))
    full_bias = _with_query_axis(spec.whole_bias(query, query_length, value_length))
    if full_bias is not None and mask is not None:
        # Visible logits above the masked ones' fill, whatever the bias (float32's lowest).
        full_bias = ops.maximum(full_bias, 0.5 * _large_negative("float32"))
        if on_torch:  # one of mask and bias (SDPA's rule): the mask folded in
            full_bias = ops.where(mask, full_bias, _large_negative(q.dtype))
            mask = None
    scale = default_scale(query, spec.scale)
    if on_torch:  # SDPA itself, on our layout: no transposes to Keras' and back
        out = _torch_sdpa(q, k, v, full_bias, mask, scale, native)
    else:
        if full_bias is not None:
            full_bias = _grid_to_keras(full_bias, rank, query)
        q, k, v = _same_widths(q, k, v)
        out = ops.dot_product_attention(
            _to_keras(q, rank),
            _to_keras(k, rank),
            _to_keras(v, rank),
            bias=full_bias,
            mask=None if mask is None else _grid_to_keras(mask, rank, query),
            scale=scale,
            is_causal=native,
        )  # (B, Tq, N, dv)
        out = _from_keras(out, query)
    if out.shape[-1] != value.shape[-1]:  # JAX's zero channels (`_same_widths`)
        out = out[..., : value.shape[-1]]
    if ops.dtype(out) != ops.dtype(value):  # computed in float32 (`_is_float16`)
        out = ops.cast(out, value.dtype)
    out = _nan_where_seen(out, seen, flag)
    if rows is not None:
        out = ops.where(masks.visible_rows(rows), out, ops.zeros_like(out))
    return out, None


BACKEND = Kernel(
    name="backend",
    run=backend_attention,
    weights=False,
    dropout=False,
    normalize=False,
    scores=("dot",),
    memory="the backend's",
    auto_rank=0,
    # Where the backend and device prefer it, unless the call keeps it off (flash_attention
    # False) or has a position bias on large scores (evaluated whole here).
    wanted=lambda spec, shape, large, flash_attention: (
        flash_attention is None
        and preferred(shape, masked=sdpa_masked(spec, shape))
        and not (spec.has_position_bias and large)
    ),
)
register(BACKEND)

"""Kernel calls in the tests: a kernel function with its spec's fields as keywords."""

from keras_attn import kernels, masks


def run(kernel, query, key, value, mask=None, is_causal=False, block_size=None, **fields):
    """`kernel(query, key, value, AttentionSpec(mask, is_causal, **fields))`.

    `kernel`: a kernel function (`kernels.chunked_attention`, ...) or a
    `kernels.KERNELS` entry; `block_size` goes to the chunked kernel; an
    integer mask is cast to bool, as `keras_attn.ops.attention` does.
    """
    fields.setdefault(
        "return_weights", kernel in (kernels.dense_attention, kernels.KERNELS["dense"])
    )
    spec = kernels.AttentionSpec(mask=masks.as_bool_mask(mask), is_causal=is_causal, **fields)
    if block_size is not None:
        return kernels.chunked_attention(query, key, value, spec, block_size=block_size)
    return kernel(query, key, value, spec)

"""NumPy references of the attention formulas, written from the papers' equations."""

import math

import numpy as np


def softmax_masked(scores, mask=None):
    """Softmax over the last axis; masked -> 0; a row with nothing visible -> 0."""
    scores = np.asarray(scores, np.float64)
    if mask is None:
        mask = np.ones(scores.shape, bool)
    mask = np.broadcast_to(mask, scores.shape)
    out = np.zeros(scores.shape)
    for idx in np.ndindex(scores.shape[:-1]):
        row, keep = scores[idx], mask[idx]
        if keep.any():
            e = np.exp(row[keep] - row[keep].max())
            out[idx][keep] = e / e.sum()
    return out


def dot_scores(q, k):
    return np.einsum("...qd,...kd->...qk", q, k)


def scaled_dot_scores(q, k, scale=None):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return dot_scores(q, k) * scale


def additive_scores(q, k, U, W, v, bias=None):
    """Bahdanau: e_ij = v^T tanh(W k_j + U q_i) (+ b), with explicit loops."""
    b = np.zeros(v.shape) if bias is None else bias
    *lead, tq, _ = q.shape
    tv = k.shape[-2]
    out = np.zeros((*lead, tq, tv))
    for idx in np.ndindex(*lead):
        for i in range(tq):
            for j in range(tv):
                out[idx + (i, j)] = v @ np.tanh(W.T @ k[idx + (j,)] + U.T @ q[idx + (i,)] + b)
    return out


def bilinear_scores(q, k, kernel):
    """Luong general: score_ij = q_i^T W k_j."""
    return np.einsum("...qa,ab,...kb->...qk", q, kernel, k)


def causal(tq, tv):
    return np.arange(tq)[:, None] + (tv - tq) >= np.arange(tv)[None, :]


def attend(scores, value, mask=None):
    w = softmax_masked(scores, mask)
    return w @ value, w


def band(tq, tv, window, query_start=None):
    """Sliding window: query `p_i = query_start + i` sees key `j` iff `|p_i - j| < window`."""
    start = tv - tq if query_start is None else query_start
    rows = np.arange(tq)[:, None] + start
    return np.abs(rows - np.arange(tv)[None, :]) < window


def alibi(num_heads, tq, tv, alibi_bias_max=8, query_start=None):
    """ALiBi (Press et al. 2022): `-m_h |p_i - j|`, slopes `2^(-8 k / h)` (k = 1..h) for h a
    power of two; otherwise those of the power of two below, then every other one of twice it."""

    def slopes(n):
        if np.log2(n).is_integer():
            return [2.0 ** (-alibi_bias_max * k / n) for k in range(1, n + 1)]
        low = 2 ** int(np.floor(np.log2(n)))
        return slopes(low) + slopes(2 * low)[0::2][: n - low]

    start = tv - tq if query_start is None else query_start
    distance = np.abs(np.arange(tq)[:, None] + start - np.arange(tv)[None, :])
    return -np.array(slopes(num_heads))[:, None, None] * distance[None]


def t5_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket of one `key - query` offset, as the paper's reference code computes it."""
    n, bucket = -relative_position, 0
    if bidirectional:
        num_buckets //= 2
        bucket = num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(np.log(n / exact) / np.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(large, num_buckets - 1)


def t5_bias(table, tq, tv, bidirectional, max_distance, query_start=None):
    """`bias[h, i, j] = table[bucket(j - p_i), h]`, with loops."""
    num_buckets, heads = table.shape
    start = tv - tq if query_start is None else query_start
    out = np.zeros((heads, tq, tv))
    for i in range(tq):
        for j in range(tv):
            out[:, i, j] = table[
                t5_bucket(j - (i + start), bidirectional, num_buckets, max_distance)
            ]
    return out


def llama3_scaling(frequencies, factor, low, high, original):
    """Meta's `apply_scaling` (llama-models, Llama 3.1), one rotary frequency at a time."""
    out = []
    for frequency in frequencies:
        wavelength = 2 * math.pi / frequency
        if wavelength < original / high:
            out.append(frequency)
        elif wavelength > original / low:
            out.append(frequency / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * frequency / factor + smooth * frequency)
    return np.array(out)

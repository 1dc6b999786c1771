"""NumPy references of the attention formulas, written from the papers' equations."""

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

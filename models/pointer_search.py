"""Search for pointer networks: beam search over convex polygons, and sorting.

`polygon_beam_search` keeps the `beam_width` most probable partial polygons
instead of the single greedy one (`keras_attn.models.decoding.polygon_decode`), and with
`convex=True` it only ever extends a polygon so that it stays convex and
counter-clockwise, the shape of every target. The constraint looks at the
chosen vertices and the candidate only, never at the other input points: it
does not test that the polygon contains them, so it does not compute the hull
for the model. As `keras_attn.models.decoding`'s greedy decoders, it feeds step `t` the
first `t + 1` pointers only (output row `t` of a `keras_attn.models.pointer_network`
depends on the pointers before it only): O(t) decoder work per step.

`sort_decode` is `keras_attn.models.decoding.pointer_decode` (constrained greedy) for `N`
steps.
"""

import keras
import numpy as np

from keras_attn._typing import TensorLike
from keras_attn.arguments import check_positive_int

from .pointer_decoding import pointer_decode, polygon_decode, predict_batch


def _turn(o, a, b):
    """z of `(a - o) x (b - o)` for broadcast `(..., 2)` arrays: > 0 is a left turn."""
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (
        b[..., 0] - o[..., 0]
    )


def sort_decode(model: keras.Model, points: TensorLike) -> np.ndarray:
    """Constrained greedy decoding of a permutation: `C_t = argmax_{j not in C_<t} p(j)`.

    `keras_attn.models.decoding.pointer_decode(model, points)`, for `N` steps: O(N^2)
    decoder steps in all. Padding points (probability 0) come after every
    real point.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}`.
        points: float `(B, N, d)`.

    Returns:
        int32 `(B, N)`: a permutation of `0..N-1` per example.
    """
    return pointer_decode(model, points)


def convex_candidates(points, sequences, t):
    """Which points may be vertex `t` of a counter-clockwise convex polygon.

    For partial polygons `v_0 .. v_(t-1)` (`sequences[..., :t]`), a new vertex `j`
    keeps the closed polygon `v_0 .. v_(t-1), j` strictly convex and
    counter-clockwise when `(v_(t-2), v_(t-1), j)` and `(v_0, v_(t-1), j)` turn
    left (a convex fan around `v_0`) and `(j, v_0, v_1)` turns left (the angle at
    `v_0` stays under 180 degrees). Any point but `v_0` may be `v_1`.

    Args:
        points: float `(R, N, 2)`.
        sequences: int `(R, S)`, `S >= t`: the vertices chosen so far.
        t: the step.

    Returns:
        bool `(R, N)`; closing the polygon (pointing at `v_0`) is not included.

    Example:

    >>> square = np.array([[[0, 0], [1, 0], [1, 1], [0, 1]]], "float64")
    >>> convex_candidates(square, np.array([[0, 1, -1, -1]]), 2).tolist()
    [[False, False, True, True]]
    >>> convex_candidates(square, np.array([[0, 1, 3, -1]]), 3).tolist()  # 2 would dent
    [[False, False, False, False]]
    """
    points = np.asarray(points, np.float64)
    rows = np.arange(len(points))
    if t == 0:
        return np.ones(points.shape[:2], bool)
    first = points[rows, sequences[:, 0]][:, None]  # (R, 1, 2)
    if t == 1:
        allowed = np.ones(points.shape[:2], bool)
        allowed[rows, sequences[:, 0]] = False
        return allowed
    second = points[rows, sequences[:, 1]][:, None]
    before_last = points[rows, sequences[:, t - 2]][:, None]
    last = points[rows, sequences[:, t - 1]][:, None]
    return (
        (_turn(before_last, last, points) > 0)
        & (_turn(first, last, points) > 0)
        & (_turn(points, first, second) > 0)
    )


def polygon_beam_search(
    model: keras.Model,
    points: TensorLike,
    beam_width: int = 4,
    convex: bool = True,
    max_vertices: int | None = None,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Beam search over closed polygons, ranking them by `log p(C | x)`.

        C* = argmax_C  sum_i log p(C_i | C_<i, x),   C = v_0 .. v_(k-1), v_0

    Every hypothesis follows the rules of `polygon_decode`: it never points
    twice at a point, except at its first vertex after at least 3 vertices,
    which closes it. A closed hypothesis stays in the beam unchanged. With
    `convex=True`, candidates also keep the polygon convex and
    counter-clockwise (`convex_candidates`), so every answer is a convex
    polygon through input points (not necessarily the hull: containment of
    the other points is not enforced). An example whose whole beam dead-ends
    falls back to `polygon_decode`. With `beam_width=1, convex=False` this is
    `polygon_decode`. Costs up to `N + 1` model calls on `B * beam_width` rows.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}` trained
            on closed polygons (`pointer_network(..., mask_chosen=False)`).
        points: float `(B, N, 2)`; padding points must get probability 0
            (`pointer_network(pad_value=...)`).
        beam_width: hypotheses kept per example.
        convex: restrict the search to convex counter-clockwise polygons.
        max_vertices: give up on a polygon that has not closed after this many
            vertices (`None`: `N`, every point). A search that gives up returns
            the best open polygon, which is never an exact match.

    Returns:
        `(polygons, scores)`: a list of `B` int arrays (the vertices, without the
        closing index) and float64 `(B,)` log-probabilities of the closed ones
        (`-inf` where the greedy fallback was used or the search gave up).

    Example:

    >>> from keras_attn.models import pointer_network
    >>> model = pointer_network(input_dim=2, units=8, mask_chosen=False)
    >>> polygons, scores = polygon_beam_search(model, np.random.uniform(size=(2, 6, 2)))
    >>> print(len(polygons), scores.shape)
    2 (2,)

    Reference:
        O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015,
        https://arxiv.org/abs/1506.03134 (beam search over valid outputs)
    """
    beam_width = check_positive_int("beam_width", beam_width)
    points = np.asarray(points, "float32")
    if points.ndim != 3 or points.shape[-1] != 2:
        raise ValueError(f"`points` must have shape (B, N, 2). Received: {points.shape}")
    batch, num_points = points.shape[:2]
    width, rows = beam_width, batch * beam_width
    flat_points = np.repeat(points, width, axis=0)  # (B*K, N, 2)
    sequences = np.full((rows, num_points + 1), -1, "int32")  # -1: not decoded yet
    scores = np.full((batch, width), -np.inf)
    scores[:, 0] = 0.0  # one live hypothesis to start from
    closed = np.zeros(rows, bool)
    all_rows = np.arange(rows)
    max_vertices = num_points if max_vertices is None else min(max_vertices, num_points)
    for t in range(max_vertices + 1):
        # Row t depends on the pointers before it only: feed those (a step costs O(t), not O(N)).
        inputs = {"points": flat_points, "pointers": sequences[:, : t + 1]}
        probs = predict_batch(model, inputs)[:, t]  # (B*K, N)
        with np.errstate(divide="ignore"):
            step = np.log(probs.astype(np.float64))  # padding points: log 0 = -inf
        allowed = np.ones((rows, num_points), bool)
        chosen = sequences[:, :t]
        allowed[np.repeat(all_rows, t), chosen.reshape(-1)] = False
        if convex:
            allowed &= convex_candidates(flat_points, sequences, t)
        if t >= 3:  # pointing at the first vertex again closes the polygon
            allowed[all_rows, sequences[:, 0]] = True
        step = np.where(allowed & ~closed[:, None], step, -np.inf)
        stay = np.where(closed, 0.0, -np.inf)[:, None]  # a closed polygon stays, at no cost
        candidates = scores.reshape(rows, 1) + np.concatenate([step, stay], 1)  # (B*K, N+1)
        candidates = candidates.reshape(batch, width * (num_points + 1))
        best = np.argsort(-candidates, axis=-1, kind="stable")[:, :width]  # (B, K)
        beam, choice = best // (num_points + 1), best % (num_points + 1)
        scores = np.take_along_axis(candidates, best, -1)
        source = (np.arange(batch)[:, None] * width + beam).reshape(-1)
        sequences, closed = sequences[source], closed[source]
        choice = choice.reshape(-1)
        extends = (choice < num_points) & np.isfinite(scores.reshape(-1))
        sequences[extends, t] = choice[extends]
        closed |= extends & (t >= 3) & (choice == sequences[:, 0])
        # Log-probabilities only fall: once an example's best closed polygon scores at
        # least as high as its best open one, no open one can overtake it.
        done = np.where(closed.reshape(batch, width), scores, -np.inf).max(-1)
        live = np.where(closed.reshape(batch, width), -np.inf, scores).max(-1)
        if np.all(done >= live):
            break
    finished = np.where(closed.reshape(batch, width), scores, -np.inf)
    pick = np.argmax(finished, axis=-1)  # the best closed hypothesis of each example
    best_scores = finished[np.arange(batch), pick]
    polygons = [_open(sequences[i * width + k]) for i, k in enumerate(pick)]
    dead = ~np.isfinite(scores).any(-1)  # every hypothesis dead-ended: greedy instead
    if dead.any():
        fallback = polygon_decode(model, points[dead])
        for i, polygon in zip(np.flatnonzero(dead), fallback, strict=True):
            polygons[i] = polygon
    for i in np.flatnonzero(~dead & ~np.isfinite(best_scores)):  # gave up: best open one
        row = sequences[i * width + np.argmax(scores[i])]
        polygons[i] = row[row >= 0]
    return polygons, best_scores


def _open(row):
    row = row[row >= 0]
    return row[:-1]  # a closed row ends with its first vertex again

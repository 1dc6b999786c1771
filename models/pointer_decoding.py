"""Greedy decoding for the pointer networks (`keras_attn.models.pointer_network`).

`pointer_decode` and `polygon_decode` are constrained greedy decoding that runs
the functional model once per step on the pointers decoded so far. Output row
`t` of a `keras_attn.models.pointer_network` depends on the pointers before it only, so
step `t` feeds the first `t + 1` pointers: the decoder costs O(t) per step,
O(N^2) in all. (`keras_attn.models.pointer_search` has beam search over convex polygons.)
Also importable from `keras_attn.models.decoding`.
"""

import keras
import numpy as np

from keras_attn._typing import TensorLike
from keras_attn.arguments import is_int

from .geometry import open_polygon

# ---------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------


def predict_batch(model: keras.Model, inputs: dict[str, TensorLike]) -> np.ndarray:
    """One inference call, NumPy in and out; right for a distributed model too.

    `predict_on_batch` traces once per shape, so it is used when the model has one replica.
    """
    strategy = getattr(model, "distribute_strategy", None)  # TensorFlow backend only
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        # Keras' `predict_on_batch` gives every replica the whole batch and concatenates
        # their outputs (replicas x B rows): call the model on the batch once instead.
        return np.asarray(model(inputs, training=False))
    return np.asarray(model.predict_on_batch(inputs))


# ---------------------------------------------------------------------------
# Pointer networks
# ---------------------------------------------------------------------------


def pointer_decode(
    model: keras.Model, points: TensorLike, steps: int | None = None, constrained: bool = True
) -> np.ndarray:
    """Greedy pointer decoding that never points twice at the same position.

        C_t = argmax_{j not in C_<t} p(C_t = j | C_<t, x)

    At step `t` the model (a `keras_attn.models.pointer_network`) gets the pointers
    decoded so far, `-1` (padding) for the steps not yet decoded, and row `t`
    of its output is read. With `constrained=True` the positions already
    chosen are excluded whatever the model says, so for `steps == N` the
    output is always a permutation of `0..N-1` (a sort order). Padded points
    (`pointer_network(pad_value=...)`) get probability 0 and are chosen only
    once every real point is: decode at most as many steps as real points.

    Costs `steps` model calls, the call at step `t` on `t + 1` pointers.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}` and
            output probabilities `(B, T, N)`.
        points: float array `(B, N, d)`.
        steps: number of pointers to decode; defaults to `N`.
        constrained: exclude the positions already chosen.

    Returns:
        int32 NumPy array `(B, steps)` of positions in `[0, N)`.

    Example:

    >>> from keras_attn.models import pointer_network
    >>> model = pointer_network(input_dim=1, units=8)
    >>> order = pointer_decode(model, np.random.uniform(size=(2, 4, 1)))
    >>> print(order.shape, sorted(order[0].tolist()))
    (2, 4) [0, 1, 2, 3]
    """
    points = np.asarray(points, "float32")
    if points.ndim != 3:
        raise ValueError(f"`points` must have rank 3. Received: points.shape={points.shape}")
    batch, num_points = points.shape[:2]
    steps = num_points if steps is None else steps
    if not is_int(steps) or steps <= 0 or (constrained and steps > num_points):
        raise ValueError(
            "`steps` must be a positive integer, at most the number of points "
            f"({num_points}) when constrained. Received: steps={steps!r}"
        )
    steps = int(steps)
    pointers = np.full((batch, steps), -1, "int32")
    chosen = np.zeros((batch, num_points), bool)
    rows = np.arange(batch)
    for t in range(steps):
        inputs = {"points": points, "pointers": pointers[:, : t + 1]}
        probs = predict_batch(model, inputs)[:, t]  # (B, N)
        if constrained:
            probs = np.where(chosen, -np.inf, probs)
        pointers[:, t] = np.argmax(probs, axis=-1)
        chosen[rows, pointers[:, t]] = True
    return pointers


def polygon_decode(model: keras.Model, points: TensorLike) -> list[np.ndarray]:
    """Greedy decoding of closed polygons (convex hulls) with a pointer network.

    Positions already chosen are excluded, except the first one: pointing back
    at it (after at least 3 vertices) closes the polygon and ends the
    sequence, the end-of-sequence convention of the Pointer Networks paper
    (train on hulls with their first vertex repeated at the end, with
    `pointer_network(..., mask_chosen=False)`). Costs up to `N + 1` model calls,
    the call at step `t` on `t + 1` pointers.

    Args:
        model: a pointer network with inputs `{"points", "pointers"}`.
        points: float array `(B, N, d)`.

    Returns:
        A list of `B` int arrays: each polygon's vertices, without the closing index.

    Example:

    >>> from keras_attn.models import pointer_network
    >>> model = pointer_network(input_dim=2, units=8, mask_chosen=False)
    >>> hulls = polygon_decode(model, np.random.uniform(size=(2, 6, 2)))
    >>> print(len(hulls), all(len(set(h.tolist())) == len(h) for h in hulls))
    2 True
    """
    points = np.asarray(points, "float32")
    if points.ndim != 3:
        raise ValueError(f"`points` must have rank 3. Received: points.shape={points.shape}")
    batch, num_points = points.shape[:2]
    pointers = np.full((batch, num_points + 1), -1, "int32")  # -1: not decoded yet
    chosen = np.zeros((batch, num_points), bool)
    closed = np.zeros(batch, bool)
    rows = np.arange(batch)
    for t in range(num_points + 1):
        inputs = {"points": points, "pointers": pointers[:, : t + 1]}
        probs = predict_batch(model, inputs)[:, t]  # (B, N)
        allowed = ~chosen
        if t >= 3:  # pointing at the first vertex again closes the polygon
            allowed[rows, pointers[:, 0]] = True
        choice = np.argmax(np.where(allowed, probs, -1.0), axis=-1)
        pointers[:, t] = np.where(closed, -1, choice)
        chosen[rows, choice] = True
        closed |= (t >= 3) & (choice == pointers[:, 0])
        if closed.all():
            break
    return [open_polygon(row) for row in pointers]

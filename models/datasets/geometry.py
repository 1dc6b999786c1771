"""Planar geometry for the convex hull task: the hull itself and polygon areas (NumPy only)."""

import numpy as np


def _cross(o: list[float], a: list[float], b: list[float]) -> float:
    # z of (a - o) x (b - o): > 0 when o -> a -> b turns counter-clockwise. Exact in float64 for
    # float32 inputs (differences are exact, products fit in 53 bits), so the sign is never wrong.
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_hull_indices(points) -> np.ndarray:
    """Indices of the convex hull vertices, counter-clockwise, starting at the lowest index.

    Andrew's monotone chain: sort the points by `(x, y)`, build the lower and the upper
    chain, popping every point that does not make a strict left turn. Points on a hull edge
    (collinear) are not vertices. This is the target order of the Pointer Networks paper.

    Args:
        points: array-like of shape `(n, 2)`; distinct points.

    Returns:
        int32 array of shape `(k,)`, `k <= n`: the hull vertices in counter-clockwise
        order, rotated so that the smallest index comes first.

    Example:

    >>> square = [[0, 0], [1, 1], [0.5, 0.5], [1, 0], [0, 1], [0.5, 0]]
    >>> convex_hull_indices(square).tolist()
    [0, 3, 1, 4]

    Reference:
        A. M. Andrew, "Another efficient algorithm for convex hulls in two dimensions",
        Information Processing Letters 9(5), 1979.
        O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015,
        https://arxiv.org/abs/1506.03134
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2:
        raise ValueError(f"`points` must have shape (n, 2). Received: points.shape={pts.shape}")
    order = np.lexsort((pts[:, 1], pts[:, 0])).tolist()
    if len(order) < 3:
        return np.asarray(sorted(order), dtype=np.int32)
    xy = pts.tolist()  # Python floats: much faster than indexing NumPy inside the loop

    def chain(indices):
        out = []
        for i in indices:
            while len(out) >= 2 and _cross(xy[out[-2]], xy[out[-1]], xy[i]) <= 0:
                out.pop()
            out.append(i)
        return out

    # Each chain ends where the other starts: drop the last point of both.
    hull = chain(order)[:-1] + chain(reversed(order))[:-1]
    start = hull.index(min(hull))
    return np.asarray(hull[start:] + hull[:start], dtype=np.int32)


def polygon_area(points, indices=None) -> float:
    """Signed area of a polygon (shoelace formula): positive when counter-clockwise.

    Args:
        points: array-like of shape `(n, 2)`.
        indices: optional vertex order into `points` (e.g. a predicted hull); all points in
            their given order when omitted.

    Returns:
        The signed area as a Python float; `abs()` of it for the area. Hull area coverage,
        the Pointer Networks metric, is `polygon_area(x, predicted) / polygon_area(x, hull)`
        when the prediction is a simple polygon.

    Example:

    >>> polygon_area([[0, 0], [2, 0], [2, 1], [0, 1]])
    2.0
    >>> polygon_area([[0, 0], [2, 0], [2, 1], [0, 1]], indices=[0, 3, 2, 1])
    -2.0

    Reference:
        O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015,
        https://arxiv.org/abs/1506.03134
    """
    pts = np.asarray(points, dtype=np.float64)
    if indices is not None:
        pts = pts[np.asarray(indices, dtype=np.int64)]
    x, y = pts[:, 0], pts[:, 1]
    return float(0.5 * np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))

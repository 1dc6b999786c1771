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


def open_polygon(pointers) -> np.ndarray:
    """A closed pointer sequence (maybe padded with -1) without its padding and closing index.

    Example:

    >>> open_polygon([0, 2, 1, 0, -1]).tolist()
    [0, 2, 1]
    """
    pointers = np.asarray(pointers)
    pointers = pointers[pointers >= 0]
    return pointers[:-1] if len(pointers) > 1 and pointers[-1] == pointers[0] else pointers


def rotate_to_lowest_index(polygon) -> np.ndarray:
    """An open polygon's vertex cycle, rotated to start at its lowest index (the target's).

    Example:

    >>> rotate_to_lowest_index([4, 1, 7, 2]).tolist()
    [1, 7, 2, 4]
    """
    polygon = open_polygon(polygon)
    if len(polygon) == 0:
        return polygon
    start = int(np.argmin(polygon))
    return np.concatenate([polygon[start:], polygon[:start]])


def is_simple_polygon(polygon) -> bool:
    """Whether a closed polygon `(k, 2)` has at least 3 vertices and no crossing edges.

    Example:

    >>> is_simple_polygon([[0, 0], [1, 0], [1, 1], [0, 1]])
    True
    >>> is_simple_polygon([[0, 0], [1, 1], [1, 0], [0, 1]])  # a bow tie
    False
    """
    polygon = np.asarray(polygon, dtype=np.float64)
    k = len(polygon)
    if k < 3:
        return False
    for i in range(k):
        for j in range(i + 2, k):
            if i == 0 and j == k - 1:
                continue  # adjacent through the closing edge
            p, q = polygon[i], polygon[(i + 1) % k]
            r, t = polygon[j], polygon[(j + 1) % k]
            if _cross(p, q, r) * _cross(p, q, t) < 0 and _cross(r, t, p) * _cross(r, t, q) < 0:
                return False
    return True


def is_convex_polygon(polygon) -> bool:
    """Whether a closed polygon `(k, 2)` is simple and strictly convex (either orientation).

    Strictly: every turn, the closing ones included, bends the same way and none is
    straight (a vertex in the middle of an edge is not a vertex of a convex polygon).

    Example:

    >>> is_convex_polygon([[0, 0], [1, 0], [1, 1], [0, 1]])
    True
    >>> is_convex_polygon([[0, 0], [2, 0], [1, 0.5], [1, 2]])  # a dent at [1, 0.5]
    False
    """
    polygon = np.asarray(polygon, dtype=np.float64)
    k = len(polygon)
    if k < 3:
        return False
    turns = [_cross(polygon[i - 2], polygon[i - 1], polygon[i]) for i in range(k)]
    same_way = all(t > 0 for t in turns) or all(t < 0 for t in turns)
    return same_way and is_simple_polygon(polygon)  # a pentagram turns one way too


def contains_points(polygon, points) -> bool:
    """Whether a convex polygon `(k, 2)` holds every point `(n, 2)`, inside or on its edges."""
    polygon = np.asarray(polygon, dtype=np.float64)
    points = np.asarray(points, dtype=np.float64)
    sign = 1.0 if polygon_area(polygon) >= 0 else -1.0  # counter-clockwise: insides are left
    edge = np.roll(polygon, -1, axis=0) - polygon  # (k, 2) edge i goes v_i -> v_(i+1)
    rel = points[None, :, :] - polygon[:, None, :]  # (k, n, 2)
    side = edge[:, None, 0] * rel[..., 1] - edge[:, None, 1] * rel[..., 0]  # (k, n)
    return bool(np.all(sign * side >= 0))


def is_valid_hull(points, indices) -> bool:
    """Whether `indices` into `points` `(n, 2)` make a valid convex-hull answer.

    Valid means: at least 3 vertices, no index repeated, and the closed polygon they make
    is simple, strictly convex (`is_convex_polygon`) and contains every point
    (`contains_points`, edges included). For points in general position that is the
    true hull up to its starting vertex and orientation, so exact match implies valid
    but not the converse.

    Example:

    >>> square = [[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]]
    >>> is_valid_hull(square, [0, 1, 2, 3]), is_valid_hull(square, [1, 0, 3, 2])
    (True, True)
    >>> is_valid_hull(square, [0, 1, 2]), is_valid_hull(square, [0, 1, 2, 4, 3])
    (False, False)
    """
    indices = open_polygon(indices).tolist()
    points = np.asarray(points, dtype=np.float64)
    if len(indices) < 3 or len(set(indices)) < len(indices):
        return False
    polygon = points[indices]
    return is_convex_polygon(polygon) and contains_points(polygon, points)


def hull_report(points, predicted, targets, pad_value: float | None = None) -> dict:
    """Convex-hull metrics of predicted polygons, each averaged over the examples.

    Args:
        points: `(B, N, 2)` points; with `pad_value`, the points whose coordinates all
            equal it are padding and left out of the containment test.
        predicted: `B` index sequences (open or closed, maybe padded with -1).
        targets: `B` true hulls (open or closed, maybe padded with -1).
        pad_value: the padding coordinate, or None.

    Returns:
        A dict of floats in [0, 1]:
        `exact_match`: the predicted vertex sequence is the target's (same start and
        orientation); `area_coverage`: predicted area over true hull area, a polygon that
        is not simple or repeats a vertex counting 0 (the paper's metric); `valid`: the
        share of `is_valid_hull` answers; `simple`: the share of simple polygons with no
        repeated vertex (those the area counts).

    Reference:
        O. Vinyals, M. Fortunato, N. Jaitly, "Pointer Networks", NeurIPS 2015,
        https://arxiv.org/abs/1506.03134
    """
    rows = {"exact_match": [], "area_coverage": [], "valid": [], "simple": []}
    for x, hull, target in zip(points, predicted, targets, strict=True):
        x = np.asarray(x, dtype=np.float64)
        if pad_value is not None:
            x = x[~np.all(x == pad_value, axis=-1)]
        hull, target = open_polygon(hull), open_polygon(target)
        rows["exact_match"].append(len(hull) == len(target) and np.array_equal(hull, target))
        simple = len(set(hull.tolist())) == len(hull) and is_simple_polygon(x[hull])
        area = abs(polygon_area(x, hull)) / polygon_area(x, target) if simple else 0.0
        rows["area_coverage"].append(area)
        rows["simple"].append(simple)
        rows["valid"].append(simple and is_valid_hull(x, hull))
    return {key: float(np.mean(values)) for key, values in rows.items()}


def hull_metrics(points, predicted, targets):
    """The Pointer Networks paper's two convex-hull metrics, averaged over examples.

    Args:
        points: `(B, N, 2)` points (padding points are never indexed).
        predicted: `B` index sequences (open or closed, maybe padded with -1).
        targets: `B` true hulls (open or closed, maybe padded with -1).

    Returns:
        `(accuracy, coverage)`: the fraction of exact vertex sequences, and the mean
        predicted-polygon area over true hull area, a non-simple polygon or one that
        repeats a vertex counting 0 (`hull_report` adds the share of valid polygons).
    """
    report = hull_report(points, predicted, targets)
    return report["exact_match"], report["area_coverage"]

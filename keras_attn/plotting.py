"""Attention plots: alignment heatmaps, HAN word/sentence highlighting, pointer selections.

Needs matplotlib, an optional extra: `pip install keras-attn[plot]`. It is imported
when a function is called, never when `keras_attn` is. Figures are drawn on
matplotlib's Agg canvas (`matplotlib.figure.Figure`, not `pyplot`): nothing opens a
window and nothing stays in pyplot's global figure list, so the functions run on
headless machines and in loops. Each returns the figure; write it with
`save_figure(fig, "attention.png")`.

Weights are anything `np.asarray` accepts (NumPy arrays, eager tensors): take one
example out of a batch first, e.g. `weights[0]`, and average or pick the heads of a
multi-head layer (`weights[0].mean(axis=0)`).
"""

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:  # matplotlib is optional: imported when a function runs
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_INSTALL = "keras_attn.plotting needs matplotlib: pip install keras-attn[plot]"


def _matplotlib():
    """The matplotlib modules used here, imported on first use (an optional extra)."""
    try:
        import matplotlib
        from matplotlib.backends import backend_agg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(_INSTALL) from error
    return matplotlib, backend_agg, Figure


def _new_figure(width, height, title=None):
    """A `Figure` on an Agg canvas: no pyplot state, no window; wide enough for `title`."""
    _, backend_agg, figure_class = _matplotlib()
    width = min(max(width, 1.0 + 0.11 * len(title or "")), 20.0)
    fig = figure_class(figsize=(width, min(height, 20.0)), layout="constrained")
    backend_agg.FigureCanvasAgg(fig)
    return fig


def _array(value, name, ndim):
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"`{name}` must be an array of numbers. Received: {name} of type {type(value).__name__}"
        ) from error
    if array.ndim not in ndim:
        raise ValueError(
            f"`{name}` must have rank {' or '.join(map(str, ndim))}. "
            f"Received: {name}.shape={array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` must be finite. Received: {name} with NaN or inf values")
    return array


def _labels(labels, name, size):
    if labels is None:
        return None
    if isinstance(labels, str) or np.ndim(labels) != 1:
        raise ValueError(f"`{name}` must be a list of strings. Received: {name}={labels!r}")
    labels = [str(label) for label in labels]
    if len(labels) != size:
        raise ValueError(
            f"`{name}` must have one label per position ({size}). "
            f"Received: len({name})={len(labels)}"
        )
    return labels


def plot_attention(
    weights: ArrayLike,
    source_labels: Sequence[str] | None = None,
    target_labels: Sequence[str] | None = None,
    ax: "Axes | None" = None,
    title: str | None = None,
) -> "Figure":
    """Heatmap of attention weights: one row per query (target), one column per key (source).

    For a seq2seq model this is the alignment matrix of Bahdanau et al.: row `t`
    shows where the decoder looked while producing target token `t`.

    Args:
        weights: `(Tq, Tv)` weights of one example (e.g. `rnn_seq2seq(...,
            return_attention=True)` gives `(B, T, S)`: pass `weights[0]`).
        source_labels: `Tv` strings for the columns (source tokens), or None.
        target_labels: `Tq` strings for the rows (target tokens), or None.
        ax: a matplotlib `Axes` to draw on; a new figure when None.
        title: the axes title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `weights` is not rank 2 or not finite, or a label list does
            not match its axis.
        TypeError: `weights` is not numeric.

    Example:

    >>> fig = plot_attention(np.eye(3), ["a", "b", "c"], ["x", "y", "z"], title="identity")
    >>> print(type(fig).__name__)
    Figure
    """
    weights = _array(weights, "weights", ndim=(2,))
    rows, columns = weights.shape
    source_labels = _labels(source_labels, "source_labels", columns)
    target_labels = _labels(target_labels, "target_labels", rows)
    if ax is None:
        fig = _new_figure(2.0 + 0.35 * columns, 1.5 + 0.3 * rows, title)
        ax = fig.add_subplot()
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    ax.set_xlabel("source (keys)")
    ax.set_ylabel("target (queries)")
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    if source_labels is not None:
        ax.set_xticks(range(columns), source_labels, rotation=90)
    if target_labels is not None:
        ax.set_yticks(range(rows), target_labels)
    if title:
        ax.set_title(title)
    return ax.figure


def plot_han(
    word_weights: ArrayLike,
    sentence_weights: ArrayLike,
    words: Sequence[Sequence[str] | str],
    title: str | None = None,
    line_width: int = 80,
) -> "Figure":
    """HAN highlighting: each sentence a row of words shaded by weight, its weight a bar.

    As in Yang et al. (2016, figure 5), a word's shade is its word weight times the
    square root of its sentence's weight, so that only important words in important
    sentences stand out; the bar on the left is the sentence weight.

    Args:
        word_weights: `(S, W)` word weights of one document
            (`hierarchical_attention_network(..., return_attention=True)` gives
            `"word_attention"` `(B, S, W)`: pass `[0]`).
        sentence_weights: `(S,)` sentence weights (`"sentence_attention"[0]`).
        words: the document's words, one entry per sentence: a list of word
            strings, or a string split on whitespace. At most `S` sentences of at
            most `W` words; sentences and words past the lists are padding and
            are not drawn.
        title: the figure title.
        line_width: characters per line before a long sentence wraps.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: wrong ranks, `sentence_weights` not of length `S`, or more
            sentences or words in `words` than the weights have.
        TypeError: weights that are not numeric.

    Example:

    >>> fig = plot_han([[0.7, 0.3], [0.5, 0.5]], [0.9, 0.1], [["great", "film"], "so so"])
    >>> print(type(fig).__name__)
    Figure
    """
    word_weights = _array(word_weights, "word_weights", ndim=(2,))
    sentence_weights = _array(sentence_weights, "sentence_weights", ndim=(1,))
    num_sentences, num_words = word_weights.shape
    if sentence_weights.shape[0] != num_sentences:
        raise ValueError(
            f"`sentence_weights` must have one weight per sentence ({num_sentences}). "
            f"Received: sentence_weights.shape={sentence_weights.shape}"
        )
    if (
        isinstance(words, str)
        or not hasattr(words, "__len__")
        or not 0 < len(words) <= num_sentences
    ):
        raise ValueError(
            f"`words` must be a list of 1 to {num_sentences} sentences. Received: words={words!r}"
        )
    words = [s.split() if isinstance(s, str) else [str(w) for w in s] for s in words]
    for i, sentence in enumerate(words):
        if len(sentence) > num_words:
            raise ValueError(
                f"`words[{i}]` must have at most {num_words} words (the width of "
                f"`word_weights`). Received: {len(sentence)} words"
            )
    # Lay the words out in character cells (monospace): row = one line of text.
    lines = []  # (sentence index, [(column, word, weight)])
    for i, sentence in enumerate(words):
        line, column = [], 0
        for j, word in enumerate(sentence):
            if line and column + len(word) > line_width:
                lines.append((i, line))
                line, column = [], 0
            line.append((column, word, word_weights[i, j] * np.sqrt(sentence_weights[i])))
            column += len(word) + 1
        lines.append((i, line))
    shades = [weight for _, line in lines for _, _, weight in line]
    top = max(max(shades, default=0.0), 1e-12)
    width = max((c + len(w) for _, line in lines for c, w, _ in line), default=1)

    fig = _new_figure(max(4.0, 1.5 + 0.09 * width), 0.8 + 0.3 * len(lines), title)
    bar_ax, text_ax = fig.subplots(1, 2, width_ratios=[1, max(width / 12, 1)], sharey=True)
    reds = _matplotlib()[0].colormaps["Reds"]
    for row, (_, line) in enumerate(lines):
        for column, word, weight in line:
            shade = weight / top
            text_ax.text(
                column, row, word, family="monospace", va="center", ha="left",
                color="white" if shade > 0.6 else "black",
                bbox={"boxstyle": "square,pad=0.1", "facecolor": reds(shade), "edgecolor": "none"},
            )  # fmt: skip
    first_rows = {}
    for row, (i, _) in enumerate(lines):
        first_rows.setdefault(i, row)
    bar_ax.barh(list(first_rows.values()), sentence_weights[list(first_rows)], color="tab:blue")
    bar_ax.set_xlim(0, 1)
    bar_ax.invert_xaxis()
    bar_ax.set_ylim(len(lines) - 0.5, -0.5)
    bar_ax.set_yticks(list(first_rows.values()), [f"s{i}" for i in first_rows])
    bar_ax.set_xlabel("sentence weight")
    text_ax.set_xlim(-0.5, width + 0.5)
    text_ax.set_axis_off()
    if title:
        fig.suptitle(title)
    return fig


def _pointers(pointers, name, size):
    """Integer positions in `[0, size)`; trailing `-1` (padding) dropped."""
    array = np.asarray(pointers)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"`{name}` must be a rank-1 integer array of positions. "
            f"Received: {name}.shape={array.shape}, dtype={array.dtype}"
        )
    kept = np.flatnonzero(array != -1)
    real = array[: kept[-1] + 1] if kept.size else array[:0]  # trailing -1 are padding
    if real.size == 0 or real.min() < 0 or real.max() >= size:
        raise ValueError(
            f"`{name}` must hold positions in [0, {size}) (-1 only as trailing padding). "
            f"Received: {name}={array.tolist()}"
        )
    return real


def plot_pointer(
    points: ArrayLike,
    pointers: ArrayLike,
    target: ArrayLike | None = None,
    ax: "Axes | None" = None,
    title: str | None = None,
) -> "Figure":
    """Pointer-network selections drawn over the inputs: a hull polygon, or a sort order.

    2-D points `(N, 2)` (convex hull): every point is drawn with its index, and
    the chosen points are joined in the order they were pointed at into a closed
    polygon (a pointer sequence that returns to its start is closed once). A
    `target` pointer sequence is drawn dashed underneath for comparison.

    1-D points `(N,)` or `(N, 1)` (sorting): the pointed-at values are drawn as bars
    in output order, each labelled with the input position it points to; a
    correct sort is an ascending staircase, and a step that goes down is red.

    Args:
        points: the inputs of one example, `(N, 2)`, `(N,)` or `(N, 1)` (without
            padding points).
        pointers: the chosen positions `(T,)`, e.g. `keras_attn.models.pointer_decode(...)[0]`;
            trailing `-1` (padding) are ignored.
        target: the true pointers `(T',)` (hull only), or None.
        ax: a matplotlib `Axes` to draw on; a new figure when None.
        title: the axes title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `points` of another shape, or pointers that are not integer
            positions in `[0, N)`.
        TypeError: `points` is not numeric.

    Example:

    >>> square = np.array([[0, 0], [1, 0], [0.5, 0.5], [1, 1], [0, 1]])
    >>> fig = plot_pointer(square, [0, 1, 3, 4], target=[0, 1, 3, 4])
    >>> fig = plot_pointer(np.array([0.3, 0.1, 0.2]), [1, 2, 0], title="sort")
    >>> print(type(fig).__name__)
    Figure
    """
    points = _array(points, "points", ndim=(1, 2))
    if points.ndim == 2 and points.shape[1] == 1:
        points = points[:, 0]
    if points.ndim == 2 and points.shape[1] != 2:
        raise ValueError(
            "`points` must have shape (N, 2), (N, 1) or (N,). "
            f"Received: points.shape={points.shape}"
        )
    pointers = _pointers(pointers, "pointers", len(points))
    if ax is None:
        fig = (
            _new_figure(5.0, 4.5, title)
            if points.ndim == 2
            else _new_figure(1.5 + 0.3 * len(pointers), 3, title)
        )
        ax = fig.add_subplot()
    if points.ndim == 1:
        values = points[pointers]
        down = np.concatenate([[False], np.diff(values) < 0])
        ax.bar(range(len(values)), values, color=np.where(down, "tab:red", "tab:blue"))
        ax.set_xticks(range(len(values)), [str(p) for p in pointers])
        ax.set_xlabel("output step (label: input position pointed to)")
        ax.set_ylabel("value")
    else:
        if target is not None:
            target = _pointers(target, "target", len(points))
            ax.fill(*points[target].T, facecolor="none", edgecolor="gray", linestyle="--",
                    label="target")  # fmt: skip
        polygon = pointers[:-1] if len(pointers) > 1 and pointers[-1] == pointers[0] else pointers
        ax.fill(*points[polygon].T, facecolor="tab:orange", alpha=0.25, edgecolor="tab:orange",
                linewidth=2, label="pointed")  # fmt: skip
        ax.scatter(*points.T, s=12, color="black", zorder=3)
        for i, (x, y) in enumerate(points):
            ax.annotate(str(i), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
        ax.set_aspect("equal", adjustable="datalim")
        ax.legend(loc="best", fontsize=8)
    if title:
        ax.set_title(title)
    return ax.figure


def save_figure(fig: "Figure", path: str | os.PathLike, dpi: int = 100) -> str | os.PathLike:
    """Writes a figure as a PNG file, creating its folder.

    Args:
        fig: a matplotlib `Figure` (what the plotting functions return).
        path: the file to write; must end in `.png`.
        dpi: resolution.

    Returns:
        `path`.

    Raises:
        TypeError: `fig` is not a matplotlib `Figure`.
        ValueError: `path` does not end in `.png`.

    Example:

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "attention.png")
    >>> path == save_figure(plot_attention(np.eye(2)), path)
    True
    """
    figure_class = _matplotlib()[2]
    if not isinstance(fig, figure_class):
        raise TypeError(f"`fig` must be a matplotlib Figure. Received: fig={fig!r}")
    if not str(path).lower().endswith(".png"):
        raise ValueError(f"`path` must end in '.png'. Received: path={path!r}")
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    return path

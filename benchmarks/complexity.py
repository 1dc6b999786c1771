"""The Transformer paper's Table 1, measured: per-layer cost of three layer types.

| layer | complexity per layer | sequential operations | (paper) |
|---|---|---|---|
| self-attention | O(L^2 d) | O(1) | |
| recurrent | O(L d^2) | O(L) | |
| convolutional (kernel k) | O(k L d^2) | O(1) | |

Each layer maps `(B, L, d) -> (B, L, d)`: self-attention is
`keras_attn.ops.attention(x, x, x)` (the `softmax(x x^T / sqrt(d)) x` of one
head, no projections, which is what the paper's row counts), the recurrent
layer `keras.layers.SimpleRNN(d)`, the convolution `keras.layers.Conv1D(d, k)`.
Forward (inference) time under `tf.function` is measured

- against `L` at fixed `d` and against `d` at fixed `L`: each sweep is
  fitted by least squares to `t = a f(L, d) + b` with the layer's `f` from
  the table, and log-log slopes are reported (expected: 2 and 1 for attention
  in `L` and `d`, 1 and 2 for the other two, once the sizes are large
  enough for the leading term to dominate; attention's softmax is an
  `O(L^2)` term the table leaves out, which lowers its slope in `d`);
- against `L` with the work held fixed (`B L = const`, so `B L d^2` FLOPs of
  the RNN and the convolution stay the same): the RNN's time still grows
  with `L` because its `L` steps run one after the other (its O(L)
  sequential operations); the convolution's does not.

Reference:
    Vaswani et al., 2017, "Attention Is All You Need", Table 1,
    https://arxiv.org/abs/1706.03762
"""

import math
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import keras_attn

KERNEL = 3
LEVELS = {
    # lengths at width d_for_length, widths at length l_for_width, fixed-work lengths
    "full": dict(
        batch=16,  # large enough that the RNN's per-step matmul, not its loop, dominates
        lengths=(64, 128, 256, 512, 1024, 2048),
        d_for_length=128,
        widths=(32, 64, 128, 256, 512),
        l_for_width=512,
        tokens=8192,
        seq_lengths=(16, 32, 64, 128, 256, 512, 1024),
        seq_d=64,
        repeats=7,
    ),
    "smoke": dict(
        batch=2,
        lengths=(16, 32),
        d_for_length=16,
        widths=(8, 16),
        l_for_width=16,
        tokens=64,
        seq_lengths=(8, 16),
        seq_d=8,
        repeats=1,
    ),
}
LAYERS = ("self-attention", "recurrent", "convolutional")
PAPER = {
    "self-attention": ("O(L^2 d)", "O(1)"),
    "recurrent": ("O(L d^2)", "O(L)"),
    "convolutional": (f"O(k L d^2), k={KERNEL}", "O(1)"),
}


def cost(kind, length, width):
    """The leading term of the paper's complexity per layer, `f(L, d)`."""
    if kind == "self-attention":
        return length**2 * width
    if kind == "recurrent":
        return length * width**2
    return KERNEL * length * width**2


def _layer_fn(kind, width):
    if kind == "self-attention":
        return lambda x: keras_attn.ops.attention(x, x, x)[0]
    if kind == "recurrent":
        layer = keras.layers.SimpleRNN(width, return_sequences=True)
    else:
        layer = keras.layers.Conv1D(width, KERNEL, padding="same")
    layer.build((None, None, width))
    return lambda x: layer(x)


def _time(kind, batch, length, width, repeats):
    """Median seconds of one forward call (after one traced and one warm call)."""
    fn = tf.function(
        lambda x: tf.reduce_sum(_layer_fn_cache(kind, width)(x)), reduce_retracing=True
    )
    x = tf.random.stateless_normal((batch, length, width), seed=(1, 0))
    np.asarray(fn(x))
    start = time.perf_counter()
    np.asarray(fn(x))
    warm = time.perf_counter() - start
    calls = max(1, math.ceil(0.1 / max(warm, 1e-6)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(x)
        np.asarray(out)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


_CACHE = {}


def _layer_fn_cache(kind, width):
    if (kind, width) not in _CACHE:
        _CACHE[(kind, width)] = _layer_fn(kind, width)
    return _CACHE[(kind, width)]


def _slope(xs, ys):
    """Least-squares slope of log(y) on log(x) over the upper half (at least 3) of the points."""
    half = min(len(xs), max(3, (len(xs) + 1) // 2))
    lx, ly = np.log(xs[-half:]), np.log(ys[-half:])
    return float(np.polyfit(lx, ly, 1)[0])


def _fit(points):
    """`t = a f + b` by least squares; returns a, b and R^2."""
    f = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    design = np.stack([f, np.ones_like(f)], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, t, rcond=None)
    residual = t - (a * f + b)
    r2 = 1.0 - float(residual @ residual) / max(float(((t - t.mean()) ** 2).sum()), 1e-30)
    return {"a": float(a), "b": float(b), "r2": r2}


def run(level="full", plot_path=None):
    """Measures the three sweeps; returns the results (and draws the plot if asked)."""
    cfg = LEVELS[level]
    _CACHE.clear()
    result = {"level": level, "config": cfg, "kernel": KERNEL, "layers": {}}
    for kind in LAYERS:
        by_length = [
            _time(kind, cfg["batch"], n, cfg["d_for_length"], cfg["repeats"])
            for n in cfg["lengths"]
        ]
        by_width = [
            _time(kind, cfg["batch"], cfg["l_for_width"], d, cfg["repeats"]) for d in cfg["widths"]
        ]
        fixed_work = [
            _time(kind, max(1, cfg["tokens"] // n), n, cfg["seq_d"], cfg["repeats"])
            for n in cfg["seq_lengths"]
        ]
        costs_length = [cost(kind, n, cfg["d_for_length"]) for n in cfg["lengths"]]
        costs_width = [cost(kind, cfg["l_for_width"], d) for d in cfg["widths"]]
        fit_length = _fit(list(zip(costs_length, by_length, strict=True)))
        fit_width = _fit(list(zip(costs_width, by_width, strict=True)))
        result["layers"][kind] = {
            "paper_complexity": PAPER[kind][0],
            "paper_sequential": PAPER[kind][1],
            "time_vs_length_s": by_length,
            "time_vs_width_s": by_width,
            "time_fixed_work_s": fixed_work,
            "slope_length": _slope(cfg["lengths"], by_length),
            "slope_width": _slope(cfg["widths"], by_width),
            "fixed_work_growth": fixed_work[-1] / fixed_work[0],
            "fit_length": fit_length,
            "fit_width": fit_width,
        }
    if plot_path:
        result["plot"] = plot(result, plot_path)
    return result


def table(result):
    """Markdown table: the paper's columns next to the measured exponents."""
    cfg = result["config"]
    lo, hi = cfg["seq_lengths"][0], cfg["seq_lengths"][-1]
    lines = [
        "Transformer paper, Table 1, measured (forward, tf.function; slopes of log t over the "
        f"upper half of each sweep; L sweep at d={cfg['d_for_length']}, d sweep at "
        f"L={cfg['l_for_width']}, B={cfg['batch']}; fixed work: B*L={cfg['tokens']}, "
        f"d={cfg['seq_d']}, L {lo} -> {hi}):",
        "",
        "| layer | complexity per layer | t ~ L^x: x | t ~ d^y: y | R^2 of t = a f + b (L; d) "
        f"| sequential ops | B*L fixed: t(L={hi}) / t(L={lo}) |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, r in result["layers"].items():
        lines.append(
            f"| {kind} | {r['paper_complexity']} | {r['slope_length']:.2f} | "
            f"{r['slope_width']:.2f} | {r['fit_length']['r2']:.3f}; {r['fit_width']['r2']:.3f} | "
            f"{r['paper_sequential']} | "
            f"{r['fixed_work_growth']:.1f}x |"
        )
    lines += [
        "",
        "With B*L fixed, the RNN's and the convolution's work (B L d^2) is constant: the RNN "
        "still slows down with L (L steps one after the other), the convolution does not. "
        "Self-attention's work (B L^2 d) grows as L there.",
    ]
    if result.get("plot"):
        lines += ["", f"plot: {result['plot']}"]
    return "\n".join(lines)


def plot(result, path):
    """Draws the three sweeps to a PNG; returns the path, or a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not drawn: matplotlib is not installed (pip install -e '.[plot]')"
    cfg = result["config"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    sweeps = [
        ("length", cfg["lengths"], "time_vs_length_s",
         f"sequence length L (d={cfg['d_for_length']})"),
        ("width", cfg["widths"], "time_vs_width_s", f"width d (L={cfg['l_for_width']})"),
        ("fixed", cfg["seq_lengths"], "time_fixed_work_s",
         f"L with B*L={cfg['tokens']} fixed (d={cfg['seq_d']})"),
    ]  # fmt: skip
    for ax, (name, xs, key, label) in zip(axes, sweeps, strict=True):
        for kind, r in result["layers"].items():
            ys = np.array(r[key]) * 1e3
            ax.loglog(xs, ys, "o-", label=kind)
            if name != "fixed":
                fit = r["fit_length" if name == "length" else "fit_width"]
                fs = [
                    cost(kind, x, cfg["d_for_length"]) if name == "length"
                    else cost(kind, cfg["l_for_width"], x) for x in xs
                ]  # fmt: skip
                ax.loglog(xs, (fit["a"] * np.array(fs) + fit["b"]) * 1e3, ":", color="gray")
        ax.set_xlabel(label)
        ax.set_ylabel("forward time, ms")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("cost vs L (dotted: fit a f(L, d) + b)")
    axes[1].set_title("cost vs d")
    axes[2].set_title("sequential operations: work held fixed")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
